"""The design: whether it can reach a verdict at all (checked before anything starts), and what
it can call on this host (the plan, the dry run, `--spec-detect`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..config.settings import RunConfig, Settings
from ..errors import ConfigError
from .adaptive import target_se
from .compare import METRICS
from .power import ASSUMED_RESIDUAL_SD, MAX_STARTS, DesignPower, design_power
from .restarts import RestartNoise
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


# --------------------------------------------------------------------------- what it can call


@dataclass(frozen=True)
class Reach:
    """What a design can call on one metric, from what is known of this host."""

    metric: str
    power: DesignPower
    noise: RestartNoise
    residual_sd: float
    residual_measured: bool

    @property
    def detectable(self) -> float:
        return self.power.detectable


def expected_requests(
    run: RunConfig, noise: RestartNoise, residual_var: float, *, fixed: bool
) -> int:
    """Requests per prompt type and start the adaptive rule should stop at, on this host."""
    least, most = run.requests_at(run.levels[0], fixed=fixed)
    target = target_se(noise.sd, run.min_effect)
    wanted = math.ceil(residual_var / target**2) if target > 0 else most
    return min(most, max(least, wanted))


def reach(
    settings: Settings, outside: Mapping[str, RestartNoise], *, repeats: int | None = None
) -> dict[str, Reach]:
    """Per metric, the smallest change the configured design calls with 80% power."""
    run = settings.run
    out = {}
    for metric in METRICS:
        noise = outside.get(metric) or RestartNoise.assumed(run.assumed_restart_noise)
        residual = noise.residual if noise.measured and noise.residual else None
        residual_var = residual if residual is not None else ASSUMED_RESIDUAL_SD**2
        k = expected_requests(run, noise, residual_var, fixed=settings.aa_only)
        power = design_power(
            noise,
            residual_var=residual_var,
            starts=repeats or run.repeats,
            requests=k,
            family=family_size(settings),
            alpha=run.alpha,
            margin=run.min_effect,
        )
        out[metric] = Reach(metric, power, noise, math.sqrt(residual_var), residual is not None)
    return out


def design_to_detect(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    change: float,
    *,
    seconds: Callable[[int, int], float],
) -> tuple[DesignPower, float] | None:
    """The quickest design (starts per arm, requests per start) that calls a change of this
    size on every metric with 80% power, and its estimated seconds; None if none can."""
    run = settings.run
    least, most = run.requests_at(run.levels[0])
    counts = sorted({least, most, max(least, min(most, 2 * least))})
    best: tuple[DesignPower, float] | None = None
    for starts in range(1, MAX_STARTS + 1):
        for k in counts:
            found = []
            for metric in METRICS:
                noise = outside.get(metric) or RestartNoise.assumed(run.assumed_restart_noise)
                residual = noise.residual if noise.measured and noise.residual else None
                found.append(
                    design_power(
                        noise,
                        residual_var=residual if residual is not None else ASSUMED_RESIDUAL_SD**2,
                        starts=starts,
                        requests=k,
                        family=family_size(settings),
                        alpha=run.alpha,
                        margin=run.min_effect,
                    )
                )
            if max(p.detectable for p in found) > change:
                continue
            cost = seconds(starts, k)
            if best is None or cost < best[1]:
                best = (max(found, key=lambda p: p.detectable), cost)
        if best is not None:
            return best
    return None
