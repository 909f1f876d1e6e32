"""The plan a user reads before anything is touched: --spec-dry-run's text and its estimate.

What the design can call on this host (its reach, the stop rule's slots, the levers) is
report/plan_reach.py → `design_lines`, timed by `design_seconds` here.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..analysis.drafters.check import Drafter
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
    SPREAD_CPU,
    SPREAD_KIND,
    SPREAD_OTHER_MACHINE,
    SPREAD_OWN,
    SlotCount,
    Timing,
    accelerator_timing,
    largest_slots,
    phase_entries,
    schedule_of,
    schedule_seconds,
    server_lines,
    slot_seconds,
    whole_time,
)
from .schedule import default_start_s as default_start_s_of

RUN_LOG = "run.log"


# A request's time per output token on a CPU where nothing of this host was measured (the
# embedded CPU vLLM's order: a fresh clone's 2-core Intel Xeon timed a slot at 27 ms a token on
# 2026-12-07, where 50 ms made its plan 25 min for 11 min 14 s); on a GPU or an unknown
# accelerator, no such guess is made.
CPU_S_PER_TOKEN = 0.03


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
    there (this very machine's first; its starts and requests as that run timed them, else its
    engine's speed at the pace it took against its plan), else its host profile's newest speed
    (only this machine's where its kind of accelerator's pace is known), else `served` (the
    running server's /metrics), else the kind of accelerator's (schedule.py ACCELERATOR_PACE;
    a GPU the table does not hold: its range); else, on a CPU, a stated assumption, elsewhere
    none. A start where none was stored: the kind's, at least `default_start_s` (the target's
    typical start). Each with the range it leaves open (`Timing.spread`)."""
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
        spread = SPREAD_OWN if (folder, record) in mine else SPREAD_OTHER_MACHINE
        other = machine and (folder, record) not in mine
        whose = " (another machine's, or one not recorded)" if other else ""
        timed = timed_pace(record)
        if timed is not None:
            start_s, s_per_token = timed
            later = " after its first (vLLM's compile cache then warm)"
            later = later if warm_starts(record.environment["pace"]) else ""
            return Timing(
                start_s if start_s is not None else default_start_s,
                s_per_token,
                f"from the stored run {folder.name}{whose}, its starts{later} and requests as "
                "it timed them",
                spread=spread,
            )
        speed = speed_of(record)
        if speed is None:
            continue
        pace = pace_of(record)
        return Timing(
            start_s=speed.start_s if speed.start_s is not None else default_start_s,
            s_per_token=speed.s_per_token,
            source=f"from the stored run {folder.name}{whose}"
            + (f", which took {pace:.1f} times its plan's estimate" if pace != 1.0 else ""),
            pace=pace,
            spread=spread,
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
            f"vLLM {entry.vllm_version}"
            + ("" if own else "; measured on another machine, or one not recorded")
            + ")",
            spread=SPREAD_OWN if own else SPREAD_OTHER_MACHINE,
        )
    if served is not None:
        return Timing(
            default_start_s,
            served,
            "from the running server's /metrics (its requests' time per output token)",
            spread=SPREAD_KIND,
        )
    if kind is not None:
        return kind  # no pace of this machine's own: its kind of accelerator's, else the table's
    where = accelerator.describe() if accelerator else "an unknown accelerator"
    none = f"no stored run or host profile of this model on {host} ({where})"
    if accelerator is not None and accelerator.kind == "cpu":
        return Timing(
            default_start_s, CPU_S_PER_TOKEN, f"assumed for a CPU: {none}", spread=SPREAD_CPU
        )
    return Timing(default_start_s, None, f"{none} measured the engine's speed")


def timed_pace(record: RunRecord) -> tuple[float | None, float] | None:
    """A stored run's own timing of its starts and slots (`environment["pace"]`, written by the
    run: its starts' mean, a slot's seconds per server in the rounds over the prompt types'
    mean max_tokens): (start seconds, seconds per output token); None where it kept none."""
    found = record.environment.get("pace")
    if not isinstance(found, dict):
        return None
    slot_s, tokens = found.get("slot_s"), found.get("max_tokens")
    if not isinstance(slot_s, int | float) or not isinstance(tokens, int | float) or tokens <= 0:
        return None
    later = warm_starts(found)
    start_s = statistics.median(later) if later else found.get("start_s")
    return (float(start_s) if isinstance(start_s, int | float) else None), slot_s / tokens


def warm_starts(pace: dict[str, Any]) -> list[float]:
    """A stored run's starts after its first (`pace["starts_s"]`, in order): the first start of
    a model on a machine compiles it, and vLLM caches what it compiled, so the next run's starts
    are the later ones' (the H100 on 2026-12-07: 117 then 89 s, then 74 to 48 s in the next
    run). Empty where fewer than two were kept."""
    starts = pace.get("starts_s")
    if not isinstance(starts, list) or len(starts) < 2:
        return []
    return [float(x) for x in starts[1:] if isinstance(x, int | float)]


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
    """A design's whole time with every slot sent, as the plan's time counts the configured
    one's (schedule.py `whole_time`: the starts, the regime window, the rounds, the token ids,
    the restore): `starts` starts per arm (pairs side by side), `requests` per prompt type and
    start, its arms side by side or one at a time. The plan's --spec-detect design and every
    lever are timed by it."""
    run = settings.run
    arms = "together" if together else ("one-at-a-time" if run.arms == "together" else run.arms)
    trial = replace(
        settings,
        run=replace(run, repeats=starts, samples=requests, max_samples=requests, arms=arms),
    )
    schedule = schedule_of(trial, baseline=baseline, aba=aba, adopts_original=adopts_original)
    slots = SlotCount(largest_slots(trial.run, len(trial.prompt_types)))
    return whole_time(trial, schedule, timing, slots).seconds


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
    if spec.is_original and spec.extra_args:  # e.g. the map on a shape's original at a depth
        return f"{spec.name} (the original's configuration with {' '.join(spec.extra_args)})"
    if spec.is_original:
        return f"{spec.name} (A/A: the original's own configuration, started again)"
    return f"{spec.name} {spec.to_json()}"


def dry_run_lines(
    settings: Settings,
    steps: Sequence[str],
    *,
    host: str,
    aba: bool,
    baseline_from: str | None,
    adopts_original: bool,
    noise: str = "",
    predicted: Sequence[str] = (),
    design: Sequence[str] = (),
    side_changes: Sequence[str] = (),
    arms: str = "",
    duration: Sequence[str] = (),
) -> list[str]:
    """The plan, as --spec-dry-run prints it; `predicted`: `stored_prediction`'s lines; `arms`:
    how the arms are served, and why (run/arms.py); `duration`: the run's whole time
    (report/plan_reach.py → `time_lines`)."""
    t = settings.target
    baseline = baseline_from is None
    phases, least, most = count_requests(settings, baseline=baseline, aba=aba)
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
        *(
            line.replace("estimated duration: about", "estimated duration: at most about")
            if run.search
            else line
            for line in duration
        ),
    ]
    return lines + list(predicted)
