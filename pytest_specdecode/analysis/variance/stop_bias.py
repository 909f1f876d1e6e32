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
change. The report gives it at two changes, the printed one and the end of the printed
interval nearer no change, and subtracts nothing from the estimate: at the printed change it
is the overstatement of a change that large (near nothing for a change far past the boundary),
at the interval's near end that of the smallest change the interval allows (the estimate then
stops at about the boundary's edge), and the calibration's overstatements lay between the two.
A point correction, the conditional bias-adjusted estimate (Troendle & Yu 1999: the change
whose stopped cells print this estimate on average), overcorrected on the calibration's cells
(a true -20% stopped at the second look printed -30% on average, "corrected" to -11%): most
cells that stop on a modest change stop just past the boundary, where it is pulled to the
interval's end.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["DRAWS", "MIN_PATHS", "overstated", "stopped_mean"]

DRAWS = 4000  # the canonical process's paths (a fixed seed: the same cell, the same figure)
_SEED = 20261207
MIN_PATHS = 20  # fewer stopped paths than this: the mean is the boundary's edge


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
    fewer than `MIN_PATHS` do. `sds`: each look's standard error; `widths`: its half-width."""
    errors = _errors(sds, draws)
    estimates = change + errors
    first = _first_stop(estimates, np.asarray(widths, dtype=float), low, high)
    last = estimates[:, -1]
    side = (last + widths[-1] < low) if below else (last - widths[-1] > high)
    kept = last[(first == len(sds) - 1) & side]
    return float(kept.mean()) if kept.size >= MIN_PATHS else None


def overstated(
    change: float,
    sds: Sequence[float],
    widths: Sequence[float],
    *,
    low: float,
    high: float,
    below: bool,
    draws: int = DRAWS,
) -> float:
    """How much further from no change than a true `change` the cells that stop at the last of
    these looks, below `low` (`below`) or above `high`, print on average (log scale). Where
    almost none stop there (a change far inside the boundary), their mean is the boundary's
    edge, the least estimate that stops: the limit of a normal's far tail."""
    found = stopped_mean(change, sds, widths, low=low, high=high, below=below, draws=draws)
    if found is None:
        found = (low - widths[-1]) if below else (high + widths[-1])
    return (change - found) if below else (found - change)
