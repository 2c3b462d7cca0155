//! The conformance cases, by area. Each is `pub fn name<P: Provider>(t: &Target) -> CaseResult`;
//! all are re-exported here (the list in [`crate::conformance_tests!`] names them).

mod atomic;
mod cm;
mod errors;
mod inline;
mod mw;
mod queues;
mod read;
mod send;
mod sgl;
mod signal;
mod srq;
mod ud;
mod write;

pub use atomic::*;
pub use cm::*;
pub use errors::*;
pub use inline::*;
pub use mw::*;
pub use queues::*;
pub use read::*;
pub use send::*;
pub use sgl::*;
pub use signal::*;
pub use srq::*;
pub use ud::*;
pub use write::*;
