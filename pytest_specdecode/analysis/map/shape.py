"""The map on the shape, from a run's record: its depths, the map carried to the full depth, and
what each drafter must accept to pay. Pure.

A shape run (config/shape/: the served model's architecture with random weights, cut to fit)
serves the baseline and the map's servers at the depth it serves, and where the map is carried,
again at one or two shallower depths (`map-d4-baseline`, `map-d4-k3-L1`, ...: config/
break_even.py → `depth_arms`). Every arm's requests give its step time at its depth
(analysis/map/depth.py fits and carries them); the pay-offs come from the carried lines, else
from the map at the depth served (analysis/map/payoff.py). A run of the model as it is served
(no shape) tells the pay-offs at its own depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ...config.arms import BASELINE
from ...config.break_even import MAP_PREFIX, carrier_of, depth_of_arm, point_of
from ...errors import ConfigError
from ...record.schema import RunRecord
from ..verdict.noise import best_estimate
from .break_even import BreakEvenMap, measured_steps
from .depth import DepthMap, StepCell, fit_depths
from .payoff import Payoff, payoffs_at_depth, payoffs_of_map

__all__ = ["MapOnShape", "cells_of_runs", "map_on_shape", "step_cells"]


@dataclass(frozen=True)
class MapOnShape:
    """The map on the shape: the depths measured and the full one, the map carried there (None:
    the full depth served, or one depth only), each drafter's pay-off, and what to know."""

    served: int | None  # the depth the run served (None: the model as it is, depth unknown)
    full: int | None
    depths: tuple[int, ...]
    carried: DepthMap | None
    payoffs: tuple[Payoff, ...]
    notes: tuple[str, ...] = ()
    # the step reader (`step_ms`, `step_cost`) for the prediction: the carried map, or the
    # steps measured where the shape was served whole; None where neither
    steps: DepthMap | None = None

    @property
    def extrapolated(self) -> bool:
        return self.carried is not None

    def statement(self) -> str:
        """What the figures are: measured at the depth served, or an extrapolation."""
        if self.carried is not None:
            c = self.carried
            return (
                f"An extrapolation: each server's step measured at {_and(c.depths)} of "
                f"{c.full_depth} layers, fitted per layer (step = a + b x layers, b the "
                f"layer's cost, a the rest: embeddings, sampler, proposer), carried to "
                f"{c.full_depth}; the interval redraws every request and moves each start "
                f"by a restart noise of {c.restart_noise:.1%}"
            )
        if self.served is not None and self.full is not None and self.served < self.full:
            return f"Measured at {self.served} of {self.full} layers, not carried to {self.full}"
        return "Measured at the depth served"

    def to_json(self) -> dict[str, Any]:
        return {
            "served": self.served,
            "full": self.full,
            "depths": list(self.depths),
            "extrapolated": self.extrapolated,
            "statement": self.statement(),
            "carried": self.carried.to_json() if self.carried else None,
            "steps": (
                self.steps.to_json() if self.steps and self.steps is not self.carried else None
            ),  # measured at the full depth alone
            "payoffs": [p.to_dict() for p in self.payoffs],
            "notes": list(self.notes),
        }


def map_on_shape(record: RunRecord, found: BreakEvenMap | None) -> MapOnShape | None:
    """The run's map on its shape (None where it mapped nothing): carried to the full depth
    where it served two depths or more below it, else the pay-offs at the depth served."""
    if found is None and not any(depth_of_arm(a) for a in record.candidates):
        return None
    served, full = _depths(record)
    cells = step_cells_of_run(record, served) if served is not None else []
    depths = tuple(sorted({c.depth for c in cells}))
    notes: list[str] = []
    carried = None
    if served is not None and full is not None and served < full and len(depths) >= 2:
        noise = best_estimate(record).get("tpot")
        try:
            carried = fit_depths(
                cells,
                full,
                confidence=1.0 - record.run.alpha,
                restart_noise=noise.sd if noise is not None else 0.0,
            )
        except ConfigError as exc:
            notes.append(f"not carried to {full} layers: {exc}")
        if noise is not None and carried is not None:
            notes.append(f"the restart noise: {noise.sd:.1%} ({noise.source})")
    elif served is not None and full is not None and served < full:
        notes.append(
            f"measured at {served} of {full} layers only: two depths carry it to {full} "
            "([shape] layers = [n/2, n], or --spec-shape-layers)"
        )
    steps = carried
    if carried is None and served is not None and served == full and depths == (full,):
        noise = best_estimate(record).get("tpot")
        try:
            steps = fit_depths(cells, full, confidence=1.0 - record.run.alpha,
                               restart_noise=noise.sd if noise is not None else 0.0)  # fmt: skip
        except ConfigError:  # no baseline measured: no step to read
            steps = None
    if carried is not None:
        payoffs = payoffs_at_depth(carried.lines, carried.depths, carried.full_depth)
        notes += _linearity(carried)
    elif found is not None:
        where = (
            f"{served} of {full} layers served"
            if served is not None and full is not None and served < full
            else "as served"
        )
        payoffs = payoffs_of_map(found.overall, where)
    else:
        payoffs = []
    return MapOnShape(served, full, depths, carried, tuple(payoffs), tuple(notes), steps)


