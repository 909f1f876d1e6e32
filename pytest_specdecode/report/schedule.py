"""What a design starts and sends, and how long that takes: the plan's server groups, its
starts, and its time.

The groups are the run's own: its order (config/arms.py `planned_order`) cut into the groups it
serves at once (`together_groups`), the places turning from group to group as the run's do
(measure/experiment/arms.py `Experiment._start_group`). The time is

    starts x a start's time + slots x a slot's time per server x servers per slot

where a slot is one request of one prompt type and level, sent to every server of its group in
turn; each rests on this machine's pace where it is stored, else on its kind of accelerator's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..analysis.verdict.side_changes import control_name
from ..config.arms import BASELINE, BASELINE_AFTER, planned_order, together_groups
from ..config.settings import RunConfig, Settings
from ..record.profile import Accelerator
from ..record.search import slot_name
from ..targets.base import Target
from ..targets.beside.placement import PlannedServer
from ..targets.lifecycle import beside_kwargs

# --------------------------------------------------------------------------- the groups


@dataclass(frozen=True)
class StartGroup:
    """Servers measured at once: side by side, a baseline start and the candidates served
    beside it; one at a time, a single start. `starts`: the server starts it takes."""

    phases: tuple[tuple[str, str], ...]  # (phase, arm), the baseline's first
    starts: int
    swap: bool = False  # side by side: the places turned by one (every second group)

    @property
    def servers(self) -> int:
        return len(self.phases)


@dataclass(frozen=True)
class Schedule:
    """A design's groups in order and its server starts (the restore's included)."""

    groups: tuple[StartGroup, ...]
    starts: int
    regime_slots: float = 0  # the regime window's slots (two servers), before N beside start

    @property
    def server_windows(self) -> int:
        """Servers that each receive every slot of their group, over all groups."""
        return sum(g.servers for g in self.groups)


def phase_entries(settings: Settings, *, baseline: bool, aba: bool) -> list[tuple[str, str]]:
    """The design's starts as (phase, arm), in the run's order: each candidate (with
    --spec-control, its control right after it) in `planned_order`, side by side up to
    `[run] beside` at once; a search's reloads after them, one start each; ABA last."""
    run = settings.run
    names = []
    for spec in settings.candidates:
        controlled = run.control and not spec.is_original
        names += [spec.name, *([control_name(spec.name)] if controlled else [])]
    together = run.arms == "together" and baseline
    slots = [slot_name(i) for i in range(1, run.max_reloads + 1)] if run.search else []
    if together:  # the run measures each reload in a start of its own, after the design
        order = planned_order(names, run.repeats, together=True, at_once=run.beside)
        order += [(slot, slot) for slot in slots]
    else:
        order = planned_order([*names, *slots], run.repeats, together=False)
    if not baseline:
        order = [entry for entry in order if entry[1] != BASELINE]
    return order + ([(BASELINE_AFTER, BASELINE_AFTER)] if aba and (names or slots) else [])


def schedule_of(
    settings: Settings, *, baseline: bool, aba: bool, adopts_original: bool
) -> Schedule:
    """The groups as the run serves them, and its server starts. Side by side, a group starts
    each candidate beside the original, and the original too unless the target measures it as
    it runs (`adopts_original`: a systemd unit keeps serving). One at a time, each phase is a
    start, but a running original measured first as it runs; and the restore starts the
    original again where the last start left another configuration serving."""
    entries = phase_entries(settings, baseline=baseline, aba=aba)
    together = settings.run.arms == "together" and baseline
    partners = together_groups(entries) if together else {}
    groups: list[StartGroup] = []
    served = 0  # groups served side by side so far: every second one turns the places
    i = 0
    while i < len(entries):
        name, arm = entries[i]
        group = partners.get(name)
        if group and entries[i + 1 : i + 1 + len(group)] == group:
            own = 0 if adopts_original else 1
            members = (entries[i], *group)
            groups.append(StartGroup(members, len(group) + own, swap=served % 2 == 1))
            served += 1
            i += 1 + len(group)
            continue
        adopted = adopts_original and not groups and arm == BASELINE
        groups.append(StartGroup((entries[i],), 0 if adopted else 1))
        i += 1
    starts = sum(g.starts for g in groups)
    last = groups[-1] if groups else None
    if adopts_original and last is not None and last.servers == 1:
        starts += int(last.phases[0][1] not in (BASELINE, BASELINE_AFTER))
    beside_many = any(g.servers >= 3 for g in groups)  # the regime window: measure/experiment/
    regime = len(settings.prompt_types) * settings.run.regime_window_slots if beside_many else 0
    return Schedule(tuple(groups), starts, regime_slots=regime)


# --------------------------------------------------------------------------- the servers


