//! Application memory and access control end to end, generic over the provider: an engine
//! registers 64 MiB of memory, connects to itself three times (three peers), grants each peer
//! another range with other rights, and revokes one grant mid-run. Every access gets exactly the
//! status its grant implies, and nothing outside a grant changes. A refused access fails the
//! peer's queue pair too (as on rxe), so the peer disconnects: the connection that made it
//! closes naming the peer's going away and the refusal that came first. Included by `memory_soft.rs`
//! and `engine_ibverbs.rs`.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::{AccessFlags, Provider, RemoteAddr, RemoteRegion, WcStatus};
use corelink_engine::*;

/// How long a step may take before the test calls it a hang (not a performance bound).
const HANG: Duration = Duration::from_secs(60);
/// The memory the application registers.
const MEMORY: usize = 64 << 20;

/// What the test thread asks the handler to do, on its worker.
enum Cmd {
    /// Connect to the engine's own address, peer number `n` (its private data).
    Connect(SocketAddr, u8),
    /// Grant peer `n` (the accepted end) `len` bytes at `offset` with `rights`.
    Grant(u8, usize, usize, AccessFlags),
    /// Revoke peer `n`'s grant.
    Revoke(u8),
    /// From peer `n`'s initiating end: a write of `data` at `at`, token `t`.
    Write(u8, RemoteAddr, Vec<u8>, u64),
    /// From peer `n`'s initiating end: a read of `len` bytes at `at`, token `t`.
    Read(u8, RemoteAddr, usize, u64),
    /// From peer `n`'s initiating end: fetch-and-add `add` at `at`, token `t`.
    FetchAdd(u8, RemoteAddr, u64, u64),
    /// Compare the memory with what the test expects (all 0x5a but for the given bytes).
    Check(Vec<(usize, Vec<u8>)>),
}

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Connected(u8, bool),
    Granted(u8, RemoteRegion),
    Revoked(u8),
    Done(u64, WcStatus, Vec<u8>, Option<u64>),
    Checked(Result<(), String>),
    /// Peer `n`'s end (initiating or not) closed, and why.
    Closed(u8, bool, CloseReason),
    Failed(String),
}

#[derive(Default)]
struct Shared {
    cmds: Mutex<VecDeque<Cmd>>,
    log: Mutex<Vec<Ev>>,
}

struct Tester<P: Provider> {
    s: Arc<Shared>,
    mem: Option<Memory<P>>,
    /// By peer number: (initiating end, accepting end, its grant).
    peers: [(Option<ConnId>, Option<ConnId>, Option<GrantId>); 4],
}

impl<P: Provider> Tester<P> {
    fn log(&self, e: Ev) {
        self.s.log.lock().unwrap().push(e);
    }

    fn run(&mut self, cx: &mut Cx<P>, cmd: Cmd) -> Result<(), EngineError> {
        let mem = match &mut self.mem {
            Some(m) => m,
            None => {
                let m = cx.register_memory(MEMORY, false)?;
                m.write_at(0, &vec![0x5a; MEMORY])?;
                self.mem.insert(m)
            }
        };
        let from = |peers: &[(Option<ConnId>, _, _); 4], n: u8| peers[n as usize].0.unwrap();
        match cmd {
            Cmd::Connect(addr, n) => cx.connect(addr, &[n], u64::from(n))?,
            Cmd::Grant(n, offset, len, rights) => {
                let conn = self.peers[n as usize].1.unwrap();
                let g = cx.grant(conn, mem, offset, len, rights)?;
                self.peers[n as usize].2 = Some(g.id);
                self.log(Ev::Granted(n, g.region));
            }
            Cmd::Revoke(n) => {
                cx.revoke(self.peers[n as usize].2.take().unwrap())?;
                self.log(Ev::Revoked(n));
            }
            Cmd::Write(n, at, data, t) => {
                let mut b = cx.alloc(data.len())?;
                b.fill(&data)?;
                cx.write(from(&self.peers, n), b, at, None, t).map_err(|(_, e)| e)?;
            }
            Cmd::Read(n, at, len, t) => {
                let mut b = cx.alloc(len)?;
                b.set_len(len)?;
                cx.read(from(&self.peers, n), b, at, t).map_err(|(_, e)| e)?;
            }
            Cmd::FetchAdd(n, at, add, t) => {
                cx.fetch_add(from(&self.peers, n), at, add, t).map_err(|(_, e)| e)?;
            }
            Cmd::Check(changes) => {
                let mut want = vec![0x5a; MEMORY];
                for (at, bytes) in &changes {
                    want[*at..*at + bytes.len()].copy_from_slice(bytes);
                }
                let mut got = vec![0; MEMORY];
                mem.read_at(0, &mut got)?;
                let r = match got.iter().zip(&want).position(|(a, b)| a != b) {
                    None => Ok(()),
                    Some(i) => Err(format!("byte {i}: {:#x}, {:#x} expected", got[i], want[i])),
                };
                self.log(Ev::Checked(r));
            }
        }
        Ok(())
    }
}

