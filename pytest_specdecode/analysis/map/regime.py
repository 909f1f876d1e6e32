"""The regime: what serving N servers beside the baseline cost it, measured in the same run.

Beside two or more, the run first measures the baseline start with one server beside it (the
regime window, `RunRecord.regime`), then the same start beside all N in the main rounds. The
figure is the baseline's throughput beside N over its throughput beside one: one start, so no
restart noise; `log value = window + prompt + residual` (analysis/variance/restarts.py
`fit_starts`), the prompt types pooled by labelling each prompt with its cell. Where the whole
interval lies below 1 - tolerance, the map and verdicts were measured in a slowed regime, and
the next plan serves fewer beside (`fallback_beside`). Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...record.measurement import Measurement
from ...record.schema import RunRecord
from ..variance.restarts import fit_starts, t_quantile

SLOWED = "slowed"  # the whole interval beyond the tolerance, on the slow side
WITHIN = "within"  # not slower than the tolerance, nor wholly faster than it
FASTER = "faster"  # the whole interval beyond the tolerance, on the fast side: not slowed,
# but the baseline's speed moved between the window and the rounds (a host-bound server drifts)
UNCLEAR = "unclear"  # the interval reaches both sides of it

METRIC = "tokens_per_s"  # a request's output tokens per second


@dataclass(frozen=True)
class RegimeFigure:
    """The baseline beside N over beside one, on one cell or pooled over them."""

    ratio: float
    low: float
    high: float
    n_one: int  # requests beside one
    n_beside: int  # requests beside N

    def to_dict(self) -> dict[str, Any]:
        return {
            "ratio": _finite(self.ratio),
            "ratio_ci": [_finite(self.low), _finite(self.high)],
            "n_one": self.n_one,
            "n_beside": self.n_beside,
        }

    def text(self) -> str:
        return (
            f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}], "
            f"{self.n_one} requests beside one, {self.n_beside} beside all"
        )


@dataclass(frozen=True)
class Regime:
    """One run's regime: the baseline start `phase` beside `beside` servers against beside one."""

    phase: str
    beside: int
    neighbour: str
    tolerance: float
    confidence: float
    pooled: RegimeFigure
    cells: dict[str, RegimeFigure] = field(default_factory=dict)
    arms: tuple[str, ...] = ()  # the arms measured beside all N: the baseline and its candidates

    @property
    def state(self) -> str:
        floor = 1.0 - self.tolerance
        if self.pooled.high < floor:
            return SLOWED
        if self.pooled.low > 1.0 + self.tolerance:
            return FASTER
        return WITHIN if self.pooled.low >= floor else UNCLEAR

    @property
    def slowed(self) -> bool:
        return self.state == SLOWED

    def marks(self, arm: str | None = None) -> bool:
        """Whether `arm` (None: the map) was measured in a slowed regime."""
        return self.slowed and (arm is None or arm in self.arms)

    def text(self) -> str:
        """One sentence for the terminal, summary.md and report.html."""
        n, tol = self.beside, f"{self.tolerance:.0%}"
        figure = f"{self.pooled.text()}, {self.confidence:.0%} interval"
        if self.state == SLOWED:
            return (
                f"the baseline ran {1 - self.pooled.ratio:.0%} slower beside {n} servers than "
                f"beside one ({figure}; tolerance {tol}): the map and the verdicts measured "
                f"beside {n} were measured in another regime than production's"
            )
        if self.state == FASTER:
            return (
                f"the baseline ran {self.pooled.ratio - 1:.0%} faster beside {n} servers than "
                f"beside one ({figure}; tolerance {tol}): beyond the tolerance on the fast side, "
                f"so its neighbours did not slow it, but its own speed moved between the window "
                f"and the rounds by more than the tolerance; the verdicts and the map compare "
                f"servers measured in the same rounds"
            )
        if self.state == WITHIN:
            return (
                f"the baseline beside {n} servers ran within {tol} of its speed beside one "
                f"({figure})"
            )
        spread = regime_spread(self)
        alpha = (1.0 - self.confidence) / 2.0
        needed = (
            f"about {regime_requests(self.tolerance, spread, alpha=alpha)} requests beside one "
            f"would tell at this spread ({spread:.1%} a request)"
            if spread is not None
            else "more slots in the regime window would tell"
        )
        return (
            f"the baseline beside {n} servers against beside one: {figure}; neither beyond the "
            f"tolerance of {tol} nor within it ({needed}; [run] regime_slots)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "beside": self.beside,
            "neighbour": self.neighbour,
            "metric": METRIC,
            "tolerance": self.tolerance,
            "confidence": self.confidence,
            "state": self.state,
            "slowed": self.slowed,
            "text": self.text(),
            "pooled": self.pooled.to_dict(),
            "cells": {k: f.to_dict() for k, f in self.cells.items()},
            "arms": list(self.arms),
        }


