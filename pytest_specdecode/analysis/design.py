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
    if not settings.candidates and not settings.run.search:
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


def _host(
    settings: Settings, outside: Mapping[str, RestartNoise], metric: str
) -> tuple[RestartNoise, float, bool]:
    """What is known of this host for a metric: the restart noise (measured, else assumed), a
    request's residual variance, and whether that was measured."""
    run = settings.run
    noise = outside.get(metric) or RestartNoise.assumed(run.assumed_restart_noise)
    measured = bool(noise.measured and noise.residual)
    return noise, (noise.residual or 0.0) if measured else ASSUMED_RESIDUAL_SD**2, measured


def _power(settings: Settings, noise: RestartNoise, residual_var: float, starts: int, k: int):
    run = settings.run
    return design_power(
        noise,
        residual_var=residual_var,
        starts=starts,
        requests=k,
        family=family_size(settings),
        alpha=run.alpha,
        margin=run.min_effect,
    )


def reach(settings: Settings, outside: Mapping[str, RestartNoise]) -> dict[str, Reach]:
    """Per metric, the smallest change the configured design calls with 80% power."""
    out = {}
    for metric in METRICS:
        noise, residual_var, measured = _host(settings, outside, metric)
        k = expected_requests(settings.run, noise, residual_var, fixed=settings.aa_only)
        power = _power(settings, noise, residual_var, settings.run.repeats, k)
        out[metric] = Reach(metric, power, noise, math.sqrt(residual_var), measured)
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
    least, most = settings.run.requests_at(settings.run.levels[0])
    counts = sorted({least, most, max(least, min(most, 2 * least))})
    hosts = [_host(settings, outside, metric) for metric in METRICS]
    for starts in range(1, MAX_STARTS + 1):
        found = []
        for k in counts:
            powers = [_power(settings, noise, var, starts, k) for noise, var, _ in hosts]
            if max(p.detectable for p in powers) <= change:
                found.append((max(powers, key=lambda p: p.detectable), seconds(starts, k)))
        if found:
            return min(found, key=lambda f: f[1])
    return None