def planned_servers(
    settings: Settings, target: Target, group: StartGroup
) -> list[PlannedServer] | None:
    """A group's servers, the original first, as the run places them: the target's
    `beside_servers` asked as `Switchboard.together_all` asks its `beside` (the same place,
    port and share); None where the backend cannot tell."""
    places = getattr(target, "beside_servers", None)
    if places is None:
        return None
    swapped = group.swap and bool(getattr(target, "swaps_places", False))
    specs = {spec.name: spec for spec in settings.candidates}
    of = group.servers - 1
    out: list[PlannedServer] = []
    for place, (name, arm) in enumerate(group.phases[1:], start=1):
        original, second = places(specs[arm], **beside_kwargs(swapped=swapped, place=place, of=of))
        out += [replace(original, name=group.phases[0][0])] if not out else []
        out.append(replace(second, name=name))
    return out


def server_lines(settings: Settings, target: Target) -> list[str]:
    """Side by side: one line per group the run serves at once, each server with its port and
    place (memory share or cores) and command, and the group's starts."""
    schedule = schedule_of(
        settings, baseline=True, aba=False, adopts_original=target.adopts_running_original
    )
    groups = [g for g in schedule.groups if g.servers > 1]
    lines = []
    for group in groups:
        base, (first, arm), *rest = group.phases
        turned = " (the places turned)" if group.swap and getattr(target, "swaps_places", 0) else ""
        servers = planned_servers(settings, target, group)
        if servers is None:  # a backend that tells its pair only (one beside at a time)
            spec = next(s for s in settings.candidates if s.name == arm)
            where = getattr(target, "beside_plan", None)
            told = where(spec) if where else f"the original at {target.api_base}, the candidate"
        elif not rest:
            mine, theirs = servers
            told = (
                f"the original on {mine.where} (restarted there: {mine.command}), the candidate "
                f"on {theirs.where} ({theirs.command})"
            )
        else:
            names = ", ".join(name for name, _ in group.phases[1:])
            lines.append(
                f"{group.servers} servers side by side for {base[0]} with {names}{turned}: "
                f"{_starts(group.starts)}, one after the other, each ready before the next:\n"
                + "\n".join(
                    f"  {s.name} on {s.where} ({'restarted there: ' if i == 0 else ''}{s.command})"
                    for i, s in enumerate(servers)
                )
            )
            continue
        lines.append(
            f"arms side by side for {first}{turned}: {told}; {_starts(group.starts)}, one after "
            "the other, each ready before the next; requests alternate between them"
        )
    return lines


def _starts(n: int) -> str:
    return f"{n} server start{'' if n == 1 else 's'}"


# --------------------------------------------------------------------------- the time


@dataclass(frozen=True)
class SlotCount:
    """The slots each group sends: the largest number, and the expected one where a
    sequential stop ends cells early (None: every cell runs to its largest); `fewest`: every
    cell stopped at its first look."""

    largest: float
    expected: float | None = None
    fewest: float | None = None

    @property
    def planned(self) -> float:
        return self.expected if self.expected is not None else self.largest

    @property
    def least(self) -> float:
        return self.fewest if self.fewest is not None else self.planned


def largest_slots(run: RunConfig, prompt_types: int) -> float:
    """The most slots one group sends: each prompt type at each level, its most requests and
    the warm-up; a level of N in flight sends its slots in about 1/N of the time."""
    rounds = run.warmup + sum(run.requests_at(lv)[1] / (lv.concurrency or 1) for lv in run.levels)
    return prompt_types * rounds


def slot_seconds(settings: Settings, s_per_token: float) -> float:
    """One slot's request to one server: the prompt types' mean max_tokens at this pace."""
    tokens = [t.max_tokens for t in settings.prompt_types.values()] or [0]
    return s_per_token * sum(tokens) / len(tokens)


def slots_seconds(schedule: Schedule, slots: SlotCount, slot_s: float) -> float:
    """The slots' time: per group, its slots x a slot's time per server x its servers (each
    slot visits every server of its group in turn, never two at once). The hook for a
    sequential stop: `slots.expected` where it ends cells early. A regime window (two or more
    beside) adds its slots to the baseline and the first server beside it."""
    regime = schedule.regime_slots * slot_s * 2
    return regime + sum(slots.planned * slot_s * g.servers for g in schedule.groups)


def schedule_seconds(
    schedule: Schedule, *, start_s: float, slot_s: float | None, slots: SlotCount
) -> float:
    """starts x a start's time + slots x a slot's time per server x servers per slot; the
    starts alone where a slot's time is unknown (None)."""
    starting = schedule.starts * start_s
    return starting if slot_s is None else starting + slots_seconds(schedule, slots, slot_s)


# --------------------------------------------------------------------------- the whole time

STOP_S = 5.0  # the restore's part: each server started is stopped once, in about this long


