#!/usr/bin/env bash
# Compares the simulator's speed of two `homa` binaries on a noisy shared
# machine: on each core (taskset), the two binaries run the same command one
# after the other, N times each, alternating (core 1 starts with the other
# binary); per core it prints each binary's best and median M events per CPU
# second and the ratios new/old. The best of several runs is what the code
# can do; the host's interruptions only ever lower a run's rate. See
# docs/simulation.md, "Twenty-sixth session".
#
# Usage: scripts/sim-speed-alternate.sh OLD_HOMA NEW_HOMA WORKLOAD MESSAGES N
#   e.g. scripts/sim-speed-alternate.sh /tmp/homa-11150a7 target/pgo/sim/homa w2 100000 6
# Runs `homa sim --workload WORKLOAD --load 0.8 --seed 1 --messages MESSAGES
# --json --quiet` under nice 19; needs 2 cores and python3.
set -euo pipefail
old=$1
new=$2
w=$3
messages=$4
n=$5
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
. "$(dirname "$0")/lib/sim-speed.sh"
rate() {
    local fields
    fields=$(sim_speed_run "$1" "$2" "$w" "$messages" | sim_speed_fields)
    echo "$fields" | cut -d' ' -f2
}
on_core() {
    local core=$1 first=$2 second=$3 first_name=$4 second_name=$5
    for _ in $(seq 1 "$n"); do
        echo "$first_name $(rate "$core" "$first")"
        echo "$second_name $(rate "$core" "$second")"
    done >"$out/core$core"
}
on_core 0 "$old" "$new" old new &
on_core 1 "$new" "$old" new old &
wait
python3 - "$out" "$w" "$messages" <<'PY'
import statistics as st, sys
out, w, m = sys.argv[1:]
for core in "01":
    runs = {"old": [], "new": []}
    for line in open(f"{out}/core{core}"):
        name, v = line.split()
        runs[name].append(float(v))
    o, n = runs["old"], runs["new"]
    print(f"{w} ({m} messages) core {core}: old best {max(o):.2f} median {st.median(o):.2f}, "
          f"new best {max(n):.2f} median {st.median(n):.2f} M events/CPU s; "
          f"new/old best {max(n) / max(o):.3f}, median {st.median(n) / st.median(o):.3f}")
PY
