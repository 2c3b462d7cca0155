//! One side's verbs objects: the device and PD, its queue pairs with their CQs and (with
//! `--use-srq`) one shared receive queue, its two registered regions, and for UD an address
//! handle to the peer; creating them, connecting the queue pairs by hand (RESET -> INIT -> RTR
//! -> RTS towards the peer's [`Info`]) and posting receives.

use std::time::{SystemTime, UNIX_EPOCH};

use corelink_verbs::{
    AccessFlags, AhAttr, Context, Endpoint, Gid, Mr, Mtu, Pd, Provider, Qp, QpAttr, QpCap,
    QpInitAttr, QpType, RecvWr, Srq, SrqAttr,
};

use super::plan::Plan;
use super::wire::Info;
use crate::perf::opts::Transport;

/// Which device a run opens and how it addresses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevCfg {
    /// Device name.
    pub name: String,
    /// Port (from 1).
    pub port: u8,
    /// GID index; `None`: the port's first IPv4-mapped GID, else 0.
    pub gid_index: Option<u32>,
}

/// An open device with one protection domain.
#[derive(Debug)]
pub struct Dev<P: Provider> {
    /// The protection domain.
    pub pd: P::Pd,
    /// The device.
    pub ctx: P::Context,
    /// Port in use.
    pub port: u8,
    /// GID index in use.
    pub gid_index: u32,
    /// The port's active MTU.
    pub mtu: Mtu,
    /// The port's LID.
    pub lid: u16,
    /// The GID in use.
    pub gid: Gid,
}

fn vctx(what: &str) -> impl Fn(corelink_verbs::Error) -> String + '_ {
    move |e: corelink_verbs::Error| format!("{what}: {e}")
}

impl<P: Provider> Dev<P> {
    /// Opens `cfg`'s device and allocates a PD.
    pub fn open(cfg: &DevCfg) -> Result<Dev<P>, String> {
        let ctx = P::open(&cfg.name).map_err(vctx(&format!("opening {}", cfg.name)))?;
        let pa = ctx.query_port(cfg.port).map_err(vctx("query_port"))?;
        let gid_index = match cfg.gid_index {
            Some(i) => i,
            None => (0..pa.gid_tbl_len.min(256))
                .find(|&i| {
                    ctx.query_gid(cfg.port, i)
                        .is_ok_and(|g| std::net::Ipv6Addr::from(g.0).to_ipv4_mapped().is_some())
                })
                .unwrap_or(0),
        };
        let gid = ctx.query_gid(cfg.port, gid_index).map_err(vctx("query_gid"))?;
        let pd = ctx.alloc_pd().map_err(vctx("alloc_pd"))?;
        Ok(Dev { pd, ctx, port: cfg.port, gid_index, mtu: pa.active_mtu, lid: pa.lid, gid })
    }
}

/// One side of a run. Fields drop in order: the queue pairs (and with them every request that
/// names the regions) first, the regions after them, the device last.
#[derive(Debug)]
pub struct Side<P: Provider> {
    /// The queue pairs, in RTS once connected.
    pub qps: Vec<P::Qp>,
    /// The shared receive queue (`--use-srq`, on a side that receives).
    pub srq: Option<P::Srq>,
    /// UD: the address handle of the peer's port.
    pub ah: Option<P::Ah>,
    /// Send CQ (every queue pair's).
    pub scq: P::Cq,
    /// Receive CQ (every queue pair's).
    pub rcq: P::Cq,
    /// Gather lists of sends and writes; where reads and atomics' old values land.
    pub src: P::Mr,
    /// What the peer writes, reads and runs atomics on; receive buffers.
    pub dst: P::Mr,
    /// Each queue pair's first PSN.
    pub psns: Vec<u32>,
    /// Bytes of one receive buffer.
    pub recv_len: usize,
    /// Distinct receive buffers.
    pub recv_slots: usize,
    /// Receives kept posted per queue pair.
    pub rx_per_qp: usize,
    /// The device.
    pub dev: Dev<P>,
}

/// A PSN for a fresh queue pair (24 bits, varying from run to run as perftest's).
fn psn(i: usize) -> u32 {
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    (t ^ (i as u32).wrapping_mul(0x9e37_79b9)) & 0x00ff_ffff
}

