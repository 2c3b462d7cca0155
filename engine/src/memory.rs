//! Application memory: what an application registers with its worker (memory the engine
//! allocates, optionally on huge pages, or the caller's own), and the grants that expose a range
//! of it to one connection's peer with the rights the application chooses.
//!
//! No peer can reach a worker's memory until the application grants a range: a [`Memory`] is
//! registered for local access only. Each grant is a registration of its own over the granted
//! range with the granted rights (so the device checks the range and the rights of every
//! access), kept by its connection: [`Cx::revoke`](crate::Cx::revoke) deregisters it at once, and
//! a connection's grants go when it starts closing. An access outside a grant, or after its
//! revoke, fails at the peer with a remote access error and leaves the memory untouched.
//!
//! What a grant's key does not do: bind the range to the one peer's QP. Every QP on the worker's
//! protection domain can use a key it learns, as with any memory region; a memory window bound
//! to the connection's QP (type 2) would, but multi-lane connections would need one key per
//! lane, and rxe checks windows' bounds only in part (docs/rxe-semantics.md). Hand a grant's
//! [`RemoteRegion`] to its peer only (a message, private data).

use std::rc::Rc;

use corelink_verbs::{AccessFlags, Mr, Pages, Pd, Provider, RemoteRegion, HUGE_PAGE};

use crate::error::{EngineError, Result};
use crate::request::ConnId;

struct Inner<P: Provider> {
    /// The whole memory, registered for local access (requests of this worker may use it).
    mr: P::Mr,
    /// The worker's protection domain: grants are registered on it.
    pd: std::sync::Arc<P::Pd>,
    /// Huge pages the memory lives in, if the engine mapped it so (dropped after `mr`).
    _huge: Option<Pages>,
}

/// Memory registered with a worker by its application. It stays on its worker's thread (it is
/// not `Send`), and lives until its last grant is revoked or closed.
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<corelink_engine::Memory<corelink_engine::verbs::soft::Soft>>();
/// ```
pub struct Memory<P: Provider> {
    inner: Rc<Inner<P>>,
}

impl<P: Provider> std::fmt::Debug for Memory<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("addr", &format_args!("{:#x}", self.inner.mr.addr()))
            .field("len", &self.inner.mr.len())
            .finish()
    }
}

impl<P: Provider> Memory<P> {
    /// `len` bytes of zeroed memory the engine allocates (page-aligned; on huge pages with
    /// `huge_pages`, which needs `vm.nr_hugepages` set on the host).
    pub(crate) fn allocate(
        pd: &std::sync::Arc<P::Pd>,
        len: usize,
        huge_pages: bool,
    ) -> Result<Self> {
        let (mr, huge) = if huge_pages {
            let map = Pages::huge(len).map_err(|source| EngineError::HugePages {
                len: len.div_ceil(HUGE_PAGE) * HUGE_PAGE,
                source,
            })?;
            // SAFETY: the mapping is valid for reads and writes for `map.len()` bytes and lives
            // in `Inner` after the registration (dropped after it); nothing holds a Rust
            // reference into it (Memory hands out none).
            let mr = unsafe { pd.register_raw(map.as_ptr(), len, AccessFlags::LOCAL_WRITE)? };
            (mr, Some(map))
        } else {
            (pd.register(len, AccessFlags::LOCAL_WRITE)?, None)
        };
        Ok(Memory { inner: Rc::new(Inner { mr, pd: pd.clone(), _huge: huge }) })
    }

    /// The caller's memory at `addr..addr + len`.
    ///
    /// # Safety
    /// The range must be valid for reads and writes until the `Memory` and every grant of it
    /// are gone (a grant lives until it is revoked or its connection closes), and nothing may
    /// hold a Rust reference into it while the device or a peer may write it.
    pub(crate) unsafe fn from_raw(
        pd: &std::sync::Arc<P::Pd>,
        addr: *mut u8,
        len: usize,
    ) -> Result<Self> {
        // SAFETY: forwarded from this function's contract.
        let mr = unsafe { pd.register_raw(addr, len, AccessFlags::LOCAL_WRITE)? };
        Ok(Memory { inner: Rc::new(Inner { mr, pd: pd.clone(), _huge: None }) })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.inner.mr.len()
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of its first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner.mr.as_ptr()
    }

    /// Copies `data` into it at `offset` (peers granted write access may write it at any time).
    pub fn write_at(&self, offset: usize, data: &[u8]) -> Result<()> {
        Ok(self.inner.mr.write_at(offset, data)?)
    }

    /// Copies its bytes at `offset` into `out`.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        Ok(self.inner.mr.read_at(offset, out)?)
    }

    /// The byte at `offset`, read atomically (acquire): a poller's look at whether a peer's
    /// write has landed (its last byte arrives last).
    #[inline]
    pub fn read_u8(&self, offset: usize) -> Result<u8> {
        Ok(self.inner.mr.read_u8(offset)?)
    }

    /// The 8-byte word at `offset` (8-byte aligned), read atomically (as peers' atomics write it).
    pub fn read_u64(&self, offset: usize) -> Result<u64> {
        Ok(self.inner.mr.read_u64(offset)?)
    }

    /// Registers `len` bytes at `offset` for a peer with `rights` (remote rights only).
    pub(crate) fn expose(
        &self,
        offset: usize,
        len: usize,
        rights: AccessFlags,
    ) -> Result<Exposed<P>> {
        let remote = AccessFlags::REMOTE_ALL;
        if rights.is_empty() || !remote.contains(rights) {
            return Err(EngineError::BadGrant {
                why: "rights are REMOTE_READ, REMOTE_WRITE or REMOTE_ATOMIC",
            });
        }
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(EngineError::GrantOutOfRange { offset, len, memory: self.len() });
        }
        let access = rights | AccessFlags::LOCAL_WRITE;
        // SAFETY: the range is inside the memory, which the grant keeps alive (`_memory`) for as
        // long as the registration lives; the memory hands out no Rust references into itself.
        let mr = unsafe { self.inner.pd.register_raw(self.as_ptr().add(offset), len, access)? };
        Ok(Exposed { mr, _memory: self.inner.clone() })
    }
}

/// A grant's registration, as its connection holds it (it keeps its memory alive).
pub(crate) struct Exposed<P: Provider> {
    mr: P::Mr,
    _memory: Rc<Inner<P>>,
}

impl<P: Provider> Exposed<P> {
    /// The granted range as its peer addresses it.
    pub(crate) fn region(&self) -> RemoteRegion {
        self.mr.region()
    }
}

impl<P: Provider> std::fmt::Debug for Exposed<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exposed").field("region", &self.mr.region()).finish()
    }
}

/// A grant: which connection it is for, and its number there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GrantId {
    /// The connection whose peer may use it.
    pub conn: ConnId,
    pub(crate) n: u32,
}

/// A range of memory exposed to one connection's peer: hand [`Grant::region`] to the peer
/// (it addresses the range with it: `RemoteAddr { addr: region.addr + offset, rkey }`), and
/// [`Cx::revoke`](crate::Cx::revoke) its id to take it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Its id, to revoke it.
    pub id: GrantId,
    /// What its peer addresses: the range's address, length and key.
    pub region: RemoteRegion,
}
