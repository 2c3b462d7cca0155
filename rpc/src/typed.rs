//! The typed layer: a [`Method`] names a request type and the Rust types of its request and
//! response, encoded with [`postcard`] (serde's compact binary format: varint integers, no
//! field names, a wire format stable since its 1.0). It sits on the raw path and changes
//! nothing of it: a typed request is serialized straight into the registered request buffer
//! (its size computed first, then written in place: no intermediate vector), a typed
//! response straight into the registered response buffer, and both are decoded from the
//! receive buffer in place, borrowing from it where the types borrow (a `&[u8]` or `&str`
//! field costs no copy and no allocation); raw calls and handlers still read and write bytes
//! as before.
//!
//! A request the server cannot decode is rejected with [`UNDECODABLE`]; a response the
//! client cannot decode (or a value that cannot be encoded) ends the call with
//! [`RpcError::Codec`].

use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use corelink_engine::verbs::Provider;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::endpoint::{Ask, Endpoint, GroupAsk, Rpc};
use crate::error::{Result, RpcError};
use crate::handle::{CallFuture, Handle};
use crate::ids::{CallId, GroupId, ReqType, SessionId};
use crate::service::{Reject, Request};

/// The code a typed handler's endpoint rejects a request with when its bytes do not decode
/// as the method's request type ([`RpcError::Rejected`]).
pub const UNDECODABLE: u32 = u32::MAX;

/// A typed request type: its number and the types of its request and response, each of
/// which may borrow from the bytes it is decoded from (the receive buffer): a handler gets a
/// request's `&[u8]` and `&str` fields in place, as a continuation gets a response's.
///
/// # Examples
///
/// ```
/// use corelink_rpc::{Method, ReqType};
///
/// #[derive(serde::Serialize, serde::Deserialize)]
/// struct Add { a: u64, b: u64 }
///
/// struct AddMethod;
/// impl Method for AddMethod {
///     const TYPE: ReqType = ReqType(10);
///     type Request<'a> = Add;
///     type Response<'a> = u64;
/// }
///
/// let bytes = corelink_rpc::encode(&Add { a: 2, b: 3 })?;
/// assert_eq!(bytes, [2, 3]); // varints: two bytes for two small numbers
/// let back: Add = corelink_rpc::decode(&bytes)?;
/// assert_eq!(back.a + back.b, 5);
///
/// // A request that borrows: its value is read in place where it arrives.
/// struct PutMethod;
/// impl Method for PutMethod {
///     const TYPE: ReqType = ReqType(11);
///     type Request<'a> = (u64, &'a [u8]);
///     type Response<'a> = ();
/// }
/// let bytes = corelink_rpc::encode(&(7u64, &b"value"[..]))?;
/// let (key, value): (u64, &[u8]) = corelink_rpc::decode(&bytes)?;
/// assert_eq!((key, value), (7, &b"value"[..]));
/// assert!(std::ptr::eq(value.as_ptr(), bytes[2..].as_ptr())); // borrowed, not copied
/// # Ok::<(), corelink_rpc::RpcError>(())
/// ```
pub trait Method: 'static {
    /// The request type it is registered and called under.
    const TYPE: ReqType;
    /// What a call sends (the handler gets it decoded in place).
    type Request<'a>: Serialize + Deserialize<'a>;
    /// What the handler answers (the caller's continuation gets it decoded in place; a
    /// [`Handle`], which returns it to another thread, needs `Response<'static>` to own its
    /// data).
    type Response<'a>: Serialize + Deserialize<'a>;
}

/// Bytes `value` takes encoded.
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> Result<usize> {
    postcard::serialize_with_flavor::<T, _, usize>(value, postcard::ser_flavors::Size::default())
        .map_err(RpcError::Codec)
}

/// `value` encoded into `buf` (exactly [`encoded_len`] bytes).
fn encode_into<T: Serialize + ?Sized>(value: &T, buf: &mut [u8]) -> Result<()> {
    postcard::to_slice(value, buf).map(|_| ()).map_err(RpcError::Codec)
}

/// `value` encoded, in a new vector (what a [`Handle`] sends).
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    postcard::to_stdvec(value).map_err(RpcError::Codec)
}

/// A value decoded from `bytes` (all of them), borrowing from them where `T` does.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok(_) => Err(RpcError::Codec(postcard::Error::DeserializeBadEncoding)),
        Err(e) => Err(RpcError::Codec(e)),
    }
}

impl<P: Provider> Endpoint<P> {
    /// Registers `handler` for method `M`: it gets each request decoded in place (and the raw
    /// [`Request`], for its session) and returns the response (which may borrow from the
    /// request), encoded straight into a registered buffer. A request that does not decode is
    /// rejected with [`UNDECODABLE`] without running the handler; a response that does not fit
    /// is answered with [`RpcError::TooLarge`].
    pub fn register_method<M: Method>(
        &mut self,
        mut handler: impl for<'a> FnMut(&Request<'a>, M::Request<'a>) -> Result<M::Response<'a>, Reject>
            + 'static,
    ) -> Result<()> {
        self.register(M::TYPE, move |req, resp| {
            let Ok(value) = decode::<M::Request<'_>>(req.data) else {
                return Err(Reject(UNDECODABLE));
            };
            let answer = handler(req, value)?;
            let Ok(len) = encoded_len(&answer) else { return Err(Reject(UNDECODABLE)) };
            let buf = resp.alloc(len).map_err(|_| Reject(UNDECODABLE))?;
            encode_into(&answer, buf).map_err(|_| Reject(UNDECODABLE))
        })
    }
}

