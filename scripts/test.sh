#!/usr/bin/env bash
# Runs the whole test suite: unit, property, protocol (deterministic test
# network), soak, loopback integration, simulator claims, the fuzz harnesses
# replaying their committed seed corpora and, as root, the network-namespace
# testbed tests (they skip with a message when not root).
# Release mode, because the soak test and the simulator tests are sized for it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
cargo test --release --workspace --all-targets "$@"
cargo test --release --workspace --doc
# The engine's optional trace points (feature `trace`) must keep compiling
# and reach their hook.
cargo test --release -p homa-proto --features trace --lib trace
# The fuzz crate is a separate workspace (cargo-fuzz needs its own); its tests
# run every committed seed through the same checks the fuzzers apply.
(cd crates/homa-proto/fuzz && cargo test --release)
(cd crates/homa-rpc/fuzz && cargo test --release)
# The runtime's hand-over between threads, model-checked with loom (its own
# cfg, so its own build directory).
RUSTFLAGS="--cfg homa_loom" CARGO_TARGET_DIR=target/loom cargo test -p homa --lib loom
