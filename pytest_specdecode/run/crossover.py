"""A run across replicas: the crossover (AB/BA, or its rotation), for `[[target.replicas]]`.

`CrossoverSession` is the run's session where the target has replicas (docs/replicas.md):
1. before anything is touched, each replica is read and checked against the others
   (run/replicas.py → `replica_facts`, analysis/replicas/alike.py → `alike`) and preflighted;
   refused replicas end the run as a usage error, nothing touched;
2. the replicas are held by targets/replicas.py → `replica_services` (each one's
   `experiment_services`, restored all at once whatever happens, drained and undrained);
3. each period (config/replicas.py → `crossover_periods`) switches the replicas at once, then
   sends each slot's prompt to every replica at once (measure/crossover.py), every sample
   journalled as it comes with its period and replica; each replica's other clients and other
   work are watched through each slot (measure/crossover_watch.py), a contaminated slot sent
   again once or marked;
4. the analysis is analysis/replicas/crossover.py → `crossover_of`; results.json's `crossover` and
   `replicas`, summary.md and the terminal say the change, the replica and period effects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from html import escape
from typing import Any

import pytest

from ..analysis.replicas.alike import alike
from ..analysis.replicas.crossover import METRICS, CrossoverSlot, crossover_of
from ..analysis.variance.restarts import RestartNoise
from ..config.arms import BASELINE
from ..config.replicas import Period, crossover_periods
from ..config.settings import Settings
from ..config.specconfig import SpecConfig
from ..errors import ConfigError, SpecDecodeError
from ..measure.crossover import Slot, crossover_slots, send_period
from ..measure.crossover_watch import CrossoverWatch, watch_lines
from ..measure.host_load import Probe
from ..progress import write_line
from ..record.ending import RunEnding
from ..record.requests.samples import RequestSample
from ..record.store import RunStore
from ..redaction import redact_text
from ..report import SUMMARY_FILE, Written
from ..report.plan import RUN_LOG
from ..report.replicas import alike_lines, crossover_json, crossover_lines, schedule_lines
from ..targets.base import Target
from ..targets.host_env import HostProbe
from ..targets.interrupts import INTERRUPTS
from ..targets.replicas import Replica, ReplicaSet, replica_services
from .folder import api_headers, check_writable
from .replicas import replica_facts
from .session import SpecDecodeSession
from .tests_seen import cut_of, failed_tests

PROGRESS_EVERY_S = 15.0  # a slot's line at most this often, and the period's last
PER_PROMPT_TYPE = (
    "a crossover across replicas decides each candidate over the whole prompt set "
    "(test_crossover_does_not_regress); it measures no arm on one server, so per-arm "
    "thresholds and per-prompt-type verdicts are not given (docs/replicas.md)"
)


def new_session(config: pytest.Config, settings: Settings) -> SpecDecodeSession:
    """The run's session: a crossover across replicas where the target has them."""
    cls = CrossoverSession if settings.replicas else SpecDecodeSession
    return cls(config, settings)


class CrossoverRun:
    """The periods, their slots and what they measured; the analysis once they are done."""

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
    ) -> None:
        self.settings = settings
        self.replicas = list(replicas)
        self.store = store
        self.held: ReplicaSet | None = None
        self._progress = progress
        self._step = step or (lambda text: None)  # what the run is doing: a cut run says it
        self._headers = headers
        self.arms = [BASELINE, *(c.name for c in settings.candidates)]
        self.periods: tuple[Period, ...] = crossover_periods([r.name for r in replicas], self.arms)
        self.slots: list[dict[str, Any]] = []  # each measured slot, as results.json keeps it
        self.done = False
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
        """Every period: the replicas switched at once, then every slot to all at once."""
        if self.done:
            return
        assert self.held is not None
        specs: dict[str, SpecConfig | None] = {BASELINE: None}
        specs.update({c.name: c for c in self.settings.candidates})
        warm, slots = crossover_slots(self.settings)
        self._slots = len(slots)
        total = len(self.periods)
        with contextlib.closing(self.watch):  # no host left sampled, whatever happens
            for period in self.periods:
                serving = ", ".join(f"{r} serves {arm}" for r, arm in period.serving)
                head = f"[crossover] period {period.number} of {total}"
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
        self.done = True

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

    def analysed(self) -> tuple[dict[str, Any] | None, str | None]:
        """results.json's `crossover`, or None and why (a period not measured)."""
        measured = {s["period"] for s in self.slots}
        missing = [p.number for p in self.periods if p.number not in measured]
        if missing:
            return None, f"period {', '.join(map(str, missing))} not measured"
        index = {arm: i for i, arm in enumerate(self.arms)}
        slots = []
        for s in self.slots:
            tpot = s["tpot"]
            slots.append(
                CrossoverSlot(
                    period=s["period"] - 1,
                    prompt=s["prompt"],
                    arms=tuple(index[a] for a in s["arms"]),
                    throughput=tuple(s["throughput"]),
                    tpot=None if any(t is None or t <= 0 for t in tpot) else tuple(tpot),
                )
            )
        run = self.settings.run
        noise = RestartNoise.assumed(run.assumed_restart_noise)
        try:
            result = crossover_of(
                slots,
                alpha=run.alpha,
                margin=run.min_effect,
                restart_noise=dict.fromkeys(METRICS, noise),
            )
        except ValueError as exc:
            return None, f"the crossover could not be analysed: {exc}"
        found = crossover_json(result, self.arms[1:])
        for entry in found.values():
            entry["restart_noise"] = noise.source
        return found, None


