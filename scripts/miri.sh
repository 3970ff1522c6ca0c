#!/usr/bin/env bash
# Runs the send buffer's unit tests (homa-proto/src/sendbuf.rs: raw memory
# shared between the engine and the runtime) under Miri, which checks every
# access of their unsafe code for undefined behaviour. Miri needs a nightly
# toolchain; this installs its `miri` and `rust-src` components with rustup
# if they are missing, and skips with a message if that is not possible
# (no nightly toolchain, no network).
#
# The receive pool's tests (pool.rs) are not run here: they fill 64 KiB
# buffer pages byte by byte, which Miri interprets so slowly that a single
# test took over 5 minutes on the 2-core CI machine (twelfth session). Run
# them by hand with:
#   cargo +nightly miri test -p homa-proto --lib -- pool::
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
cargo +nightly miri test -p homa-proto --lib -- sendbuf::
