"""What an early stop does to the estimate: a cell that stops at an early look overstates its
change, and by how much. Pure.

A cell stops at the first look whose interval lies wholly beyond the margin (or wholly inside
it); at an early look only an estimate far out stops, so the estimates of the cells that stopped
there lie further out than the change they measure (a true -20% stopped at the first of four
looks printed about -27%: docs/statistics.md, "Stop when decided"). The printed interval keeps
its coverage (it is taken at the look's boundary); the estimate does not.

`stopped_mean` is the mean estimate of the cells that stop at a given look on the canonical
process: each look's estimate is the change plus an error whose variance is that look's, the
later look's error the earlier's plus an independent part (the slots added), and each look
stops as `decide` does, on that look's half-width. `overstated` is that mean's excess over the
change, at the change the cell printed: what the report says of an early stop. It is not
subtracted from the estimate. The conditional bias-adjusted estimate (Troendle & Yu 1999), the
change whose stopped cells print this estimate on average, overcorrected on the calibration's
cells (a true -20% stopped at the second look printed -30%, corrected to -11%): the looks'
standard errors hold the prompts' own speed-ups until the prompts repeat, which the estimate
does not, and the half-widths are themselves estimated, so the stop selects on the estimate
less than the canonical process does. At the printed change, the excess understates the
overstatement of a smaller change, and the note says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["DRAWS", "overstated", "stopped_mean"]

DRAWS = 4000  # the canonical process's paths (a fixed seed: the same cell, the same figure)
_SEED = 20261207


def _errors(sds: Sequence[float], draws: int) -> np.ndarray:
    """Paths of the looks' estimation errors (draws x looks): the last look's error has its
    variance; each earlier one adds an independent part, so `cov(e_i, e_j) = var(e_j)` for the
    later look j (nested slots)."""
    var = np.maximum.accumulate(np.square(np.asarray(sds, dtype=float))[::-1])[::-1]
    z = np.random.default_rng(_SEED).standard_normal((draws, var.size))
    parts = np.sqrt(np.diff(var[::-1], prepend=0.0))[::-1]  # the last look's, then increments
    return np.cumsum((z * parts)[:, ::-1], axis=1)[:, ::-1]


def _first_stop(estimates: np.ndarray, widths: np.ndarray, low: float, high: float) -> np.ndarray:
    """Per path, the first look where the interval lies wholly outside (low, high) or wholly
    inside it; -1 where none does."""
    lo, hi = estimates - widths, estimates + widths
    stops = (hi < low) | (lo > high) | ((lo > low) & (hi < high))
    first = np.argmax(stops, axis=1)
    return np.where(stops.any(axis=1), first, -1)


def stopped_mean(
    change: float,
    sds: Sequence[float],
    widths: Sequence[float],
    *,
    low: float,
    high: float,
    below: bool,
    draws: int = DRAWS,
) -> float | None:
    """The mean estimate at the last of these looks over the paths that stop there first, with
    the interval wholly below `low` (`below`) or above `high`, at a true `change`; None where
    no path does. `sds`: each look's standard error; `widths`: each look's half-width."""
    errors = _errors(sds, draws)
    estimates = change + errors
    first = _first_stop(estimates, np.asarray(widths, dtype=float), low, high)
    last = estimates[:, -1]
    side = (last + widths[-1] < low) if below else (last - widths[-1] > high)
    kept = last[(first == len(sds) - 1) & side]
    return float(kept.mean()) if kept.size else None


def overstated(
    estimate: float,
    sds: Sequence[float],
    widths: Sequence[float],
    *,
    low: float,
    high: float,
    draws: int = DRAWS,
) -> float:
    """How much further out than the change the cells that stop at the last of these looks
    print on average, were the change the printed `estimate` (log scale, >= 0); 0 where the
    estimate is no call beyond the margin."""
    below = estimate + widths[-1] < low
    if not below and not estimate - widths[-1] > high:
        return 0.0
    found = stopped_mean(estimate, sds, widths, low=low, high=high, below=below, draws=draws)
    if found is None:
        return 0.0
    return max(0.0, (estimate - found) if below else (found - estimate))
