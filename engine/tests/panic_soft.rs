//! A handler that panics takes its worker down, not the engine's shutdown: the control core
//! sees the worker's ring ends dropped (it never said it stopped) and `Engine::shutdown`
//! returns `EngineError::Panicked` naming the worker (before, the control core waited for
//! the worker's `Stopped` for ever, and `shutdown` or the engine's drop hung).

use std::sync::mpsc;
use std::time::Duration;

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::*;

const HANG: Duration = Duration::from_secs(30);

/// Panics in its first poll.
struct Doomed;

impl Handler<Soft> for Doomed {
    fn poll(&mut self, _cx: &mut Cx<Soft>) {
        panic!("a handler's bug (this test's, on purpose)");
    }
}

#[test]
fn a_panicking_handler_ends_in_a_reported_panic_not_a_hung_shutdown() {
    let text =
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"10.78.0.1:7000\"\n\
                [worker]\nidle_after_us = 1000";
    let v = parse(text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let engine = Engine::<Soft>::start(&v, Placement::RoundRobin, |_| Doomed).unwrap();
    // (Let the worker reach its first poll and panic.)
    std::thread::sleep(Duration::from_millis(50));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(engine.shutdown());
    });
    match rx.recv_timeout(HANG) {
        Ok(Err(e @ EngineError::Panicked { .. })) => {
            assert!(e.to_string().contains("worker 0"), "{e}");
        }
        Ok(other) => panic!("shutdown said {other:?}"),
        Err(_) => panic!("shutdown hung after a worker panicked"),
    }
}
