//! What the parts' unit tests share: a soft RC QP in INIT.

use corelink_verbs::soft::Soft;
use corelink_verbs::{Pd, Provider, Qp, QpAttr, QpCap, QpInitAttr, QpState, QpType};

/// An RC QP on `pd` with `cq` for both queues, `depth` deep each, moved to INIT.
pub(crate) fn soft_qp_in_init(
    pd: &<Soft as Provider>::Pd,
    cq: &<Soft as Provider>::Cq,
    depth: u32,
) -> <Soft as Provider>::Qp {
    let cap = QpCap {
        max_send_wr: depth,
        max_recv_wr: depth,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    let attr = QpInitAttr::<Soft> {
        qp_type: QpType::Rc,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap,
        sq_sig_all: false,
    };
    let mut qp = pd.create_qp(&attr).unwrap();
    qp.modify(&QpAttr { state: QpState::Init, ..QpAttr::default() }).unwrap();
    qp
}
