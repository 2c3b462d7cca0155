//! The server part of a worker's handler: grants its memory, echoes, answers, keeps its
//! receives.

use corelink_engine::verbs::{Provider, RemoteRegion, WcStatus};
use corelink_engine::{
    Buf, CloseReason, ConnId, ConnInfo, Cx, Done, EngineError, Handler, Memory, Message,
};

use super::{
    grant_memory, granted, parse_hello, region_byte, write_lat_polls, Event, Shared, BYE_IMM,
    ECHO_IMM, GRANT_TOKEN, POLL_SLOT,
};
use crate::perf::opts::{PerfOpts, Test};

pub(super) struct ServerPart<P: Provider> {
    shared: Shared,
    /// The memory this side grants its client (registered at the first connection).
    mem: Option<Memory<P>>,
    test: Test,
    max_size: usize,
    /// The sizes, in order (`write_lat` in polling mode answers with the marker's size).
    sizes: Vec<usize>,
    /// `write_lat` in polling mode (`write_lat_polls`, decided once).
    polls: bool,
    /// `--quiet`: send_lat's pongs and `write_lat`'s in polling mode go quiet (unsignalled,
    /// as the client's pings then go).
    quiet: bool,
    /// The last marker seen (polling mode).
    last: u8,
    /// The client's connection, the memory it granted this side, its connection count.
    conn: Option<(ConnId, Option<RemoteRegion>, u16)>,
    /// Writes to echo that came before the client's grant (on another lane): their lengths.
    early: Vec<u32>,
    error: Option<String>,
    /// The client said its run is complete (`BYE_IMM`).
    complete: bool,
}

impl<P: Provider> ServerPart<P> {
    pub(super) fn new(shared: Shared, o: &PerfOpts) -> Self {
        ServerPart {
            shared,
            mem: None,
            test: o.test,
            max_size: o.max_size(),
            sizes: o.sizes.clone(),
            polls: o.test == Test::WriteLat && write_lat_polls(&o.sizes),
            quiet: o.sched.quiet,
            last: 0,
            conn: None,
            early: Vec::new(),
            error: None,
            complete: false,
        }
    }

    fn fail(&mut self, cx: &mut Cx<P>, conn: ConnId, e: String) {
        self.error.get_or_insert(e);
        let _ = cx.close(conn);
    }
}

impl<P: Provider> ServerPart<P> {
    /// Sends `data` back on `conn`: quiet (no immediate), or with `imm`.
    #[inline(always)]
    fn echo_send(
        &mut self,
        cx: &mut Cx<P>,
        conn: ConnId,
        data: &[u8],
        quiet: bool,
        imm: Option<u32>,
    ) {
        let r = cx.alloc(data.len()).and_then(|mut b| {
            b.fill(data)?;
            if quiet {
                cx.send_quiet(conn, b, 0).map_err(|(_, e)| e)
            } else {
                cx.send(conn, b, imm, 0).map_err(|(_, e)| e)
            }
        });
        if let Err(e) = r {
            self.answer_failed(cx, conn, e);
        }
    }

    /// An answer could not go: the run fails, unless the connection or the engine is ending.
    #[cold]
    fn answer_failed(&mut self, cx: &mut Cx<P>, conn: ConnId, e: EngineError) {
        if !matches!(e, EngineError::ConnectionClosing(_) | EngineError::ShuttingDown) {
            self.fail(cx, conn, format!("answering: {e}"));
        }
    }

    /// Answers a write of `n` bytes with a write of the same length into the client's memory.
    fn echo_write(&mut self, cx: &mut Cx<P>, conn: ConnId, region: RemoteRegion, n: u32) {
        let r = cx
            .alloc(n as usize)
            .and_then(|b| cx.write(conn, b, region.at(0), Some(ECHO_IMM), 0).map_err(|(_, e)| e));
        if let Err(e) = r {
            self.answer_failed(cx, conn, e);
        }
    }
}

