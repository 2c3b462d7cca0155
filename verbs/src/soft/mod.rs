//! The `soft` provider (in progress).
