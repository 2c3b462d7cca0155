//! The typed layer: a [`Method`] names a request type and the Rust types of its request and
//! response, encoded with [`postcard`] (serde's compact binary format: varint integers, no
//! field names, a wire format stable since its 1.0). It sits on the raw path and changes
//! nothing of it: a typed request is serialized straight into the registered request buffer
//! (its size computed first, then written in place: no intermediate vector), a typed
//! response straight into the registered response buffer, and both are decoded from the
//! receive buffer in place; raw calls and handlers still read and write bytes as before.
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
use serde::Serialize;

use crate::endpoint::{Ask, Endpoint, GroupAsk, Rpc};
use crate::error::{Result, RpcError};
use crate::handle::{CallFuture, Handle};
use crate::ids::{CallId, GroupId, ReqType, SessionId};
use crate::service::{Reject, Request};

/// The code a typed handler's endpoint rejects a request with when its bytes do not decode
/// as the method's request type ([`RpcError::Rejected`]).
pub const UNDECODABLE: u32 = u32::MAX;

/// A typed request type: its number and the types of its request and response.
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
///     type Request = Add;
///     type Response = u64;
/// }
///
/// let bytes = corelink_rpc::encode(&Add { a: 2, b: 3 })?;
/// assert_eq!(bytes, [2, 3]); // varints: two bytes for two small numbers
/// let back: Add = corelink_rpc::decode(&bytes)?;
/// assert_eq!(back.a + back.b, 5);
/// # Ok::<(), corelink_rpc::RpcError>(())
/// ```
pub trait Method: 'static {
    /// The request type it is registered and called under.
    const TYPE: ReqType;
    /// What a call sends.
    type Request: Serialize + DeserializeOwned;
    /// What the handler answers.
    type Response: Serialize + DeserializeOwned;
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

/// A value decoded from `bytes` (all of them).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    match postcard::take_from_bytes(bytes) {
        Ok((value, [])) => Ok(value),
        Ok(_) => Err(RpcError::Codec(postcard::Error::DeserializeBadEncoding)),
        Err(e) => Err(RpcError::Codec(e)),
    }
}

impl<P: Provider> Endpoint<P> {
    /// Registers `handler` for method `M`: it gets each request decoded (and the raw
    /// [`Request`], for its session) and returns the response, which is encoded straight into
    /// a registered buffer. A request that does not decode is rejected with
    /// [`UNDECODABLE`] without running the handler; a response that does not fit is answered
    /// with [`RpcError::TooLarge`].
    pub fn register_method<M: Method>(
        &mut self,
        mut handler: impl FnMut(&Request<'_>, M::Request) -> Result<M::Response, Reject> + 'static,
    ) -> Result<()> {
        self.register(M::TYPE, move |req, resp| {
            let Ok(value) = decode::<M::Request>(req.data) else {
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
    /// request buffer); `then` runs on this worker exactly once with the decoded response or
    /// why there is none, as for [`Rpc::call`] (whose refusals this shares, and
    /// [`RpcError::Codec`] for a request that cannot be encoded). A `then` that captures
    /// nothing keeps the call free of allocations, as on the raw path.
    pub fn call_method<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request,
        timeout: Duration,
        then: impl FnOnce(&mut Rpc<'_, P>, Result<M::Response>) + 'static,
    ) -> Result<CallId> {
        let len = encoded_len(request)?;
        let fill = |b: &mut [u8]| {
            // The buffer is exactly `len` bytes, measured by the same serializer: this
            // cannot fail, and if it did the server would reject the bytes as undecodable.
            let _ = encode_into(request, b);
        };
        let then = Box::new(move |rpc: &mut Rpc<'_, P>, out: Result<&[u8]>| {
            then(rpc, out.and_then(decode::<M::Response>));
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
        request: &M::Request,
        timeout: Duration,
        then: impl FnOnce(&mut Rpc<'_, P>, Result<M::Response>) + 'static,
    ) -> Result<(SessionId, CallId)> {
        let len = encoded_len(request)?;
        let fill = |b: &mut [u8]| {
            // Exactly `len` bytes, as in `call_method`.
            let _ = encode_into(request, b);
        };
        let then = Box::new(move |rpc: &mut Rpc<'_, P>, out: Result<&[u8]>| {
            then(rpc, out.and_then(decode::<M::Response>));
        });
        let ask = GroupAsk { group, ty: M::TYPE, len, timeout };
        self.ep.call_group_with(self.cx, ask, fill, then).map_err(|(e, _)| e)
    }
}

impl Handle {
    /// Calls method `M` on the worker's `session` and waits for the decoded response (as
    /// [`Handle::call`]; the request is encoded on this thread).
    pub fn call_method<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request,
        timeout: Duration,
    ) -> Result<M::Response> {
        let bytes = encode(request)?;
        decode(&self.call(session, M::TYPE, &bytes, timeout)?)
    }

    /// The same as a `Future` (as [`Handle::call_async`]).
    pub fn call_method_async<M: Method>(
        &mut self,
        session: SessionId,
        request: &M::Request,
        timeout: Duration,
    ) -> MethodFuture<M> {
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

impl<M: Method> Future for MethodFuture<M> {
    type Output = Result<M::Response>;

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
