"""The run's state for one pytest session: one object, registered as a plugin in pytest_configure.

It owns the run folder, the progress log, the experiment and the end of the run; its plan, made
on the target before anything is touched, and the settings as they resolved there: run/planning.py.
The hooks in plugin.py and the fixtures in fixtures.py only call into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .. import __version__
from ..analysis.run import RunAnalysis, analyze, max_num_seqs
from ..analysis.verdict.compare import PromptTypeVerdict
from ..analysis.verdict.design import check_design
from ..analysis.verdict.reuse import stored_baseline
from ..config.arms import BASELINE, BASELINE_AFTER
from ..config.settings import Settings
from ..config.specconfig import SpecConfig, validate_spec_values
from ..config.target import TargetConfig
from ..errors import ConfigError, SpecDecodeError
from ..measure.environment import environment
from ..measure.experiment.arms import Experiment
from ..measure.search import SearchRun
from ..options import settings_from_options
from ..progress import ProgressLog, write_line
from ..record.ending import RunCut
from ..record.schema import Phase, RunRecord, TargetInfo
from ..record.search import SEARCH_PREFIX
from ..record.store import RunStore, stored_runs
from ..redaction import redact_argv, redact_env, redact_text
from ..report import Written, write_reports
from ..report import terminal as terminal_report
from ..report.plan import RUN_LOG
from ..targets.base import Progress, Target
from ..targets.facts.vllm import with_request_metrics
from ..targets.host_env import HostProbe
from ..targets.lifecycle import RunEnding, experiment_services
from ..targets.shaped import shaped_target
from .drafters import drafters_environment
from .folder import api_headers, check_writable, new_run_dir
from .host_noise import HostNoise
from .planning import Planning
from .tests_seen import cut_of, failed_tests

PLUGIN_NAME = "specdecode-session"


def session_of(config: pytest.Config) -> SpecDecodeSession:
    """The run's session object: registered in pytest_configure, or now if a suite asks first."""
    found = config.pluginmanager.get_plugin(PLUGIN_NAME)
    if found is None:
        try:
            found = SpecDecodeSession(config, settings_from_options(config))
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(found, PLUGIN_NAME)
    return found