@dataclass(frozen=True)
class TimePart:
    """One part of a run's time: what it is and its seconds; `paced`: at the plan's pace (not:
    measured by this run already, as the methods query is when the plan is said)."""

    what: str
    seconds: float
    paced: bool = True


@dataclass(frozen=True)
class PlanTime:
    """A run's whole time, part by part, and the range it may take: `low` with every cell
    stopped at its first look at the quick end of the pace's range, `high` with every slot
    sent at its slow end. `requests_known`: False where no pace tells the requests' time."""

    parts: tuple[TimePart, ...]
    low: float
    high: float
    requests_known: bool = True

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.parts)

    @property
    def ahead(self) -> float:
        """The seconds still ahead when the plan is said: the parts not yet measured."""
        return sum(p.seconds for p in self.parts if p.paced)


def token_id_batches(settings: Settings, schedule: Schedule) -> int:
    """The untimed token-id requests after the timed ones (measure/experiment/token_record.py),
    counted as one slot per prompt type and start that records them: every start but the drift
    check's (and a control's), an A/A run's first only."""
    if not settings.run.record_token_ids:
        return 0
    controls = {control_name(c.name) for c in settings.candidates}
    starts = sum(
        1
        for g in schedule.groups
        for _, arm in g.phases
        if arm != BASELINE_AFTER and arm not in controls
    )
    return len(settings.prompt_types) * (min(starts, 1) if settings.aa_only else starts)


def rounds_text(schedule: Schedule, slots: SlotCount, prompt_types: int) -> str:
    """The groups as the run serves them, and the slots each prompt type sends per server."""
    sizes: dict[int, int] = {}
    for g in schedule.groups:
        sizes[g.servers] = sizes.get(g.servers, 0) + 1
    groups = ", ".join(
        f"{n} group{'s' if n != 1 else ''} of {servers} servers, every slot to each in turn"
        if servers > 1
        else f"{n} start{'s' if n != 1 else ''} alone"
        for servers, n in sizes.items()
    )
    most = slots.largest / max(1, prompt_types)
    told = f"{most:.0f} slots a prompt type at most (warm-up included)"
    if slots.expected is not None:
        told = (
            f"about {slots.expected / max(1, prompt_types):.0f} of {most:.0f} slots a prompt "
            "type (warm-up included)"
        )
    return f"the rounds: {groups}; {told}"


def whole_time(
    settings: Settings,
    schedule: Schedule,
    timing: Timing,
    slots: SlotCount,
    *,
    methods_s: float | None = None,
) -> PlanTime:
    """Everything the run spends, part by part: asking vLLM for its methods (`methods_s`, as
    measured), every start, the regime window, the rounds, the token ids, the restore; each at
    this host's pace (`timing`), and the range that pace leaves open (`Timing.spread`)."""
    fixed = [TimePart("asking vLLM for its methods", methods_s, paced=False)] if methods_s else []

    def paced(count: SlotCount) -> list[TimePart]:
        n = schedule.starts
        out = [TimePart(f"{_starts(n)} at ~{timing.start_s:.0f} s", n * timing.start_s)]
        if timing.s_per_token is not None:
            slot_s = slot_seconds(settings, timing.s_per_token)
            types = len(settings.prompt_types)
            if schedule.regime_slots:
                per = schedule.regime_slots / max(1, types)
                regime = (schedule.regime_slots + types * settings.run.warmup) * slot_s * 2
                out.append(TimePart(f"the regime window ({per:.0f} slots a prompt type)", regime))
            rounds = sum(count.planned * slot_s * g.servers for g in schedule.groups)
            out.append(TimePart(rounds_text(schedule, count, types), rounds))
            if batches := token_id_batches(settings, schedule):
                out.append(TimePart("the token ids, untimed", batches * slot_s))
        out.append(TimePart("the restore", STOP_S * n))
        return [replace(p, seconds=p.seconds * timing.pace) for p in out]

    base = sum(p.seconds for p in fixed)
    quick = SlotCount(slots.largest, slots.least)
    fast, slow = timing.spread
    low = base + fast * sum(p.seconds for p in paced(quick))
    high = base + slow * sum(p.seconds for p in paced(SlotCount(slots.largest)))
    return PlanTime(
        tuple(fixed + paced(slots)), low, high, requests_known=timing.s_per_token is not None
    )


# --------------------------------------------------------------------------- by accelerator


@dataclass(frozen=True)
class AcceleratorPace:
    """A kind of accelerator's start and pace where this machine has stored none: a request's
    wall time per output token at max_tokens, with what a slot spends around it."""

    start_s: float
    s_per_token: float
    measured: str  # where and with what it was measured


