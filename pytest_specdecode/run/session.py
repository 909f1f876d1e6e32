"""The run's state for one pytest session: one object, registered as a plugin in pytest_configure.

It owns the settings, the run folder, the progress log, the experiment and the end of the run.
The hooks in plugin.py and the fixtures in fixtures.py only call into it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .. import __version__
from ..analysis.drafters.check import Drafter
from ..analysis.run import RunAnalysis, analyze, max_num_seqs
from ..analysis.verdict.compare import PromptTypeVerdict
from ..analysis.verdict.design import check_design
from ..analysis.verdict.reuse import stored_baseline
from ..config.arms import BASELINE, BASELINE_AFTER
from ..config.settings import Settings
from ..config.specconfig import SpecConfig, VllmFacts, validate_spec_values
from ..errors import ConfigError, HostError, SpecDecodeError
from ..measure.environment import environment
from ..measure.experiment.arms import Experiment
from ..measure.search import SearchRun
from ..measure.traffic import quiet, rate_text
from ..options import settings_from_options
from ..progress import ProgressLog, write_line
from ..record.counters import TrafficWatch
from ..record.ending import RunCut
from ..record.profile import lookup
from ..record.schema import Phase, RunRecord, TargetInfo
from ..record.search import SEARCH_PREFIX
from ..record.store import RunStore, stored_runs
from ..redaction import redact_argv, redact_env, redact_text
from ..report import Written, write_reports
from ..report import terminal as terminal_report
from ..report.plan import (
    RUN_LOG,
    drafter_plan,
    dry_run_lines,
    plain_seconds,
    search_text,
    service_plan,
    side_change_plan,
)
from ..report.stored_plan import stored_prediction, stored_search_plan
from ..targets.base import Service, Target
from ..targets.facts.vllm import (
    request_metrics_args,
    request_metrics_plan,
    validated_against_target,
    with_request_metrics,
)
from ..targets.host_env import HostProbe, busiest
from ..targets.lifecycle import RunEnding, experiment_services
from .arms import choose_arms, with_arms, with_regime
from .drafters import check_drafters, drafters_environment
from .folder import api_headers, check_writable, new_run_dir
from .host_noise import HostNoise
from .replicas import replicas_dry_run
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
        self.settings = settings
        self.run_dir = new_run_dir(settings)  # created once the run really starts
        self.experiment: Experiment | None = None
        self.search: SearchRun | None = None  # --spec-search: its slots, resolved on demand
        self.written: Written | None = None
        self.vllm_facts: VllmFacts | None = None  # what the candidates were validated against
        self.drafters: list[Drafter] = []  # each drafter's config, checked where it is loaded
        self.request_metrics_note: str | None = None  # why no per-request metrics, if so
        self.progress = ProgressLog(config)
        self._finished = False
        self._analysis: RunAnalysis | None = None  # the run's one analysis, once it is complete
        self._reports_existed = settings.reports_dir.exists()
        self.on_discard: list[Callable[[], None]] = []  # undone when a refused run is discarded
        self._failures_shown: dict[str, str] = {}  # an arm that failed to start: the first test
        self._started = time.monotonic()  # the run's wall time: recorded, for the next plans
        self._planned_s: float | None = None
        self._stopped: tuple[str, str, float] | None = None  # (kind, by, wall time): what ended it
        self.host_noise = HostNoise.of_option(
            config.getoption("spec_host_profiles"),
            settings,
            run_dir=self.run_dir,
            progress=self.progress,
            facts=lambda: self.vllm_facts,
        )

    # -- before anything starts ---------------------------------------------------------------
    def check_before_start(self) -> None:
        """Refuse, before anything starts: a design that cannot reach a verdict, a reused
        baseline that cannot be, a reports folder that cannot be written."""
        check_design(self.settings)
        path = self.config.getoption("spec_baseline_from")
        if path:
            stored_baseline(path, self.settings)
        check_writable(self.settings.reports_dir)
        wanted = self.settings.candidates or self.settings.run.search
        if wanted and self.writes_html:  # a run; the dry run checks its own
            self._use_facts(self._validated())

    def _use_facts(self, facts: VllmFacts) -> None:
        """The facts the candidates were checked against; each speculative candidate then asks
        for per-request metrics where that vLLM knows the option."""
        self.vllm_facts = facts
        _, self.request_metrics_note = request_metrics_args(facts)
        candidates = with_request_metrics(self.settings.candidates, facts)
        self.settings = dataclasses.replace(self.settings, candidates=candidates)

    def _validated(self) -> VllmFacts:
        """The candidates checked against the target's own vLLM (read-only); its facts."""
        target = self._open_target(self.settings.reports_dir)
        try:
            facts = validated_against_target(
                target, self.settings.candidates, progress=self.progress
            )
            self.drafters = check_drafters(target, self.settings.candidates, progress=self.progress)
            return facts
        except HostError as exc:  # the host cannot be reached: nothing was touched
            raise ConfigError(str(exc)) from None
        finally:
            target.close()  # touches the host only to undo what this run did: nothing

    @property
    def writes_html(self) -> bool:
        """pytest-html writes report.html into the run folder: only when an experiment runs."""
        option = self.config.option
        return not (option.spec_dry_run or option.collectonly or getattr(option, "help", False))

    # -- the dry run ----------------------------------------------------------------------------
    def dry_run(self) -> int:
        """Print the plan. Nothing is started, written or locked; only reads on a host."""
        settings = self.settings
        if settings.replicas:  # a target of several replicas: its own plan
            return replicas_dry_run(self.config, settings, self.progress)
        target = self._open_target(settings.reports_dir)
        try:
            checked = []
            if settings.candidates:
                facts = validated_against_target(
                    target, settings.candidates, progress=self.progress
                )
                self._use_facts(facts)
                settings = self.settings
                self.drafters = check_drafters(target, settings.candidates, progress=self.progress)
                checked = [
                    f"validated the candidates against {facts.describe()}"
                    + (f" ({facts.note})" if facts.note else ""),
                    request_metrics_plan(facts),
                ]
                if self.drafters:
                    checked.append(
                        "\n".join(["checked the drafters:", *drafter_plan(self.drafters)])
                    )
            arms = self._choose_arms(target)
            settings = self.settings
            steps = [*checked, *service_plan(settings, target)]
        except SpecDecodeError as exc:
            write_line(f"pytest-specdecode dry run: {exc}")
            return pytest.ExitCode.USAGE_ERROR
        finally:
            target.close()  # touches the host only to undo what this run did: nothing
        lines = dry_run_lines(
            settings,
            steps,
            host=target.host_name,
            timing=self.host_noise.timing(target, self.settings),
            aba=self.config.getoption("spec_aba"),
            baseline_from=self.config.getoption("spec_baseline_from"),
            adopts_original=target.adopts_running_original,
            noise=self.host_noise.noise_plan(target),
            predicted=(
                stored_search_plan(settings, host=target.host_name)
                if settings.run.search
                else stored_prediction(settings, host=target.host_name)
            ),
            design=self._design_lines(target),
            side_changes=side_change_plan(settings, self._target_version(), self.vllm_facts),
            arms=arms,
        )
        write_line("\n".join(lines), stream=sys.stdout)
        return pytest.ExitCode.OK

    def _target_version(self) -> str | None:
        """The target's vLLM version where it was asked (not the offline list's)."""
        facts = self.vllm_facts
        return facts.version if facts is not None and not facts.offline else None

    def _choose_arms(self, target: Target) -> str:
        """`[run] arms = "auto"` resolved on this host (run/arms.py): the settings from here on
        serve the arms side by side or one at a time; the plan's line says which, and why."""
        key = self.host_noise.plan_key(target)
        mode, why = choose_arms(
            self.settings,
            target,
            machine=self.host_noise.machine_of(target),
            profile=lookup(self.host_noise.profiles, key).profile,
            version=key.vllm_version,
        )
        settings, fewer = with_regime(
            with_arms(self.settings, mode), lambda: self.host_noise.regimes(target)
        )
        self.settings = self.host_noise.settings = settings
        how = f"arms: {'side by side' if mode == 'together' else 'one at a time'}: {why}"
        return how + (f"; servers beside: {fewer}" if fewer else "")

    def _design_lines(self, target: Target) -> list[str]:
        """What the design can call on this host, and what would call --spec-detect's change."""
        return self.host_noise.design_lines(
            target,
            self.settings,
            detect=self.config.getoption("spec_detect"),
            baseline=self.config.getoption("spec_baseline_from") is None,
            aba=self.config.getoption("spec_aba"),
        )

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
            self.progress(f"plan: {self._choose_arms(target)}")
            settings = self.settings
            self._planned_s = plain_seconds(
                settings,
                self.host_noise.timing(target, settings),
                baseline=self.config.getoption("spec_baseline_from") is None,
                aba=self.config.getoption("spec_aba"),
                adopts_original=target.adopts_running_original,
            )[0]
            for step in service_plan(settings, target):
                self.progress(f"plan: {step}")
            if settings.run.search:
                self.progress(f"plan: candidates {search_text(settings.run)}")
            self.progress(f"plan: restart noise: {self.host_noise.noise_plan(target)}")
            for line in self._design_lines(target):
                self.progress(f"plan: {line}")
            for line in side_change_plan(settings, self._target_version(), self.vllm_facts):
                self.progress(f"plan: {line}")
            for line in drafter_plan(self.drafters):
                self.progress(f"plan: drafter: {line}")
            target.preflight()
        except SpecDecodeError as exc:
            target.close()
            self.progress(f"refused, nothing was touched: {exc}")
            self._discard_run_dir()
            pytest.exit(f"pytest-specdecode: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
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
                    request_metrics_note=self.request_metrics_note,
                    facts=self.vllm_facts,
                    probe=HostProbe(target.host),
                    step=self.progress.step,
                )
                self.progress.step("watching the host before the run")
                self._watch_host(target, board.original)
                if settings.run.search:
                    self.search = self._search(self.experiment, target.host_name)
                if target.adopts_running_original and board.was_active:
                    self._watch_traffic(board.original)
                yield self.experiment
        finally:  # the restore ran in experiment_services' teardown: keep what it reported
            if store is not None and board is not None and board.restore_report is not None:
                store.record.restore = board.restore_report
                store.flush()

    def _search(self, experiment: Experiment, host: str) -> SearchRun:
        """--spec-search: each reload chosen by prediction, checked by the host's vLLM as any
        candidate is, and measured by the experiment (whose teardown is the restore)."""
        run, model = self.settings.run, self.settings.target.model
        assert run.search is not None

        def stored() -> list[tuple[str, RunRecord]]:
            found = stored_runs(self.settings.reports_dir, host=host, model=model)
            return [(folder.name, r) for folder, r in found if folder != self.run_dir]

        def prepare(spec: SpecConfig) -> SpecConfig:
            values = validate_spec_values(spec.values, source=spec.name, facts=self.vllm_facts)
            checked = SpecConfig(spec.name, values)
            facts = self.vllm_facts
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
        return self.config.hook.pytest_specdecode_open_target(
            config=self.config, settings=self.settings, log_dir=log_dir, progress=self.progress
        )

    def _watch_host(self, target: Target, original: Service) -> None:
        """Before the run: the host's other work, against which each window is judged; a busy
        host is named in the plan with what is using it."""
        assert self.experiment is not None
        run = self.settings.run
        env = self.experiment.host_before(original)
        if env is None:
            return
        self.progress(f"the host before the run: {env.describe()}")
        share = env.other_cpu_share or 0.0
        if share <= run.busy_host_share and not env.other_gpu_processes:
            return
        using = "; ".join(busiest(target.host)) or "unknown"
        after = (
            "measured anyway, its environment beside every verdict (--spec-allow-busy-host)"
            if run.allow_busy_host
            else f"each window is measured again where other work moves by more than "
            f"{run.busy_host_share:.0%} of the host beyond its usual"
        )
        self.progress(f"plan: a busy host: {env.describe()}; using it: {using}; {after}")

    def _watch_traffic(self, original: Service) -> None:
        """Before anything is touched: is anyone else using the service? Refuse if so, unless
        allowed (their requests are then told apart per window)."""
        assert self.experiment is not None
        run = self.settings.run
        self.progress.step(f"watching {original.label} for other clients' traffic")
        self.progress(
            f"watching {original.label} for {run.traffic_watch_s:g}s for other clients' traffic"
        )
        seen = self.experiment.watch(original, run.traffic_watch_s)
        text = rate_text(seen, run.traffic_watch_s)
        self.experiment.record.traffic_watch = TrafficWatch(
            seconds=run.traffic_watch_s, traffic=seen, text=text, quiet=quiet(seen)
        )
        self.experiment.store.flush()
        self.progress(f"traffic before the run: {text}")
        if quiet(seen) or run.allow_traffic:
            return
        message = (
            f"{original.label} is serving other clients ({text}): their requests would move "
            "the timings and the acceptance counters. Refusing to touch it; nothing was "
            "touched. Pass --spec-allow-traffic to measure it anyway (each window is then "
            "checked, and measured again where others' requests show)"
        )
        self.progress(message)
        pytest.exit(f"pytest-specdecode: {message}", returncode=pytest.ExitCode.USAGE_ERROR)

    def _new_record(self, target: Target) -> RunRecord:
        settings = self.settings
        t = settings.target
        record = RunRecord(
            plugin_version=__version__,
            config_file=str(settings.source),
            target=TargetInfo(
                backend=t.backend,
                host=target.host_name,
                api_base=target.api_base,
                model=t.model,
                unit=t.unit,
                command=redact_argv(t.command),
                env=redact_env(t.env),
            ),
            run=settings.run,
            candidates={c.name: dict(c.values) for c in settings.candidates},
            prompt_types=dict(settings.prompt_types),
            environment={
                "planned_s": self._planned_s,  # the plan's estimate, before this host's pace
                **environment(
                    target,
                    settings.source,
                    self.host_noise.machine_of(target),
                    besides=(self.host_noise.profiles,),
                ),
                "vllm": self.vllm_facts.record() if self.vllm_facts else None,
                **drafters_environment(self.drafters),  # each named, with its warnings
            },
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
