#!/usr/bin/env bash
# Runs the `homa` command as its benchmarks are measured: built with
# profile-guided optimisation (scripts/pgo-build.sh). The profile is made
# again only when the source, the lock file, the compiler or the build
# script changed; otherwise the existing binary runs at once.
# Where the profile-guided build cannot be made (no rustup llvm-tools and no
# way to install them), it says so and runs the plain release build, whose
# 100-byte round trips are ~0.15 us slower (docs/performance.md).
#
# Usage: scripts/bench.sh SUBCOMMAND [ARGS...]   e.g. scripts/bench.sh echo-bench
# No root needed. The first run takes a few minutes (two builds and a
# ~20 s training run); later runs start at once.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi

# What the profile depends on. From git's file list when there is one (so
# build output and editor files do not count), else every source file.
source_files() {
    if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        git ls-files -z -- Cargo.toml Cargo.lock crates ':!crates/homa-proto/fuzz' ':!crates/homa-rpc/fuzz'
    else
        find Cargo.toml Cargo.lock crates \( -path crates/homa-proto/fuzz -o -path crates/homa-rpc/fuzz \) -prune -o \
            -type f \( -name '*.rs' -o -name Cargo.toml \) -print0 | sort -z
    fi
}
key=$(
    {
        rustc -vV
        sha256sum scripts/pgo-build.sh
        # A listed file deleted from the work tree only changes the key.
        source_files | xargs -0 sha256sum 2>/dev/null || true
    } | sha256sum | cut -d' ' -f1
)

stamp=target/pgo/source-key
bin=target/pgo/release/homa
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    echo "bench.sh: profile-guided build is up to date ($bin)" >&2
elif ./scripts/pgo-build.sh; then
    echo "$key" >"$stamp"
else
    echo "bench.sh: WARNING: the profile-guided build failed; running the plain" \
        "release build instead (100-byte round trips ~0.15 us slower)" >&2
    cargo build --release -p homa-cli
    bin=target/release/homa
fi
exec "$bin" "$@"
