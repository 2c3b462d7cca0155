//! A worker's requests, from the moment `Cx` accepts one until its issuer learns how it ended:
//! the slab they live in (queues link them through it), the vectors of external clients' requests
//! (kept in step with the slab here, by slot), and the merge table of reads in flight. A
//! request leaves through [`Requests::remove`] only, which takes its vector and its merge entry
//! with it.

use std::collections::HashMap;

use corelink_verbs::{Provider, RemoteAddr, WcStatus};

use crate::pool::Buf;
use crate::request::{ConnId, Done, OpKind};

use super::ids::ReqId;
use super::words::{Words, WordsAt};
use crate::handoff::Origin;
use crate::slab::Slab;

/// What makes two reads identical (so that one RDMA read serves both).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MergeKey {
    pub(crate) slot: u16,
    /// The connection's write epoch when the read was posted: a read never shares the result
    /// of a read posted before a write that the connection posted before it.
    pub(crate) epoch: u32,
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) rkey: u32,
}

/// A request, from the moment `Cx` accepts it until its issuer learns how it ended. It lives in
/// the worker's request slab; queues and lanes link it (through `link`).
#[derive(Debug)]
pub(crate) struct Req<P: Provider> {
    pub(crate) conn: ConnId,
    /// The lane it went on (once posted).
    pub(crate) lane: u8,
    pub(crate) kind: OpKind,
    /// Its buffer (an atomic's holds the old value); none once it is a quiet send posted
    /// inline (the device copied its bytes at the post: the buffer went back to the pool).
    pub(crate) buf: Option<Buf<P>>,
    pub(crate) remote: RemoteAddr,
    /// Bytes it moves.
    pub(crate) len: u32,
    pub(crate) imm: Option<u32>,
    /// Addend (fetch-and-add) or compare value (compare-and-swap).
    pub(crate) arg: u64,
    /// Swap value (compare-and-swap).
    pub(crate) swap: u64,
    pub(crate) token: u64,
    pub(crate) origin: Origin,
    /// The next request riding on this one's work request (merged reads, coalesced writes).
    pub(crate) next: Option<ReqId>,
    /// While it is in the worker's merge table: the write epoch of its key there.
    pub(crate) merge_epoch: Option<u32>,
    /// Its success is not told ([`crate::Cx::send_quiet`], [`crate::Cx::write_quiet`]): its
    /// work request asks for no completion of its own unless one is due, and its buffer goes
    /// back to the pool.
    pub(crate) quiet: bool,
}

impl<P: Provider> Req<P> {
    /// Its key in the merge table, as a read posted at write epoch `epoch`.
    pub(crate) fn merge_key(&self, epoch: u32) -> MergeKey {
        MergeKey {
            slot: self.conn.slot,
            epoch,
            addr: self.remote.addr,
            len: self.len,
            rkey: self.remote.rkey,
        }
    }

    /// Whether it counts against the QP's outstanding reads and atomics.
    pub(crate) fn is_rd_atomic(&self) -> bool {
        self.kind.is_rd_atomic()
    }
}

/// Of a request's fields only its buffer needs dropping, so that a completion can take the
/// buffer out and forget the record where it lies (`Requests::take_plain`).
const NO_DROP_BUT_BUF: () = {
    use corelink_verbs::RemoteAddr;
    use std::mem::needs_drop;
    assert!(!needs_drop::<(ConnId, u8, OpKind, RemoteAddr, u32, Option<u32>, u64, u64)>());
    assert!(!needs_drop::<(u64, Origin, Option<ReqId>, Option<u32>)>());
};
#[allow(clippy::let_unit_value)]
const _: () = NO_DROP_BUT_BUF;

/// A request as its completion takes it out of the slab: what telling its issuer needs.
#[derive(Debug)]
pub(crate) struct Retired<P: Provider> {
    pub(crate) id: ReqId,
    pub(crate) conn: ConnId,
    pub(crate) kind: OpKind,
    /// Its buffer (none once a quiet inline send was posted: `Req::buf`).
    pub(crate) buf: Option<Buf<P>>,
    /// Bytes it moved.
    pub(crate) len: u32,
    pub(crate) token: u64,
    pub(crate) origin: Origin,
    /// The next request riding on its work request.
    pub(crate) next: Option<ReqId>,
    /// Its success is not told (`Req::quiet`).
    pub(crate) quiet: bool,
}

