"""A candidate whose engine dies before it ever serves is started once more, where the run
allows it; one whose configuration vLLM refuses is not, whatever order the log's lines came in.
The report names both starts.

Seen in CI: a candidate's engine died 19 s into its start with `RuntimeError: Did not receive
response from front-end process within 5 minutes`, and the test that needed its window failed.
And (issue 48): a suffix candidate refused by `ImportError: Arctic Inference is required` was
started twice, its cause read as `EngineDeadError`, which its unit's journal held first.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.target import target_config
from pytest_specdecode.errors import ConfigError, ServiceError, StartDied
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.report.rows import checks
from pytest_specdecode.targets import lifecycle
from pytest_specdecode.targets.base import SETTLE_MOST_S, settled_log
from pytest_specdecode.targets.lifecycle import experiment_services
from pytest_specdecode.targets.start_failure import (
    config_refusal,
    first_errors,
    root_cause,
    settled,
    start_cause,
)

from ...support.inprocess import run_in_process
from ...support.scripted_target import Script, ScriptedTarget
from ...support.sigint import own_interrupts
from ...support.synthetic import record, settings
from ..plugin.test_gate import CONFTEST, REPO, write_gate
from .test_arms_together import SPEC, alive, local_target, sleeping_vllm  # noqa: F401 (a fixture)

DATA = Path(__file__).resolve().parents[2] / "data"
DIED = "RuntimeError: Did not receive response from front-end process within 5 minutes"
LOADING = "(EngineCore_DP0 pid=9) INFO 12-04 10:00:00 [core.py:1] Loading model weights"
ASYNC = "(APIServer pid=7) WARNING 12-04 10:00:00 [config.py:1] Async scheduling not supported"
# The CPU vLLM 0.32, captured 2026-12-07 (tests/data/README.md): a suffix start refused at its
# config, and the last lines of a serving server whose engine core died (its EngineDeadError).
SUFFIX = (DATA / "vllm-0.32-cpu-suffix-refused.log").read_text().splitlines()
ENGINE_DEAD = (DATA / "vllm-0.32-cpu-engine-dead.log").read_text().splitlines()
ARCTIC = (
    "ImportError: Arctic Inference is required for suffix decoding. "
    "Install via `pip install arctic-inference==0.1.1`."
)
DEAD = (
    "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. "
    "See stack trace (above) for the root cause."
)


# -- which deaths a second start would repeat ------------------------------------------------


def test_a_death_for_another_reason_is_not_a_refusal() -> None:
    # The CI log: loading, then the death; a warning on the way says "not supported", as every
    # n-gram start on the CPU vLLM does, and is no error.
    lines = [ASYNC, LOADING, "Traceback (most recent call last):", DIED]
    assert config_refusal(lines) is None


@pytest.mark.parametrize(
    "last",
    [
        "api_server.py: error: argument --speculative-config: invalid loads value: '{'",
        "vllm: error: unrecognized arguments: --spec-nonsense",
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig",
        "ValueError: num_speculative_tokens must be > 0, got -1",
        "ImportError: Arctic Inference is required for suffix decoding",
        "NotImplementedError: Speculative decoding is not supported on this platform",
        "RuntimeError: method 'mtp' is not supported by this model",
    ],
)
def test_vllm_refusing_the_configuration_is_told_apart(last: str) -> None:
    lines = [LOADING, "Traceback (most recent call last):", '  File "x.py", line 1', last]
    assert config_refusal(lines) == last


def test_a_real_failed_start_whose_module_is_missing_is_a_refusal() -> None:
    captured = (DATA / "vllm-0.32-cpu-worker-import-failure.log").read_text().splitlines()
    refused = config_refusal(captured)
    assert refused == "ModuleNotFoundError: No module named 'flashinfer'"


@pytest.mark.parametrize("first", ["the refusal", "the engine's death"])
def test_a_refusal_beside_an_engines_death_is_a_refusal_in_either_order(first: str) -> None:
    # A process's log (the local backend) or a unit's journal since the start (systemd: the
    # stopped original's last lines may come first, as in CI), in both orders.
    lines = SUFFIX + ENGINE_DEAD if first == "the refusal" else ENGINE_DEAD + SUFFIX
    found = start_cause(lines)
    assert (found.refused, found.cause, found.pending) == (ARCTIC, ARCTIC, False)
    root = root_cause(first_errors(lines))
    assert root is not None and (root.process, root.text) == ("APIServer pid=7635", ARCTIC)


def test_a_units_journal_of_restarts_gives_the_traceback_to_the_latest_server() -> None:
    # The stopped original (pid 30180), the candidate (7635), and its restart by systemd (7702):
    # an unprefixed traceback is the latest API server's, not the first that logged.
    again = [line.replace("pid=7635", "pid=7702") for line in SUFFIX]
    found = [(e.process, e.text) for e in first_errors(ENGINE_DEAD + SUFFIX + again)]
    assert found == [("APIServer pid=30180", DEAD), ("APIServer pid=7635", ARCTIC),
                     ("APIServer pid=7702", ARCTIC)]  # fmt: skip


def test_the_engines_death_alone_awaits_its_cause() -> None:
    found = start_cause(ENGINE_DEAD)
    assert (found.cause, found.refused, found.pending) == (DEAD, None, True)
    assert not settled(ENGINE_DEAD, ENGINE_DEAD)  # unchanged, but its cause may be on its way
    assert not settled(ENGINE_DEAD, ENGINE_DEAD + SUFFIX)  # still growing
    assert settled(ENGINE_DEAD + SUFFIX, ENGINE_DEAD + SUFFIX)
    died = [LOADING, "Traceback (most recent call last):", DIED]
    assert settled(died, died) and start_cause(died) == start_cause(died)
    assert start_cause(died).cause == DIED and not start_cause(died).pending


class GrowingLog:
    """A dead start whose log never stops growing: a line a read."""

    label = "a start that keeps logging"

    def __init__(self) -> None:
        self.lines = [*ENGINE_DEAD]

    def start_log(self) -> list[str]:
        self.lines.append(
            f"(APIServer pid=30180) ERROR 12-07 11:23:20 [x.py:1] line {len(self.lines)}"
        )
        return list(self.lines)

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.lines[-lines:]


def test_the_wait_for_a_dead_starts_log_is_bounded() -> None:
    target = ScriptedTarget(Script(), {})
    before = target.time.now
    lines = settled_log(GrowingLog(), target.time.clock)  # type: ignore[arg-type]
    assert target.time.now - before == SETTLE_MOST_S
    assert lines[: len(ENGINE_DEAD)] == ENGINE_DEAD and len(lines) > len(ENGINE_DEAD)


# -- the setting --------------------------------------------------------------------------------


def test_the_setting_is_on_for_a_local_process_and_off_for_a_unit_unless_set(
    tmp_path: Path,
) -> None:
    local = {"api_base": "http://127.0.0.1:8000", "model": "m",
             "command": ["vllm", "serve", "/m"]}  # fmt: skip
    unit = {"host": "ssh://root@h:22", "unit": "vllm.service", "model": "m"}
    assert target_config(local, tmp_path, "x").retry_failed_start is True
    assert target_config(unit, tmp_path, "x").retry_failed_start is False
    assert target_config({**unit, "retry_failed_start": True}, tmp_path, "x").retry_failed_start
    off = {**local, "retry_failed_start": False}
    assert target_config(off, tmp_path, "x").retry_failed_start is False
    with pytest.raises(ConfigError, match="retry_failed_start must be true or false"):
        target_config({**local, "retry_failed_start": "yes"}, tmp_path, "x")


# -- the experiment over scripted services --------------------------------------------------


def run(tmp_path: Path, target: ScriptedTarget, *, retry: bool) -> Experiment:
    s = settings(tmp_path, samples=2, prompt_types=("coding",))
    (tmp_path / "run").mkdir(exist_ok=True)
    store = RunStore(tmp_path / "run", record(s))
    lines: list[str] = []
    with experiment_services(
        target,
        ready_timeout_s=2.0,
        restore_timeout_s=2.0,
        progress=lines.append,
        transport=target.transports().sync,
        clock=target.time.clock,
        retry_failed_start=retry,
    ) as board:
        exp = Experiment(s, board, store, progress=lines.append, transports=target.transports())
        exp.lines = lines  # type: ignore[attr-defined]
        for arm in ("baseline", "ngram"):
            try:
                exp.arm(arm)
            except ServiceError as exc:
                exp.failed = exc  # type: ignore[attr-defined]
    return exp


def starts(target: ScriptedTarget, name: str) -> int:
    return target.events.count(f"start {name}")


def test_an_engine_that_dies_once_before_serving_is_started_again(tmp_path: Path) -> None:
    once = Script(crash_at_start=DIED, crash_starts=1)
    target = ScriptedTarget(Script(), {"ngram": once}, running=True)
    exp = run(tmp_path, target, retry=True)
    assert not hasattr(exp, "failed"), exp.failed  # type: ignore[attr-defined]
    assert starts(target, "ngram") == 2
    # Stopped (what was left of it) before the second start; the run went on and measured it.
    ngram = [e for e in target.events if e.endswith(" ngram")]
    assert ngram == ["start ngram", "stop ngram", "start ngram", "stop ngram"], target.events
    phase = exp.record.phases["ngram"]
    assert phase.measurements["coding"].tokens_per_s, phase
    assert phase.died_start is not None and phase.died_start.cause == DIED
    first = phase.died_start.text  # the first start's failure, as a failed start reports it
    assert first.startswith("scripted service 'ngram' failed while starting, after 0s:"), first
    assert "--- last 3 log lines of scripted service 'ngram' ---" in first
    assert "ngram" not in exp.record.failures
    said = "\n".join(exp.lines)  # type: ignore[attr-defined]
    assert f"scripted service 'ngram' died 0s into its start, before it ever served ({DIED})" in (
        said
    )
    assert "starting scripted service 'ngram' again" in said
    # The report names both starts; the record keeps them (results.json, read back).
    texts = [c.text for c in checks(exp.record, analyze(exp.record)) if c.warn]
    named = [t for t in texts if t.startswith("candidate ngram: the first start died")]
    assert named and DIED in named[0] and "started again, and measured on the second" in named[0]
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    again = RunRecord.from_json(stored).phases["ngram"].died_start
    assert again == phase.died_start
    assert stored["phases"]["baseline"]["died_start"] is None


def test_a_configuration_vllm_refuses_is_not_started_again(tmp_path: Path) -> None:
    refused = "ValueError: prompt_lookup_max must be > 0, got -4"
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=refused)}, running=True)
    exp = run(tmp_path, target, retry=True)
    assert starts(target, "ngram") == 1
    assert refused in str(exp.failed)  # type: ignore[attr-defined]
    assert "ngram" not in exp.record.phases
    assert not any("once more" in line for line in exp.lines)  # type: ignore[attr-defined]
    assert target.original().is_active()  # restored


@pytest.mark.parametrize("late", ["the refusal", "the engine's death"])
def test_a_refusal_whose_line_comes_late_is_not_started_again(tmp_path: Path, late: str) -> None:
    # The death is seen at once; the rest of the log reaches it 3 s later (a journal behind its
    # unit): the retry is decided once the log settled, on the refusal either way.
    log, rest = (ENGINE_DEAD, SUFFIX) if late == "the refusal" else (SUFFIX, ENGINE_DEAD)
    script = Script(crash_at_start=DEAD, crash_log=log, crash_log_late=rest, late_s=3.0)
    target = ScriptedTarget(Script(), {"ngram": script}, running=True)
    exp = run(tmp_path, target, retry=True)
    assert starts(target, "ngram") == 1
    failed = exp.failed  # type: ignore[attr-defined]
    assert isinstance(failed, StartDied) and (failed.refused, failed.cause) == (ARCTIC, ARCTIC)
    assert target.original().is_active()  # restored


def test_a_death_whose_cause_never_comes_is_started_again_once_the_wait_ends(
    tmp_path: Path,
) -> None:
    script = Script(crash_at_start=DEAD, crash_log=ENGINE_DEAD, crash_starts=1)
    target = ScriptedTarget(Script(), {"ngram": script}, running=True)
    exp = run(tmp_path, target, retry=True)
    assert not hasattr(exp, "failed"), exp.failed  # type: ignore[attr-defined]
    assert starts(target, "ngram") == 2
    died = exp.record.phases["ngram"].died_start
    assert died is not None and died.cause == DEAD


def test_without_the_setting_a_death_is_not_retried(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=DIED, crash_starts=1)},
                            running=True)  # fmt: skip
    exp = run(tmp_path, target, retry=False)
    assert starts(target, "ngram") == 1
    assert DIED in str(exp.failed)  # type: ignore[attr-defined]


def test_a_second_death_fails_the_arm_and_names_both_starts(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=DIED)}, running=True)
    exp = run(tmp_path, target, retry=True)
    assert starts(target, "ngram") == 2  # once more, never a third time
    failed = str(exp.failed)  # type: ignore[attr-defined]
    assert failed.startswith("scripted service 'ngram' failed while starting"), failed
    assert f"(started twice: the first start died too, 0s into it: {DIED})" in failed
    assert exp.record.failures["ngram"].startswith("scripted service 'ngram' failed while")
    assert target.original().is_active()


def test_a_start_that_dies_once_a_signal_came_is_not_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C reaches a local server's process group too: its engine dies as the controller
    notes the signal (raised in another thread, such as a replica's switch). That death is no
    reason for a second start: the run is ending, and a start can take an hour."""
    interrupts = own_interrupts(monkeypatch)
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start=DIED, crash_starts=1)},
                            running=True)  # fmt: skip
    made = target.candidate

    def candidate(spec):
        service = made(spec)
        real = service.failure

        def failure() -> str | None:
            if not interrupts.signals:
                interrupts.signalled(signal.SIGINT)  # noted; its KeyboardInterrupt is elsewhere
            return real()

        service.failure = failure  # type: ignore[method-assign]
        return service

    target.candidate = candidate  # type: ignore[method-assign]
    exp = run(tmp_path, target, retry=True)
    assert starts(target, "ngram") == 1
    assert DIED in str(exp.failed)  # type: ignore[attr-defined]
    assert not any("once more" in line for line in exp.lines)  # type: ignore[attr-defined]
    assert target.original().is_active()  # restored


