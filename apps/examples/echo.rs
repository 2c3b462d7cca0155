//! An echo service on the engine.
//!
//! ```text
//! echo [both] [--count N] [--size BYTES]                  # one process, soft: the engine connects to itself
//! echo server ADDR [--provider soft|ibverbs] [--config MAP.toml] [--clients N]
//! echo client ADDR [--count N] [--size BYTES] [--window W] [--linger MS] [--provider soft|ibverbs]
//! ```
//!
//! The server's handler sends every message it receives back, with its immediate. The client's
//! handler connects (`Cx::connect`, from its first `poll`), keeps `--window` messages in flight,
//! each numbered by its immediate and filled with a pattern of that number, checks every echo
//! byte for byte, and after `--count` round trips prints the round-trip latency and closes the
//! connection (with `--linger MS`, it first leaves the connection idle for that long, printing
//! `echo client: lingering`, so that a dead peer can only be seen by the engine's keepalive); the main thread then shuts the engine down and prints the worker's metrics.
//! Exit status: 0 when every echo came back right, 1 on a mismatch or an error, 2 on bad usage.

mod engine_common;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use clap::Parser;
use corelink_engine::{Buf, CloseReason, ConnId, ConnInfo, Cx, Done, Handler, Message};
use corelink_verbs::{Provider, WcStatus};
use engine_common::{latency, Common, Link};

#[derive(Parser, Debug)]
#[command(name = "echo", about = "An echo service on the corelink engine")]
struct Cli {
    #[command(flatten)]
    common: Common,
    /// bytes per message (at most 4096, the engine's receive buffers with the default pools)
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    size: u32,
    /// client: keep the connection idle this many milliseconds before closing it
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    linger: u64,
}

/// The client's timer: its linger is over (the client part's tokens start at `CLIENT_TIMERS`).
const T_LINGER: u64 = engine_common::CLIENT_TIMERS;

/// Byte `i` of message `seq`.
fn byte(seq: u32, i: usize) -> u8 {
    (seq as usize).wrapping_mul(31).wrapping_add(i.wrapping_mul(7)).wrapping_add(i >> 8) as u8
}

/// Sends back whatever arrives; one report per connection when it closes.
struct EchoServer {
    link: Link,
    /// Echoes and the first error, by connection.
    conns: HashMap<ConnId, (u64, Option<String>)>,
}

impl<P: Provider> Handler<P> for EchoServer {
    fn on_connected(&mut self, _cx: &mut Cx<P>, conn: ConnId, info: &ConnInfo) {
        let hello = String::from_utf8_lossy(&info.private_data);
        println!("echo server: accepted {conn} ({hello:?})");
        self.conns.insert(conn, (0, None));
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let sent = cx.alloc(msg.data.len()).and_then(|mut b| {
            b.fill(msg.data)?;
            cx.send(conn, b, msg.imm, 0).map_err(|(_, e)| e)
        });
        let Some(state) = self.conns.get_mut(&conn) else { return };
        match sent {
            Ok(()) => state.0 += 1,
            Err(e) => {
                state.1.get_or_insert(format!("echoing on {conn}: {e}"));
                let _ = cx.close(conn);
            }
        }
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        // An echo still unacknowledged when the client disconnects is flushed: not an error.
        if done.status.is_success() || done.status == WcStatus::WrFlushErr {
            return;
        }
        if let Some(state) = self.conns.get_mut(&done.conn) {
            state.1.get_or_insert(format!("echo on {}: {}", done.conn, done.status));
            let _ = cx.close(done.conn);
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        let (echoed, error) = self.conns.remove(&conn).unwrap_or_default();
        self.link.report(match (error, reason) {
            (Some(e), _) => Err(e),
            (None, CloseReason::Error(s)) => Err(format!("{conn} failed: {s}")),
            (None, r @ CloseReason::Unanswered(_)) => Err(format!("{conn} was lost: {r}")),
            (None, r) => Ok(format!("echo server: {conn} closed ({r:?}) after {echoed} echoes")),
        });
    }
}

/// Connects, keeps `window` numbered messages in flight and checks each echo.
#[derive(Default)]
struct EchoClient {
    link: Link,
    count: u32,
    size: usize,
    window: usize,
    asked: bool,
    conn: Option<ConnId>,
    /// Messages sent, their send completions, echoes received.
    sent: u32,
    sends_done: u32,
    got: u32,
    in_flight: VecDeque<(u32, Instant)>,
    rtts: Vec<Duration>,
    started: Option<Instant>,
    error: Option<String>,
    /// How long to leave the connection idle after the last echo, and since when it is.
    linger: Duration,
    lingering: Option<Instant>,
}

impl EchoClient {
    fn fail<P: Provider>(&mut self, cx: &mut Cx<P>, e: String) {
        self.error.get_or_insert(e);
        if let Some(c) = self.conn {
            let _ = cx.close(c);
        }
    }

