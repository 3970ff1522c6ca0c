#!/usr/bin/env bash
# Runs the whole test suite: unit, property, protocol (deterministic test
# network), soak, loopback integration and, as root, network-namespace tests.
# Release mode, because the soak test and the simulator tests are sized for it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
cargo test --release --workspace --all-targets "$@"
cargo test --release --workspace --doc
