"""The ranks' guard of a crossover across replicas: every verdict's second word. Pure.

Two replicas and two arms: within each crossover, the k-th slot of a prompt in its first period
is matched with the k-th slot of the same prompt in its second; each pair's `d_first -
d_second` (`d = log(B) - log(A)`) is `2 delta` plus its starts' and slots' noise, the prompt's
own levels and replica effect cancelled. The guard is Wilcoxon's signed-rank test over those
differences: with nothing in them, they are independent and symmetric about 0, so its null is
right whatever the prompts do.

Koch's test was the guard before (Mann-Whitney of the first period's differences against the
second's, each prompt's mean difference over both periods taken out). With each prompt once a
period, the second period's aligned values are the first's negatives, and the test's null (two
independent samples) does not hold: it rejected 9-13% of runs with nothing in them.

The starts are not the guard's business: the interval carries them; the guard only checks that
the slots' ranks agree with it.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy import stats as _st

from .model import Table

__all__ = ["matched_differences", "ranks_p", "signed_rank_p"]


def matched_differences(table: Table, metric: str) -> np.ndarray:
    """Two replicas, two arms: per crossover and prompt, the first period's k-th slot's
    difference less the second's (the module's docstring)."""
    logs = table.logs[metric]
    d = logs[:, 1] - logs[:, 0]
    crossover, second = table.period // 2, table.period % 2
    out = []
    for c in np.unique(crossover):
        for prompt in np.unique(table.prompt[crossover == c]):
            here = (crossover == c) & (table.prompt == prompt)
            first, then = d[here & (second == 0)], d[here & (second == 1)]
            k = min(first.size, then.size)
            out.append(first[:k] - then[:k])
    return np.concatenate(out) if out else np.zeros(0)


def ranks_p(table: Table, metric: str) -> float:
    """The signed-rank test's two-sided p over the matched differences; 1 where there are
    none, or none but ties at zero."""
    return signed_rank_p(matched_differences(table, metric))


EXACT = 50  # up to this many differences without ties, the exact null distribution


def signed_rank_p(found: np.ndarray) -> float:
    """Wilcoxon's signed-rank test, two-sided (zeros dropped, as scipy's default): exact up
    to EXACT differences without ties, else the normal approximation with the ties'
    correction (scipy's `wilcoxon` gives the same; this skips its per-call handling, which
    took half a crossover's analysis)."""
    x = found[found != 0.0]
    n = x.size
    if not n:
        return 1.0
    size = np.abs(x)
    order = np.argsort(size, kind="stable")
    ranks = np.empty(n)
    ranks[order] = np.arange(1, n + 1, dtype=float)
    _, inverse, counts = np.unique(size, return_inverse=True, return_counts=True)
    tied = counts.size < n
    if tied:  # average ranks within ties
        ranks = (np.bincount(inverse, weights=ranks) / counts)[inverse]
    w = float(ranks[x > 0].sum())
    if n <= EXACT and not tied:
        dist = _null(n)
        at = round(w)
        below, above = dist[: at + 1].sum(), dist[at:].sum()
        return float(min(1.0, 2.0 * min(below, above)))
    mean = n * (n + 1) / 4.0
    var = n * (n + 1) * (2 * n + 1) / 24.0 - float(np.sum(counts**3 - counts)) / 48.0
    if var <= 0:
        return 1.0
    z = abs(w - mean) / math.sqrt(var)
    return float(min(1.0, 2.0 * _st.norm.sf(max(z, 0.0))))


@functools.lru_cache(maxsize=64)
def _null(n: int) -> np.ndarray:
    """The exact null distribution of the signed-rank sum for `n` untied differences."""
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k].copy()
    return counts / 2.0**n
