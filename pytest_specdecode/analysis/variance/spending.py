"""Group-sequential boundaries: how much of a one-sided alpha each look at the data may spend.
Pure.

A cell served side by side is looked at a few times (`LOOKS` of its planned slots). At each
look the change's statistic `Z_k = estimate_k / se_k` is compared with a boundary `c_k`; the
boundaries are chosen so that, with no change, the chance that `Z` ever crosses them is at most
`alpha` (Lan-DeMets alpha spending, O'Brien-Fleming type: `spent(t) = 2 - 2 Phi(z_{alpha/2} /
sqrt(t))`, which spends almost nothing early and keeps the last look's boundary near the
fixed design's).

`t_k` is the information fraction: the variance of the change's estimate with all planned
slots over its variance at look k. Within one pair, the pair's offset is shared by every slot,
so `var(n) = omega^2 + sigma_d^2 / n` and the looks' statistics have the canonical correlation
`sqrt(t_j / t_k)` on these fractions (Jennison & Turnbull, ch. 7): where the offset dominates,
the fractions lie near 1 and an early look costs little. The boundary is found by the
Armitage-McPherson-Rowe recursion on a grid, so the same fractions give the same boundary.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize as _opt
from scipy import special as _sp
from scipy import stats as _st

__all__ = ["LOOKS", "boundaries", "fractions_of", "look_slots", "nominal_level", "spent"]

LOOKS = (0.25, 0.5, 0.75, 1.0)  # the looks, as fractions of the planned slots
MIN_LEVEL = 1e-12  # a nominal level below this calls nothing
_STEP = 0.02  # the grid's step, on the scale of the score at full information
_FLOOR = -8.0  # the grid's lower end (the score's SD is at most 1)


def look_slots(planned: int, looks: Sequence[float] = LOOKS) -> tuple[int, ...]:
    """The slot counts at which a cell of `planned` slots is looked at (at least 2 each)."""
    if planned < 1:
        return ()
    found = {min(planned, max(2, math.ceil(f * planned - 1e-9))) for f in looks}
    return tuple(sorted(found | {planned}))


def spent(t: float, alpha: float) -> float:
    """The one-sided alpha spent by information fraction `t` (O'Brien-Fleming type)."""
    if t >= 1.0:
        return alpha
    if t <= 0.0:
        return 0.0
    return float(2.0 * _st.norm.sf(_st.norm.isf(alpha / 2.0) / math.sqrt(t)))


def fractions_of(variances: Sequence[float], final: float) -> tuple[float, ...]:
    """Information fractions from the estimate's variance at each look and with all planned
    slots; rounded down to 0.01 (the boundary is cached on them; lower fractions assume less
    correlated looks, which errs on the safe side), increasing, the last at most 1."""
    out: list[float] = []
    for v in variances:
        t = min(1.0, final / v) if v > 0 and math.isfinite(v) else 1.0
        t = max(0.01, math.floor(t * 100 + 1e-9) / 100)
        out.append(max(t, out[-1]) if out else t)
    return tuple(out)


def boundaries(fractions: Sequence[float], alpha: float) -> tuple[float, ...]:
    """One-sided z boundaries at looks with these information fractions, spending `alpha`."""
    return _boundaries(tuple(float(t) for t in fractions), float(alpha))


def nominal_level(fractions: Sequence[float], alpha: float) -> float:
    """The last look's boundary as a one-sided nominal level (the p below which it calls)."""
    if not fractions:
        return alpha
    level = float(_st.norm.sf(boundaries(fractions, alpha)[-1]))
    return max(MIN_LEVEL, min(alpha, level))


@functools.lru_cache(maxsize=8192)
def _boundaries(fractions: tuple[float, ...], alpha: float) -> tuple[float, ...]:
    if not fractions:
        return ()
    t0 = fractions[0]
    first = float(_st.norm.isf(max(spent(t0, alpha), MIN_LEVEL)))
    out = [first]
    # the score S = Z sqrt(t) on cells below the boundary: their edges and masses
    edges = _cells(first * math.sqrt(t0))
    mass = np.diff(_sp.ndtr(edges / math.sqrt(t0)))
    for before, t in itertools.pairwise(fractions):
        spread = math.sqrt(max(t - before, 1e-8))
        mids = (edges[:-1] + edges[1:]) / 2.0
        b = _next_bound(mids, mass, spread, spent(t, alpha) - spent(before, alpha), edges[-1])
        out.append(b / math.sqrt(t))
        new = _cells(b)
        mass = mass @ np.diff(_sp.ndtr((new[None, :] - mids[:, None]) / spread), axis=1)
        edges = new
    return tuple(out)


def _cells(upper: float) -> np.ndarray:
    """The grid's edges from the floor up to `upper` (a boundary on the score's scale)."""
    edges = np.arange(_FLOOR, upper + _STEP, _STEP)
    edges[-1] = upper
    return edges


def _next_bound(
    mids: np.ndarray, mass: np.ndarray, spread: float, want: float, last: float
) -> float:
    """The next look's boundary on the score's scale: the chance of crossing it from the mass
    still below the last boundary, by an increment of SD `spread`, is `want`."""

    def crossing(b: float) -> float:
        return float(mass @ _sp.ndtr((mids - b) / spread))

    top = last + 12.0 * spread
    if want <= 0.0 or crossing(top) >= want:
        return top  # nothing left to spend here
    if crossing(_FLOOR) <= want:
        return _FLOOR
    return float(_opt.brentq(lambda x: crossing(x) - want, _FLOOR, top))