impl<P: Provider> Handler<P> for Tester<P> {
    fn poll(&mut self, cx: &mut Cx<P>) {
        let Some(cmd) = self.s.cmds.lock().unwrap().pop_front() else { return };
        if let Err(e) = self.run(cx, cmd) {
            self.log(Ev::Failed(verbs::chain(&e).to_string()));
        }
    }

    fn on_connected(&mut self, _cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        // The connect's token on the initiating end, its private data on the accepting end.
        let n = match info.initiated {
            true => info.token as u8,
            false => info.private_data.first().copied().unwrap_or(0),
        };
        let p = &mut self.peers[n as usize % 4];
        if info.initiated {
            p.0 = Some(conn);
        } else {
            p.1 = Some(conn);
        }
        self.log(Ev::Connected(n, info.initiated));
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        let end = self.peers.iter().enumerate().find_map(|(n, p)| {
            (p.0 == Some(conn))
                .then_some((n as u8, true))
                .or((p.1 == Some(conn)).then_some((n as u8, false)))
        });
        if let Some((n, initiated)) = end {
            self.log(Ev::Closed(n, initiated, *reason));
        }
    }

    fn on_completion(&mut self, _cx: &mut Cx<P>, done: Done<Buf<P>>) {
        let bytes = done.buf.as_ref().map(|b| b.as_slice().to_vec()).unwrap_or_default();
        self.log(Ev::Done(done.token, done.status, bytes, done.old_value));
    }
}

struct Bed {
    s: Arc<Shared>,
}

impl Bed {
    fn cmd(&self, c: Cmd) {
        self.s.cmds.lock().unwrap().push_back(c);
    }