impl<P: Provider> Side<P> {
    /// Creates everything for `plan` on `dev` (`receives`: whether this side takes sends).
    pub fn new(dev: Dev<P>, plan: &Plan, receives: bool) -> Result<Side<P>, String> {
        let qp_type = match plan.transport {
            Transport::Rc => QpType::Rc,
            Transport::Uc => QpType::Uc,
            Transport::Ud => QpType::Ud,
        };
        let rx_per_qp = plan.rx_per_qp(receives);
        let sq = plan.sq_depth();
        let scq_depth = (plan.qps * sq + 16) as u32;
        let rcq_depth = (plan.qps * rx_per_qp + 16) as u32;
        let scq = dev.ctx.create_cq(scq_depth).map_err(vctx("create_cq (send)"))?;
        let rcq = dev.ctx.create_cq(rcq_depth).map_err(vctx("create_cq (receive)"))?;
        let srq = match plan.use_srq {
            true => {
                let attr = SrqAttr { max_wr: (rx_per_qp * plan.qps).max(1) as u32, max_sge: 1 };
                Some(dev.pd.create_srq(&attr).map_err(vctx("create_srq"))?)
            }
            false => None,
        };
        let cap = QpCap {
            max_send_wr: sq as u32,
            max_recv_wr: rx_per_qp.max(1) as u32,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: plan.inline,
        };
        let local = AccessFlags::LOCAL_WRITE;
        let src = dev.pd.register(plan.src_len(), local).map_err(vctx("register"))?;
        let dst = dev
            .pd
            .register(plan.dst_len(receives), local | AccessFlags::REMOTE_ALL)
            .map_err(vctx("register"))?;
        // Touch both regions now, so that no page is first touched while measuring.
        for mr in [&src, &dst] {
            mr.write_at(0, &vec![0u8; mr.len()]).map_err(vctx("Mr::write_at"))?;
        }
        let mut qps = Vec::with_capacity(plan.qps);
        for _ in 0..plan.qps {
            let attr = QpInitAttr::<P> {
                qp_type,
                send_cq: &scq,
                recv_cq: &rcq,
                srq: srq.as_ref(),
                cap,
                sq_sig_all: false,
            };
            qps.push(dev.pd.create_qp(&attr).map_err(vctx("create_qp"))?);
        }
        Ok(Side {
            psns: (0..qps.len()).map(psn).collect(),
            qps,
            srq,
            ah: None,
            scq,
            rcq,
            src,
            dst,
            recv_len: plan.recv_len(),
            recv_slots: plan.recv_slots(receives),
            rx_per_qp,
            dev,
        })
    }

    /// What the peer needs to connect to this side.
    pub fn info(&self, plan: &Plan) -> Info {
        Info {
            test: plan.test.code(),
            transport: plan.transport as u8,
            srq: plan.use_srq,
            max_size: plan.max_size() as u64,
            lid: self.dev.lid,
            gid: self.dev.gid,
            region: self.dst.region(),
            qps: self.qps.iter().zip(&self.psns).map(|(q, &p)| (q.qp_num(), p)).collect(),
        }
    }

    /// Moves every queue pair to RTS towards its peer in `peer` (the same index), creates the
    /// UD address handle, and posts this side's receives.
    pub fn connect(&mut self, peer: &Info) -> Result<(), String> {
        if peer.qps.len() != self.qps.len() {
            return Err(format!(
                "the peer has {} queue pairs, this side {} (give both the same -q)",
                peer.qps.len(),
                self.qps.len()
            ));
        }
        let d = &self.dev;
        for (i, qp) in self.qps.iter_mut().enumerate() {
            let (qpn, peer_psn) = peer.qps[i];
            let attr = QpAttr {
                port: d.port,
                sgid_index: d.gid_index as u8,
                path_mtu: d.mtu.min(Mtu::Mtu4096),
                rq_psn: peer_psn,
                sq_psn: self.psns[i],
                ..QpAttr::default()
            };
            let dest = match qp.qp_type() {
                QpType::Ud => Endpoint::default(),
                _ => Endpoint { qpn, psn: peer_psn, lid: peer.lid, gid: peer.gid },
            };
            qp.connect_to(dest, &attr).map_err(vctx(&format!("connecting QP {i}")))?;
        }
        if self.qps.first().is_some_and(|q| q.qp_type() == QpType::Ud) {
            let attr = AhAttr {
                port: d.port,
                dlid: peer.lid,
                dgid: peer.gid,
                sgid_index: d.gid_index as u8,
                hop_limit: 64,
            };
            self.ah = Some(d.pd.create_ah(&attr).map_err(vctx("create_ah"))?);
        }
        let mut slot = 0;
        for qp in 0..self.qps.len() {
            let n = match self.srq {
                Some(_) if qp > 0 => 0, // the SRQ's receives are posted once, with QP 0's
                Some(_) => self.rx_per_qp * self.qps.len(),
                None => self.rx_per_qp,
            };
            for _ in 0..n {
                self.post_recv(qp, slot % self.recv_slots)?;
                slot += 1;
            }
        }
        Ok(())
    }

    /// Posts one receive into buffer `slot`, on queue pair `qp` or the SRQ. Its `wr_id` says
    /// both (queue pair in the high 32 bits).
    pub fn post_recv(&mut self, qp: usize, slot: usize) -> Result<(), String> {
        let sge = self
            .dst
            .sge(slot * self.recv_len, self.recv_len as u32)
            .map_err(vctx("a receive buffer"))?;
        let sgl = [sge];
        let wr = RecvWr { wr_id: ((qp as u64) << 32) | slot as u64, sgl: &sgl };
        let r = match (&self.srq, self.qps.get_mut(qp)) {
            // SAFETY: the buffer is inside `self.dst`, which `self` drops after its queue pairs
            // and SRQ, so it outlives the receive; nothing holds a Rust reference into it (it is
            // only read and written through `Mr`'s copying methods).
            (Some(srq), _) => unsafe { srq.post_recv(&[wr]) },
            // SAFETY: as above.
            (None, Some(q)) => unsafe { q.post_recv(&[wr]) },
            (None, None) => return Err(format!("no queue pair {qp}")),
        };
        r.map_err(vctx("post_recv"))
    }

    /// Where `wc` (a receive completion) came from: (queue pair index, buffer slot).
    pub fn recv_origin(&self, wr_id: u64) -> (usize, usize) {
        ((wr_id >> 32) as usize, (wr_id & 0xffff_ffff) as usize)
    }
}
