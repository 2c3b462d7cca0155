#![allow(dead_code)] // (each test crate uses a part of it)
//! How the engine tests give a peer memory: the accepting end of a connection registers
//! memory (once per handler), grants it whole to its peer with every remote right, and says
//! where in a message (immediate [`IMM`]: the region's 20 bytes); the initiating end starts
//! once that message arrives. (The engine exposes nothing by itself.)

use corelink_engine::verbs::{AccessFlags, Provider, RemoteRegion};
use corelink_engine::{ConnId, Cx, Memory, Message};

/// The immediate of a grant's message.
pub const IMM: u32 = 0x6772_6e74;
/// The token of its send.
pub const TOKEN: u64 = u64::MAX - 7;
/// Bytes each handler exposes.
pub const BYTES: usize = 1 << 20;

/// A handler's memory, registered at its first accepted connection (or by `prepare`).
pub struct Granter<P: Provider> {
    mem: Option<Memory<P>>,
}

impl<P: Provider> Default for Granter<P> {
    fn default() -> Self {
        Granter { mem: None }
    }
}

impl<P: Provider> Granter<P> {
    /// The memory, registered now if it is not yet: call it from `Handler::on_start` to keep
    /// the registration out of the worker's loop (else the first accepted connection does).
    pub fn prepare(&mut self, cx: &mut Cx<P>) -> &Memory<P> {
        self.mem.get_or_insert_with(|| cx.register_memory(BYTES, false).expect("register"))
    }

    /// On an accepted connection: grants the memory to its peer and tells it where; returns
    /// the region granted.
    pub fn grant(&mut self, cx: &mut Cx<P>, conn: ConnId) -> RemoteRegion {
        let mem = self.prepare(cx);
        let g = cx.grant(conn, mem, 0, BYTES, AccessFlags::REMOTE_ALL).expect("grant");
        let mut b = cx.alloc(RemoteRegion::WIRE_BYTES).expect("a buffer");
        b.fill(&g.region.to_bytes()).expect("fill");
        cx.send(conn, b, Some(IMM), TOKEN).map_err(|(_, e)| e).expect("send the grant");
        g.region
    }

    /// The memory (once a connection was accepted).
    pub fn memory(&self) -> Option<&Memory<P>> {
        self.mem.as_ref()
    }
}

/// The region a grant's message names (`None`: another message).
pub fn granted(msg: &Message<'_>) -> Option<RemoteRegion> {
    (msg.imm == Some(IMM)).then(|| RemoteRegion::from_bytes(msg.data)).flatten()
}

/// The region a grant's message to an external client names (`None`: another event).
pub fn granted_event(e: &corelink_engine::Event) -> Option<RemoteRegion> {
    match e {
        corelink_engine::Event::Message { data, imm: Some(IMM), .. } => {
            RemoteRegion::from_bytes(data)
        }
        _ => None,
    }
}
