#!/usr/bin/env bash
# Installs what corelink needs to build and test on Debian 12 (bookworm): the verbs and
# rdma_cm headers (the `ibverbs` provider links them), libclang (bindgen, for rdma-sys),
# pkg-config, hwloc and udev headers. Run as root or with sudo. Rust comes from rustup.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

export DEBIAN_FRONTEND=noninteractive
# A broken extra source (an unreachable mirror in sources.list.d) fails `apt-get update` while
# Debian's own lists still refresh: warn and go on; a package that is really missing fails below.
$SUDO apt-get update || echo "install-deps: apt-get update reported errors (see above); going on" >&2
$SUDO apt-get install -y --no-install-recommends \
    build-essential pkg-config libibverbs-dev librdmacm-dev ibverbs-providers \
    libclang-dev clang libhwloc-dev libudev-dev

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust with rustup (https://rustup.rs), e.g." >&2
    echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y" >&2
    exit 1
fi

# cargo-fuzz, for scripts/test.sh's bounded runs of the fuzz targets in fuzz/ (about two
# minutes to build; skipped when it is there).
if ! cargo fuzz --help >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# The Soft-RoCE guest in which the tests run the ibverbs provider against a real RDMA stack
# (QEMU, Debian's kernel, rdma-core, perftest, virtme-ng): see tests/rxe-guest/run.
$SUDO "$(dirname "${BASH_SOURCE[0]}")/../tests/rxe-guest/run" --install
