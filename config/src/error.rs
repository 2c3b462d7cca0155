//! The config crate's one error type.

/// What is wrong with a core map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The text is not valid TOML, or a key has the wrong type or is unknown.
    #[error("core map, line {line}, column {column}: {message}")]
    Syntax {
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// A value is out of range or malformed.
    #[error("core map: `{key} = {value}`: {reason}")]
    Invalid {
        /// The key, e.g. `worker.cq_depth` or `workers[2]`.
        key: String,
        /// The value as written.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A core the machine does not have.
    #[error("core map: `{key} = {core}`: this machine has no core {core} (cores: {available})")]
    NoSuchCore {
        /// The key naming it.
        key: String,
        /// The core.
        core: usize,
        /// The cores there are, as ranges.
        available: String,
    },
    /// A core named twice.
    #[error("core map: core {core} is used twice: by `{first}` and by `{second}`")]
    CoreUsedTwice {
        /// The core.
        core: usize,
        /// The first key naming it.
        first: String,
        /// The second key naming it.
        second: String,
    },
    /// A worker on a different NUMA node from the device, with `numa = "require"`.
    #[error(
        "core map: `{key} = {core}` is on NUMA node {core_node} but device {device} is on node \
         {device_node} (numa = \"require\")"
    )]
    NumaMismatch {
        /// The worker's key.
        key: String,
        /// The worker's core.
        core: usize,
        /// Its NUMA node.
        core_node: u32,
        /// The device.
        device: String,
        /// The device's NUMA node.
        device_node: u32,
    },
    /// The machine's topology could not be read.
    #[error("cannot read the machine's topology: {0}")]
    Topology(String),
}
