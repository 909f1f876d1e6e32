"""The plan a user reads before anything is touched: --spec-dry-run's text and its estimate."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from ..analysis.drafters.check import Drafter
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
from ..analysis.verdict.side_changes import (
    control_name,
    foreseen,
    foreseen_text,
    from_rules,
    reproduce,
)
from ..config.arms import BASELINE
from ..config.settings import RunConfig, Settings
from ..config.specconfig import SpecConfig, VllmFacts
from ..errors import ConfigError
from ..record.profile import Accelerator, ProfileLookup, recorded_accelerator, speed_of
from ..record.schema import RunRecord
from ..record.search import slot_name
from ..record.store import stored_runs
from ..targets.base import Target, room_beside
from .schedule import (
    SlotCount,
    Timing,
    accelerator_timing,
    largest_slots,
    phase_entries,
    schedule_of,
    schedule_seconds,
    server_lines,
    slot_seconds,
)
from .schedule import default_start_s as default_start_s_of
from .text import fmt_duration

RUN_LOG = "run.log"


# A request's time per output token on a CPU where nothing of this host was measured (the
# embedded CPU vLLM's order); on a GPU or an unknown accelerator, no such guess is made.
CPU_S_PER_TOKEN = 0.05


def previous_timing(
    settings: Settings,
    *,
    host: str,
    default_start_s: float,
    accelerator: Accelerator | None = None,
    profile: ProfileLookup | None = None,
    served: float | None = None,
    machine: str | None = None,
) -> Timing:
    """The engine's speed on this host and accelerator: the newest stored run of the model
    there (this very machine's first), else its host profile's newest speed (only this
    machine's where its kind of accelerator's pace is known), else `served` (the running
    server's /metrics), else the kind of accelerator's (schedule.py ACCELERATOR_PACE); else, on
    a CPU, a stated assumption, elsewhere none. A start where none was stored: the kind's, at
    least `default_start_s` (the target's typical start)."""
    default_start_s = default_start_s_of(accelerator, default_start_s)
    found_runs = [
        (folder, record)
        for folder, record in stored_runs(
            settings.reports_dir, host=host, model=settings.target.model
        )
        if recorded_accelerator(record.environment) == accelerator
    ]
    mine = [r for r in found_runs if machine and r[1].environment.get("machine") == machine]
    for folder, record in [*mine, *found_runs]:
        speed = speed_of(record)
        if speed is None:
            continue
        pace = pace_of(record)
        return Timing(
            start_s=speed.start_s if speed.start_s is not None else default_start_s,
            s_per_token=speed.s_per_token,
            source=f"from the stored run {folder.name}"
            + (f", which took {pace:.1f} times its plan's estimate" if pace != 1.0 else ""),
            pace=pace,
        )
    found = profile.profile if profile else None
    timed = [e for e in found.entries if e.speed is not None] if found else []
    entry = max(timed, key=lambda e: (bool(machine) and e.machine == machine, e.date), default=None)
    own = entry is not None and bool(machine) and entry.machine == machine
    kind = accelerator_timing(accelerator, default_start_s)
    if profile is not None and entry is not None and entry.speed is not None and (own or not kind):
        return Timing(
            start_s=entry.speed.start_s or default_start_s,
            s_per_token=entry.speed.s_per_token,
            source=f"from the host profile {profile.path} (the A/A run {entry.run}, "
            f"vLLM {entry.vllm_version})",
        )
    if served is not None:
        return Timing(
            default_start_s,
            served,
            "from the running server's /metrics (its requests' time per output token)",
        )
    if kind is not None:
        return kind  # no pace of this machine's own: its kind of accelerator's
    where = accelerator.describe() if accelerator else "an unknown accelerator"
    none = f"no stored run or host profile of this model on {host} ({where})"
    if accelerator is not None and accelerator.kind == "cpu":
        return Timing(default_start_s, CPU_S_PER_TOKEN, f"assumed for a CPU: {none}")
    return Timing(default_start_s, None, f"{none} measured the engine's speed")


def search_text(run: RunConfig) -> str:
    """How a search's candidates are chosen, or "none" without a search."""
    if not run.search:
        return "none"
    return (
        f"chosen by --spec-search {run.search}: up to {run.max_reloads} reloads, "
        f"{', '.join(slot_name(i) for i in range(1, run.max_reloads + 1))}, each picked by "
        "prediction from what was measured before it, each in one server start"
    )


def order_lines(run: RunConfig) -> list[str]:
    """How each start sends its requests, and whether the arms are served side by side."""
    lines = [
        "within a start: interleaved, rounds of one slot per prompt type and level in a "
        f"seeded shuffled order (seed {run.seed} with the start's name)"
        if run.order == "interleaved"
        else "within a start: blocked, one prompt type's window after another"
    ]
    if run.arms == "together":
        lines.append(
            "arms side by side: each candidate's start beside a baseline start, every slot sent "
            "to one server, then the other, never both at once"
        )
    return lines


def phase_order(settings: Settings, *, baseline: bool, aba: bool) -> list[str]:
    """The phases the design measures, in the run's order (ABA last); a search's at most."""
    return [name for name, _ in phase_entries(settings, baseline=baseline, aba=aba)]


def count_requests(settings: Settings, *, baseline: bool, aba: bool) -> tuple[int, int, int]:
    """(phases measured, least requests, most requests) for this configuration."""
    run = settings.run
    phases = len(phase_order(settings, baseline=baseline, aba=aba))
    sizes = [run.requests_at(level) for level in run.levels]
    least = sum(low for low, _ in sizes) + run.warmup
    most = sum(high for _, high in sizes) + run.warmup
    per_prompt = len(settings.prompt_types) * phases
    return phases, per_prompt * least, per_prompt * most


def count_starts(settings: Settings, *, baseline: bool, aba: bool, adopts_original: bool) -> int:
    """Server starts, as the run takes them (report/schedule.py `schedule_of`)."""
    return schedule_of(settings, baseline=baseline, aba=aba, adopts_original=adopts_original).starts


PACE_BOUNDS = (0.5, 5.0)  # a stored run's own pace is trusted within these


def pace_of(record: RunRecord) -> float:
    """A stored run's wall time over the estimate its plan gave (both recorded in its
    environment, `run_s` and `planned_s`), within PACE_BOUNDS; 1 where either is missing."""
    run_s, planned_s = record.environment.get("run_s"), record.environment.get("planned_s")
    if not isinstance(run_s, int | float) or not isinstance(planned_s, int | float):
        return 1.0
    if planned_s <= 0:
        return 1.0
    low, high = PACE_BOUNDS
    return min(high, max(low, run_s / planned_s))


def estimate_seconds(
    settings: Settings, timing: Timing, *, baseline: bool, aba: bool, adopts_original: bool
) -> tuple[float, int]:
    """(seconds, server starts): starts, plus the most requests at their full max_tokens (none
    where the engine's speed is unknown: then the starts alone); at this host's own pace."""
    seconds, starts = plain_seconds(
        settings, timing, baseline=baseline, aba=aba, adopts_original=adopts_original
    )
    return seconds * timing.pace, starts


def plain_seconds(
    settings: Settings, timing: Timing, *, baseline: bool, aba: bool, adopts_original: bool
) -> tuple[float, int]:
    """`estimate_seconds` before this host's pace: what a run records as its plan's. Starts x
    a start's time + slots x a slot's time per server x servers per slot (schedule.py)."""
    schedule = schedule_of(settings, baseline=baseline, aba=aba, adopts_original=adopts_original)
    slot_s = None if timing.s_per_token is None else slot_seconds(settings, timing.s_per_token)
    slots = SlotCount(largest_slots(settings.run, len(settings.prompt_types)))
    seconds = schedule_seconds(schedule, start_s=timing.start_s, slot_s=slot_s, slots=slots)
    return seconds, schedule.starts


def design_seconds(
    settings: Settings,
    timing: Timing,
    starts: int,
    requests: int,
    *,
    together: bool,
    baseline: bool,
    aba: bool,
    adopts_original: bool,
) -> float:
    """A design's time, as `estimate_seconds` gives the configured one's: `starts` starts per
    arm (pairs side by side), `requests` per prompt type and start, its arms side by side or
    one at a time. The plan's --spec-detect design and every lever are timed by it."""
    run = settings.run
    arms = "together" if together else ("one-at-a-time" if run.arms == "together" else run.arms)
    trial = replace(
        settings,
        run=replace(run, repeats=starts, samples=requests, max_samples=requests, arms=arms),
    )
    return estimate_seconds(
        trial, timing, baseline=baseline, aba=aba, adopts_original=adopts_original
    )[0]


def side_change_plan(
    settings: Settings, version: str | None, facts: VllmFacts | None = None
) -> list[str]:
    """Per candidate, the side changes foreseen (analysis/verdict/side_changes.py: the serving
    vLLM's own rules where it was asked, else the known ones), and with --spec-control what its
    control arm would add; worded as expected, not measured."""
    out = []
    for spec in settings.candidates:
        if spec.is_original:
            continue
        expected = foreseen_text(spec.method, version, facts)
        out.append(
            f"side changes of {spec.name}: "
            + (expected or _none_foreseen(facts))
            + "; what the start actually runs with is read from its log and shown beside "
            "its verdict"
        )
        if settings.run.control:
            rules = reproduce(from_rules(foreseen(spec.method, version, facts)))
            out.append(
                f"control arm {control_name(spec.name)}: after {spec.name}, the original again "
                f"with {spec.name}'s side changes as measured at its start (foreseen: "
                f"{rules.describe()})"
            )
    return out


def _none_foreseen(facts: VllmFacts | None) -> str:
    if facts is not None and facts.async_never:
        return f"none foreseen ({facts.async_never}, the original's too)"
    return "none foreseen by the known rules"


def service_plan(settings: Settings, target: Target) -> list[str]:
    """The steps on the serving host: the target's own, one arm at a time; side by side, where
    each pair runs, and what is stopped after it (never the one-at-a-time swaps)."""
    if settings.run.arms != "together":
        return target.plan(settings.candidates)
    several = min(settings.run.beside, len(settings.candidates)) > 1
    return [
        *arms_plan(settings, target),
        ("after each group's windows, the servers beside the original are stopped"
         if several else "after each pair's windows, its second server is stopped")
        + "; at the end the original is left as it was found",
    ]  # fmt: skip


def arms_plan(settings: Settings, target: Target) -> list[str]:
    """`--spec-arms together`: where each server of each group runs. Raises a ConfigError,
    naming the host and the reason, where the host has no room for them."""
    if settings.run.arms != "together":
        return []
    lines = []
    at_once = min(settings.run.beside, len(settings.candidates))
    if at_once > 1:
        lines.append(
            f"up to {at_once} candidates served beside each baseline start at once ([run] "
            "beside), started one after the other; every slot visits each server in turn, in "
            "an order that turns from slot to slot, never two at once"
        )
    for spec in settings.candidates:
        why = room_beside(target, spec, of=at_once)
        if why:
            raise ConfigError(f"--spec-arms together refused on {target.host_name}: {why}")
    return lines + server_lines(settings, target)


def drafter_plan(drafters: Sequence[Drafter]) -> list[str]:
    """Each drafter named (path, architecture, layers, size, vocabulary), with its warnings."""
    lines = []
    for drafter in drafters:
        lines.append(f"candidate {drafter.check.candidate}: {drafter.description}")
        lines += [f"  warning: {w}" for w in drafter.check.warnings]
    return lines


def candidate_text(spec: SpecConfig) -> str:
    if spec.is_original:
        return f"{spec.name} (A/A: the original's own configuration, started again)"
    return f"{spec.name} {spec.to_json()}"


def dry_run_lines(
    settings: Settings,
    steps: Sequence[str],
    *,
    host: str,
    timing: Timing,
    aba: bool,
    baseline_from: str | None,
    adopts_original: bool,
    noise: str = "",
    predicted: Sequence[str] = (),
    design: Sequence[str] = (),
    side_changes: Sequence[str] = (),
    arms: str = "",
) -> list[str]:
    """The plan, as --spec-dry-run prints it; `predicted`: `stored_prediction`'s lines; `arms`:
    how the arms are served, and why (run/arms.py)."""
    t = settings.target
    baseline = baseline_from is None
    phases, least, most = count_requests(settings, baseline=baseline, aba=aba)
    seconds, starts = estimate_seconds(
        settings, timing, baseline=baseline, aba=aba, adopts_original=adopts_original
    )
    run = settings.run
    lines = [
        "pytest-specdecode dry run: nothing is started, written or changed.",
        f"host: {host} ({t.backend} backend)" + (f", unit {t.unit}" if t.unit else ""),
        f"model: {t.model} at {t.api_base}",
        "candidates: " + (", ".join(map(candidate_text, settings.candidates)) or search_text(run)),
        f"prompt types: {', '.join(settings.prompt_types)}",
        *side_changes,
    ]
    if baseline_from:
        lines.append(
            f"baseline: reused from {baseline_from}, not measured"
            + ("" if adopts_original else "; the original is not started for it")
        )
    steps = list(steps)
    if aba and (settings.candidates or run.search):  # just before the restore, the last step
        steps.insert(
            len(steps) - 1,
            "drift check (ABA): stop the last candidate, start the original and measure it "
            "again as 'baseline-after'",
        )
    order = phase_order(settings, baseline=baseline, aba=aba)
    if order:
        first = order[0] + (" (as it runs)" if adopts_original and order[0] == BASELINE else "")
        lines.append(f"server starts, in order: {', '.join([first, *order[1:]])}")
    lines += [arms] if arms else []
    lines += order_lines(run)
    if noise:
        lines.append(f"restart noise: {noise}")
    lines += design
    lines.append("steps, in order:")
    for i, step in enumerate(steps, start=1):
        first, *rest = step.splitlines()
        lines.append(f"  {i}. {first}")
        lines += [f"     {line}" for line in rest]
    counted = f"{least} to {most}" if most > least else f"{least}"
    per_level = []
    for level in run.levels:
        low, high = run.requests_at(level)
        at = f" at {level.label}" if len(run.levels) > 1 else ""
        per_level.append(f"{low}{f' to {high}' if high > low else ''}{at}")
    lines += [
        f"load levels: {', '.join(level.label for level in run.levels)}, each measured in "
        "every phase (no extra restarts)",
        f"requests: {'up to ' if run.search else ''}{counted} = {phases} phases x "
        f"{len(settings.prompt_types)} prompt types x "
        f"({' + '.join(per_level)} measured + {run.warmup} warm-up)",
        duration_line(seconds, starts, timing, search=bool(run.search)),
    ]
    return lines + list(predicted)


def duration_line(seconds: float, starts: int, timing: Timing, *, search: bool) -> str:
    """The estimate, and what it rests on; the starts alone where the speed is unknown."""
    at = f"{starts} server start{'' if starts == 1 else 's'} at ~{timing.start_s:.0f}s"
    if timing.s_per_token is None:
        return (
            f"estimated duration: the starts alone take about {fmt_duration(seconds)} ({at}); "
            f"the requests' time is not estimated: {timing.source}"
        )
    return (
        f"estimated duration: {'at most ' if search else ''}about {fmt_duration(seconds)} "
        f"({at}, requests at up to ~{timing.s_per_token * 1000:.0f} ms per output token; "
        f"{timing.source})"
    )


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
