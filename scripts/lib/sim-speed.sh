# Shared by scripts/sim-speed-compare.sh and scripts/sim-speed-alternate.sh
# (sourced, not run): how one simulator run is started and how its speed
# is read, so that the two ways of comparing binaries measure the same
# thing.

# sim_speed_run CORE HOMA WORKLOAD MESSAGES: one `homa sim` run at 80% load,
# seed 1, pinned to CORE under nice 19; its JSON report on stdout.
sim_speed_run() {
    nice -n 19 taskset -c "$1" "$2" sim --workload "$3" --load 0.8 --seed 1 \
        --messages "$4" --json --quiet 2>/dev/null
}

# sim_speed_fields: reads a report on stdin and prints its events, its M
# events per CPU second and its CPU seconds (the run loop's, not the
# report's).
sim_speed_fields() {
    python3 -c 'import json, sys
r = json.load(sys.stdin)
r = r[0] if isinstance(r, list) else r
print(r["events"], r["events_per_cpu_second"] / 1e6, r["cpu_seconds"])'
}
