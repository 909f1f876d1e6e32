"""The restore and the experiment's phases, fast, over scripted services (no server).

The same paths run against the real CPU vLLM (tests/real_vllm) and the real systemd host
(tests/real_host); here each failure is scripted, so every branch runs in milliseconds.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path

import pytest

from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.errors import ServiceError
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.ending import RunEnding
from pytest_specdecode.record.store import RunStore, load_run
from pytest_specdecode.targets.lifecycle import experiment_services

from ...support.scripted_target import NEVER, Script, ScriptedTarget, measure_arms
from ...support.sigint import own_interrupts, plugin_sigint
from ...support.synthetic import record, settings


def run(tmp_path: Path, target: ScriptedTarget, *phases: str, **timeouts: float):
    """Measure the phases in order; returns the Experiment (its board holds the restore)."""
    s = settings(tmp_path, samples=2, prompt_types=("coding",), candidates=("ngram", "eagle"))
    (tmp_path / "run").mkdir(exist_ok=True)
    store = RunStore(tmp_path / "run", record(s))
    lines: list[str] = []
    with experiment_services(
        target,
        ready_timeout_s=timeouts.get("ready", 2.0),
        restore_timeout_s=timeouts.get("restore", 2.0),
        progress=lines.append,
        transport=target.transports().sync,
        clock=target.time.clock,
    ) as board:
        exp = Experiment(s, board, store, progress=lines.append, transports=target.transports())
        exp.lines = lines  # type: ignore[attr-defined]
        for name in phases:
            exp.arm(name)
    return exp


def test_an_original_that_was_not_running_is_left_stopped(tmp_path: Path) -> None:
    target = ScriptedTarget(Script())
    exp = run(tmp_path, target, "ngram")
    assert target.events[-3:] == ["start ngram", "stop ngram", "close"]
    report = exp.board.restore_report
    assert report is not None and not report.was_active and not report.is_active


def test_a_running_original_is_measured_as_it_runs_and_started_once_at_restore(
    tmp_path: Path,
) -> None:
    target = ScriptedTarget(Script(), running=True)
    run(tmp_path, target, "baseline", "ngram", "eagle")
    assert [e for e in target.events if e.startswith(("start", "stop"))] == [
        "stop original",  # measured first as it ran: no start for the baseline
        "start ngram",
        "stop ngram",
        "start eagle",
        "stop eagle",
        "start original",  # the restore
    ]
    assert target.original().is_active()


def test_an_exception_mid_run_restores(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), running=True)
    with pytest.raises(RuntimeError, match="a test's own bug"):
        s = settings(tmp_path, samples=2, prompt_types=("coding",))
        with experiment_services(
            target, ready_timeout_s=2, restore_timeout_s=2, progress=lambda _: None,
            transport=target.transports().sync, clock=target.time.clock,
        ) as board:  # fmt: skip
            board.activate(s.candidates[0])
            raise RuntimeError("a test's own bug")
    assert target.events[-2:] == ["start original", "close"]
    assert target.original().is_active()


def test_a_candidate_that_crashes_names_its_cause_first_and_is_not_started_twice(
    tmp_path: Path,
) -> None:
    crash = "ImportError: Arctic Inference is required for suffix decoding"
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=crash)}, running=True)
    with pytest.raises(ServiceError) as caught:
        run(tmp_path, target, "ngram")
    first = str(caught.value).splitlines()[0]
    assert first.startswith("scripted service 'ngram' failed while starting, after 0s: ")
    assert first.endswith(f"{crash} (the process exited with status 1)")
    assert "--- last 3 log lines of scripted service 'ngram' ---" in str(caught.value)
    assert target.original().is_active()  # restored


def test_a_failed_phase_fails_again_at_once(tmp_path: Path) -> None:
    crash = "RuntimeError: Engine core initialization failed"
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=crash)}, running=True)
    s = settings(tmp_path, samples=2, prompt_types=("coding",))
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run", record(s))
    with experiment_services(
        target, ready_timeout_s=2, restore_timeout_s=2, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    ) as board:  # fmt: skip
        exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
        for _ in range(3):  # each test of the candidate asks again
            with pytest.raises(ServiceError, match="Engine core initialization failed"):
                exp.arm("ngram")
    assert target.events.count("start ngram") == 1
    assert store.record.failures["ngram"].startswith("scripted service 'ngram' failed while")


def test_a_candidate_that_never_gets_ready_times_out_and_restores(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), {"ngram": Script(ready_after_s=NEVER)}, running=True)
    with pytest.raises(ServiceError, match=r"scripted service 'ngram' not ready after 1s"):
        run(tmp_path, target, "ngram", ready=1.0)
    assert 1.0 < target.time.now < 5  # gave up once the timeout passed (virtual seconds)
    assert target.original().is_active()


def test_a_slow_restore_is_waited_for_and_reported(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(restore_s=1.5), running=True)
    exp = run(tmp_path, target, "ngram", restore=5.0)
    report = exp.board.restore_report
    assert report is not None and report.is_active and report.seconds >= 1.5
    assert report.describe().startswith("scripted service 'original' restored to active and")


def test_a_restore_that_cannot_finish_fails_loudly(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(restore_s=NEVER), running=True)
    with pytest.raises(ServiceError, match=r"restore failed on scripted-host: .*not ready"):
        run(tmp_path, target, "ngram", restore=1.0)


def test_repeated_starts_run_in_the_balanced_order(tmp_path: Path) -> None:
    # A B B A A B B A: a drift over the run weighs on both arms alike (A B A B would not).
    s = settings(tmp_path, samples=2, prompt_types=("coding",))
    s = replace(s, run=replace(s.run, repeats=4))
    target = ScriptedTarget(Script())
    store = measure_arms(target, s, tmp_path, "ngram", "baseline")
    assert list(store.record.phases) == [
        "baseline", "ngram", "ngram#2", "baseline#2", "baseline#3", "ngram#3", "ngram#4",
        "baseline#4",
    ]  # fmt: skip
    starts = [e.removeprefix("start ") for e in target.events if e.startswith("start")]
    assert starts == ["original", "ngram", "ngram", "original", "original", "ngram", "ngram",
                      "original"]  # fmt: skip


def test_a_clean_restore_reports_no_problems(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), running=True)
    exp = run(tmp_path, target, "ngram")
    report = exp.board.restore_report
    assert report is not None and report.errors == [] and not report.failed


def test_an_original_never_stopped_is_said_so_not_restored(tmp_path: Path) -> None:
    """Measured as it runs and never stopped (a systemd unit beside which a candidate ran): the
    restore and the run's ending say it served throughout, not that it was put back."""
    target = ScriptedTarget(Script(), running=True)
    exp = run(tmp_path, target, BASELINE)
    report = exp.board.restore_report
    assert report is not None and report.never_stopped and not report.failed
    assert report.describe().startswith(
        "scripted service 'original' was never stopped: it served throughout, and is active "
        "and serving"
    )
    assert "the original was never stopped: it served throughout" in exp.board.ending.describe()
    # once the run stops it (a candidate of the unit), the restore puts it back as before
    (tmp_path / "again").mkdir()
    again = run(tmp_path / "again", ScriptedTarget(Script(), running=True), "ngram")
    assert again.board.restore_report is not None
    assert not again.board.restore_report.never_stopped
    assert "restored to active and serving" in again.board.restore_report.describe()