impl<P: Provider> Handler<P> for ServerPart<P> {
    /// `write_lat` in polling mode: answers a new marker at the end of the server's slot
    /// (inlined into the engine's loop: an idle iteration costs a test and a load here).
    #[inline]
    fn poll(&mut self, cx: &mut Cx<P>) {
        if !self.polls || self.error.is_some() {
            return;
        }
        let Some((conn, Some(region), _)) = self.conn else { return };
        let b = region_byte(&self.mem, POLL_SLOT - 1);
        if b != 0 && b != self.last {
            self.answer_marker(cx, conn, region, b);
        }
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let Some((test, max, conns)) = parse_hello(&info.private_data) else {
            self.conn = Some((conn, None, 1));
            return self.fail(cx, conn, "a client that is not corelink-perf".into());
        };
        self.conn = Some((conn, None, conns));
        if let Err(e) = grant_memory(cx, &mut self.mem, conn) {
            return self.fail(cx, conn, format!("granting memory: {e}"));
        }
        if test != self.test {
            let (c, s) = (test.name(), self.test.name());
            return self.fail(cx, conn, format!("the client runs {c}, this server {s}"));
        }
        if max > self.max_size {
            let m = self.max_size;
            let e = format!(
                "the client sends up to {max} B, this server was started for {m} B (give both \
                 the same -s / -a)"
            );
            return self.fail(cx, conn, e);
        }
        self.shared.tell(Event::ServerConnected);
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        // A ping-pong's ping first (its answer is the round trip's path): a send_lat ping is a
        // plain send, as perftest's, and so is its pong (quiet with `--quiet`). (write_lat's
        // pings are writes with an immediate: `written` says so.)
        if msg.written.is_none() && msg.imm.is_none() && self.test == Test::SendLat {
            return self.echo_send(cx, conn, msg.data, self.quiet, None);
        }
        if let Some(region) = granted(msg) {
            if let Some(c) = self.conn.as_mut().filter(|c| c.0 == conn) {
                c.1 = Some(region);
            }
            for n in std::mem::take(&mut self.early) {
                self.echo_write(cx, conn, region, n);
            }
            return;
        }
        if msg.imm == Some(BYE_IMM) {
            self.complete = true;
            return;
        }
        // (send_lat's pings, quiet or not, were answered above)
        if msg.imm != Some(ECHO_IMM) {
            return; // send_bw: receive and let the engine repost
        }
        match (msg.written, self.conn.and_then(|c| c.1)) {
            (None, _) => self.echo_send(cx, conn, msg.data, false, Some(ECHO_IMM)),
            (Some(n), Some(region)) => self.echo_write(cx, conn, region, n),
            (Some(n), None) => self.early.push(n), // answered once the client's grant arrives
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        let _ = GRANT_TOKEN; // the grant's send ends like any answer
        if !done.status.is_success() && done.status != WcStatus::WrFlushErr {
            self.fail(cx, done.conn, format!("answer: {}", done.status));
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, _conn: ConnId, reason: &CloseReason) {
        let conns = self.conn.map_or(1, |c| c.2);
        self.shared.tell(Event::ServerDone(match (self.error.take(), reason) {
            (Some(e), _) => Err(e),
            (None, CloseReason::Error(s)) => Err(format!("the connection failed: {s}")),
            (None, r) if !self.complete => {
                Err(format!("the client's run ended before it was complete ({r})"))
            }
            (None, _) => Ok(conns),
        }));
    }
}

impl<P: Provider> ServerPart<P> {
    /// write_lat's new marker `b`, seen by [`Handler::poll`]: answered with a write of its
    /// size into the client's slot.
    #[inline(never)]
    fn answer_marker(&mut self, cx: &mut Cx<P>, conn: ConnId, region: RemoteRegion, b: u8) {
        self.last = b;
        let Some(&size) = self.sizes.get(usize::from(b >> 3)) else {
            return self.fail(cx, conn, format!("marker {b:#x}: a size this server lacks"));
        };
        let r = cx.alloc(size).and_then(|mut buf| {
            buf.set_len(size)?;
            buf.as_mut_slice()[size - 1] = b;
            let at = region.at((2 * POLL_SLOT - size) as u64);
            // (quiet, with --quiet: the client's next ping says this pong arrived)
            if self.quiet {
                cx.write_quiet(conn, buf, at, None, 0).map_err(|(_, e)| e)
            } else {
                cx.write(conn, buf, at, None, 0).map_err(|(_, e)| e)
            }
        });
        if let Err(e) = r {
            self.answer_failed(cx, conn, e);
        }
    }
}