def regime_of(record: RunRecord) -> Regime | None:
    """The run's regime figure from its recorded requests; None without a regime window, or
    where its baseline start has no requests to compare it with."""
    window = record.regime
    phase = record.phases.get(window.phase) if window else None
    if window is None or phase is None:
        return None
    confidence = 1.0 - 2.0 * record.run.alpha
    pairs = [
        (key, one, phase.measurements[key])
        for key, one in window.measurements.items()
        if key in phase.measurements
    ]
    cells = {
        key: figure
        for key, one, many in pairs
        if (figure := regime_figure([(key, one, many)], confidence)) is not None
    }
    pooled = regime_figure(pairs, confidence)
    if pooled is None:
        return None
    return Regime(
        window.phase,
        window.beside,
        window.neighbour,
        window.tolerance,
        confidence,
        pooled,
        cells,
        arms=tuple(
            dict.fromkeys(
                p.arm
                for p in record.phases.values()
                if p.name == window.phase or p.together_with == window.phase
            )
        ),
    )


def regime_figure(
    cells: Sequence[tuple[str, Measurement, Measurement]], confidence: float
) -> RegimeFigure | None:
    """Beside N over beside one, over these cells (key, beside one, beside N): each prompt of
    each cell its own level where the requests pair by prompt; None with too few requests."""
    one: list[tuple[float, str]] = []
    many: list[tuple[float, str]] = []
    for key, a, b in cells:
        one += _values(key, a)
        many += _values(key, b)
    if not one or not many or len(one) + len(many) < 3:
        return None
    labels = {label: i for i, label in enumerate(sorted({p for _, p in one + many}))}
    groups = [np.log([v for v, _ in side]) for side in (one, many)]
    prompts = [[labels[p] for _, p in side] for side in (one, many)]
    fit = fit_starts(groups, prompts)
    if not fit.residual_df or not math.isfinite(fit.residual_var):
        return None
    estimate = float(fit.effects[1] - fit.effects[0])
    var = fit.residual_var * float(fit.cov[0, 0] + fit.cov[1, 1] - 2 * fit.cov[0, 1])
    half = t_quantile(0.5 + confidence / 2, fit.residual_df) * math.sqrt(max(var, 0.0))
    return RegimeFigure(
        math.exp(estimate),
        math.exp(estimate - half),
        math.exp(estimate + half),
        len(one),
        len(many),
    )


def _values(key: str, m: Measurement) -> list[tuple[float, str]]:
    """A cell's values with their prompt's label (the cell and the prompt's index)."""
    return [(v, f"{key}#{i}") for v, i in m.by_prompt(METRIC)]


# --------------------------------------------------------------------------- the window's size

REGIME_POWER = 0.80  # the window settles its tolerance this often where it holds (or is missed)
MOST_REQUESTS = 10_000  # no window beyond this: the search for its size stops here