def sigint_at_first_poll(target: ScriptedTarget, name: str) -> list[int]:
    """The candidate `name`'s first readiness poll sends SIGINT to this process: a Ctrl-C while
    its server starts. Returns the list that counts the signals sent."""
    sent: list[int] = []
    made = target.candidate

    def candidate(spec):
        service = made(spec)
        if spec.name == name:
            real = service.ready

            def ready() -> bool:
                if not sent:
                    sent.append(signal.SIGINT)
                    os.kill(os.getpid(), signal.SIGINT)
                return real()

            service.ready = ready  # type: ignore[method-assign]
        return service

    target.candidate = candidate  # type: ignore[method-assign]
    return sent


def test_a_sigint_during_a_candidates_start_restores_and_keeps_what_was_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupts = own_interrupts(monkeypatch)
    target = ScriptedTarget(Script(), {"ngram": Script(ready_after_s=3.0)}, running=True)
    sent = sigint_at_first_poll(target, "ngram")
    s = settings(tmp_path, samples=2, prompt_types=("coding",))
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run", record(s))
    endings: list[RunEnding] = []
    steps: list[str] = []
    with plugin_sigint(), pytest.raises(KeyboardInterrupt), experiment_services(
        target, ready_timeout_s=10, restore_timeout_s=10, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
        record_ending=endings.append,
    ) as board:  # fmt: skip
        exp = Experiment(s, board, store, progress=lambda _: None,
                         transports=target.transports(), step=steps.append)  # fmt: skip
        exp.arm(BASELINE)
        exp.arm("ngram")
    assert sent and steps[-1] == "starting ngram"  # the signal came while ngram started
    # the restore ran: the candidate, started but not yet serving, stopped; the original back
    assert [e for e in target.events if e.startswith(("start", "stop"))] == [
        "stop original", "start ngram", "stop ngram", "start original",
    ]  # fmt: skip
    assert target.original().is_active() and target.events[-1] == "close"
    report = board.restore_report
    assert report is not None and report.is_active and report.serving and not report.failed
    assert endings[-1].how == "interrupted" and endings[-1].signals == ["SIGINT"]
    assert interrupts.signals == ["SIGINT"]  # the plugin's handler noted it
    # nothing measured is lost: the baseline's requests, in results.json and the journal
    measured = store.record.phases[BASELINE].measurements["coding"].samples
    assert len(measured) == 2 and "ngram" not in store.record.phases
    stored = load_run(tmp_path / "run").phases[BASELINE].measurements["coding"].samples
    assert [x.to_json() for x in stored] == [x.to_json() for x in measured]
    journal = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert sum('"warmup": false' in line for line in journal) == 2
