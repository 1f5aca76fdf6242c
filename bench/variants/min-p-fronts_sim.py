"""Evidence for `min-p-fronts.patch`: a Python mirror of its algorithm (histogram_cut_min_p.cuh:
thread fronts of kThreadFront members, the bar of the block's running maximum, the chunk front
of kChunkFront members, the exactness test at tau), in exact arithmetic, against brute force.

Asserts that every row the fronts call exact gets the brute-force token, and prints how often
rows are exact (the rest fall back to the select kernel's read). Tokens reach a thread in the
kernel's order (rounds of 4 groups of 4 tokens a thread). Run: python3 min-p-fronts_sim.py [N]
"""

import math
import random
import sys

THREAD_FRONT, CHUNK_FRONT = 8, 16
NONE = (-math.inf, 1 << 30)


def beats(a, b):
    """(score, id) order: the higher score, ties to the lower id."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


def offer(front, lossy, z, c, bar):
    """offer_to_front: front is [(z, candidate)] in falling z; returns the new lossy mark."""
    new, placed, dominated = [], False, False
    for zk, ck in front:
        if zk >= z and not beats(c, ck):
            dominated = True
        if not placed and zk < z:
            new.append((z, c))
            placed = True
        if (zk <= z and beats(c, ck)) or zk < bar:
            continue
        new.append((zk, ck))
    if dominated:
        return lossy
    if not placed:
        new.append((z, c))
    if len(new) > THREAD_FRONT:
        lossy = max(lossy, new.pop()[0])
    front[:] = new
    return lossy


def chunk_front(xs, z, noise, begin, end, threads, temperature, log_min_p):
    """Kernel 1 over one chunk: (members, lossy_below, exact_to)."""
    fronts = [[] for _ in range(threads)]
    lossy = [-math.inf] * threads
    block_max = -math.inf

    def bar_of(m):
        return m / temperature + log_min_p - 1e-5 * (abs(m / temperature) + abs(log_min_p))

    for start in range(begin, end, threads * 16):
        for u in range(4):
            for t in range(threads):
                group = [i for i in range(start + 4 * (u * threads + t),
                                          start + 4 * (u * threads + t) + 4) if i < end]
                if not group:
                    continue
                block_max = max(block_max, max(xs[i] for i in group))
                bar = bar_of(block_max)
                for i in group:
                    if z[i] >= bar:
                        lossy[t] = offer(fronts[t], lossy[t], z[i], (z[i] + noise[i], i), bar)
    members = [m for f in fronts for m in f]
    out, above, strict, exact_to = [], bar_of(block_max), False, math.inf
    while True:
        rest = [m for m in members if (m[0] > above if strict else m[0] >= above)]
        if not rest:
            break
        best = rest[0]
        for m in rest:
            if beats(m[1], best[1]):
                best = m
        if len(out) == CHUNK_FRONT:
            exact_to = above
            break
        out.append(best)
        above, strict = best[0], True
    return out, max(lossy), exact_to


def row_token(xs, temperature, min_p, chunks, threads, rng):
    """(exact, token from the fronts, brute-force token) for one row."""
    z = [x / temperature for x in xs]
    noise = [-math.log(-math.log(rng.random())) for _ in xs]
    log_min_p = math.log(min_p)
    tau = max(z) + log_min_p
    truth = NONE
    for i, zi in enumerate(z):
        if zi >= tau and beats((zi + noise[i], i), truth):
            truth = (zi + noise[i], i)
    size = (len(xs) + chunks - 1) // chunks
    exact, got = True, NONE
    for j in range(chunks):
        members, lossy_below, exact_to = chunk_front(
            xs, z, noise, j * size, min(len(xs), (j + 1) * size), threads, temperature, log_min_p)
        exact = exact and lossy_below < tau <= exact_to
        for zk, ck in members:
            if zk >= tau and beats(ck, got):
                got = ck
    return exact, got, truth


def main(n):
    # Per-thread token counts of the H100 benchmark: ~150 (128 rows), ~600 (512 rows).
    shapes = [("randn sigma 1, 150 a thread", 1.0, 2, 64),
              ("randn sigma 1, 600 a thread", 1.0, 1, 32),
              ("randn sigma 4, 150 a thread", 4.0, 2, 64)]
    for name, sigma, chunks, threads in shapes:
        for min_p in (0.2, 0.05, 0.01, 0.001):
            rng = random.Random(17)
            exact_rows = 0
            for _ in range(n):
                xs = [rng.gauss(0.0, sigma) for _ in range(20000)]
                exact, got, truth = row_token(xs, 0.7, min_p, chunks, threads, rng)
                assert not exact or got == truth
                exact_rows += exact
            print(f"{name}, T 0.7, min_p {min_p}: exact {exact_rows} / {n}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 6)
