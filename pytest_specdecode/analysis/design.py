"""Whether a design can reach a verdict at all: checked before anything starts."""

from __future__ import annotations

import math

from ..config.settings import Settings
from ..errors import ConfigError
from .compare import METRICS
from .stats import minimum_requests


def family_size(settings: Settings) -> int:
    """Comparisons in a candidate's family: every prompt type at every level, on every metric."""
    return len(settings.prompt_types) * len(settings.run.levels) * len(METRICS)


def check_design(settings: Settings) -> None:
    """Refuse a design whose requests could never show a difference: every verdict would be
    inconclusive, and the run a waste of reloads."""
    if not settings.candidates:
        return
    run = settings.run
    family = family_size(settings)
    need = minimum_requests(family, run.alpha)
    least = min(run.requests_at(level)[0] for level in run.levels)
    if least * run.repeats >= need:
        return
    repeats = math.ceil(need / least)
    levels = len(run.levels)
    what = f"{len(settings.prompt_types)} prompt types" + (
        f" x {levels} load levels" if levels > 1 else ""
    )
    raise ConfigError(
        f"with {least} requests per prompt type{', level' if levels > 1 else ''} and server "
        f"start, and {run.repeats} start{'s' if run.repeats != 1 else ''} per arm, no verdict "
        f"can be reached: {family} comparisons ({what} x throughput and TPOT) at alpha "
        f"{run.alpha:g} need at least {need} requests per comparison and arm. Take "
        f"--spec-samples {need} (or --spec-repeats {repeats}); nothing was started"
    )
