//! Application memory and access control on `soft` (the scenario is in `common/memory.rs`,
//! shared with `engine_ibverbs.rs`).

#[path = "common/memory.rs"]
mod memory;

#[test]
fn grants_give_exactly_their_ranges_and_rights() {
    memory::grants_give_exactly_their_ranges_and_rights::<corelink_engine::verbs::soft::Soft>(
        "provider = \"soft\"",
        "10.99.8.1:0".parse().unwrap(),
    );
}
