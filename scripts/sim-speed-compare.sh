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
. "$(dirname "$0")/lib/sim-speed.sh"
for round in $(seq 1 "$rounds"); do
    co=$(((round + 1) % 2))
    cn=$((round % 2))
    sim_speed_run "$co" "$old" "$w" "$messages" | sim_speed_fields >"$out/old" &
    a=$!
    sim_speed_run "$cn" "$new" "$w" "$messages" | sim_speed_fields >"$out/new" &
    b=$!
    wait "$a" "$b"
    read -r oe or oc <"$out/old"
    read -r ne nr nc <"$out/new"
    python3 -c 'import sys
w, rd, oe, o, oc, ne, n, nc = sys.argv[1:]
o, n = float(o), float(n)
print(f"{w} round {rd}: old {o:.2f} M events/CPU s ({oe} events, {float(oc):.1f} s), "
      f"new {n:.2f} ({ne} events, {float(nc):.1f} s), new/old {n / o:.3f}")' \
        "$w" "$round" "$oe" "$or" "$oc" "$ne" "$nr" "$nc"
done
