"""Whether a design can reach a verdict at all: checked before anything starts."""

from __future__ import annotations

import math

from ..config.settings import Settings
from ..errors import ConfigError
from .compare import METRICS
from .stats import minimum_requests


def family_size(settings: Settings) -> int:
    """Comparisons in a candidate's family: every prompt type on every metric."""
    return len(settings.prompt_types) * len(METRICS)


def check_design(settings: Settings) -> None:
    """Refuse a design whose requests could never show a difference: every verdict would be
    inconclusive, and the run a waste of reloads."""
    if not settings.candidates:
        return
    run = settings.run
    family = family_size(settings)
    need = minimum_requests(family, run.alpha)
    have = run.samples * run.repeats
    if have >= need:
        return
    repeats = math.ceil(need / run.samples)
    raise ConfigError(
        f"with {run.samples} requests per prompt type and server start, and {run.repeats} "
        f"start{'s' if run.repeats != 1 else ''} per arm, no verdict can be reached: "
        f"{family} comparisons ({len(settings.prompt_types)} prompt types x throughput and "
        f"TPOT) at alpha {run.alpha:g} need at least {need} requests per prompt type and arm. "
        f"Take --spec-samples {need} (or --spec-repeats {repeats}); nothing was started"
    )