impl<P: Provider> Retired<P> {
    /// The parts of request `id`, taken out as `r`.
    #[inline(always)]
    pub(crate) fn of(id: ReqId, r: Req<P>) -> Self {
        let Req { conn, kind, buf, len, token, origin, next, quiet, .. } = r;
        Retired { id, conn, kind, buf, len, token, origin, next, quiet }
    }

    /// Whether it counted against the QP's outstanding reads and atomics.
    #[inline(always)]
    pub(crate) fn is_rd_atomic(&self) -> bool {
        self.kind.is_rd_atomic()
    }

    /// The outcome an external client hears (`data` is its vector: a read's gets the bytes
    /// read, within the capacity the client gave).
    pub(crate) fn client_done(
        self,
        status: WcStatus,
        mut data: Vec<u8>,
        old_value: Option<u64>,
        closed_by: Option<crate::request::CloseReason>,
    ) -> Done<Vec<u8>> {
        let buf = match self.kind {
            OpKind::FetchAdd | OpKind::CompareSwap => None,
            OpKind::Read if status.is_success() => {
                data.clear();
                data.extend_from_slice(self.buf.as_ref().map_or(&[][..], |b| b.as_slice()));
                Some(data)
            }
            _ => Some(data),
        };
        let (conn, token, kind) = (self.conn, self.token, self.kind);
        Done { conn, token, kind, status, buf, old_value, closed_by }
    }
}

/// A plain request taken out for its completion (`Requests::take_plain`): its connection,
/// token, kind, buffer, the bytes it moved, and whether it is quiet (its success untold).
pub(crate) type Plain<P> = (ConnId, u64, OpKind, Option<Buf<P>>, u32, bool);

/// What a request carries beside its record until it completes: nothing (the handler's
/// requests, at no cost), or an external client's vector (kept by slot, given back in its
/// completion).
pub(crate) trait Carried: Sized {
    /// Keeps it in `slot`'s place in `vectors`.
    fn keep(self, vectors: &mut Vectors, slot: usize);
}

impl Carried for () {
    #[inline(always)]
    fn keep(self, _: &mut Vectors, _: usize) {}
}

impl Carried for Vec<u8> {
    #[inline(always)]
    fn keep(self, vectors: &mut Vectors, slot: usize) {
        vectors.put(slot, self);
    }
}

/// External clients' vectors by request slot. Its places are made as far as the highest slot
/// that held one (within room reserved for every slot at start: it never allocates after),
/// so that a worker whose requests are all its handler's touches none of them, at start or
/// at its end.
pub(crate) struct Vectors {
    places: Vec<Vec<u8>>,
}

impl Vectors {
    fn new(slots: usize) -> Self {
        Vectors { places: Vec::with_capacity(slots) }
    }

    #[inline(always)]
    fn put(&mut self, slot: usize, v: Vec<u8>) {
        if slot >= self.places.len() {
            // (within the capacity reserved for every slot: no allocation)
            debug_assert!(slot < self.places.capacity());
            self.places.resize_with(slot + 1, Vec::new);
        }
        // (every client request's vector is taken when it leaves: the place is empty)
        debug_assert_eq!(self.places[slot].capacity(), 0);
        self.places[slot] = v;
    }

    #[inline(always)]
    fn take(&mut self, slot: usize) -> Vec<u8> {
        self.places.get_mut(slot).map(std::mem::take).unwrap_or_default()
    }
}

/// The requests of one worker.
pub(crate) struct Requests<P: Provider> {
    slab: Slab<Req<P>>,
    /// Where each slot's atomic writes its old value (as many words as slots).
    words: Words<P>,
    /// External clients' vectors, by request slot (none for the handler's requests).
    ext: Vectors,
    /// Reads in flight that identical reads may ride on, by key.
    merges: HashMap<MergeKey, ReqId>,
    /// Entries the merge table holds at most (reserved at start: it never grows).
    merge_cap: usize,
}

