//! # corelink-config
//!
//! TOML core maps: which provider and device (port, GID index) corelink uses, which core runs the
//! control plane, which cores run workers, each worker's resources (queue depths, inline size,
//! registered buffer-pool size classes, polling budget, idle policy) and the listen address.
//!
//! [`parse`] turns text into a [`CoreMap`]; [`CoreMap::validate`] checks it against a
//! [`Topology`] (the machine's, read with hwloc by [`MachineTopology::load`], or a
//! [`StaticTopology`] in tests). Both are pure functions that never panic: every problem is a
//! [`ConfigError`] naming the key and the value, and a TOML syntax error gives its line and column.
#![deny(missing_docs)]

mod error;
mod model;
mod topology;
mod validate;

pub use error::ConfigError;
pub use model::{
    Batching, Classes, CoreMap, CoreSpec, NumaPolicy, PinPolicy, PoolClass, ProviderKind, Qps,
    Scheduler, WorkerResources,
};
pub use topology::{Core, MachineTopology, StaticTopology, Topology};
pub use validate::{limits, Validated, Warning};

/// Parses a core map from TOML text (no validation against the machine yet).
pub fn parse(text: &str) -> Result<CoreMap, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let (line, column) = match e.span() {
            Some(span) => line_col(text, span.start),
            None => (0, 0),
        };
        ConfigError::Syntax { line, column, message: e.message().trim().to_owned() }
    })
}

/// 1-based line and column of byte `offset` in `text`.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = text.get(..offset.min(text.len())).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_carry_line_and_column() {
        let e = parse("control_core = 0\nworkers = [1,\n").unwrap_err();
        let ConfigError::Syntax { line, column, .. } = e else { panic!("{e:?}") };
        assert!(line >= 2, "line {line}");
        assert!(column >= 1);
        let e = parse("control_core = \"zero\"\n").unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { line: 1, .. }), "{e}");
        let e = parse("bogus_key = 1\n").unwrap_err();
        assert!(e.to_string().contains("bogus_key"), "{e}");
    }

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 99), (1, 3));
    }

    #[test]
    fn parse_never_panics_on_junk() {
        for junk in
            ["", "=", "[[[", "workers = [\"9-\"]", "\u{0}", "worker = 3", "[worker]\npools = 1"]
        {
            let _ = parse(junk);
        }
    }
}
