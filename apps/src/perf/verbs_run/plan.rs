//! The numbers a verbs run works with: its options once checked, and the depths, windows,
//! buffer slots and region lengths that follow from them. Both sides of a run derive their own
//! plan from their own options.

use std::time::Duration;

use corelink_verbs::GRH_BYTES;

use crate::perf::opts::{Test, Transport, Verb, MAX_BYTES_IN_FLIGHT};

/// Receives a `send_bw` receiver keeps posted per queue pair, at least (perftest's RX depth).
pub const RX_DEPTH: usize = 512;

/// Receives a `send_lat` side keeps posted per queue pair.
pub const RX_DEPTH_LAT: usize = 16;

/// Send requests a latency test may leave unretired before it polls for their completions.
pub const LAT_SQ_SLACK: usize = 16;

/// A verbs run's checked options and what follows from them.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The test.
    pub test: Test,
    /// RC, UC or UD.
    pub transport: Transport,
    /// Queue pairs (`-q`).
    pub qps: usize,
    /// Receives come from one shared receive queue (`--use-srq`).
    pub use_srq: bool,
    /// Message sizes, UD's already limited to the MTU.
    pub sizes: Vec<usize>,
    /// Iterations per size (`-n`), unless `duration`.
    pub iters: u64,
    /// `-D`.
    pub duration: Option<Duration>,
    /// Requests in flight per queue pair (`-t`).
    pub tx_depth: usize,
    /// Requests per `post_send` call (`-l`).
    pub post_list: usize,
    /// One request in this many asks for a completion (`-Q`).
    pub cq_mod: usize,
    /// Messages up to this many bytes go inline (`-I`; 0: none).
    pub inline: u32,
}

impl Plan {
    /// Bytes the receiver reserves for the GRH at the start of each receive buffer (UD).
    pub fn grh(&self) -> usize {
        if self.transport == Transport::Ud {
            GRH_BYTES as usize
        } else {
            0
        }
    }

    /// Bytes of local buffer one request of `size` uses (8 for atomics: the old value).
    pub fn elem(&self, size: usize) -> usize {
        match self.test.verb() {
            Verb::Atomic => 8,
            _ => size.max(1),
        }
    }

    /// Requests in flight per queue pair at `size`: 1 for latency tests; else the TX depth, at
    /// most [`MAX_BYTES_IN_FLIGHT`] bytes' worth.
    pub fn window(&self, size: usize) -> usize {
        if self.test.is_lat() {
            return 1;
        }
        self.tx_depth.min((MAX_BYTES_IN_FLIGHT / self.elem(size)).max(1))
    }

    /// Distinct buffer slots requests of `size` cycle through (in-flight requests beyond them
    /// share slots, as perftest's do).
    pub fn slots(&self, size: usize) -> usize {
        (MAX_BYTES_IN_FLIGHT / self.elem(size)).clamp(1, self.window(size) * self.qps)
    }

    /// The largest message.
    pub fn max_size(&self) -> usize {
        self.sizes.iter().copied().max().unwrap_or(8)
    }

    /// Bytes of the local source region (requests' gather lists, reads' and atomics' results).
    pub fn src_len(&self) -> usize {
        let most = self.sizes.iter().map(|&s| self.slots(s) * self.elem(s)).max().unwrap_or(8);
        round64(most)
    }

    /// Receives this side keeps posted per queue pair (`receives`: whether it takes any).
    pub fn rx_per_qp(&self, receives: bool) -> usize {
        match (receives, self.test.is_lat()) {
            (false, _) => 0,
            (true, true) => RX_DEPTH_LAT,
            (true, false) => (2 * self.tx_depth).clamp(RX_DEPTH, 8192),
        }
    }

    /// Bytes of one receive buffer: the largest message, after the GRH space on UD.
    pub fn recv_len(&self) -> usize {
        self.max_size() + self.grh()
    }

    /// Distinct receive buffers (receives beyond them share buffers).
    pub fn recv_slots(&self, receives: bool) -> usize {
        let posted = (self.rx_per_qp(receives) * self.qps).max(1);
        (MAX_BYTES_IN_FLIGHT / self.recv_len()).clamp(1, posted)
    }

    /// Bytes of the region peers use: receive buffers for sends, else as large as the source
    /// region (writes and reads cycle through its slots; atomics use its first word).
    pub fn dst_len(&self, receives: bool) -> usize {
        match self.test.verb() {
            Verb::Send => round64(self.recv_slots(receives) * self.recv_len()),
            _ => self.src_len(),
        }
    }

    /// Send-queue depth of each queue pair.
    pub fn sq_depth(&self) -> usize {
        let w = self.sizes.iter().map(|&s| self.window(s)).max().unwrap_or(1);
        w + self.post_list + LAT_SQ_SLACK
    }
}

fn round64(n: usize) -> usize {
    n.max(64).div_ceil(64) * 64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(test: Test, transport: Transport, sizes: &[usize]) -> Plan {
        Plan {
            test,
            transport,
            qps: 1,
            use_srq: false,
            sizes: sizes.to_vec(),
            iters: 10,
            duration: None,
            tx_depth: 128,
            post_list: 1,
            cq_mod: 1,
            inline: 0,
        }
    }

    #[test]
    fn regions_hold_every_slot() {
        let p = plan(Test::WriteBw, Transport::Uc, &[2, 65536, 8 << 20]);
        assert_eq!(p.window(2), 128);
        assert_eq!(p.window(8 << 20), 2);
        assert_eq!(p.src_len(), 16 << 20);
        assert_eq!(p.dst_len(false), p.src_len());
        let p = plan(Test::SendBw, Transport::Ud, &[1024]);
        assert_eq!(p.recv_len(), 1064);
        assert_eq!(p.rx_per_qp(true), RX_DEPTH);
        assert_eq!(p.recv_slots(true), RX_DEPTH);
        assert!(p.dst_len(true) >= RX_DEPTH * 1064);
        let p = plan(Test::AtomicBw, Transport::Rc, &[8]);
        assert_eq!((p.elem(8), p.src_len()), (8, 1024));
        let p = plan(Test::SendLat, Transport::Rc, &[2]);
        assert_eq!((p.window(2), p.rx_per_qp(true), p.grh()), (1, RX_DEPTH_LAT, 0));
    }
}