impl<P: Provider> Requests<P> {
    /// Room for `capacity` requests and `merges` reads in the merge table, reserved now, and
    /// a word registered on `pd` for each request's atomic.
    pub(crate) fn new(pd: &P::Pd, capacity: usize, merges: usize) -> crate::Result<Self> {
        Ok(Requests {
            words: Words::new(pd, capacity)?,
            slab: Slab::new(capacity),
            ext: Vectors::new(capacity),
            merges: HashMap::with_capacity(merges),
            merge_cap: merges,
        })
    }

    /// Where the atomics' words are (what their work requests name).
    #[inline(always)]
    pub(crate) fn words(&self) -> WordsAt {
        self.words.at()
    }

    /// The old value that atomic `id` (of kind `kind`, just ended with `status`) read: none
    /// for another kind or a failure.
    #[inline(always)]
    pub(crate) fn old_value(&self, id: ReqId, kind: OpKind, status: WcStatus) -> Option<u64> {
        let atomic = matches!(kind, OpKind::FetchAdd | OpKind::CompareSwap);
        (atomic & status.is_success()).then(|| self.words.read(id))
    }

    /// Stores the request `make` builds from `arg` (in its slot), with what it carries; gives
    /// both back when the slab is full (`make` unrun).
    #[inline(always)]
    pub(crate) fn insert_from<A, E: Carried>(
        &mut self,
        ext: E,
        arg: A,
        make: impl FnOnce(A) -> Req<P>,
    ) -> Result<ReqId, (A, E)> {
        match self.slab.insert_from(arg, make) {
            Ok(id) => {
                ext.keep(&mut self.ext, id.slot());
                Ok(id)
            }
            Err(arg) => Err((arg, ext)),
        }
    }

    /// The request `id`, if it is current.
    #[inline(always)]
    pub(crate) fn get(&self, id: ReqId) -> Option<&Req<P>> {
        self.slab.get(id)
    }

    /// The request `id`, mutably, if it is current.
    #[inline(always)]
    pub(crate) fn get_mut(&mut self, id: ReqId) -> Option<&mut Req<P>> {
        self.slab.get_mut(id)
    }

    /// The slab, for the queues that link requests through it.
    #[inline(always)]
    pub(crate) fn slab(&self) -> &Slab<Req<P>> {
        &self.slab
    }

    /// The slab, mutably, for the queues that link requests through it.
    #[inline(always)]
    pub(crate) fn slab_mut(&mut self) -> &mut Slab<Req<P>> {
        &mut self.slab
    }

    /// Takes request `id` out, with its client's vector; its merge entry goes too.
    #[inline(always)]
    pub(crate) fn remove(&mut self, id: ReqId) -> Option<(Req<P>, Vec<u8>)> {
        let r = self.take(id)?;
        let ext = self.vector(id, r.origin);
        Some((r, ext))
    }

    /// Takes request `id` out, leaving an external client's vector for [`Requests::vector`],
    /// which its completion calls at once (before any request is stored).
    #[inline(always)]
    pub(crate) fn take(&mut self, id: ReqId) -> Option<Req<P>> {
        let r = self.slab.remove(id)?;
        if let Some(epoch) = r.merge_epoch {
            unmerge(&mut self.merges, &r, epoch, id);
        }
        Some(r)
    }

