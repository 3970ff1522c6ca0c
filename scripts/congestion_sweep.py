#!/usr/bin/env python3
"""Issue #20's simulator experiments (docs/congestion.md): runs
`homa sim --experiment rtt-mix|incast` for adaptive and static windows over
seeds and prints one line per setting (means over seeds).

    scripts/congestion_sweep.py rtt-mix 100000 [--seeds 1,2,3] [--extra '--buffer-bytes 0']
    scripts/congestion_sweep.py incast 64000 --senders 32
"""
import argparse, json, subprocess, sys, os

HOMA = os.environ.get("HOMA", os.path.join(os.path.dirname(__file__), "..", "target", "release", "homa"))

def statics(size):
    pts = {5000, 10000, 20000, 40000, 80000, 160000, 320000}
    pts = sorted(p for p in pts if p < size) + [size]
    return ["static"] + ["static:%d" % p for p in pts]

def run(exp, size, window, seed, extra, senders):
    cmd = ["nice", "-n", "19", HOMA, "sim", "--experiment", exp, "--message-size", str(size),
           "--window", window, "--seed", str(seed), "--json"] + extra
    if exp == "incast":
        cmd += ["--senders", str(senders)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("experiment")
    ap.add_argument("size", type=int)
    ap.add_argument("--senders", type=int, default=32)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--windows", default=None, help="comma list; default adaptive + static sweep")
    ap.add_argument("--extra", default="", help="more homa sim options, space-separated")
    a = ap.parse_args()
    a.extra = a.extra.split()
    seeds = [int(s) for s in a.seeds.split(",")]
    windows = a.windows.split(",") if a.windows else ["adaptive"] + statics(a.size)
    for w in windows:
        rs = [run(a.experiment, a.size, w, s, a.extra, a.senders) for s in seeds]
        mean = lambda k: sum(r[k] for r in rs) / len(rs)
        if a.experiment == "rtt-mix":
            print("%-8d %-15s goodput %6.1f Gbps [%5.1f..%5.1f] p99 %7.0f us p50 %6.0f us drops %7.0f resent %7.0f  (%s)" % (
                a.size, w, mean("goodput_gbps"), min(r["goodput_gbps"] for r in rs),
                max(r["goodput_gbps"] for r in rs), mean("p99_us"), mean("p50_us"), mean("drops"),
                sum(r["engine"].get("retransmitted_packets", 0) for r in rs) / len(rs),
                rs[0]["params"]["unsched_bytes"] if w != "adaptive" else "adaptive"), flush=True)
        else:
            print("%2d x %-8d %-15s rct p99 %8.0f us p50 %8.0f us (ideal %5.0f) drops %7.0f warm-up drops %5.0f resent %6.0f" % (
                a.senders, a.size, w, mean("rct_p99_us"), mean("rct_p50_us"), rs[0]["rct_ideal_us"],
                mean("drops"), mean("warmup_drops"),
                sum(r["engine"].get("retransmitted_packets", 0) for r in rs) / len(rs)), flush=True)

if __name__ == "__main__":
    main()
