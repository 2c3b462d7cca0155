//! The `ibverbs` provider (in progress).
