#!/usr/bin/env bash
# The soak run (issue 15): RPC calls and one-sided requests on soft under a fault plan that
# changes every phase, for as long as asked; prints each phase's ends by status, calls by
# outcome, fault counts and resident memory, then checks that everything issued ended once.
# Not a test (it runs for minutes); exit status 1 if anything was lost.
#
#   scripts/soak.sh [--seconds S] [--phase-ms MS]     (default: 20 s, 2 s phases)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build -q --release -p corelink-apps --example soak
exec "${CARGO_TARGET_DIR:-target}/release/examples/soak" "$@"
