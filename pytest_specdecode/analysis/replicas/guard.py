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

import math
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from scipy import stats as _st

from .model import Slot

__all__ = ["matched_differences", "ranks_p"]


def matched_differences(slots: Sequence[Slot], metric: str) -> np.ndarray:
    """Two replicas, two arms: per crossover and prompt, the first period's k-th slot's
    difference less the second's (the module's docstring)."""
    sent: dict[tuple[int, int, object], list[float]] = defaultdict(list)
    for s in slots:
        values = s.values(metric)
        assert values is not None
        sent[(s.period // 2, s.period % 2, s.prompt)].append(math.log(values[1] / values[0]))
    out = []
    for (crossover, half, prompt), first in sent.items():
        if half:
            continue
        second = sent.get((crossover, 1, prompt), [])
        out += [a - b for a, b in zip(first, second, strict=False)]
    return np.array(out, dtype=float)


def ranks_p(slots: Sequence[Slot], metric: str) -> float:
    """The signed-rank test's two-sided p over the matched differences; 1 where there are
    none, or none but ties at zero."""
    found = matched_differences(slots, metric)
    found = found[found != 0.0]
    if not found.size:
        return 1.0
    try:
        p = float(_st.wilcoxon(found, alternative="two-sided").pvalue)
    except ValueError:
        return 1.0
    return p if math.isfinite(p) else 1.0
