#!/usr/bin/env python3
"""Ideal reference for a network of hosts: the greedy centralized SRPT
scheduler that pFabric's paper calls "Ideal".

H hosts, each with one uplink and one downlink of the same rate, joined by a
non-blocking fabric. Every host generates messages with Poisson arrivals at
load RHO of its link, sizes from a workload CSV, to a uniformly chosen other
host. At every arrival and completion the scheduler takes the active messages
in order of fewest remaining bytes and serves each at the full link rate if
both its sender's uplink and its receiver's downlink are still free
(preemptive; no packets, no fixed delays, no switch queues). Slowdown is the
completion time over the message's own transmission time. Prints p50/p99
slowdown per decile of the measured messages by size (the first tenth of the
arrivals is warm-up), in the format of scripts/srpt-oracle.py.

    python3 scripts/srpt-network-oracle.py WORKLOAD.csv RHO MESSAGES SEED [HOSTS]
"""
import csv
import random
import sys


def main():
    path, rho, n, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    hosts = int(sys.argv[5]) if len(sys.argv) > 5 else 144
    sizes, weights = [], []
    for row in csv.DictReader(open(path)):
        sizes.append(int(row["length_bytes"]))
        weights.append(float(row["weight"]))
    tot = sum(weights)
    weights = [w / tot for w in weights]
    mean = sum(s * w for s, w in zip(sizes, weights))
    rng = random.Random(seed)
    # Time unit: one byte at the link rate. The whole network generates
    # HOSTS * RHO / mean messages per byte-time.
    lam = hosts * rho / mean
    size = rng.choices(sizes, weights, k=n)
    src = [0] * n
    dst = [0] * n
    arr = [0.0] * n
    t = 0.0
    for k in range(n):
        t += rng.expovariate(lam)
        arr[k] = t
        s = rng.randrange(hosts)
        d = rng.randrange(hosts - 1)
        src[k] = s
        dst[k] = d if d < s else d + 1
    rem = [float(x) for x in size]
    done = [0.0] * n
    live = set()  # arrived, not finished
    served = []  # indices being served now
    now = 0.0
    i = 0
    finished = 0
    while finished < n:
        # Next event: an arrival or the earliest completion among those served.
        nxt_arr = arr[i] if i < n else float("inf")
        nxt_done = min((rem[k] for k in served), default=float("inf"))
        dt = min(nxt_arr - now, nxt_done)
        for k in served:
            rem[k] -= dt
        now += dt
        for k in served:
            if rem[k] <= 1e-6:
                done[k] = now
                finished += 1
                live.discard(k)
        while i < n and arr[i] <= now:
            live.add(i)
            i += 1
        # Re-rank every active message by its remaining bytes; match greedily.
        up = set()
        down = set()
        served = []
        for k in sorted(live, key=rem.__getitem__):
            if src[k] not in up and dst[k] not in down:
                up.add(src[k])
                down.add(dst[k])
                served.append(k)
                if len(up) == hosts:
                    break
    warm = n // 10
    res = sorted(((size[k], (done[k] - arr[k]) / size[k]) for k in range(warm, n)), key=lambda x: x[0])
    m = len(res)
    out = []
    for d in range(10):
        part = sorted(x[1] for x in res[d * m // 10:(d + 1) * m // 10])
        out.append((part[len(part) // 2], part[int(len(part) * 0.99)]))
    print(path.split("/")[-1], f"hosts {hosts} network",
          "p99", " ".join(f"{p99:.2f}" for _, p99 in out),
          "| p50", " ".join(f"{p50:.2f}" for p50, _ in out))


if __name__ == "__main__":
    main()