class CrossoverSession(SpecDecodeSession):
    """The session of a run across replicas (the module's docstring)."""

    crossover: CrossoverRun | None = None
    _why_none: str | None = None
    _result: dict[str, Any] | None = None

    def check_before_start(self) -> None:
        """The reports folder, and what a crossover does not do; the candidates are checked on
        each replica as the run starts."""
        run, option = self.settings.run, self.config.getoption
        given = [
            name
            for name, on in (
                ("--spec-search", run.search),
                ("--spec-break-even", run.break_even),
                ("--spec-baseline-from", option("spec_baseline_from")),
                ("--spec-aba", option("spec_aba")),
            )
            if on
        ]
        if given:
            raise ConfigError(
                f"[target] has replicas: {', '.join(given)} is not run across replicas (the "
                "crossover's period effect is its drift check); nothing was touched"
            )
        check_writable(self.settings.reports_dir)

    @contextlib.contextmanager
    def running(self, session: pytest.Session) -> Iterator[CrossoverRun]:  # type: ignore[override]
        """Check the replicas, hold them all, yield the run; whatever happens, the teardown
        restores each replica, all at once."""
        settings = self.settings
        self._started = time.monotonic()
        opened: list[tuple[Replica, Target]] = []
        try:  # nothing is touched until every replica passed
            for config in settings.replicas:
                try:
                    target = self._replica_target(config.target, config.name)
                except SpecDecodeError as exc:
                    raise ConfigError(f"replica {config.name}: {exc}") from None
                unit = config.target.unit if config.target.backend == "systemd" else None
                replica = Replica(config.name, target, config.drain, config.undrain, unit=unit)
                opened.append((replica, target))
            facts = []
            for config, (replica, target) in zip(settings.replicas, opened, strict=True):
                try:
                    facts.append(replica_facts(config, target, self.progress, settings.candidates))
                except SpecDecodeError as exc:
                    raise ConfigError(f"{replica.where}: {exc}") from None
            found = alike(facts)
            for line in [*alike_lines(found), *self._schedule()]:
                self.progress(f"plan: {line}")
            if found.refused:
                raise ConfigError(
                    "the replicas are not alike enough to compare across: "
                    + "; ".join(found.refusals)
                )
            for replica, target in opened:
                self.progress.step(f"preflight of {replica.where}")
                try:
                    target.preflight()
                except SpecDecodeError as exc:
                    raise ConfigError(f"{replica.where}: {exc}") from None
        except SpecDecodeError as exc:
            for _, target in opened:
                target.close()
            self.progress(f"refused, nothing was touched: {exc}")
            self._discard_run_dir()
            pytest.exit(f"pytest-specdecode: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for config in settings.replicas:
            (self.run_dir / f"replica-{config.name}").mkdir(exist_ok=True)
        self.progress.open(self.run_dir / RUN_LOG)
        self.progress(f"run folder {self.run_dir}")
        store = RunStore(self.run_dir, self._new_record(opened[0][1]))
        replicas = [r for r, _ in opened]
        store.extra["replicas"] = [r.to_json() for r in replicas]
        run = CrossoverRun(
            settings,
            replicas,
            store,
            progress=self.progress,
            headers=api_headers(settings),
            step=self.progress.step,
            probes=[HostProbe(r.target.host) for r in replicas],
        )
        self.crossover = run
        lock = threading.Lock()

        def record_ending(ending: RunEnding) -> None:  # from each replica's restore thread
            with lock:
                store.record.ending = ending
                store.flush()

        t = settings.target
        try:
            with replica_services(
                replicas,
                ready_timeout_s=t.startup_timeout_s,
                restore_timeout_s=t.restore_timeout_s,
                progress=self.progress,
                headers=api_headers(settings),
                retry_failed_start=t.retry_failed_start,
                record_ending=record_ending,
            ) as held:
                run.held = held
                yield run
        finally:
            with lock:
                store.extra["replicas"] = run.replicas_json()
                store.flush()

    def _replica_target(self, target_config: Any, name: str) -> Target:
        """A replica's target, its servers' logs in a folder of its own (made once the run
        starts: a refused run leaves no folder)."""
        settings = dataclasses.replace(self.settings, target=target_config)
        return self.config.hook.pytest_specdecode_open_target(
            config=self.config,
            settings=settings,
            log_dir=self.run_dir / f"replica-{name}",
            progress=self.progress,
        )

    def _schedule(self) -> list[str]:
        names = [r.name for r in self.settings.replicas]
        return schedule_lines(names, BASELINE, [c.name for c in self.settings.candidates])

    def arm(self, name: str) -> Any:
        """No arm is measured on one server in a crossover: the tests that need one skip."""
        pytest.skip(PER_PROMPT_TYPE)

    def complete_design(self) -> Any:  # type: ignore[override]
        """Both periods measured, then the analysis (once)."""
        assert self.crossover is not None
        if self._result is None and self._why_none is None:
            self.crossover.measure_all()
            self.progress.step("analysing the crossover")
            self._result, self._why_none = self.crossover.analysed()
        return self._result

    def crossover_verdicts(self) -> tuple[dict[str, Any] | None, str | None]:
        """Per candidate its crossover entry (with `verdict`), or None and why."""
        return self.complete_design(), self._why_none

    def finish(self, exit_code: int | None = None) -> Written | None:
        """Once, after the restore: the analysis into results.json, summary.md; a run cut short
        says so. Never raises."""
        if self._finished:
            return self.written
        self._finished = True
        run = self.crossover
        if run is None:
            return None
        try:
            store = run.store
            store.record.cut = cut_of(
                self.config,
                store.record,
                stopped=self._stopped,
                first_signal_at=INTERRUPTS.first_at,
                started=self._started,
                step_at=self.progress.step_at,
                starts_planned=len(run.periods),
                design_complete=run.done,
                exit_code=exit_code,
            )
            if store.record.cut is not None:
                self.progress(f"run cut: {store.record.cut.headline()}")
            if self._result is None and self._why_none is None:
                self._result, self._why_none = run.analysed()
            store.extra["crossover"] = self._result
            if self._why_none:
                store.extra["crossover_missing"] = self._why_none
            store.extra["replicas"] = run.replicas_json()
            store.record.environment["run_s"] = time.monotonic() - self._started
            store.flush()
            text = self._summary(failed_tests(self.config))
            summary = self.run_dir / SUMMARY_FILE
            summary.write_text(text)
            step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
            if step_summary:
                with open(step_summary, "a") as f:
                    f.write(text + "\n")
            self.written = Written(self.run_dir, summary, {}, text)
        except Exception:
            write_line("[specdecode] the report could not be written:\n" + traceback.format_exc())
        return self.written

    def _lines(self) -> list[str]:
        assert self.crossover is not None
        run = self.crossover
        return [
            *crossover_lines(
                self._result,
                [r.to_json() for r in run.replicas],
                names=[r.name for r in run.replicas],
                why_none=self._why_none,
            ),
            *watch_lines([run.watch.seen[r.name] for r in run.replicas]),
        ]

    def _summary(self, failed: Sequence[str]) -> str:
        """summary.md: the crossover's change, replica and period effects, and each replica."""
        assert self.crossover is not None
        record = self.crossover.store.record
        head = ["# Speculative decoding across replicas: the crossover", ""]
        if record.cut is not None:
            head += [f"**Run cut short:** {record.cut.headline()}", ""]
        body = [_bullet(line) for line in self._lines()]
        plan = [_bullet(line) for line in self._schedule()]
        tail = ["", "## Failed tests", *(f"- {t}" for t in failed)] if failed else []
        return "\n".join([*head, "## Result", *body, "", "## Plan", *plan, *tail]) + "\n"

    def html_section(self) -> str | None:
        """report.html's short section: the summary's lines."""
        if self.crossover is None:
            return None
        items = "".join(f"<li>{escape(line)}</li>" for line in self._lines())
        return f"<h2>Across replicas: the crossover</h2><ul>{items}</ul>"

    def terminal_lines(self) -> list[str]:
        if self.crossover is None:
            return []
        lines = self._lines()
        lines.append(f"results: {self.crossover.store.path}")
        if self.written is not None:
            lines.append(f"summary: {self.written.summary}")
        return [redact_text(line) for line in lines]


def _bullet(line: str) -> str:
    """A line as a markdown item; an indented one as an item under the one before."""
    return f"  - {line.strip()}" if line.startswith("  ") else f"- {line.strip()}"
