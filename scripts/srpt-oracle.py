#!/usr/bin/env python3
"""Ideal reference: one link at load RHO, Poisson arrivals, preemptive SRPT
(service in bytes), sizes from a workload CSV. Prints p50/p99 slowdown
(response time / service time) per decile of messages by size."""
import csv, heapq, random, sys
path, rho, n, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
sizes, weights = [], []
for row in csv.DictReader(open(path)):
    sizes.append(int(row["length_bytes"])); weights.append(float(row["weight"]))
tot = sum(weights); weights = [w / tot for w in weights]
mean = sum(s * w for s, w in zip(sizes, weights))
rng = random.Random(seed)
lam = rho / mean  # arrivals per byte-time
jobs = rng.choices(sizes, weights, k=n)
t = 0.0; arr = []
for s in jobs:
    t += rng.expovariate(lam); arr.append(t)
heap = []  # (remaining, idx)
now = 0.0; done = [0.0] * n; i = 0
while i < n or heap:
    if not heap:
        now = max(now, arr[i]); heapq.heappush(heap, (float(jobs[i]), i)); i += 1; continue
    rem, j = heap[0]
    nxt = arr[i] if i < n else float("inf")
    if now + rem <= nxt:
        heapq.heappop(heap); now += rem; done[j] = now
    else:
        heapq.heapreplace(heap, (rem - (nxt - now), j)); now = nxt
        heapq.heappush(heap, (float(jobs[i]), i)); i += 1
warm = n // 10
res = sorted(((jobs[k], (done[k] - arr[k]) / jobs[k]) for k in range(warm, n)), key=lambda x: x[0])
m = len(res)
out = []
for d in range(10):
    part = sorted(x[1] for x in res[d * m // 10:(d + 1) * m // 10])
    out.append((part[len(part) // 2], part[int(len(part) * 0.99)]))
print(path.split("/")[-1], "p99", " ".join(f"{p99:.2f}" for _, p99 in out), "| p50", " ".join(f"{p50:.2f}" for p50, _ in out))
