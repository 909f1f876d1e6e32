"""Adaptive samples: when a start has sent enough requests (a rule on the spread alone).

Requests are cheap and starts are not. A start keeps sending requests for a prompt type until
its effect, the prompts' own levels removed, is pinned down: its standard error at most the
larger of the restart noise and half the margin. Past that point the requests' share of a
start's variance is at most what no number of requests removes, so more of them barely narrow
a verdict's interval (docs/statistics.md has the simulation). The rule reads the residual
spread, never the values' level, so stopping on it does not bias the comparison.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from ...record.measurement import Measurement
from ..variance.restarts import fit_starts

__all__ = ["pinned", "target_se"]

METRIC_VALUES = {"throughput": "tokens_per_s", "tpot": "tpot_ms"}
MIN_RESIDUAL_DF = 3  # below this, the fit's own residual is not trusted yet


def target_se(noise_sd: float, min_effect: float) -> float:
    """How tightly a start's effect must be pinned down (log scale)."""
    return max(noise_sd, math.log1p(min_effect) / 2)


def pinned(
    earlier: Sequence[Measurement],
    current: Measurement,
    *,
    target: float,
    residual: Mapping[str, float | None] | None = None,
) -> bool:
    """Whether the current start's requests pin its effect down on every metric.

    `earlier` are the run's earlier starts of the same prompt type and level: where the
    requests pair by prompt, the prompts' levels are learnt from them. `residual` is a
    request's variance around its start and prompt as measured before (a host profile), per
    metric, for a first start whose prompts are all new.
    """
    for metric, values in METRIC_VALUES.items():
        se = _start_se(earlier, current, values, (residual or {}).get(metric))
        if se is None or se > target:
            return False
    return True


def _start_se(
    earlier: Sequence[Measurement], current: Measurement, values: str, residual: float | None
) -> float | None:
    mine = current.by_prompt(values)
    if len(mine) < 2:
        return None
    groups = [m.by_prompt(values) for m in earlier]
    groups = [g for g in groups if g] + [mine]
    logs = [np.log([v for v, _ in g]) for g in groups]
    prompts = [[i for _, i in g] for g in groups]
    linked = all(i is not None for p in prompts for i in p)
    fit = fit_starts(logs, prompts if linked else None)  # type: ignore[arg-type]
    if fit.paired and fit.residual_df >= MIN_RESIDUAL_DF:
        return math.sqrt(fit.residual_var * float(fit.cov[-1, -1]))
    if linked and residual is not None:
        return math.sqrt(residual / len(mine))
    if fit.paired:
        return None  # the prompts' levels are not known yet: keep sending
    # One prompt repeated (or no prompt recorded): the start's own spread
    return math.sqrt(float(np.var(logs[-1], ddof=1)) / len(mine))