    /// Takes request `id` out, if it is a plain request of the handler (with nothing riding on
    /// it and in no merge table), as what its completion needs: its
    /// connection, token, kind, buffer and the bytes it moved, read where the record lies
    /// (never moved whole). Any other request stays (and `None`): its completion goes the
    /// general way.
    #[inline(always)]
    pub(crate) fn take_plain(&mut self, id: ReqId) -> Option<Plain<P>> {
        let read = |r: &Req<P>| {
            // Every field named (a new one must be looked at here): the buffer is moved out,
            // the others are copied (`NO_DROP_BUT_BUF`).
            let Req {
                conn,
                lane: _,
                kind,
                buf,
                remote: _,
                len,
                imm: _,
                arg: _,
                swap: _,
                token,
                origin,
                next,
                merge_epoch,
                quiet,
            } = r;
            let plain =
                matches!(origin, Origin::Handler) && next.is_none() && merge_epoch.is_none();
            if !plain {
                return None;
            }
            // SAFETY: the buffer is read out once, here, and the record forgotten after.
            let buf = unsafe { std::ptr::read(buf) };
            Some((*conn, *token, *kind, buf, *len, *quiet))
        };
        // SAFETY: of a request's fields only its buffer needs dropping (`NO_DROP_BUT_BUF`);
        // `read` moves it out exactly when it returns `Some`.
        unsafe { self.slab.take_read(id, read) }
    }

    /// The vector of request `id` (taken out, from `origin`): an external client's, or none.
    #[inline(always)]
    pub(crate) fn vector(&mut self, id: ReqId, origin: Origin) -> Vec<u8> {
        match origin {
            Origin::Client(_) => self.ext.take(id.slot()),
            Origin::Handler | Origin::Keepalive | Origin::Fence => Vec::new(),
        }
    }

    /// Whether a read with merge key `key` is in flight (an identical read would ride on it).
    pub(crate) fn reading(&self, key: &MergeKey) -> bool {
        self.merges.contains_key(key)
    }

    /// A read about to be posted with merge key `key`: rides on an identical read in flight
    /// (returns true: it is chained behind it), or enters the merge table as the one later
    /// identical reads ride on (within the table's reserved capacity: beyond, no merging).
    pub(crate) fn ride_or_register(&mut self, key: MergeKey, id: ReqId) -> bool {
        if let Some(&primary) = self.merges.get(&key) {
            // An identical read is in flight: ride on it. (Its entry leaves the table when it
            // completes; one that outlived its read would be a bug: drop it, post.)
            if let Some(after) = self.slab.get(primary).map(|p| p.next) {
                if let Some(r) = self.slab.get_mut(id) {
                    r.next = after;
                }
                if let Some(p) = self.slab.get_mut(primary) {
                    p.next = Some(id);
                }
                return true;
            }
            self.merges.remove(&key);
        }
        if self.merges.len() < self.merge_cap {
            self.merges.insert(key, id);
        }
        false
    }

    /// Takes request `id` and every request riding on it out, in chain order, handing each
    /// (with its client's vector) to `each`: a failed work request's issuers are told so.
    pub(crate) fn take_chain(&mut self, id: ReqId, mut each: impl FnMut(ReqId, Req<P>, Vec<u8>)) {
        let mut next = Some(id);
        while let Some(n) = next {
            let Some((r, data)) = self.remove(n) else { break };
            next = r.next;
            each(n, r, data);
        }
    }

    /// Requests held (waiting and in flight).
    pub(crate) fn len(&self) -> usize {
        self.slab.len()
    }

    /// Lookups of queued requests that cannot fail and did (see `slab::Fifo`).
    pub(crate) fn misses(&self) -> u64 {
        self.slab.misses()
    }
}