def regime_requests(
    tolerance: float, sd: float, *, alpha: float, power: float = REGIME_POWER
) -> int:
    """Requests beside one (each paired by its prompt with one beside all N) for the regime's
    `1 - 2 alpha` interval to lie wholly within, or wholly beyond, `1 - tolerance` with this
    power, at a request's spread `sd` (log, one side): the least n with `sqrt(2 sd^2 / n) (t(1 -
    alpha, n - 1) + t(power, n - 1)) <= -log(1 - tolerance)` (`regime_figure` fits each prompt's
    level, so n pairs leave n - 1 degrees of freedom). MOST_REQUESTS where none is enough."""
    margin = -math.log1p(-tolerance)
    if sd <= 0.0:
        return 2
    n = 2
    while n < MOST_REQUESTS:
        df = n - 1
        se = sd * math.sqrt(2.0 / n)
        if se * (t_quantile(1.0 - alpha, df) + t_quantile(power, df)) <= margin:
            return n
        n += 1 if n < 64 else max(1, n // 16)
    return MOST_REQUESTS


def regime_spread(regime: Regime) -> float | None:
    """A request's spread (log, one side) that a measured regime shows: its pooled interval's
    half-width over its t quantile, as `regime_requests` takes it (n pairs: the requests beside
    one, each paired with one beside all N); None where it cannot tell."""
    fig, n = regime.pooled, regime.pooled.n_one
    if n < 2 or not (fig.high > fig.low > 0.0):
        return None
    half = (math.log(fig.high) - math.log(fig.low)) / 2.0
    se = half / t_quantile(0.5 + regime.confidence / 2.0, n - 1)
    return se * math.sqrt(n / 2.0)


@dataclass(frozen=True)
class RegimeSize:
    """The regime window a plan sends: its slots per cell (0: left out), the requests that
    would settle the tolerance at the spread assumed, and why it is left out, if it is."""

    slots: int
    needed: int
    spread: float
    left_out: str | None = None


def regime_size(
    cells: int, most_slots: int, *, tolerance: float, alpha: float, spread: float
) -> RegimeSize:
    """The window sized to settle its tolerance with REGIME_POWER at a request's `spread`:
    enough slots per cell (of `cells`) for `regime_requests`; left out, with the reason,
    where that is more slots than a cell sends beside all N (`most_slots`): its requests pair
    with those, so more could not settle it."""
    needed = regime_requests(tolerance, spread, alpha=alpha)
    slots = max(1, math.ceil(needed / max(1, cells)))
    if slots <= most_slots:
        return RegimeSize(slots, needed, spread)
    why = (
        f"the regime window would need {needed} requests beside one ({slots} slots a cell, "
        f"more than the {most_slots} a cell sends beside all) to settle {tolerance:.0%} with "
        f"{REGIME_POWER:.0%} power at a request's spread of {spread:.1%}"
    )
    return RegimeSize(0, needed, spread, why)


def fallback_beside(asked: int, measured: Sequence[tuple[str, Regime]]) -> tuple[int, str | None]:
    """How many servers beside the baseline this plan serves, from the regimes stored runs
    measured on this machine (newest first, each named by its run): `asked`, unless a run
    measured the baseline slowed beside N <= asked; then the largest N measured within the
    tolerance below the least slowed, else 1 (one candidate beside the baseline). With why."""
    latest: dict[int, tuple[str, Regime]] = {}
    for run, regime in measured:
        latest.setdefault(regime.beside, (run, regime))  # the newest measurement of each N
    slowed = sorted(n for n, (_, r) in latest.items() if r.slowed and n <= asked)
    if not slowed:
        return asked, None
    least = slowed[0]
    within = [n for n, (_, r) in latest.items() if r.state in (WITHIN, FASTER) and n < least]
    chosen = max(within, default=1)
    run, regime = latest[least]
    why = (
        f"{chosen} beside the baseline, not {asked}: the stored run {run} measured the "
        f"baseline {1 - regime.pooled.ratio:.0%} slower beside {least} servers than beside one "
        f"(tolerance {regime.tolerance:.0%})"
    )
    if chosen > 1:
        why += f"; beside {chosen} the run {latest[chosen][0]} measured it within its tolerance"
    return chosen, why


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