    fn send_more<P: Provider>(&mut self, cx: &mut Cx<P>, conn: ConnId) {
        while self.in_flight.len() < self.window && self.sent < self.count {
            let seq = self.sent;
            let sent = cx.alloc(self.size).and_then(|mut b| {
                for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                    *x = byte(seq, i);
                }
                cx.send(conn, b, Some(seq), u64::from(seq)).map_err(|(_, e)| e)
            });
            if let Err(e) = sent {
                return self.fail(cx, format!("sending message {seq}: {e}"));
            }
            self.in_flight.push_back((seq, Instant::now()));
            self.sent += 1;
        }
    }

    fn maybe_close<P: Provider>(&mut self, cx: &mut Cx<P>) {
        if let (Some(c), true) =
            (self.conn, self.got == self.count && self.sends_done == self.count)
        {
            if self.linger.is_zero() {
                let _ = cx.close(c);
            } else if self.lingering.is_none() {
                println!(
                    "echo client: lingering {} ms on an idle connection",
                    self.linger.as_millis()
                );
                self.lingering = Some(Instant::now());
                if let Err(e) = cx.set_timer(self.linger, T_LINGER) {
                    self.fail(cx, format!("setting the linger timer: {e}"));
                }
            }
        }
    }
}

impl<P: Provider> Handler<P> for EchoClient {
    fn poll(&mut self, cx: &mut Cx<P>) {
        self.link.connect_once(&mut self.asked, cx, b"echo client");
    }

    fn on_connect_failed(
        &mut self,
        _cx: &mut Cx<P>,
        _token: u64,
        error: &corelink_engine::EngineError,
    ) {
        self.link.connect_failed(error);
    }

    fn on_connected(&mut self, cx: &mut Cx<P>, conn: ConnId, _info: &ConnInfo) {
        println!("echo client: connected ({conn})");
        self.conn = Some(conn);
        self.started = Some(Instant::now());
        self.send_more(cx, conn);
    }

    fn on_message(&mut self, cx: &mut Cx<P>, conn: ConnId, msg: &Message<'_>) {
        let Some((seq, at)) = self.in_flight.pop_front() else {
            return self.fail(cx, format!("an echo ({:?}) with nothing in flight", msg.imm));
        };
        if msg.imm != Some(seq) {
            return self.fail(cx, format!("echo of message {:?}, expected {seq}", msg.imm));
        }
        if msg.data.len() != self.size {
            let n = msg.data.len();
            return self.fail(cx, format!("echo {seq}: {n} bytes, sent {}", self.size));
        }
        if let Some(i) = msg.data.iter().enumerate().position(|(i, &x)| x != byte(seq, i)) {
            let (got, want) = (msg.data[i], byte(seq, i));
            return self.fail(cx, format!("echo {seq}: byte {i} is {got:#x}, sent {want:#x}"));
        }
        self.rtts.push(at.elapsed());
        self.got += 1;
        self.send_more(cx, conn);
        self.maybe_close(cx);
    }

    fn on_completion(&mut self, cx: &mut Cx<P>, done: Done<Buf<P>>) {
        if !done.status.is_success() {
            return self.fail(cx, format!("send {}: {}", done.token, done.status));
        }
        self.sends_done += 1;
        self.maybe_close(cx);
    }

    fn on_timer(&mut self, cx: &mut Cx<P>, token: u64) {
        if let (T_LINGER, Some(c)) = (token, self.conn) {
            let _ = cx.close(c);
        }
    }

    fn on_closed(&mut self, _cx: &mut Cx<P>, conn: ConnId, reason: &CloseReason) {
        if let Some(e) = self.error.take() {
            return self.link.report(Err(e));
        }
        if let (Some(t), CloseReason::Peer | CloseReason::Unanswered(_) | CloseReason::Error(_)) =
            (self.lingering, reason)
        {
            let idle = t.elapsed().as_secs_f64();
            return self
                .link
                .report(Err(format!("{conn} was lost {idle:.2} s into the linger: {reason}")));
        }
        if self.got != self.count {
            let n = self.got;
            return self.link.report(Err(format!("{conn} closed ({reason:?}) after {n} echoes")));
        }
        let secs = self.started.map_or(0.0, |t| t.elapsed().as_secs_f64());
        self.link.report(Ok(format!(
            "echo client: {} round trips of {} B, window {}, all checked, in {:.3} s \
             ({:.0} per s)\necho client: round trip {}",
            self.count,
            self.size,
            self.window,
            secs,
            f64::from(self.count) / secs.max(1e-9),
            latency(&mut self.rtts)
        )));
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (count, size, window) = (cli.common.count, cli.size as usize, cli.common.window as usize);
    let linger = Duration::from_millis(cli.linger);
    engine_common::main(
        "echo",
        &cli.common,
        |link| EchoServer { link, conns: HashMap::new() },
        move |link| EchoClient { link, count, size, window, linger, ..EchoClient::default() },
    )
}
