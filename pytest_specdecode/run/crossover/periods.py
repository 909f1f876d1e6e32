"""A run across replicas: the crossover (AB/BA, or its rotation), repeated as the plan says, for
`[[target.replicas]]`. The session around it: run/crossover/session.py.

`CrossoverRun` makes the periods and keeps what they measured:
1. each period (config/replicas.py → `crossover_periods`, `planned` crossovers of them)
   switches the replicas at once, then sends each slot's prompt to every replica at once
   (measure/crossover.py), every sample journalled as it comes with its period and replica;
   each replica's other clients and other work are watched through each slot
   (measure/crossover_watch.py), a contaminated slot sent again once or marked;
2. after each crossover but the last, a look: the analysis so far (`analysed`), at the look's
   boundary (analysis/replicas/looks.py); once every candidate is decided on a measured restart
   noise, no more crossovers;
3. the analysis is analysis/replicas/crossover.py → `crossover_of`; results.json's
   `crossover`, `crossover_looks` and the lines say the change, the replica and period
   effects, the crossovers made and where the run stopped.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...analysis.replicas.crossover import METRICS, CrossoverResult, crossover_of
from ...analysis.variance.restarts import RestartNoise
from ...config.arms import BASELINE
from ...config.replicas import Period, crossover_periods
from ...config.settings import Settings
from ...config.specconfig import SpecConfig
from ...measure.crossover import Slot, crossover_slots, send_period
from ...measure.crossover_watch import CrossoverWatch
from ...measure.host_load import Probe
from ...record.requests.samples import RequestSample
from ...record.store import RunStore
from ...report.replicas.lines import crossover_json, look_line
from ...targets.replicas import Replica, ReplicaSet
from ..crossover_known import slots_of

PROGRESS_EVERY_S = 15.0  # a slot's line at most this often, and the period's last


class CrossoverRun:
    """The periods, their slots and what they measured; the looks and the analysis."""

    def __init__(
        self,
        settings: Settings,
        replicas: Sequence[Replica],
        store: RunStore,
        *,
        progress: Any,
        headers: dict[str, str] | None,
        step: Any = None,
        probes: Sequence[Probe | None] | None = None,
        planned: int = 1,
        outside: Mapping[str, RestartNoise] | None = None,
    ) -> None:
        self.settings = settings
        self.replicas = list(replicas)
        self.store = store
        self.held: ReplicaSet | None = None
        self._progress = progress
        self._step = step or (lambda text: None)  # what the run is doing: a cut run says it
        self._headers = headers
        self.arms = [BASELINE, *(c.name for c in settings.candidates)]
        self.planned = max(1, planned)  # crossovers at most: the plan's
        assumed = RestartNoise.assumed(settings.run.assumed_restart_noise)
        self.outside = {m: (outside or {}).get(m, assumed) for m in METRICS}
        self.periods: tuple[Period, ...] = crossover_periods(
            [r.name for r in replicas], self.arms, self.planned
        )
        self.slots: list[dict[str, Any]] = []  # each measured slot, as results.json keeps it
        self.looks: list[dict[str, Any]] = []  # after each crossover but the last
        self.done = False
        self.stopped: str | None = None  # why no more crossovers were made, where it stopped
        self._lock = threading.Lock()
        self._said = time.monotonic()  # the last slot's progress line
        self._slots = 0  # measured slots per period
        self._tries: dict[tuple[int, int], int] = {}  # (period, slot): times sent
        self.watch = CrossoverWatch(
            settings,
            store,
            names=[r.name for r in self.replicas],
            transports=[r.target.transports() for r in self.replicas],
            probes=list(probes) if probes is not None else [None] * len(self.replicas),
            progress=progress,
            headers=headers,
        )

    def measure_all(self) -> None:
        """Every period: the replicas switched at once, then every slot to all at once; after
        each crossover but the last, a look, and no more crossovers once decided."""
        if self.done:
            return
        assert self.held is not None
        specs: dict[str, SpecConfig | None] = {BASELINE: None}
        specs.update({c.name: c for c in self.settings.candidates})
        warm, slots = crossover_slots(self.settings)
        self._slots = len(slots)
        total = len(self.periods)
        per_crossover = len(self.arms)
        with contextlib.closing(self.watch):  # no host left sampled, whatever happens
            for period in self.periods:
                serving = ", ".join(f"{r} serves {arm}" for r, arm in period.serving)
                head = f"[crossover] period {period.number} of {total}"
                if self.planned > 1 and (period.number - 1) % per_crossover == 0:
                    self._progress(f"[crossover] crossover {period.crossover} of {self.planned}")
                self._step(f"crossover period {period.number}: switching the replicas ({serving})")
                self._progress(f"{head}: switching the replicas ({serving})")
                services = self.held.serve({r: specs[arm] for r, arm in period.serving})
                if period is self.periods[0]:
                    self._step("crossover: watching each replica's host before the run")
                    self.watch.before_run(services)
                watched = [(r, services[r]) for r, _ in period.serving]
                self._progress(
                    f"{head}: {len(warm)} warm-up and {len(slots)} measured slots, each sent to "
                    f"{len(period.serving)} replicas at once"
                )
                send_period(
                    [services[r] for r, _ in period.serving],
                    [arm for _, arm in period.serving],
                    [*warm, *slots],
                    run=self.settings.run,
                    headers=self._headers,
                    transports=[
                        self._replica(r).target.transports().async_ for r, _ in period.serving
                    ],
                    clock=self.replicas[0].target.transports().clock,
                    on_slot=lambda slot, samples, p=period: self._stored(p, slot, samples),
                    first_sent=lambda h=head, s=serving: self._progress(f"{h}: {s}"),
                    before_slot=lambda slot, n=period.number, w=watched: self._before(n, slot, w),
                )
                if period.number % per_crossover == 0 and self._look(period.crossover):
                    break
        if self.stopped is None:
            self.stopped = f"all {self.planned} planned crossover{'s' if self.planned > 1 else ''}"
        self.done = True

    def _look(self, crossover: int) -> bool:
        """After crossover `crossover` (not the last planned): the analysis so far; True where
        every candidate is decided on a measured restart noise (no more crossovers)."""
        if crossover >= self.planned:
            return False
        self._step(f"crossover: the look after crossover {crossover}")
        result, why = self._analysis()
        if result is None:
            self._progress(f"[crossover] look after crossover {crossover}: {why}")
            return False
        decided = result.stops
        entry = {
            "crossover": crossover,
            "planned": self.planned,
            "confidence": result.metrics[0].change.confidence if result.metrics else None,
            "measured": result.measured,
            "decided": decided,
            "verdicts": {f"{self.arms[m.arm]} {m.metric}": m.verdict.value for m in result.metrics},
        }
        self.looks.append(entry)
        with self._lock:
            self.store.extra["crossover_looks"] = self.looks
            self.store.flush()
        self._progress(f"[crossover] {look_line(result, self.arms[1:], decided=decided)}")
        if decided:
            self.stopped = f"decided after crossover {crossover} of {self.planned}"
        return decided

    def _before(self, number: int, slot: Slot, watched: list[tuple[str, Any]]) -> None:
        self._step(
            f"crossover period {number}: sending slot {slot.index + 1}"
            + (" (warm-up)" if slot.warmup else "")
            + " to every replica"
        )
        self.watch.begin(watched)

    def _replica(self, name: str) -> Replica:
        return next(r for r in self.replicas if r.name == name)

    def _stored(self, period: Period, slot: Slot, samples: Sequence[RequestSample]) -> bool:
        """One slot's samples, journalled at once, each with its period and replica; True
        where other clients or other work on a replica have it sent again."""
        other, busy = self.watch.end(samples)
        if slot.warmup:
            return False
        key = (period.number, slot.index)
        self._tries[key] = attempt = self._tries.get(key, 0) + 1
        where = f"[crossover] period {period.number}, slot {slot.index + 1}"
        action = self.watch.settle(where, other, busy, attempt=attempt)
        if action == "again":
            return True
        arms = [arm for _, arm in period.serving]
        for (replica, arm), sample in zip(period.serving, samples, strict=True):
            self.store.add_sample(arm, sample, period=period.number, replica=replica)
        self.slots.append(
            {
                "period": period.number,
                "slot": slot.index,
                "prompt": slot.prompt,
                "prompt_type": slot.prompt_type.name,
                "replicas": [r for r, _ in period.serving],
                "arms": arms,
                "throughput": [s.tokens_per_s for s in samples],
                "tpot": [s.tpot_s for s in samples],
            }
        )
        if action == "mark":
            self.slots[-1]["contaminated"] = {
                r: "; ".join(n for n in (other.get(r), busy.get(r)) if n)
                for r, _ in period.serving
                if other.get(r) or busy.get(r)
            }
        with self._lock:
            self.store.extra["crossover_slots"] = self.slots
            self.store.flush()
        now = time.monotonic()
        if now - self._said >= PROGRESS_EVERY_S or slot.index + 1 == self._slots:
            self._said = now
            speeds = ", ".join(
                f"{r} {s.tokens_per_s:.1f} tok/s"
                for (r, _), s in zip(period.serving, samples, strict=True)
            )
            self._progress(
                f"[crossover] period {period.number}: slot {slot.index + 1} of {self._slots} "
                f"measured ({speeds})"
            )
        return False

    def replicas_json(self) -> list[dict[str, Any]]:
        """results.json's `replicas`: each one's restore and what was seen on it."""
        return [{**r.to_json(), **self.watch.seen[r.name].to_json()} for r in self.replicas]

    def _analysis(self) -> tuple[CrossoverResult | None, str | None]:
        """The analysis of every complete crossover so far, or None and why."""
        measured = {s["period"] for s in self.slots}
        per = len(self.arms)
        first = [p.number for p in self.periods[:per] if p.number not in measured]
        if first:
            return None, f"period {', '.join(map(str, first))} not measured"
        complete = 0  # crossovers whose every period was measured
        while complete < self.planned and all(
            n in measured for n in range(complete * per + 1, (complete + 1) * per + 1)
        ):
            complete += 1
        kept = [s for s in self.slots if s["period"] <= complete * per]
        run = self.settings.run
        try:
            return (
                crossover_of(
                    slots_of(kept, self.arms),
                    alpha=run.alpha,
                    margin=run.min_effect,
                    restart_noise=self.outside,
                    planned=self.planned,
                ),
                None,
            )
        except ValueError as exc:
            return None, f"the crossover could not be analysed: {exc}"

    def analysed(self) -> tuple[dict[str, Any] | None, str | None]:
        """results.json's `crossover`, or None and why (a period not measured)."""
        result, why = self._analysis()
        if result is None:
            return None, why
        found = crossover_json(result, self.arms[1:])
        begun = max((s["period"] for s in self.slots), default=0)
        cut = (
            f"; crossover {result.crossovers + 1} was cut before its end: its slots are not "
            "analysed"
            if begun > result.crossovers * len(self.arms)
            else ""
        )
        for entry in found.values():
            entry["stopped"] = (self.stopped or f"cut after crossover {result.crossovers}") + cut
        return found, None