def _depths(record: RunRecord) -> tuple[int | None, int | None]:
    """(the depth served, the full depth): the shape's, where the run served one."""
    shape = record.shape
    if shape is None:
        return None, None
    return shape.layers, shape.full


def _linearity(carried: DepthMap) -> list[str]:
    """With three depths or more: where a server's step is not a line in the layers."""
    bent = [
        f"{f.server} at {f.level} ({f.worst_residual:.1%})"
        for f in carried.fits
        if f.worst_residual is not None and f.worst_residual > 0.03
    ]
    if not bent:
        checked = any(f.worst_residual is not None for f in carried.fits)
        return ["every server's step is a line in the layers within 3%"] if checked else []
    return [f"not a line in the layers (the largest miss at a depth measured): {', '.join(bent)}"]


def _and(values: Sequence[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]


# --- the cells ---------------------------------------------------------------------------------


def step_cells_of_run(record: RunRecord, served: int) -> list[StepCell]:
    """Every arm of the map at its depth: the baseline and the map's servers at the depth
    served, `map-d<n>-...` at n, each keyed as its server at the depth served."""
    out: list[StepCell] = []
    for arm in [BASELINE, *record.candidates]:
        depth = depth_of_arm(arm)
        spec = record.candidates.get(arm) if arm != BASELINE else None
        if depth is None and arm != BASELINE and point_of(spec or {}) is None:
            continue  # a hypothesis, not the map's
        key = _server(arm)
        out += step_cells(record, depth if depth is not None else served, arms={arm: key})
    return out


def _server(arm: str) -> str:
    """`map-d4-k3-L1` → `map-k3-L1`; `map-d4-baseline` → BASELINE."""
    if depth_of_arm(arm) is None:
        return arm
    rest = arm[len(MAP_PREFIX) :].split("-", 1)[1]
    return BASELINE if rest == "baseline" else MAP_PREFIX + rest


def step_cells(
    record: RunRecord, depth: int, *, arms: dict[str, str] | None = None
) -> list[StepCell]:
    """The step times of a run's arms (default: the baseline and each map server) at `depth`
    layers, per load level, prompt types as strata. A map server's tokens per step are its
    counters' (else the asked L: a drafter with a model proposes k every step)."""
    if arms is None:
        arms = {BASELINE: BASELINE}
        arms.update({c: c for c, spec in record.candidates.items() if point_of(spec)})
    out: list[StepCell] = []
    for arm, key in arms.items():
        spec = record.candidates.get(arm) if arm != BASELINE else None
        point = point_of(spec) if spec else None
        for level in record.run.levels:
            cells = [m for p in record.arm_phases(arm) for m in p.measurements.values()
                     if m.level.label == level.label and m.tpot_ms]  # fmt: skip
            if not cells:
                continue
            x = 1.0
            if point is not None:
                counted = measured_steps(cells).tokens_per_step
                x = counted if counted is not None else point[1]
            out.append(StepCell(
                key, level.label, depth, tuple(tuple(v * x for v in m.tpot_ms) for m in cells),
                x, carrier_of(spec) if point and spec else "", point[0] if point else None,
                point[1] if point else None,
            ))  # fmt: skip
    return out


def cells_of_runs(runs: Sequence[tuple[int, RunRecord]]) -> list[StepCell]:
    """Runs of one shape at several depths (one run each), their cells together; a ConfigError
    where two runs served one depth (which start's step would the line take?)."""
    seen = [depth for depth, _ in runs]
    twice = sorted({d for d in seen if seen.count(d) > 1})
    if twice:
        raise ConfigError(f"two runs served {twice} layers: give one run per depth")
    return [c for depth, record in runs for c in step_cells(record, depth)]
