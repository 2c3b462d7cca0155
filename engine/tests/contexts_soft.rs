//! Workers on device contexts of their own, on the `soft` provider (the checks are in
//! `common/contexts.rs`, shared with `engine_ibverbs.rs`).

#[path = "common/contexts.rs"]
mod contexts;
#[path = "common/grant.rs"]
mod grant;

use corelink_verbs::soft::Soft;

#[test]
fn workers_have_contexts_of_their_own() {
    let a = contexts::core_map("provider = \"soft\"", "10.99.12.1:0".parse().unwrap(), 2);
    let b = contexts::core_map("provider = \"soft\"", "10.99.12.2:0".parse().unwrap(), 1);
    contexts::workers_have_contexts_of_their_own::<Soft>(&a, &b);
}
