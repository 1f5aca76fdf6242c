"""Evidence for `top-p-walk.patch`: a Python mirror of its algorithm, in exact arithmetic, against
brute force.

A top-p kept set is a prefix of the rank order (z falling, ties to the lower id), so a row's
token is c_0, its best score z + G, when c_0 is kept, and otherwise the best score among the
tokens ranked before c_0 (c_1) when c_1 is kept. Kernel 1 scores every token whose noise bound
reaches the block's best so far less SLACK nats, keeps each thread's best two scores (winner,
runner-up) and the best score it scored but did not keep (its floor), and writes a chunk's kept
tokens within SLACK of the chunk's best (at most CAP). Every token scoring at least
max(best - SLACK, floors) is then in the row's lists, so c_1 is exact when it scores above that.
Kernel 1a sums the masses before c_0 and before c_1 in its one read; kernel 1b takes c_1 when c_0
is surely not kept and c_1 surely kept. Other rows go the histogram way, as today.

Asserts that every row the walk decides gets the brute-force token and prints how many rows are
decided by c_0, by c_1, and not at all. Tokens reach a thread in the kernel's order (rounds of 4
groups of 4 tokens a thread). Run: python3 top-p-walk_sim.py [rows]
"""

import math
import random
import sys

SLACK, CAP = 2.0, 32
NONE = (-math.inf, 1 << 30)  # a candidate (score, id) every token beats


def beats(a, b):
    """(score, id) order: the higher score, ties to the lower id."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


def chunk_lists(z, noise, begin, end, threads):
    """Kernel 1 over one chunk: (list of (z, candidate), floor score, overflow)."""
    winner = [NONE] * threads
    winner_z = [-math.inf] * threads
    runner = [NONE] * threads
    runner_z = [-math.inf] * threads
    floor = [-math.inf] * threads
    best = NONE  # the block's best so far (best_seen)
    for start in range(begin, end, threads * 16):
        for u in range(4):
            for t in range(threads):
                first = start + 4 * (u * threads + t)
                for i in range(first, min(first + 4, end)):
                    cand = (z[i] + noise[i], i)
                    bar = max(best[0], winner[t][0]) - SLACK
                    if cand[0] < bar:  # the kernel's bound is at least the score
                        continue
                    if beats(cand, winner[t]):
                        floor[t] = max(floor[t], runner[t][0])
                        runner[t], runner_z[t] = winner[t], winner_z[t]
                        winner[t], winner_z[t] = cand, z[i]
                    elif beats(cand, runner[t]):
                        floor[t] = max(floor[t], runner[t][0])
                        runner[t], runner_z[t] = cand, z[i]
                    else:
                        floor[t] = max(floor[t], cand[0])
                    if beats(winner[t], best):
                        best = winner[t]
    limit = best[0] - SLACK
    kept = [(zz, c) for t in range(threads)
            for zz, c in ((winner_z[t], winner[t]), (runner_z[t], runner[t]))
            if c[1] != NONE[1] and c[0] >= limit]
    return kept[:CAP], max(floor), len(kept) > CAP


def row_token(xs, temperature, top_p, chunks, threads, rng):
    """('c0' | 'c1' | None, its token, brute-force token) for one row."""
    z = [x / temperature for x in xs]
    noise = [-math.log(-math.log(rng.random())) for _ in xs]
    z_max = max(z)
    mass = [math.exp(v - z_max) for v in z]
    total = math.fsum(mass)
    order = sorted(range(len(z)), key=lambda i: (-z[i], i))
    before, acc = [0.0] * len(z), 0.0
    for i in order:
        before[i] = acc
        acc += mass[i]
    truth = NONE
    for i in order:
        if before[i] >= top_p * total:
            break
        if beats((z[i] + noise[i], i), truth):
            truth = (z[i] + noise[i], i)

    size = (len(xs) + chunks - 1) // chunks
    entries, floor, overflow = [], -math.inf, False
    for j in range(chunks):
        e, f, o = chunk_lists(z, noise, j * size, min(len(xs), (j + 1) * size), threads)
        entries += e
        floor, overflow = max(floor, f), overflow or o
    c0 = NONE
    c0_z = -math.inf
    for zz, c in entries:
        if beats(c, c0):
            c0, c0_z = c, zz
    # A float sum too close to the limit is a doubt (kernel 1b's bounds).
    def kept(c):
        b = before[c[1]]
        if abs(b - top_p * total) <= 1e-4 * total:
            return None
        return b < top_p * total
    k0 = kept(c0)
    if k0:
        return "c0", c0, truth
    if k0 is None or overflow:
        return None, NONE, truth
    c1 = NONE
    for zz, c in entries:
        if (zz > c0_z or (zz == c0_z and c[1] < c0[1])) and beats(c, c1):
            c1 = c
    if c1 == NONE or c1[0] < c0[0] - SLACK or not c1[0] > floor:
        return None, NONE, truth
    return ("c1", c1, truth) if kept(c1) else (None, NONE, truth)


def main(n):
    # Per-thread token counts of the H100 benchmark: ~150 (128 rows), ~600 (512 rows).
    shapes = [("randn sigma 1, 150 a thread", 1.0, 2, 64),
              ("randn sigma 1, 600 a thread", 1.0, 1, 32),
              ("randn sigma 4, 150 a thread", 4.0, 2, 64)]
    for name, sigma, chunks, threads in shapes:
        for top_p in (0.9, 0.5, 0.99):
            rng = random.Random(17)
            counts = {"c0": 0, "c1": 0, None: 0}
            for _ in range(n):
                xs = [rng.gauss(0.0, sigma) for _ in range(20000)]
                how, got, truth = row_token(xs, 0.7, top_p, chunks, threads, rng)
                assert how is None or got == truth, (name, top_p, got, truth)
                counts[how] += 1
            print(f"{name}, T 0.7, top_p {top_p}: c0 {counts['c0']}, c1 {counts['c1']}, "
                  f"undecided {counts[None]} of {n}", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
