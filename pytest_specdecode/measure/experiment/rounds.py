"""A start's requests in rounds (measure/experiment/order.py): each round holds one slot of every
cell still measuring, sent to every start in turn, and is sent again once quiet where other
clients or other work contaminated it."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ...config.prompts import RequestPlan
from ...config.settings import PromptType
from ...record.counters import Acceptance, Traffic, add_traffic, combine
from ...record.host_env import WindowEnvironment
from ...record.measurement import ClientLoad
from ...record.requests.level_stats import LevelStats
from ...record.requests.samples import RequestSample
from ...record.schema import Phase
from ...targets.base import Service
from ..server_metrics import acceptance_between, traffic_between
from ..traffic import foreign
from .context import RunContext
from .order import CellPlan, RoundOrder, slot_size
from .token_record import TokenIdRecorder
from .watch import QuietWatch, after_contamination
from .windows import Window, WindowSender


@dataclass
class Slot:
    """One slot as sent: its cell's requests, their aggregates, the server's counts over it."""

    cell: Cell
    samples: list[RequestSample]
    stats: LevelStats
    traffic: Traffic
    acceptance: Acceptance


@dataclass
class Cell:
    """One window of the interleaved order, measured slot by slot."""

    window: Window
    plan: CellPlan
    service: Service
    kept: list[Slot] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # which rounds were sent again, why


@dataclass
class Start:
    """One server start measured in rounds: its cells, and per prompt type its plan."""

    phase: Phase
    service: Service
    cells: dict[str, Cell] = field(default_factory=dict)
    prompt_types: list[tuple[PromptType, RequestPlan, list[Window]]] = field(default_factory=list)


ROUNDS_PER_LINE = 5  # a progress line every this many rounds


class Rounds:
    """Round after round of slots, to one start or to several served side by side."""

    def __init__(
        self, ctx: RunContext, sender: WindowSender, quiet: QuietWatch, ids: TokenIdRecorder
    ) -> None:
        self._ctx = ctx
        self._sender = sender
        self._quiet = quiet
        self._ids = ids
        self._planned = 0  # the start's slots at most (at most: adaptive cells stop early)

    def measure(self, starts: list[Start], order: RoundOrder, *, slots: int | None = None) -> None:
        """Warm-up, then round after round of slots, each to every start in turn; then each
        cell's figures and the token ids. `[run] order = "blocked"`: one cell after another.
        `slots`: exactly this many slots per cell, and no token ids (the regime window)."""
        ctx, run = self._ctx, self._ctx.settings.run
        for start in starts:
            self._prepare(start, slots)
        for start in starts:  # warm-up first, one prompt type after another
            for _, plan, windows in start.prompt_types:
                if plan.warmup:
                    self._sender.send(windows[0], plan.warmup, warmup=True)
        lead = starts[0]
        names = " and ".join(f"[{s.phase.name}]" for s in starts)
        kind = "shuffled" if run.order == "interleaved" else "one cell after another"
        ctx.progress(
            f"{names}: {len(lead.cells)} cells in rounds, one slot each ({kind}, seed "
            f"{order.seed}): a request at c1, a burst of N requests at cN"
        )
        self._planned = sum(-(-c.plan.most // c.plan.step) for c in lead.cells.values())
        slot = rounds = 0
        stopped: set[str] = set()  # side by side: cells decided (analysis/verdict/sequential)
        while keys := [
            k
            for k in lead.cells
            if k not in stopped and any(self._wants(s.cells[k]) for s in starts)
        ]:
            if run.order == "blocked":
                keys = keys[:1]
            rounds += 1
            sequence = order.round(keys)
            began = ctx.clock.now()
            self._send_round(starts, sequence, slot, order, rounds)
            if slots is None:  # the run's pace (the regime window's aside)
                self._paced(ctx.clock.now() - began, len(sequence) * len(starts))
            slot += len(sequence)
            stopped |= self._decided(starts, sequence)
            if rounds % ROUNDS_PER_LINE == 0:
                ctx.progress(
                    f"{names}: {rounds} rounds, {slot} slots sent; {len(keys)} of "
                    f"{len(lead.cells)} cells still measuring"
                )
        for start in starts:
            for cell in start.cells.values():
                _close_cell(cell)
                self._sender.summary(cell.window)
            ctx.store.flush()
        for start in starts if slots is None else ():
            for prompt_type, plan, windows in start.prompt_types:
                self._ids.after_start(start.phase, prompt_type, windows, plan)

    def _paced(self, seconds: float, requests: int) -> None:
        """A round's time into the run's pace, kept for the next plan (`environment["pace"]`:
        the rounds' seconds, their slots sent to each server, a slot's seconds per server, the
        prompt types' mean max_tokens; the warm-up and the regime window aside); after the
        first round, the run's own estimate (`RunContext.first_round`)."""
        ctx = self._ctx
        pace = ctx.record.environment.setdefault("pace", {"rounds_s": 0.0, "slots": 0})
        first = not pace["slots"]
        pace["rounds_s"] += seconds
        pace["slots"] += requests
        pace["slot_s"] = pace["rounds_s"] / max(1, pace["slots"])
        tokens = [t.max_tokens for t in ctx.settings.prompt_types.values()] or [0]
        pace["max_tokens"] = sum(tokens) / len(tokens)
        if first and requests and ctx.first_round is not None:
            ctx.first_round(seconds / requests)

    def _prepare(self, start: Start, slots: int | None = None) -> None:
        """A start's windows and cells, prompt type by prompt type, on the request plan;
        `slots`: a fixed number of slots per cell."""
        settings = self._ctx.settings
        for prompt_type in settings.prompt_types.values():
            plan = self._sender.plan(prompt_type)
            self._ctx.progress(f"[{start.phase.name}] {prompt_type.name}: {plan.describe()}")
            windows = self._sender.windows(start.phase, prompt_type, start.service)
            start.prompt_types.append((prompt_type, plan, windows))
            for window, indices in zip(windows, plan.levels, strict=True):
                least, most = settings.run.requests_at(window.m.level, fixed=settings.aa_only)
                step = slot_size(window.m.level, least)
                if slots is not None:
                    least = most = min(slots * step, len(indices))
                cell = CellPlan(window.m.key, tuple(indices), least, most, step)
                start.cells[window.m.key] = Cell(window, cell, start.service)

    def _decided(self, starts: list[Start], keys: Sequence[str]) -> set[str]:
        """Side by side: the cells the stop rule finds decided at this round's look."""
        if len(starts) < 2:
            return set()
        out = set()
        for key in keys:
            lead = starts[0].cells[key]
            if self._sender.decided(
                lead.window,
                [s.cells[key].window for s in starts[1:]],
                slots=len(lead.kept),
                planned=-(-lead.plan.most // lead.plan.step),
                cells=len(starts[0].cells),
            ):
                out.add(key)
        return out

    def _wants(self, cell: Cell) -> bool:
        sent, plan = len(cell.window.m.samples), cell.plan
        # adaptive: only the spread decides, never the values themselves
        pinned = plan.least <= sent < plan.most and self._sender.pinned(cell.window)
        return plan.wants(sent, pinned=pinned)

    def _send_round(
        self,
        starts: list[Start],
        sequence: Sequence[str],
        first_slot: int,
        order: RoundOrder,
        number: int,
    ) -> None:
        """One round, sent again once quiet where other clients or other work contaminated it."""
        ctx, run = self._ctx, self._ctx.settings.run
        where = f"[{' + '.join(s.phase.name for s in starts)}] round {number}"
        set_aside: list[str] = []  # why each earlier try was set aside (the host)
        for attempt in range(1, run.traffic_attempts + 1):
            sent: list[Slot] = []
            firsts: list[str] = []
            with contextlib.ExitStack() as stack:
                pair = [s.service for s in starts]
                watches = [stack.enter_context(self._quiet.window(s.service, pair)) for s in starts]
                for j, key in enumerate(sequence):
                    turn = [starts[i] for i in order.turn(len(starts))]
                    firsts.append(turn[0].phase.name)
                    for start in turn:  # one after the other, never two at once
                        sent.append(self._send_slot(start.cells[key], first_slot + j))
                envs = [w.environment() if w else None for w in watches]
            other = _round_foreign(starts, sent)
            busy = self._judge_round(starts, envs, sequence[0])
            if other is None and busy is None:
                self._keep(starts, sequence, sent, envs, firsts, set_aside)
                return
            if other is not None:
                ctx.progress(f"{where}: other clients used the server during the window ({other})")
            if busy is not None:
                ctx.progress(f"{where}: the host was not quiet during the window ({busy})")
            action = after_contamination(
                other is not None,
                busy is not None,
                attempt=attempt,
                attempts=run.traffic_attempts,
                run=run,
            )
            if action != "again":
                if busy is not None and not run.allow_busy_host:
                    for env in envs:
                        if env is not None:
                            env.contaminated = busy
                if action == "mark":
                    ctx.progress(f"{where}: kept, marked contaminated")
                else:
                    ctx.progress(f"{where}: kept (--spec-allow-busy-host)")
                self._keep(starts, sequence, sent, envs, firsts, set_aside)
                return
            for slot in sent:  # kept in the record, not analysed
                m, gone = slot.cell.window.m, {id(x) for x in slot.samples}
                m.discarded += slot.samples
                m.samples = [x for x in m.samples if id(x) not in gone]
            ctx.store.flush()
            ctx.progress(
                f"{where}: measuring again (attempt {attempt + 1} of {run.traffic_attempts}) "
                f"once the {'server' if busy is None else 'host'} is quiet"
            )
            if other is not None:
                for start in starts:
                    self._quiet.wait_for_quiet(start.service)
            if busy is not None:  # one host: the pair watched as one server
                self._quiet.wait_for_quiet_host(starts[0].service, [s.service for s in starts])
                set_aside.append(f"round {number}: {busy}")  # as its progress lines name it

    def _send_slot(self, cell: Cell, slot: int) -> Slot:
        """One slot, between two reads of its server's counters (untimed)."""
        self._ctx.step(
            f"measuring slot {slot + 1} of {self._planned} ({cell.window.m.key}) on "
            f"{cell.window.phase.name}"
        )
        before = self._ctx.counters(cell.service)
        indices = cell.plan.next_slot(len(cell.window.m.samples))
        result = self._sender.send(cell.window, indices, slot=slot)
        after = self._ctx.counters(cell.service)
        return Slot(
            cell,
            result.samples,
            result.stats,
            traffic_between(before, after),
            acceptance_between(before, after),
        )

    def _judge_round(
        self, starts: list[Start], envs: Sequence[WindowEnvironment | None], key: str
    ) -> str | None:
        """What moved beyond the bounds on any start's host through the round (None: clean)."""
        notes = []
        pairs = list(zip(starts, envs, strict=True))
        for start, env in pairs:
            if env is None:
                continue
            beside = next(((s.phase.name, e) for s, e in pairs if s is not start and e), None)
            off = self._quiet.judge_env(env, start.phase, key, beside=beside)
            if off:
                notes.append(off if len(starts) == 1 else f"{start.phase.name}: {off}")
        return "; ".join(notes) or None

    def _keep(
        self,
        starts: list[Start],
        sequence: Sequence[str],
        sent: Sequence[Slot],
        envs: Sequence[WindowEnvironment | None],
        firsts: Sequence[str],
        set_aside: Sequence[str],
    ) -> None:
        for slot in sent:
            slot.cell.kept.append(slot)
        for start, env in zip(starts, envs, strict=True):
            for key in sequence:
                cell = start.cells[key]
                cell.set_aside += set_aside
                if env is not None:
                    cell.window.m.environment = _worse(cell.window.m.environment, replace(env))
            if len(starts) > 1:
                start.phase.sent_first += firsts
        self._ctx.store.flush()


def _close_cell(cell: Cell) -> None:
    """A cell's figures over its kept slots: wall time, counters, the client's load."""
    m = cell.window.m
    m.wall_s = sum(s.stats.wall_s for s in cell.kept)
    m.acceptance = combine([s.acceptance for s in cell.kept])
    m.traffic = add_traffic([s.traffic for s in cell.kept])
    m.foreign = foreign(m.traffic, m.samples)
    m.client = ClientLoad()
    for slot in cell.kept:
        m.client.add(slot.stats)
    if m.environment is not None:
        m.environment.remeasured = list(cell.set_aside)


def _round_foreign(starts: Sequence[Start], sent: Sequence[Slot]) -> str | None:
    """Other clients' traffic on any start's server through a round (None: only ours)."""
    notes = []
    for start in starts:
        own = [s for s in sent if s.cell.service is start.service]
        found = foreign(add_traffic([s.traffic for s in own]), [x for s in own for x in s.samples])
        if found:
            notes.append(found if len(starts) == 1 else f"{start.phase.name}: {found}")
    return "; ".join(notes) or None


def _worse(a: WindowEnvironment | None, b: WindowEnvironment) -> WindowEnvironment:
    """Of a cell's rounds' environments, the one to keep: the off one, else the busiest."""
    if a is None:
        return b

    def rank(env: WindowEnvironment) -> tuple[bool, float]:
        return (bool(env.off or env.contaminated), env.other_cpu_share or 0.0)

    return b if rank(b) > rank(a) else a
