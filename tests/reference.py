"""An independent float64 reference of DESIGN §3 (filters and penalties), in numpy."""

from __future__ import annotations

import numpy as np


def penalized(logits, history_counts=None, prompt=(), repetition=1.0, frequency=0.0,
              presence=0.0, bias=None):
    """§3.2–3.4 on a float64 copy: repetition over prompt ∪ output, frequency/presence over
    output counts, then bias."""
    l = np.array(logits, dtype=np.float64)
    l[np.isnan(l)] = -np.inf
    counts = history_counts or {}
    seen = set(prompt) | {t for t, c in counts.items() if c > 0}
    for t in seen:
        if repetition != 1.0:
            l[t] = l[t] / repetition if l[t] > 0 else l[t] * repetition
    for t, c in counts.items():
        if c > 0:
            l[t] -= frequency * c + presence
    for t, b in (bias or {}).items():
        l[t] += b
    return l


def filtered_probs(l, temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0):
    """The exact sampled distribution for processed logits `l` (float64 vector)."""
    l = np.asarray(l, dtype=np.float64)
    V = l.size
    probs = np.zeros(V)
    if temperature == 0.0 or top_k == 1:
        probs[int(np.argmax(l))] = 1.0
        return probs
    z = l / temperature
    order = sorted(np.flatnonzero(np.isfinite(z)), key=lambda i: (-z[i], i))
    if 0 < top_k < V:
        order = order[:top_k]
    order = np.array(order)
    e = np.exp(z[order] - z[order[0]])
    if top_p < 1.0:
        before = np.concatenate([[0.0], np.cumsum(e)[:-1]]) / e.sum()
        keep = before < top_p
        order, e = order[keep], e[keep]
    if min_p > 0.0:
        keep = z[order] >= z[order[0]] + np.log(min_p)
        order, e = order[keep], e[keep]
    probs[order] = e / e.sum()
    return probs


def chi_square_pvalue(samples, probs, min_expected=5.0):
    """Pearson chi-square of sample counts against `probs`, pooling bins whose expected count
    is below `min_expected` into one."""
    from scipy import stats

    samples = np.asarray(samples)
    n = samples.size
    counts = np.bincount(samples, minlength=probs.size).astype(np.float64)
    expected = probs * n
    big = expected >= min_expected
    obs = list(counts[big])
    exp = list(expected[big])
    small_exp = expected[~big].sum()
    if small_exp > 0:
        obs.append(counts[~big].sum())
        exp.append(small_exp)
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp).pvalue)
