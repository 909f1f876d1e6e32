"""The plan's reach: what the design can call on this host, with 80% power.

`design_lines` gives the plan's lines (--spec-dry-run, and run.log as a run starts): the change
each metric's verdict can call (analysis/verdict/design.py → `reach`), the intervals it will
print, side by side where the stop rule looks (`stop_line`), the host's drift beside its restart
noise and the cheapest lever (`lever_lines`), and with --spec-detect the design that would call
a change of that size. Every design and lever is timed by report/plan.py → `design_seconds`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..analysis.variance.power import MAX_STARTS
from ..analysis.variance.restarts import PRIOR, RestartNoise
from ..analysis.variance.time_drift import TimeDrift, drift_text
from ..analysis.verdict.design import (
    DECIDE_AT,
    Lever,
    Reach,
    design_to_detect,
    drift_reach,
    levers,
    reach,
    twin_plan,
)
from ..analysis.verdict.sequential import stop_plan
from ..config.settings import Settings
from .plan import design_seconds
from .schedule import Timing
from .text import fmt_duration


def design_lines(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    *,
    detect: float | None,
    timing: Timing,
    baseline: bool,
    aba: bool,
    adopts_original: bool,
    drift: TimeDrift | None = None,
    accelerator: str | None = None,
) -> list[str]:
    """What this design can call on this host, and (`--spec-detect`) what would call a change
    of the size the user names; where the host's drift is known, the cheapest lever.
    `accelerator`: its kind, for the slot noise where no profile holds one."""
    if not settings.candidates and not settings.run.search:
        return []
    found = reach(settings, outside, accelerator=accelerator)
    first = next(iter(found.values()))
    noise = first.noise
    told = (
        f"restart noise {noise.sd:.1%} measured with {noise.df:.0f} degrees of freedom"
        if noise.measured
        else f"restart noise: {PRIOR} of {noise.sd:.1%} from another machine (weighted as "
        f"{noise.df:g} df)"
        if noise.is_prior
        else f"restart noise assumed {noise.sd:.0%} (weighted as {noise.df:g} df)"
    )
    residual = f"a request's own spread {first.residual_sd:.1%}" + (
        "" if first.residual_measured else " (assumed)"
    )
    if drift is not None and "throughput" in found:
        found["throughput"] = drift_reach(settings, found["throughput"], drift)
    calls = ", ".join(
        f"{r.metric} {_change(r.detectable)}" + (" (the drift counted)" if r.drift_counted else "")
        for r in found.values()
    )
    run = settings.run
    starts = (
        f"{run.repeats} pair{'s' if run.repeats != 1 else ''} of starts side by side, by pairs"
        if run.arms == "together"
        else f"{run.repeats} start{'s' if run.repeats != 1 else ''} per arm"
    )
    lines = [
        f"what this design can call with 80% power: {calls} ({told}; {residual}; {starts}, "
        f"about {first.power.requests} requests per prompt type and start; margin "
        f"±{run.min_effect:.0%})",
        "the intervals it will print, about the change (log scale): "
        + ", ".join(r.half_text() for r in found.values()),
    ]
    if (twin := twin_plan(settings, outside, room=True, accelerator=accelerator)) is not None:
        lines.append(twin.text())

    def seconds(starts: int, requests: int, together: bool = run.arms == "together") -> float:
        return design_seconds(
            settings,
            timing,
            starts,
            requests,
            together=together,
            baseline=baseline,
            aba=aba,
            adopts_original=adopts_original,
        )

    if run.arms == "together" and run.sequential and run.repeats == 1 and not settings.aa_only:
        lines.append(stop_line(settings, first, seconds))

    if drift is not None:
        lines += lever_lines(settings, outside, drift, detect or DECIDE_AT, seconds, timing)
    if detect is None:
        return lines

    design = design_to_detect(settings, outside, detect, seconds=seconds)
    if design is None:
        lines.append(
            f"to call a {detect:.0%} change with 80% power: no design of up to {MAX_STARTS} "
            "starts per arm can, at this restart noise and margin"
        )
    else:
        power, cost = design
        lines.append(
            f"to call a {detect:.0%} change with 80% power: --spec-repeats {power.starts} "
            f"--spec-samples {power.requests} --spec-max-samples {power.requests} "
            f"({power.starts} start{'s' if power.starts != 1 else ''} per arm, "
            f"{power.requests} requests per prompt type and start; "
            + (
                f"about {fmt_duration(cost)} on this host, {timing.source})"
                if timing.s_per_token is not None
                else f"its starts alone about {fmt_duration(cost)}; {timing.source})"
            )
        )
    return lines


def stop_line(settings: Settings, found: Reach, seconds) -> str:
    """Side by side: where the stop rule looks (analysis/verdict/sequential.py), the slots a
    prompt type is expected to send at the design's reach and at no change, and the most."""
    run = settings.run
    change = -min(found.detectable, 0.9) if math.isfinite(found.detectable) else -0.5
    prompts = min(len(t.prompts) or 1 for t in settings.prompt_types.values())
    cells = len(settings.prompt_types) * len(run.levels)
    looks, at, none = stop_plan(run, cells=cells, prompts=prompts, noise=found.noise,
                                residual_sd=found.residual_sd, change=change)  # fmt: skip
    per = run.requests_at(run.levels[0])[1] / looks[-1]  # requests a slot

    def took(slots: float) -> str:
        return fmt_duration(seconds(run.repeats, max(1, round(slots * per))))

    return (
        f"stops a prompt type once decided (looks at {', '.join(map(str, looks))} slots): "
        f"expected {at:.0f} slots at a change of {change:+.0%} (about {took(at)} in all), "
        f"{none:.0f} at none ({took(none)}); at most {looks[-1]} ({took(looks[-1])})"
    )