impl<P: Provider> Rpc<'_, P> {
    /// Calls method `M` on `session` with `request` (encoded straight into the registered
    /// request buffer); `then` runs on this worker exactly once with the response decoded in
    /// place (borrowing from the receive buffer where it borrows) or why there is none, as for
    /// [`Rpc::call`] (whose refusals this shares, and [`RpcError::Codec`] for a request that
    /// cannot be encoded). A `then` that captures nothing keeps the call free of allocations,
    /// as on the raw path.
    pub fn call_method<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request<'_>,
        timeout: Duration,
        then: impl for<'a> FnOnce(&mut Rpc<'_, P>, Result<M::Response<'a>>) + 'static,
    ) -> Result<CallId> {
        let len = encoded_len(request)?;
        let fill = |b: &mut [u8]| {
            // The buffer is exactly `len` bytes, measured by the same serializer: this
            // cannot fail, and if it did the server would reject the bytes as undecodable.
            let _ = encode_into(request, b);
        };
        let then = Box::new(move |rpc: &mut Rpc<'_, P>, out: Result<&[u8]>| {
            then(rpc, out.and_then(decode::<M::Response<'_>>));
        });
        let ask = Ask { session, ty: M::TYPE, len, timeout };
        self.ep.call_with(self.cx, ask, fill, then).map_err(|(e, _)| e)
    }

    /// Calls method `M` on the member of `group` with the fewest outstanding calls, as
    /// [`Rpc::call_method`] on that session (with [`Rpc::call_group`]'s refusals); returns
    /// the session it went to and the call.
    pub fn call_method_group<M: Method>(
        &mut self,
        group: GroupId,
        request: &M::Request<'_>,
        timeout: Duration,
        then: impl for<'a> FnOnce(&mut Rpc<'_, P>, Result<M::Response<'a>>) + 'static,
    ) -> Result<(SessionId, CallId)> {
        let len = encoded_len(request)?;
        let fill = |b: &mut [u8]| {
            // Exactly `len` bytes, as in `call_method`.
            let _ = encode_into(request, b);
        };
        let then = Box::new(move |rpc: &mut Rpc<'_, P>, out: Result<&[u8]>| {
            then(rpc, out.and_then(decode::<M::Response<'_>>));
        });
        let ask = GroupAsk { group, ty: M::TYPE, len, timeout };
        self.ep.call_group_with(self.cx, ask, fill, then).map_err(|(e, _)| e)
    }
}

impl Handle {
    /// Calls method `M` on the worker's `session` and waits for the decoded response (as
    /// [`Handle::call`]; the request is encoded on this thread, the response decoded here
    /// into a value that owns its data).
    ///
    /// A response that borrows cannot come to another thread this way (it would borrow the
    /// bytes the call returns; rustc says that `Deserialize` is "not general enough", an error
    /// without a code; the same with `type Response<'a> = String` compiles):
    ///
    /// ```compile_fail
    /// use corelink_rpc::{Handle, Method, ReqType, SessionId};
    /// struct Prefix;
    /// impl Method for Prefix {
    ///     const TYPE: ReqType = ReqType(6);
    ///     type Request<'a> = (u8, &'a str);
    ///     type Response<'a> = &'a str;
    /// }
    /// fn call(h: &mut Handle, s: SessionId) {
    ///     let _ = h.call_method::<Prefix>(s, &(1, "x"), std::time::Duration::from_secs(1));
    /// }
    /// ```
    pub fn call_method<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request<'_>,
        timeout: Duration,
    ) -> Result<M::Response<'static>>
    where
        M::Response<'static>: DeserializeOwned,
    {
        let bytes = encode(request)?;
        decode(&self.call(session, M::TYPE, &bytes, timeout)?)
    }

    /// The same as a `Future` (as [`Handle::call_async`]).
    pub fn call_method_async<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request<'_>,
        timeout: Duration,
    ) -> MethodFuture<M>
    where
        M::Response<'static>: DeserializeOwned,
    {
        let inner = encode(request).map(|bytes| self.call_async(session, M::TYPE, bytes, timeout));
        MethodFuture { inner: Some(inner), _method: PhantomData }
    }
}

/// A typed call from [`Handle::call_method_async`]: its output is the decoded response.
#[must_use = "a future does nothing until polled"]
pub struct MethodFuture<M: Method> {
    /// The raw call, or why the request could not be encoded (taken when it is output).
    inner: Option<Result<CallFuture>>,
    _method: PhantomData<fn() -> M>,
}

impl<M: Method> std::fmt::Debug for MethodFuture<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodFuture").field("type", &M::TYPE).finish()
    }
}

impl<M: Method> Future for MethodFuture<M>
where
    M::Response<'static>: DeserializeOwned,
{
    type Output = Result<M::Response<'static>>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        match &mut this.inner {
            Some(Ok(call)) => match Pin::new(call).poll(cx) {
                Poll::Ready(out) => {
                    this.inner = None;
                    Poll::Ready(out.and_then(|bytes| decode(&bytes)))
                }
                Poll::Pending => Poll::Pending,
            },
            Some(Err(_)) => match this.inner.take() {
                Some(Err(e)) => Poll::Ready(Err(e)),
                _ => Poll::Ready(Err(RpcError::WorkerGone)),
            },
            // Polled after its output: as a call whose worker is gone.
            None => Poll::Ready(Err(RpcError::WorkerGone)),
        }
    }
}
