"""The plan's reach and time: what the design can call on this host, with 80% power, and how
long the whole run takes.

`design_lines` gives the plan's lines (--spec-dry-run, and run.log as a run starts): the change
each metric's verdict can call (analysis/verdict/design.py → `reach`), the one interval it will
print (side by side under the stop rule, per look, at that look's boundary), the host's drift
beside its restart noise and the cheapest lever (`lever_lines`), and with --spec-detect the
design that would call a change of that size. Every design and lever is timed by
report/plan.py → `design_seconds`. `time_lines` gives the run's whole time (report/schedule.py →
`whole_time`): where the stop rule looks and the slots a cell is expected to send (`stop_slots`,
analysis/verdict/sequential.py → `stop_plan`), every part, and the range the pace leaves open.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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
from .schedule import PlanTime, SlotCount, Timing, largest_slots, schedule_of, whole_time
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
        printed_line(found),
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


def printed_line(found: Mapping[str, Reach]) -> str:
    """The one figure for what the run will print: the half-width (log) of each change's
    interval; under the stop rule, where a prompt type stops at each look, at that look's
    boundary, with the prompts' own speed-ups it assumes until they repeat."""
    texts = {metric: r.half_text() for metric, r in found.items()}
    first = next(iter(found.values()))
    alike = len(set(texts.values())) == 1
    figures = (
        next(iter(texts.values())) + f" ({' and '.join(texts)} alike)"
        if alike
        else "; ".join(f"{metric} {text}" for metric, text in texts.items())
    )
    if not first.at_looks:
        return f"the interval it will print about each change (log scale): {figures}"
    return (
        "the interval it will print about each change (log scale), where a prompt type stops: "
        f"{figures}; the prompts' own speed-ups taken as {first.speedup_sd:.0%} apart until "
        "they repeat"
    )


@dataclass(frozen=True)
class StopSlots:
    """Side by side under the stop rule: a cell's looks (slots), and the slots it is expected
    to send at the change the design can call and at none (sequential.py → `stop_plan`)."""

    looks: tuple[int, ...]
    change: float
    at_change: float
    at_none: float


def stop_slots(settings: Settings, found: Reach) -> StopSlots | None:
    """Where the stop rule looks and what a cell is expected to send; None where it runs not
    (one at a time, several pairs, an A/A run, `[run] sequential = false`)."""
    run = settings.run
    if not (run.arms == "together" and run.sequential and run.repeats == 1) or settings.aa_only:
        return None
    change = -min(found.detectable, 0.9) if math.isfinite(found.detectable) else -0.5
    prompts = min(len(t.prompts) or 1 for t in settings.prompt_types.values())
    cells = len(settings.prompt_types) * len(run.levels)
    looks, at, none = stop_plan(run, cells=cells, prompts=prompts, noise=found.noise,
                                residual_sd=found.residual_sd, change=change,
                                speedup_sd=found.speedup_sd)  # fmt: skip
    return StopSlots(looks, change, at, none)


def stop_line(stop: StopSlots) -> str:
    """Where the stop rule looks, and the slots a prompt type is expected to send."""
    looks = stop.looks
    return (
        f"stops a prompt type once decided (looks at {', '.join(map(str, looks))} slots): "
        f"about {stop.at_change:.0f} slots where its change is about what the design can call "
        f"({stop.change:+.0%}), {stop.at_none:.0f} where there is none; at most {looks[-1]}"
    )


def slot_count(settings: Settings, stop: StopSlots | None) -> SlotCount:
    """The slots each group sends (schedule.py `SlotCount`): the most, and under the stop rule
    the expected (each cell at the design's reach) and the fewest (each at its first look)."""
    run, types = settings.run, len(settings.prompt_types)
    largest = largest_slots(run, types)
    if stop is None:
        return SlotCount(largest)
    cells = largest / max(1, types) - run.warmup  # a prompt type's slots, all levels

    def count(slots: float) -> float:
        return types * (run.warmup + cells * slots / stop.looks[-1])

    return SlotCount(largest, count(stop.at_change), count(stop.looks[0]))


def plan_time(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    timing: Timing,
    *,
    baseline: bool,
    aba: bool,
    adopts_original: bool,
    methods_s: float | None = None,
    accelerator: str | None = None,
) -> tuple[PlanTime, StopSlots | None]:
    """The run's whole time (schedule.py `whole_time`), its cells sending what the stop rule
    is expected to leave them; and where the stop rule looks."""
    wanted = settings.candidates or settings.run.search
    stop = None
    if wanted:
        first = next(iter(reach(settings, outside, accelerator=accelerator).values()))
        stop = stop_slots(settings, first)
    schedule = schedule_of(settings, baseline=baseline, aba=aba, adopts_original=adopts_original)
    found = whole_time(settings, schedule, timing, slot_count(settings, stop), methods_s=methods_s)
    return found, stop


def time_lines(time: PlanTime, timing: Timing, stop: StopSlots | None = None) -> list[str]:
    """The plan's lines for the run's time: where the stop rule looks, then the whole time with
    every part, then the pace it rests on and the range it leaves open; where no pace tells the
    requests' time, the starts' alone, and what is not known."""
    lines = [stop_line(stop)] if stop is not None else []
    parts = ", ".join(
        f"{p.what} ({fmt_duration(p.seconds)}{'' if p.paced else ', done'})" for p in time.parts
    )
    if not time.requests_known:
        return [
            *lines,
            f"estimated duration: the starts alone take about {fmt_duration(time.seconds)} "
            f"({parts}); the requests' time is not known: {timing.source}",
        ]
    fast, slow = timing.spread
    stops = "every cell stopped at its first look or sending every slot, " if stop else ""
    return [
        *lines,
        f"estimated duration: about {fmt_duration(time.seconds)} in all "
        f"({fmt_duration(time.low)} to {fmt_duration(time.high)}): {parts}",
        f"  at the pace {timing.source}"
        + (f", {timing.pace:.1f} times its plan's" if timing.pace != 1.0 else "")
        + f"; {fmt_duration(time.low)} to {fmt_duration(time.high)}: {stops}the pace "
        f"{fast:g} to {slow:g} times this; the run says its own estimate after its first "
        "start and round",
    ]


def estimate_line(
    found: PlanTime, planned: PlanTime, startups: Sequence[float], slot_s: float, done_s: float
) -> str:
    """The run's own estimate, once, after its first start and round: the whole time `found`
    at the starts and the slot it measured, what is still ahead of the `done_s` seconds spent,
    and the plan's figure beside it."""
    took = " and ".join(f"{s:.0f}" for s in startups) or "none"
    return (
        f"estimate after the first start and round: about {fmt_duration(found.seconds)} in all, "
        f"about {fmt_duration(max(0.0, found.seconds - done_s))} ahead (the plan said "
        f"{fmt_duration(planned.seconds)}): starts of {took} s, a slot {slot_s:.2f} s a server"
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
