#!/usr/bin/env python3
"""Ideal references for the simulator's deciles: Poisson arrivals at load RHO,
sizes from a workload CSV, preemptive SRPT with service in bytes (no packets,
no fixed delays). Prints p50/p99 slowdown (completion time over the message's
own transmission time) per decile of the measured messages by size; the
first tenth of the arrivals is warm-up.

    python3 scripts/srpt-oracle.py WORKLOAD.csv RHO MESSAGES SEED
        one link: every message on a single SRPT queue.
    python3 scripts/srpt-oracle.py WORKLOAD.csv RHO MESSAGES SEED --network HOSTS
        a network (what pFabric's paper calls "Ideal"): HOSTS hosts, each
        with an uplink and a downlink of the same rate joined by a
        non-blocking fabric, each generating messages at load RHO to a
        uniformly chosen other host. At every arrival and completion the
        scheduler takes the active messages by fewest remaining bytes and
        serves each at the full link rate if its sender's uplink and its
        receiver's downlink are both still free (greedy SRPT matching).
"""
import csv
import heapq
import random
import sys


def load(path):
    sizes, weights = [], []
    for row in csv.DictReader(open(path)):
        sizes.append(int(row["length_bytes"]))
        weights.append(float(row["weight"]))
    tot = sum(weights)
    weights = [w / tot for w in weights]
    mean = sum(s * w for s, w in zip(sizes, weights))
    return sizes, weights, mean


def one_link(size, arr):
    """Completion times of messages `size` arriving at `arr` on one link."""
    n = len(size)
    heap = []  # (remaining, idx)
    now = 0.0
    done = [0.0] * n
    i = 0
    while i < n or heap:
        if not heap:
            now = max(now, arr[i])
            heapq.heappush(heap, (float(size[i]), i))
            i += 1
            continue
        rem, j = heap[0]
        nxt = arr[i] if i < n else float("inf")
        if now + rem <= nxt:
            heapq.heappop(heap)
            now += rem
            done[j] = now
        else:
            heapq.heapreplace(heap, (rem - (nxt - now), j))
            now = nxt
            heapq.heappush(heap, (float(size[i]), i))
            i += 1
    return done


def network(size, arr, src, dst, hosts):
    """Completion times under greedy SRPT matching of uplinks and downlinks."""
    n = len(size)
    rem = [float(x) for x in size]
    done = [0.0] * n
    live = set()  # arrived, not finished
    served = []  # being served now
    now = 0.0
    i = 0
    finished = 0
    while finished < n:
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
        up, down = set(), set()
        served = []
        for k in sorted(live, key=rem.__getitem__):
            if src[k] not in up and dst[k] not in down:
                up.add(src[k])
                down.add(dst[k])
                served.append(k)
                if len(up) == hosts:
                    break
    return done


def main():
    args = sys.argv[1:]
    hosts = None
    if "--network" in args:
        at = args.index("--network")
        hosts = int(args[at + 1])
        del args[at:at + 2]
    path, rho, n, seed = args[0], float(args[1]), int(args[2]), int(args[3])
    sizes, weights, mean = load(path)
    rng = random.Random(seed)
    # Time unit: one byte at the link rate.
    lam = (hosts or 1) * rho / mean
    size = rng.choices(sizes, weights, k=n)
    arr, src, dst, t = [], [], [], 0.0
    for _ in range(n):
        t += rng.expovariate(lam)
        arr.append(t)
        if hosts is not None:
            s = rng.randrange(hosts)
            d = rng.randrange(hosts - 1)
            src.append(s)
            dst.append(d if d < s else d + 1)
    if hosts is None:
        done = one_link(size, arr)
        label = ""
    else:
        done = network(size, arr, src, dst, hosts)
        label = f" hosts {hosts} network"
    warm = n // 10
    res = sorted(((size[k], (done[k] - arr[k]) / size[k]) for k in range(warm, n)),
                 key=lambda x: x[0])
    m = len(res)
    out = []
    for d in range(10):
        part = sorted(x[1] for x in res[d * m // 10:(d + 1) * m // 10])
        out.append((part[len(part) // 2], part[int(len(part) * 0.99)]))
    print(path.split("/")[-1] + label,
          "p99", " ".join(f"{p99:.2f}" for _, p99 in out),
          "| p50", " ".join(f"{p50:.2f}" for p50, _ in out))


if __name__ == "__main__":
    main()