    fn wait<T>(&self, what: &str, f: impl Fn(&[Ev]) -> Option<T>) -> T {
        let deadline = Instant::now() + HANG;
        loop {
            {
                let log = self.s.log.lock().unwrap();
                if let Some(e) = log.iter().find_map(|e| match e {
                    Ev::Failed(e) => Some(e.clone()),
                    _ => None,
                }) {
                    panic!("{what}: {e}: {:?}", log);
                }
                if let Some(t) = f(&log) {
                    return t;
                }
            }
            assert!(Instant::now() < deadline, "{what}: {:?}", self.s.log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn granted(&self, n: u8) -> RemoteRegion {
        self.wait("the grant", |log| {
            log.iter().find_map(|e| match e {
                Ev::Granted(m, r) if *m == n => Some(*r),
                _ => None,
            })
        })
    }

    /// The status (and bytes, old value) of request `t`.
    fn done(&self, t: u64) -> (WcStatus, Vec<u8>, Option<u64>) {
        self.wait(&format!("request {t}"), |log| {
            log.iter().find_map(|e| match e {
                Ev::Done(u, s, b, o) if *u == t => Some((*s, b.clone(), *o)),
                _ => None,
            })
        })
    }
}

/// The whole scenario on an engine made from `provider`'s lines, listening on `listen`.
pub fn grants_give_exactly_their_ranges_and_rights<P: Provider>(
    provider: &str,
    listen: SocketAddr,
) {
    let text = format!(
        "{provider}\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n\
         [worker]\nidle_after_us = 1000\npeer_grace_ms = 60000"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let s = Arc::new(Shared::default());
    let s2 = s.clone();
    let e = Engine::<P>::start(&v, Placement::RoundRobin, move |_| Tester {
        s: s2.clone(),
        mem: None,
        peers: Default::default(),
    })
    .unwrap();
    let addr = e.listen_addr().unwrap();
    let bed = Bed { s };
    for n in 1..=3 {
        bed.cmd(Cmd::Connect(addr, n));
        bed.wait("both ends connected", |log| {
            let ends = log.iter().filter(|e| matches!(e, Ev::Connected(m, _) if *m == n)).count();
            (ends == 2).then_some(())
        });
    }
    let (rw, ro) = (AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE, AccessFlags::REMOTE_READ);
    let (mib, at1, at2, at3) = (1 << 20, 0, 32 << 20, 48 << 20);
    bed.cmd(Cmd::Grant(1, at1, mib, rw));
    bed.cmd(Cmd::Grant(2, at2, 64 << 10, ro));
    bed.cmd(Cmd::Grant(3, at3, 64 << 10, rw | AccessFlags::REMOTE_ATOMIC));
    let (g1, g2, g3) = (bed.granted(1), bed.granted(2), bed.granted(3));
    assert_eq!((g1.len, g2.len, g3.len), (mib as u64, 64 << 10, 64 << 10));
    let mut changed = Vec::new();

    // Peer 1, read and write: its write lands, its read sees it.
    bed.cmd(Cmd::Write(1, g1.at(100), vec![1; 8], 10));
    assert_eq!(bed.done(10).0, WcStatus::Success);
    changed.push((at1 + 100, vec![1; 8]));
    bed.cmd(Cmd::Read(1, g1.at(100), 8, 11));
    assert_eq!(bed.done(11).0, WcStatus::Success);
    assert_eq!(bed.done(11).1, vec![1; 8]);

    // Peer 2, read-only: a read works, a write is refused and changes nothing.
    bed.cmd(Cmd::Read(2, g2.at(0), 8, 20));
    assert_eq!(bed.done(20), (WcStatus::Success, vec![0x5a; 8], None));
    bed.cmd(Cmd::Write(2, g2.at(0), vec![2; 8], 21));
    assert_eq!(bed.done(21).0, WcStatus::RemAccessErr, "a write without the right");

    // Peer 3, with atomics: a fetch-and-add works; a write across the grant's end is refused
    // and leaves both sides of the end untouched.
    bed.cmd(Cmd::FetchAdd(3, g3.at(0), 5, 30));
    let old = u64::from_ne_bytes([0x5a; 8]);
    assert_eq!(bed.done(30).2, Some(old));
    changed.push((at3, (old + 5).to_ne_bytes().to_vec()));
    bed.cmd(Cmd::Write(3, g3.at(g3.len - 4), vec![3; 8], 31));
    assert_eq!(bed.done(31).0, WcStatus::RemAccessErr, "a write beyond the grant");

    // Peer 1's grant revoked mid-run: its next write is refused and changes nothing.
    bed.cmd(Cmd::Revoke(1));
    bed.wait("the revoke", |log| log.contains(&Ev::Revoked(1)).then_some(()));
    bed.cmd(Cmd::Write(1, g1.at(200), vec![4; 8], 12));
    assert_eq!(bed.done(12).0, WcStatus::RemAccessErr, "a write after the revoke");
    // Each refusal closed both ends: the accepting end's queue pair failed (its receives
    // flushed) and it disconnected, and the initiating end, waiting for that (a long
    // `peer_grace_ms`: nothing else ends its wait), names it with the refusal.
    for n in 1..=3 {
        let why = bed.wait("the initiating end's close", |log| {
            log.iter().find_map(|e| match e {
                Ev::Closed(m, true, r) if *m == n => Some(*r),
                _ => None,
            })
        });
        assert_eq!(why, CloseReason::PeerGone(WcStatus::RemAccessErr), "peer {n}: {why}");
    }

    // Nothing else changed, in all 64 MiB.
    bed.cmd(Cmd::Check(changed));
    let r = bed.wait("the check", |log| {
        log.iter().find_map(|e| match e {
            Ev::Checked(r) => Some(r.clone()),
            _ => None,
        })
    });
    r.unwrap();
    e.shutdown().unwrap();
}