/// Takes read `r` (`id`, posted at write epoch `epoch`) out of the merge table, if it is the
/// entry of its key.
#[inline(never)]
fn unmerge<P: Provider>(merges: &mut HashMap<MergeKey, ReqId>, r: &Req<P>, epoch: u32, id: ReqId) {
    let key = r.merge_key(epoch);
    if merges.get(&key) == Some(&id) {
        merges.remove(&key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::Pool;
    use corelink_verbs::soft::Soft;
    use corelink_verbs::Context;

    fn req(kind: OpKind, buf: Option<Buf<Soft>>, origin: Origin) -> Req<Soft> {
        Req {
            conn: ConnId { worker: 0, slot: 1, generation: 2 },
            lane: 0,
            kind,
            len: buf.as_ref().map_or(8, |b| b.len() as u32),
            buf,
            remote: RemoteAddr::default(),
            imm: None,
            arg: 1,
            swap: 0,
            token: 7,
            origin,
            next: None,
            merge_epoch: None,
            quiet: false,
        }
    }

    #[test]
    fn a_plain_request_is_taken_with_its_buffer_and_any_other_stays() {
        let ctx = Soft::open("soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let pool = Pool::new(&pd, &[(64, 8)]).unwrap();
        let mut reqs = Requests::<Soft>::new(&pd, 8, 4).unwrap();
        let mut put = |r: Req<Soft>| reqs.insert_from((), r, |r| r).ok().unwrap();
        // The handler's requests of every kind, atomics too (with no buffer: their old value
        // is in their slot's word), are plain; a client's and one with a request riding on it
        // are not.
        let atomic = put(req(OpKind::FetchAdd, None, Origin::Handler));
        let read = put(req(OpKind::Read, pool.get(8).ok(), Origin::Handler));
        let client = put(req(OpKind::Read, pool.get(8).ok(), Origin::Client(0)));
        let mut chained = req(OpKind::Read, pool.get(8).ok(), Origin::Handler);
        chained.next = Some(read);
        let chained = put(chained);
        let (conn, token, kind, buf, _, quiet) = reqs.take_plain(atomic).unwrap();
        assert_eq!((conn.slot, token, kind, quiet), (1, 7, OpKind::FetchAdd, false));
        assert!(buf.is_none(), "an atomic holds no buffer");
        assert!(reqs.get(atomic).is_none(), "taken");
        assert_eq!(reqs.take_plain(read).map(|p| p.3.is_some()), Some(true), "with its buffer");
        for id in [client, chained] {
            assert!(reqs.take_plain(id).is_none());
            assert!(reqs.get(id).is_some(), "not plain: it stays for the general way");
        }
    }

    #[test]
    fn an_atomics_old_value_is_read_from_its_slots_word_on_success_only() {
        let ctx = Soft::open("soft0").unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let mut reqs = Requests::<Soft>::new(&pd, 8, 4).unwrap();
        let a = reqs.insert_from((), req(OpKind::FetchAdd, None, Origin::Handler), |r| r);
        let a = a.ok().unwrap();
        let b = reqs.insert_from((), req(OpKind::CompareSwap, None, Origin::Handler), |r| r);
        let b = b.ok().unwrap();
        let (wa, wb) = (reqs.words().sge(a), reqs.words().sge(b));
        assert_ne!(wa.addr, wb.addr, "each request its own word");
        assert_eq!((wa.length, wb.length), (8, 8));
        // (as the device writes them)
        // SAFETY: both words lie in the registered region, aligned.
        unsafe {
            (wa.addr as *mut u64).write_volatile(5);
            (wb.addr as *mut u64).write_volatile(9);
        }
        let ok = WcStatus::Success;
        assert_eq!(reqs.old_value(a, OpKind::FetchAdd, ok), Some(5));
        assert_eq!(reqs.old_value(b, OpKind::CompareSwap, ok), Some(9));
        assert_eq!(reqs.old_value(a, OpKind::FetchAdd, WcStatus::RemAccessErr), None, "failed");
        assert_eq!(reqs.old_value(a, OpKind::Read, ok), None, "not an atomic");
    }

    #[test]
    fn client_vectors_are_kept_by_slot_and_make_places_only_as_far_as_used() {
        let mut v = Vectors::new(1024);
        assert_eq!(v.places.len(), 0, "no place made at start");
        v.put(700, vec![1, 2, 3]);
        assert_eq!(v.places.len(), 701);
        assert_eq!(v.places.capacity(), 1024, "made within the room reserved: no allocation");
        v.put(3, vec![4]);
        assert_eq!(v.places.len(), 701);
        assert_eq!(v.take(700), vec![1, 2, 3]);
        assert!(v.take(700).is_empty(), "taken once");
        assert_eq!(v.take(3), vec![4]);
        assert!(v.take(900).is_empty(), "a place never made holds nothing");
    }
}