class SpecDecodeSession:
    """One experiment per pytest session."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.run_dir = new_run_dir(settings)  # created once the run really starts
        self.experiment: Experiment | None = None
        self.search: SearchRun | None = None  # --spec-search: its slots, resolved on demand
        self.written: Written | None = None
        self.progress = ProgressLog(config)
        self._finished = False
        self._analysis: RunAnalysis | None = None  # the run's one analysis, once it is complete
        self._reports_existed = settings.reports_dir.exists()
        self.on_discard: list[Callable[[], None]] = []  # undone when a refused run is discarded
        self._failures_shown: dict[str, str] = {}  # an arm that failed to start: the first test
        self._started = time.monotonic()  # the run's wall time: recorded, for the next plans
        self._stopped: tuple[str, str, float] | None = None  # (kind, by, wall time): what ended it
        self.host_noise = HostNoise.of_option(
            config.getoption("spec_host_profiles"),
            settings,
            run_dir=self.run_dir,
            progress=self.progress,
            facts=lambda: self.plan.vllm_facts,
        )
        # before anything is touched: the candidates checked, the arms chosen, the plan said
        self.plan = Planning(
            config,
            settings,
            self.host_noise,
            self.progress,
            self._open_target,
            run_dir=self.run_dir,
        )

    @property
    def settings(self) -> Settings:
        """The run's settings: as configured, then as the plan resolved them on its target."""
        return self.plan.settings

    # -- before anything starts ---------------------------------------------------------------
    def check_before_start(self) -> None:
        """Refuse, before anything starts: a design that cannot reach a verdict, a reused
        baseline that cannot be, a reports folder that cannot be written, a candidate the
        target's vLLM refuses (run/planning.py)."""
        check_design(self.settings)
        path = self.config.getoption("spec_baseline_from")
        if path and self.settings.shape is not None:
            raise ConfigError(
                f"--spec-baseline-from {path} with --spec-shape: a stored baseline measured "
                "another model than the shape; the shape's baseline is its own start"
            )
        if path:
            stored_baseline(path, self.settings)
        check_writable(self.settings.reports_dir)
        wanted = self.settings.candidates or self.settings.run.search or self.settings.shape
        if wanted and self.writes_html:  # a run; the dry run checks its own
            self.plan.validate()

    @property
    def writes_html(self) -> bool:
        """pytest-html writes report.html into the run folder: only when an experiment runs."""
        option = self.config.option
        return not (option.spec_dry_run or option.collectonly or getattr(option, "help", False))

    def dry_run(self) -> int:
        """Print the plan (run/planning.py). Nothing is started, written or locked."""
        return self.plan.dry_run()

    # -- the run ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def running(self, session: pytest.Session) -> Iterator[Experiment]:
        """Bring services up on demand; whatever happens, the teardown restores the original."""
        t = self.settings.target
        headers = api_headers(self.settings)
        target = self._open_target(self.run_dir)
        transports = target.transports()
        self._started = time.monotonic()
        try:  # nothing is touched until preflight has passed; its last step takes the lock
            self.plan.log(target)  # the arms chosen on this host: the settings from here on
            target.preflight()
        except SpecDecodeError as exc:
            target.close()
            self.progress(f"refused, nothing was touched: {exc}")
            self._discard_run_dir()
            pytest.exit(f"pytest-specdecode: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        settings = self.settings
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.progress.open(self.run_dir / RUN_LOG)
        self.progress(f"run folder {self.run_dir}")
        store: RunStore | None = None
        board = None

        def record_ending(ending: RunEnding) -> None:  # as soon as each part of it is known
            if store is not None:
                store.record.ending = ending
                store.flush()

        try:
            with experiment_services(
                target,
                ready_timeout_s=t.startup_timeout_s,
                restore_timeout_s=t.restore_timeout_s,
                progress=self.progress,
                headers=headers,
                transport=transports.sync,
                record_ending=record_ending,
                clock=transports.clock,
                retry_failed_start=t.retry_failed_start,
            ) as board:
                store = RunStore(self.run_dir, self._new_record(target))
                self.experiment = Experiment(
                    settings,
                    board,
                    store,
                    progress=self.progress,
                    headers=headers,
                    transports=transports,
                    outside=self.host_noise.known(self.host_noise.plan_key(target)),
                    request_metrics_note=self.plan.request_metrics_note,
                    facts=self.plan.vllm_facts,
                    probe=HostProbe(target.host),
                    step=self.progress.step,
                    first_round=lambda slot_s: self._estimate_now(target, board.startups, slot_s),
                )
                self.progress.step("watching the host before the run")
                self.plan.watch_host(self.experiment, target, board.original)
                if settings.run.search:
                    self.search = self._search(self.experiment, target.host_name)
                # the original as it serves: measured as the baseline, or stopped for the
                # shape's window (a unit serving its shape): no other client may be using it
                if board.was_active and (
                    target.adopts_running_original or board.found is not board.original
                ):
                    self.plan.watch_traffic(self.experiment, board.found)
                yield self.experiment
        finally:  # the restore ran in experiment_services' teardown: keep what it reported
            if store is not None and board is not None and board.restore_report is not None:
                store.record.restore = board.restore_report
                store.flush()

    def _estimate_now(self, target: Target, startups: list[float], slot_s: float) -> None:
        """Once, after the first start and round: the run's whole time at its own pace."""
        line = self.plan.estimate_now(
            target, startups, slot_s, elapsed_s=time.monotonic() - self._started
        )
        if line:
            self.progress(line)

    def _search(self, experiment: Experiment, host: str) -> SearchRun:
        """--spec-search: each reload chosen by prediction, checked by the host's vLLM as any
        candidate is, and measured by the experiment (whose teardown is the restore)."""
        run, model = self.settings.run, self.settings.target.model
        assert run.search is not None

        def stored() -> list[tuple[str, RunRecord]]:
            found = stored_runs(self.settings.reports_dir, host=host, model=model)
            return [(folder.name, r) for folder, r in found if folder != self.run_dir]

        def prepare(spec: SpecConfig) -> SpecConfig:
            facts = self.plan.vllm_facts
            values = validate_spec_values(spec.values, source=spec.name, facts=facts)
            checked = SpecConfig(spec.name, values)
            return with_request_metrics((checked,), facts)[0] if facts else checked

        return SearchRun(
            experiment,
            method=run.search,
            max_reloads=run.max_reloads,
            margin=run.min_effect,
            stored=stored,
            prepare=prepare,
            progress=self.progress,
            before_choice=self._known_noise,
            max_num_seqs=max_num_seqs(experiment.record),
        )

    def arm(self, name: str) -> Phase:
        """An arm's measurements over all its starts; a search's slot resolved first (raises
        SearchStopped where the search did not reach it)."""
        assert self.experiment is not None
        if self.search is not None and name.startswith(SEARCH_PREFIX):
            slot = name.removeprefix(SEARCH_PREFIX)
            if slot.isdigit():
                name = self.search.arm(int(slot))
        return self.experiment.arm(name)

    def start_failure_text(self, nodeid: str, exc: BaseException) -> str | None:
        """What a test that needed an arm which failed to start reports: the whole failure
        once, for the first such test; one line pointing at it for every later one. None for
        any other exception."""
        arm = self.experiment.failed_arm(exc) if self.experiment is not None else None
        if arm is None:
            return None
        first = self._failures_shown.setdefault(arm, nodeid)
        if first == nodeid:
            return f"{type(exc).__name__}: {exc}"
        headline = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return f"the {arm} arm failed to start (shown in full at {first}): {headline[:200]}"

    def describe(self, candidate: str) -> str:
        """A candidate as its tests name it: a search's slot with the config it chose."""
        search = self.experiment.record.search if self.experiment else None
        found = search.reload_of(candidate) if search else None
        return f"{candidate} ({found.label})" if found else candidate

    def _open_target(self, log_dir: Path) -> Target:
        """The target (the `pytest_specdecode_open_target` hook's, else the configured
        backend); with --spec-shape, once the plan resolved it, serving the shape."""
        settings = self.settings

        def hook(target: TargetConfig, *, log_dir: Path, progress: Progress | None) -> Target:
            return self.config.hook.pytest_specdecode_open_target(
                config=self.config,
                settings=dataclasses.replace(settings, target=target),
                log_dir=log_dir,
                progress=progress,
            )

        served = self.plan.shape if hasattr(self, "plan") else None
        if served is None:
            return hook(settings.target, log_dir=log_dir, progress=self.progress)
        return shaped_target(
            settings.target, served, open_target=hook, log_dir=log_dir, progress=self.progress
        )

    def _new_record(self, target: Target) -> RunRecord:
        settings = self.settings
        t = settings.target
        # the shape as the target serves it (a unit's: its folder on the host)
        shape = getattr(target, "served", None) or self.plan.shape
        record = RunRecord(
            plugin_version=__version__,
            config_file=str(settings.source),
            target=TargetInfo(
                backend=t.backend,
                host=target.host_name,
                api_base=target.api_base,
                model=shape.model_label(t.model) if shape else t.model,
                unit=t.unit,
                command=redact_argv(t.command),
                env=redact_env(t.env),
            ),
            run=settings.run,
            candidates={c.name: dict(c.values) for c in settings.candidates},
            prompt_types=dict(settings.prompt_types),
            environment={
                "planned_s": self.plan.planned_s,  # the plan's estimate of what follows it
                **environment(
                    target,
                    settings.source,
                    self.host_noise.machine_of(target),
                    besides=(self.host_noise.profiles,),
                ),
                "vllm": self.plan.vllm_facts.record() if self.plan.vllm_facts else None,
                **drafters_environment(self.plan.drafters),  # each named, with its warnings
            },
            shape=shape,
        )
        reuse = self.config.getoption("spec_baseline_from")
        if reuse:
            record.phases[BASELINE], record.baseline_from = stored_baseline(reuse, settings)
            self.progress(f"baseline: reused from {reuse}, not measured")
        return record

    def verdict(self, candidate: str, prompt_type: str) -> PromptTypeVerdict:
        """One candidate against the baseline on one prompt type.

        Everything a verdict rests on is measured first, the same for every verdict and for the
        reports: every start of the design, the drift check's baseline (--spec-aba), and the
        restart noise known from stored runs of this host, model and vLLM version.
        """
        return self.complete_design().verdicts[candidate][prompt_type]

    def complete_design(self) -> RunAnalysis:
        """Every start of the design, then (--spec-aba) the original once more, last; then the
        run's one analysis, computed once and handed to every test and report."""
        assert self.experiment is not None
        if self._analysis is not None:
            return self._analysis
        self.experiment.measure_all()
        if self.search is not None:
            self.search.complete()
        record = self._record()
        aba = self.config.getoption("spec_aba") and not record.arm_phases(BASELINE_AFTER)
        if aba and record.arm_phases(BASELINE) and record.measured_candidates:
            self.progress("drift check (ABA): measuring the original again")
            self.experiment.baseline_after()
        self.progress.step("analysing the run")
        self._known_noise()
        self._analysis = analyze(record)
        self.progress.step("running the tests (the design was measured)")
        return self._analysis

    def _known_noise(self) -> None:
        """The restart noise known of this host, recorded once the baseline's version is."""
        if self.host_noise.record_prior(self._record()):
            self.experiment.store.flush()  # type: ignore[union-attr]

    def _record(self) -> RunRecord:
        assert self.experiment is not None
        return self.experiment.record

    def _discard_run_dir(self) -> None:
        """A refused run leaves nothing to review: no run folder, no HTML report."""
        for undo in self.on_discard:
            undo()
        shutil.rmtree(self.run_dir, ignore_errors=True)
        if not self._reports_existed:
            with contextlib.suppress(OSError):
                self.settings.reports_dir.rmdir()

    # -- the end ------------------------------------------------------------------------------
    def note_stop(self, kind: str, by: str) -> None:
        """What ended the run early, as pytest saw it (the first only): "interrupt" (a
        KeyboardInterrupt), "exit" (pytest.exit) or "error" (an internal error)."""
        if self._stopped is None:
            self._stopped = (kind, by, time.time())

    def _cut(self, design_complete: bool, exit_code: int | None) -> RunCut | None:
        """Whether the run was cut short, and how to say so (record/ending.py → run_cut)."""
        assert self.experiment is not None
        return cut_of(
            self.config,
            self.experiment.record,
            stopped=self._stopped,
            first_signal_at=self.experiment.board.interrupts.first_at,
            started=self._started,
            step_at=self.progress.step_at,
            starts_planned=len(self.experiment.order),
            design_complete=design_complete,
            exit_code=exit_code,
        )

    def analysis(self) -> RunAnalysis | None:
        """The run's one analysis: None until the design is complete (or the run ended)."""
        return self._analysis

    def drift(self):
        """--spec-aba: the drift check, after everything else was measured."""
        return self.complete_design().drift

    def finish(self, exit_code: int | None = None) -> Written | None:
        """Once, after the restore: the analysis into results.json, the plots and summary.md;
        a run cut short says so (`RunCut`, at the top of each). `exit_code`: pytest's.

        Never raises: the samples are already stored, and the test outcome must stand.
        """
        if self._finished:
            return self.written
        self._finished = True
        if self.experiment is None:
            return None
        try:
            store = self.experiment.store
            design_complete = self._analysis is not None
            store.record.cut = self._cut(design_complete, exit_code)
            if store.record.cut is not None:  # run.log keeps it too
                self.progress(f"run cut: {store.record.cut.headline()}")
            if self._analysis is None:  # an interrupted or partial run: what it measured
                self._known_noise()
                self._analysis = analyze(store.record)
            analysis = self._analysis
            store.record.environment["run_s"] = time.monotonic() - self._started
            starts = self.experiment.board.startups  # the starts' pace beside the rounds'
            if starts and isinstance(pace := store.record.environment.get("pace"), dict):
                pace["start_s"] = sum(starts) / len(starts)
                pace["starts_s"] = list(starts)  # in order: the first compiles (plan.warm_starts)
            self.host_noise.update_profile(store.record)
            store.analysis = analysis.to_json()
            store.flush()
            self.written = write_reports(
                store.record,
                analysis,
                self.run_dir,
                failed=failed_tests(self.config),
                step_summary=os.environ.get("GITHUB_STEP_SUMMARY"),
            )
        except Exception:
            write_line("[specdecode] the report could not be written:\n" + traceback.format_exc())
        return self.written

    def terminal_lines(self) -> list[str]:
        if self.experiment is None:
            return []
        record = self.experiment.record
        files = {"results": self.experiment.store.path}
        if self.written is not None:
            files = {"summary": self.written.summary, **files}
        analysis = self._analysis if self._analysis is not None else analyze(record)
        lines = terminal_report.lines(record, analysis, files=files)
        return [redact_text(line) for line in lines]