def lever_lines(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    drift: TimeDrift,
    change: float,
    seconds: Callable[[int, int, bool], float],
    timing: Timing,
) -> list[str]:
    """The host's drift beside its restart noise, and the cheapest lever that would call a
    change of this size: the sentence, then every lever's numbers. `seconds(starts, requests,
    together)`: `design_seconds`, the configured design's own estimate."""
    noise = outside.get("throughput") or RestartNoise.assumed(settings.run.assumed_restart_noise)
    whose = "a prior from another machine" if noise.is_prior else "this host"
    lines = [f"{whose}: restart noise {noise.sd:.1%} (start effects), {drift_text(drift)}"]

    found = levers(settings, outside, drift, change, seconds=seconds)
    if not found:
        return [
            *lines,
            f"to call a {change:.0%} change: no lever of up to {MAX_STARTS} starts per arm can",
        ]
    run = settings.run
    most = run.requests_at(run.levels[0])[1]
    this = next(
        (lever for lever in found if (lever.starts, lever.requests) == (run.repeats, most)), None
    )
    if this is not None and this.what == "more starts":
        lines.append(
            f"this design calls a {change:.0%} change with 80% power, the drift counted: "
            f"±{this.detectable:.1%}, about {fmt_duration(this.seconds)}"
        )
        return lines + [
            f"  cheaper, {_lever_text(lever)}" for lever in found if lever.seconds < this.seconds
        ]
    best = found[0]
    lines.append(
        f"cheapest lever to call a {change:.0%} change with 80% power: {best.what}, "
        f"{best.options} (±{best.detectable:.1%}, about {fmt_duration(best.seconds)})"
    )
    lines += [f"  {_lever_text(lever)}" for lever in found[1:]]
    return lines


def _lever_text(lever: Lever) -> str:
    return (
        f"{lever.what}: {lever.options}: ±{lever.detectable:.1%}, about "
        f"{fmt_duration(lever.seconds)}"
    )


def _change(value: float) -> str:
    return f"±{value:.1%}" if math.isfinite(value) else "nothing (too few starts or requests)"
