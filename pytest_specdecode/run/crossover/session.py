"""The session of a run across replicas (`[[target.replicas]]`): the checks before anything is
touched, the plan, the replicas held and restored, the report (docs/replicas.md).

`CrossoverSession` is the run's session where the target has replicas (`new_session`):
1. before anything is touched, each replica is read and checked against the others
   (run/replicas.py → `replica_facts`, analysis/replicas/alike.py → `alike`) and preflighted;
   refused replicas end the run as a usage error, nothing touched;
2. the plan: what is known of the replicas' noise (run/crossover_known.py) and how many
   crossovers a decision needs (report/replicas/crossovers.py → `plan_of`), printed and kept in
   results.json's `crossover_plan`;
3. the replicas are held by targets/replicas.py → `replica_services` (each one's
   `experiment_services`, restored all at once whatever happens, drained and undrained), and
   the crossovers run (run/crossover/periods.py → `CrossoverRun`), stopping once decided;
4. results.json's `crossover` and `replicas`, summary.md and the terminal say the change, the
   replica and period effects, the crossovers made.
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

from ...analysis.replicas.alike import alike
from ...config.arms import BASELINE
from ...config.settings import Settings
from ...errors import ConfigError, SpecDecodeError
from ...measure.crossover_watch import watch_lines
from ...progress import write_line
from ...record.ending import RunEnding
from ...record.store import RunStore
from ...redaction import redact_text
from ...report import SUMMARY_FILE, Written
from ...report.plan import RUN_LOG
from ...report.replicas.crossovers import CrossoverPlan
from ...report.replicas.lines import alike_lines, crossover_lines, schedule_lines
from ...targets.base import Target
from ...targets.host_env import HostProbe
from ...targets.interrupts import INTERRUPTS
from ...targets.replicas import Replica, replica_services
from ..crossover_known import crossover_plan
from ..folder import api_headers, check_writable
from ..replicas import replica_facts
from ..session import SpecDecodeSession
from ..tests_seen import cut_of, failed_tests
from .periods import CrossoverRun

PER_PROMPT_TYPE = (
    "a crossover across replicas decides each candidate over the whole prompt set "
    "(test_crossover_does_not_regress); it measures no arm on one server, so per-arm "
    "thresholds and per-prompt-type verdicts are not given (docs/replicas.md)"
)


def new_session(config: pytest.Config, settings: Settings) -> SpecDecodeSession:
    """The run's session: a crossover across replicas where the target has them."""
    cls = CrossoverSession if settings.replicas else SpecDecodeSession
    return cls(config, settings)


class CrossoverSession(SpecDecodeSession):
    """The session of a run across replicas (the module's docstring)."""

    crossover: CrossoverRun | None = None
    crossovers_plan: CrossoverPlan | None = None
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
        if option("spec_repeats") is not None:
            raise ConfigError(
                "[target] has replicas: --spec-repeats is not used across replicas (each "
                "crossover restarts every replica into each arm once): --spec-crossovers N sets "
                "the most crossovers; nothing was touched"
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
            for line in alike_lines(found):
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
            self.crossovers_plan = crossover_plan(
                settings,
                [(c, t, f) for c, (_, t), f in zip(settings.replicas, opened, facts, strict=True)],
                detect=self.config.getoption("spec_detect"),
                profiles=self.host_noise.profiles,
                run_dir=self.run_dir,
                progress=self.progress,
            )
            for line in [*self._schedule(), *self.crossovers_plan.lines()]:
                self.progress(f"plan: {line}")
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
        store.extra["crossover_plan"] = self.crossovers_plan.to_json()
        run = CrossoverRun(
            settings,
            replicas,
            store,
            progress=self.progress,
            headers=api_headers(settings),
            step=self.progress.step,
            probes=[HostProbe(r.target.host) for r in replicas],
            planned=self.crossovers_plan.planned,
            outside=self.crossovers_plan.known.noise,
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
        planned = self.crossovers_plan.planned if self.crossovers_plan else 1
        return schedule_lines(names, BASELINE, [c.name for c in self.settings.candidates], planned)

    def arm(self, name: str) -> Any:
        """No arm is measured on one server in a crossover: the tests that need one skip."""
        pytest.skip(PER_PROMPT_TYPE)

    def complete_design(self) -> Any:  # type: ignore[override]
        """Every planned period measured (or the run stopped once decided), then the analysis
        (once)."""
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
        if self.crossovers_plan is not None:
            plan += [_bullet(line) for line in self.crossovers_plan.lines()]
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
