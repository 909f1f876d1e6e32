"""Group-sequential boundaries: how much of a one-sided alpha each look at the data may spend.
Pure.

A cell served side by side is looked at a few times (`LOOKS` of its planned slots). At each
look the change's statistic `Z_k = estimate_k / se_k` is compared with a boundary `c_k`; the
boundaries are chosen so that, with no change, the chance that `Z` ever crosses them is at most
`alpha` (Lan-DeMets alpha spending).

What a look may spend is set by the plan, not by the data: `spent(s) = alpha s^3` (the power
family of Kim & DeMets, rho 3) at `s`, the look's share of the planned slots (`look_times`).
How correlated the looks are is the data's: `t_k`, the information fraction, the variance of
the change's estimate with all planned slots over its variance at look k. Within one pair, the
pair's offset is shared by every slot, so `var(n) = omega^2 + sigma_d^2 / n` and the looks'
statistics have the canonical correlation `sqrt(t_j / t_k)` on these fractions (Jennison &
Turnbull, ch. 7). Spending on the slots' schedule keeps the last look's boundary near the fixed
design's wherever the looks are correlated (the offset dominating: fractions near 1), and within
a fifth of its level where they are not; spending on the fractions themselves would spend
nearly all of alpha at the first look where they lie near 1, and the last look would pay for it
(docs/statistics.md, "Stop when decided"). The boundary is found by the
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

__all__ = [
    "LOOKS",
    "RHO",
    "boundaries",
    "fractions_of",
    "look_slots",
    "look_times",
    "nominal_level",
    "spent",
]

LOOKS = (0.25, 0.5, 0.75, 1.0)  # the looks, as fractions of the planned slots
MIN_LEVEL = 1e-12  # a nominal level below this calls nothing
_STEP = 0.02  # the grid's step, on the scale of the score at full information
_FLOOR = -8.0  # the grid's lower end (the score's SD is at most 1)
RHO = 3.0  # the spending's power, alpha s^RHO; None: O'Brien-Fleming type


def look_slots(planned: int, looks: Sequence[float] = LOOKS) -> tuple[int, ...]:
    """The slot counts at which a cell of `planned` slots is looked at (at least 2 each)."""
    if planned < 1:
        return ()
    found = {min(planned, max(2, math.ceil(f * planned - 1e-9))) for f in looks}
    return tuple(sorted(found | {planned}))


def look_times(looks: Sequence[int], planned: int) -> tuple[float, ...]:
    """When each look spends: its share of the cell's planned slots (at most 1)."""
    return tuple(min(1.0, n / planned) if planned > 0 else 1.0 for n in looks)


def spent(t: float, alpha: float, rho: float | None = RHO) -> float:
    """The one-sided alpha spent by time `t`: `alpha t^rho`, or with `rho` None of O'Brien-Fleming
    type, `2 - 2 Phi(z_{alpha/2} / sqrt(t))`."""
    if t >= 1.0:
        return alpha
    if t <= 0.0:
        return 0.0
    if rho is not None:
        return float(alpha * t**rho)
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


def boundaries(
    fractions: Sequence[float],
    alpha: float,
    times: Sequence[float] | None = None,
    rho: float | None = RHO,
) -> tuple[float, ...]:
    """One-sided z boundaries at looks with these information fractions, spending `alpha` at
    `times` (each look's share of the planned slots; None: the fractions themselves)."""
    fractions = tuple(float(t) for t in fractions)
    times = fractions if times is None else tuple(float(s) for s in times)
    if len(times) != len(fractions):
        raise ValueError(f"{len(times)} spending times for {len(fractions)} looks")
    return _boundaries(fractions, float(alpha), times, rho)


def nominal_level(
    fractions: Sequence[float],
    alpha: float,
    times: Sequence[float] | None = None,
    rho: float | None = RHO,
) -> float:
    """The last look's boundary as a one-sided nominal level (the p below which it calls)."""
    if not fractions:
        return alpha
    level = float(_st.norm.sf(boundaries(fractions, alpha, times, rho)[-1]))
    return max(MIN_LEVEL, min(alpha, level))


@functools.lru_cache(maxsize=8192)
def _boundaries(
    fractions: tuple[float, ...], alpha: float, times: tuple[float, ...], rho: float | None
) -> tuple[float, ...]:
    if not fractions:
        return ()
    t0 = fractions[0]
    first = float(_st.norm.isf(max(spent(times[0], alpha, rho), MIN_LEVEL)))
    out = [first]
    # the score S = Z sqrt(t) on cells below the boundary: their edges and masses
    edges = _cells(first * math.sqrt(t0))
    mass = np.diff(_sp.ndtr(edges / math.sqrt(t0)))
    steps = zip(itertools.pairwise(fractions), itertools.pairwise(times), strict=True)
    for (before, t), (was, now) in steps:
        spread = math.sqrt(max(t - before, 1e-8))
        mids = (edges[:-1] + edges[1:]) / 2.0
        want = spent(now, alpha, rho) - spent(was, alpha, rho)
        b = _next_bound(mids, mass, spread, want, edges[-1])
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
