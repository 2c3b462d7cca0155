//! # corelink-config
//!
//! TOML core maps for corelink. Its content arrives with the engine issue: which provider,
//! device, port and GID index to use, which core runs the control plane, which cores run
//! workers, per-worker resources (queue depths, inline size, buffer-pool size classes, polling
//! budget) and the listen address, validated against the machine's real topology (hwlocality).
//! Parsing and validation are pure functions that never panic.
#![deny(missing_docs)]