# Measured on an H200 lease (issue 41, vLLM 0.26.0, SmolLM2-135M, 256 tokens): starts of 50 to
# 151 s (151 and 114 s for a pair, 482 s for six); 192 slots of two servers in 517 s and 52
# slots of six in 445 s, 1.35 and 1.43 s per request: 5.3 and 5.6 ms per output token.
# On an H100 lease (issue 50, the same model and vLLM): starts of 108 and 82 s; the main job's
# rounds (side by side, one pair, cells stopped at 12 and 24 slots) sent 176 requests in 162 s,
# 0.92 s per request: 3.6 ms per output token.
ACCELERATOR_PACE = {
    "H200": AcceleratorPace(
        100.0,
        0.0054,
        "measured on an H200 with SmolLM2-135M and vLLM 0.26.0: starts of 50-151 s, a "
        "request of 256 tokens 1.35-1.43 s",
    ),
    "H100": AcceleratorPace(
        95.0,
        0.0036,
        "measured on an H100 with SmolLM2-135M and vLLM 0.26.0: starts of 82 and 108 s, a "
        "request of 256 tokens 0.92 s",
    ),
}

# How far the time may lie from the plan's, by where its pace comes from: this machine's own
# runs; another machine's of its kind (one CPU of one name ran 49% faster than the profile's,
# issue 50); a kind of accelerator's table entry; an accelerator the table does not hold (its
# range, widened); a CPU with nothing stored (the embedded vLLM's order of magnitude).
SPREAD_OWN = (0.8, 1.25)
SPREAD_OTHER_MACHINE = (0.6, 1.5)
SPREAD_KIND = (0.7, 1.5)
SPREAD_UNKNOWN_GPU = (0.6, 1.6)
SPREAD_CPU = (0.5, 2.0)


def accelerator_pace(accelerator: Accelerator | None) -> AcceleratorPace | None:
    """The kind of accelerator's pace (a GPU by its model's name), or None where not known."""
    if accelerator is None or accelerator.kind != "gpu":
        return None
    name = accelerator.model.upper()
    return next((pace for kind, pace in ACCELERATOR_PACE.items() if kind in name), None)


def default_start_s(accelerator: Accelerator | None, target_start_s: float) -> float:
    """A start's time where this machine stored none: its kind of accelerator's, at least the
    target's typical start (a production unit's model may take longer than the one measured);
    a GPU of a kind not held: the table's middle."""
    pace = accelerator_pace(accelerator)
    if pace is None and accelerator is not None and accelerator.kind == "gpu":
        pace = _table_middle()
    return max(pace.start_s, target_start_s) if pace else target_start_s


def _table_middle() -> AcceleratorPace:
    """The middle of the table's GPUs (geometric), for a GPU of a kind it does not hold."""
    paces = list(ACCELERATOR_PACE.values())
    starts = [p.start_s for p in paces]
    tokens = [p.s_per_token for p in paces]
    return AcceleratorPace(
        math.sqrt(min(starts) * max(starts)),
        math.sqrt(min(tokens) * max(tokens)),
        "the table's GPUs ("
        + ", ".join(ACCELERATOR_PACE)
        + f"): starts of {min(starts):.0f}-{max(starts):.0f} s, "
        f"{min(tokens) * 1000:.1f}-{max(tokens) * 1000:.1f} ms per output token",
    )


@dataclass(frozen=True)
class Timing:
    """How long things took before: per server start and per output token (None: unknown)."""

    start_s: float
    s_per_token: float | None
    source: str  # where these numbers come from
    # this host's own pace: a stored run's wall time over its plan's estimate (what the plain
    # estimate leaves out: warm-up, token ids, waits, stops), where it recorded both
    pace: float = 1.0
    # how far the run's time may lie from the estimate at this pace, as factors: this machine's
    # own runs narrowly; another machine's, a kind's or an assumption more widely
    spread: tuple[float, float] = SPREAD_OWN


def accelerator_timing(accelerator: Accelerator | None, start_s: float) -> Timing | None:
    """Where this machine stored no pace of its own: its kind of accelerator's (schedule.py
    ACCELERATOR_PACE), a start taking `start_s`, named as such; a GPU of a kind the table does
    not hold: the middle of the table's GPUs, with their range; None for a CPU or none known."""
    if accelerator is None or accelerator.kind != "gpu":
        return None
    pace = accelerator_pace(accelerator)
    if pace is not None:
        return Timing(
            start_s,
            pace.s_per_token,
            f"assumed for {accelerator.describe()}, {pace.measured}; this machine stored no "
            "run of its own",
            spread=SPREAD_KIND,
        )
    middle = _table_middle()
    return Timing(
        start_s,
        middle.s_per_token,
        f"assumed for {accelerator.describe()}: no pace is stored for this machine or its "
        f"kind; the middle of {middle.measured}",
        spread=SPREAD_UNKNOWN_GPU,
    )
