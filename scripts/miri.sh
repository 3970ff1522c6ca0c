#!/usr/bin/env bash
# Runs the unit tests of the engine's unsafe code under Miri, which checks
# every access for undefined behaviour and data races: the receive pool
# (homa-proto/src/pool.rs: one raw region shared by the engine and the
# application's messages on any thread, with atomic reference counts) and
# the send buffer (sendbuf.rs: raw memory shared between the engine and the
# runtime), and partial messages (partial.rs: a message read on one thread
# while the engine writes the rest of it on another). Miri needs a nightly toolchain; this installs its `miri` and
# `rust-src` components with rustup if they are missing, and skips with a
# message if that is not possible (no nightly toolchain, no network).
#
# Under Miri the pool's bpages are 1 KiB instead of 64 KiB (`BPAGE_SIZE`),
# and its tests scale their sizes to match: with 64 KiB pages a single test
# took over 5 minutes here, as Miri fills and compares them byte by byte.
# The property test runs 2 cases there and the threaded test 100 messages
# (64 and 2,000 natively). About 2 minutes on the 2-core CI machine, a
# third of it building.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
    echo "miri.sh: no nightly toolchain (rustup toolchain list): Miri skipped" >&2
    exit 0
fi
# Idempotent (quick when both are there); Miri's first run also needs
# rust-src to build its sysroot.
if ! rustup component add --toolchain nightly miri rust-src >/dev/null 2>&1 \
    || ! cargo +nightly miri --version >/dev/null 2>&1; then
    echo "miri.sh: could not install nightly's miri and rust-src components: Miri skipped" >&2
    exit 0
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/miri-target"
cargo +nightly miri test -p homa-proto --lib -- pool:: sendbuf:: partial::
