//! A `soft` engine whose one worker's handler tells the test of each connection it gets
//! (`None`) and of each close, with its reason: what the fault tests watch the far side with.

use std::sync::mpsc;

use corelink_config::{parse, MachineTopology};
use corelink_engine::verbs::soft::Soft;
use corelink_engine::*;

/// Tells the test of its connections (`None`) and closes.
pub struct Teller(mpsc::Sender<Option<CloseReason>>);

impl Handler<Soft> for Teller {
    fn on_connected(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, _info: &ConnInfo) {
        let _ = self.0.send(None);
    }

    fn on_closed(&mut self, _cx: &mut Cx<Soft>, _conn: ConnId, reason: &CloseReason) {
        let _ = self.0.send(Some(*reason));
    }
}

/// An engine of one worker listening on `listen`, with top-level lines `top` and `[worker]`
/// lines `worker`, and what its handler tells.
pub fn engine(
    listen: &str,
    top: &str,
    worker: &str,
) -> (Engine<Soft>, mpsc::Receiver<Option<CloseReason>>) {
    let text = format!(
        "provider = \"soft\"\ncontrol_core = 0\nworkers = [1]\nlisten = \"{listen}\"\n{top}\n\
         [worker]\nidle_after_us = 1000\n{worker}"
    );
    let v = parse(&text).unwrap().validate(&MachineTopology::load().unwrap()).unwrap();
    let (tx, rx) = mpsc::channel();
    (Engine::<Soft>::start(&v, Placement::RoundRobin, move |_| Teller(tx.clone())).unwrap(), rx)
}
