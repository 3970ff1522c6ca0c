#!/usr/bin/env bash
# Compares the simulator's speed of two `homa` binaries on a shared machine:
# both run the same command at the same time, one per core (taskset), and
# the second round swaps the cores; each round prints both binaries' M
# events per CPU second and their ratio. Only ratios taken this way mean
# anything on a machine that others use too (docs/simulation.md, "Speed").
#
# Usage: scripts/sim-speed-compare.sh OLD_HOMA NEW_HOMA WORKLOAD [ROUNDS [MESSAGES]]
#   e.g. scripts/sim-speed-compare.sh /tmp/homa-11150a7 target/sim/homa w4
# Runs `homa sim --workload WORKLOAD --load 0.8 --seed 1 --messages MESSAGES
# --json` (the mode 11150a7 also has) under nice 19; needs 2 cores and
# python3. ROUNDS (default 2) is the number of rounds; MESSAGES (default
# 100000) the run's length (W1's 100,000 messages take 0.4 s, in which
# building the 144 hosts' tables is a few percent).
set -euo pipefail
old=$1
new=$2
w=$3
rounds=${4:-2}
messages=${5:-100000}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(sim --workload "$w" --load 0.8 --seed 1 --messages "$messages" --json --quiet)
for round in $(seq 1 "$rounds"); do
    co=$(((round + 1) % 2))
    cn=$((round % 2))
    nice -n 19 taskset -c "$co" "$old" "${args[@]}" >"$out/old.json" 2>/dev/null &
    a=$!
    nice -n 19 taskset -c "$cn" "$new" "${args[@]}" >"$out/new.json" 2>/dev/null &
    b=$!
    wait "$a" "$b"
    python3 - "$out" "$w" "$round" <<'PY'
import json, sys
out, w, rd = sys.argv[1:]
def rate(kind):
    r = json.load(open(f"{out}/{kind}.json"))
    r = r[0] if isinstance(r, list) else r
    return r["events"], r["events_per_cpu_second"] / 1e6, r["cpu_seconds"]
o, n = rate("old"), rate("new")
print(f"{w} round {rd}: old {o[1]:.2f} M events/CPU s ({o[0]} events, {o[2]:.1f} s), "
      f"new {n[1]:.2f} ({n[0]} events, {n[2]:.1f} s), new/old {n[1] / o[1]:.3f}")
PY
done