# -- the whole run, as pytest prints it -------------------------------------------------------


def test_the_run_goes_on_and_its_report_names_both_starts(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests.support` for the copied conftest
    # The config's target is a local process: the retry is on by default.
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed(gap_s=0.005)").replace(
        '{"ngram": Script(',
        f'{{"ngram": Script(crash_at_start={DIED!r}, crash_starts=1, speeds=',
    )
    assert "crash_starts=1" in conftest
    result = run_in_process(pytester, *write_gate(pytester, conftest))
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, out + err  # n-gram improved on both: the gate passes
    assert "starting scripted service 'ngram' again" in err, err
    named = (
        f"candidate ngram: the first start died before serving ({DIED}, 0s into it); "
        "started again, and measured on the second"
    )
    assert f"warning: {named}" in out, out
    (run_dir,) = (pytester.path / "reports").iterdir()
    assert f"- ⚠ {named}" in (run_dir / "summary.md").read_text()
    stored = json.loads((run_dir / "results.json").read_text())["phases"]["ngram"]
    assert stored["died_start"]["cause"] == DIED and stored["startup_s"] is not None


# -- a server beside the original (--spec-arms together) ----------------------------------------


@pytest.mark.usefixtures("sleeping_vllm")  # a local server that only sleeps
def test_a_server_beside_that_dies_once_is_stopped_and_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waited: list[tuple[str, int | None]] = []

    def wait(service, **_: object) -> float:
        waited.append((service.label, service.pid))
        if "beside-ngram" in service.label and len(waited) == 2:  # the original's is first
            raise StartDied("died", cause=DIED, after_s=19.0, refused=None)
        return 0.0

    monkeypatch.setattr(lifecycle, "wait_until_ready", wait)
    target = local_target(tmp_path)
    lines: list[str] = []
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=30, progress=lines.append,
        retry_failed_start=True,
    ) as board:  # fmt: skip
        with board.together(SPEC, restart_original=False) as (original, second):
            first = waited[1][1]
            assert second.pid != first and alive(second.pid) and not alive(first)
            assert board.besides == [second] and alive(original.pid)
            assert board.died_starts["ngram"].after_s == 19.0
        assert not alive(second.pid)
    assert sum("beside-ngram" in label for label, _ in waited) == 2
    assert any("starting it once more" in line for line in lines), lines
