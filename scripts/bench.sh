#!/usr/bin/env bash
# Runs the `homa` command as its benchmarks are measured: built with
# profile-guided optimisation (scripts/pgo-build.sh). The profile is made
# again only when the source, the lock file, the compiler or the build
# script changed; otherwise the existing binary runs at once.
# Where the profile-guided build cannot be made (no rustup llvm-tools and no
# way to install them), it says so and runs the plain release build, whose
# 100-byte round trips are ~0.15 us slower (docs/performance.md).
#
# `scripts/bench.sh sim ...` runs the simulator from its own profile-guided
# build (`scripts/pgo-build.sh --sim`: the `sim` profile, trained on short
# simulations), 5-15% more simulated events per CPU second than `cargo run
# --profile sim`.
#
# Usage: scripts/bench.sh SUBCOMMAND [ARGS...]   e.g. scripts/bench.sh echo-bench
# No root needed. The first run takes a few minutes (two builds and a
# ~20-40 s training run); later runs start at once.
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

if [ "${1:-}" = sim ]; then
    profile=sim
    mode=--sim
    slower="5-15% fewer simulated events per CPU second"
else
    profile=release
    mode=
    slower="100-byte round trips ~0.15 us slower"
fi
stamp=target/pgo/source-key-$profile
bin=target/pgo/$profile/homa
if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$key" ]; then
    echo "bench.sh: profile-guided build is up to date ($bin)" >&2
elif ./scripts/pgo-build.sh $mode; then
    echo "$key" >"$stamp"
else
    echo "bench.sh: WARNING: the profile-guided build failed; running the plain" \
        "$profile build instead ($slower)" >&2
    cargo build --profile "$profile" -p homa-cli
    bin=target/$profile/homa
fi
exec "$bin" "$@"
