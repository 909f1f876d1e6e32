"""A start failure names its cause: the first error of every vLLM process, read from the
start's whole log, shown once however many tests needed the arm."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ServiceError
from pytest_specdecode.targets.base import wait_until_ready
from pytest_specdecode.targets.start_failure import first_errors, last_exception, root_cause
from tests.support.scripted_target import Script, ScriptedTarget
from tests.unit.plugin.test_gate import CONFIG, write_gate

from ...support.inprocess import run_in_process

DATA = Path(__file__).resolve().parents[2] / "data"
# A real start of the CPU vLLM 0.32 whose worker cannot import its class (`--worker-cls
# flashinfer.worker.Worker`): the worker, then the engine core, then the API server fail.
CAPTURED = (DATA / "vllm-0.32-cpu-worker-import-failure.log").read_text().splitlines()
ROOT = "ModuleNotFoundError: No module named 'flashinfer'"
API_SERVER = "RuntimeError: Engine core initialization failed. See root cause above."


def test_the_first_error_of_each_process_of_a_real_failed_start() -> None:
    found = [(e.process, e.text) for e in first_errors(CAPTURED)]
    assert found[0] == ("VllmWorker-0 pid=21143", ROOT)  # the worker renames itself "Worker"
    assert found[1][0] == "EngineCore pid=20984"
    assert found[1][1].startswith("Exception: WorkerProc initialization failed")
    assert found[2][0] == "APIServer pid=20818"  # its traceback is unprefixed, at the end
    assert found[2][1].startswith(API_SERVER)
    assert len(found) == 3  # the engine core's unprefixed repeat is not a process of its own


def test_a_warning_that_quotes_an_exception_is_no_error() -> None:
    warning = [line for line in CAPTURED if "OSError: [Errno 24]" in line]
    assert warning and "WARNING" in warning[0]  # the API server's ulimit warning
    assert first_errors(warning) == []


def test_the_root_cause_is_the_earliest_error() -> None:
    root = root_cause(first_errors(CAPTURED))
    assert root is not None and root.text == ROOT
    assert last_exception(CAPTURED[-30:]).startswith(API_SERVER)  # what the tail alone says


def test_older_vllm_prefixes_raw_tracebacks_with_colour() -> None:
    # vLLM before 0.32 prefixed every line its processes wrote, tracebacks too, in cyan.
    cyan, reset = "\x1b[0;36m", "\x1b[0;0m"
    lines = [
        f"{cyan}(APIServer pid=7){reset} INFO 12-02 10:00:00 [api_server.py:1] vLLM API server",
        f"{cyan}(EngineCore_DP0 pid=9){reset} Process EngineCore_DP0:",
        f"{cyan}(EngineCore_DP0 pid=9){reset} Traceback (most recent call last):",
        f'{cyan}(EngineCore_DP0 pid=9){reset}   File "x.py", line 1, in <module>',
        f"{cyan}(EngineCore_DP0 pid=9){reset} {ROOT}",
        f"{cyan}(APIServer pid=7){reset} {API_SERVER} Failed core proc(s): {{}}",
    ]
    found = [(e.process, e.text) for e in first_errors(lines)]
    assert found == [
        ("EngineCore_DP0 pid=9", ROOT),
        ("APIServer pid=7", f"{API_SERVER} Failed core proc(s): {{}}"),
    ]


def test_a_failed_start_names_the_root_cause_first_and_every_process() -> None:
    crashed = Script(crash_at_start=ROOT, crash_log=CAPTURED)
    target = ScriptedTarget(Script(), {"ngram": crashed})
    service = target.candidate(_spec())
    service.start()
    with pytest.raises(ServiceError) as caught:
        wait_until_ready(
            service,
            timeout_s=5,
            progress=lambda _: None,
            transport=target.transports().sync,
            clock=target.time.clock,
        )
    text = str(caught.value)
    first = text.splitlines()[0]
    assert first.startswith("scripted service 'ngram' failed while starting, after 0s: ")
    assert first.endswith(f"VllmWorker-0 pid=21143: {ROOT} (the process exited with status 1)")
    assert f"from the {len(CAPTURED)} log lines of this start" in text
    listed = re.findall(r"^  (\S+ pid=\d+): ", text, re.M)
    assert listed == ["VllmWorker-0 pid=21143", "EngineCore pid=20984", "APIServer pid=20818"]


def _spec() -> SpecConfig:
    return SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})


CRASHING = """
from pathlib import Path
from tests.support.scripted_target import Script, ScriptedTarget, Speed

LOG = Path({log!r}).read_text().splitlines()

def pytest_specdecode_open_target(config, settings, log_dir):
    crashed = Script(crash_at_start={root!r}, crash_log=LOG)
    return ScriptedTarget(Script(), {{"ngram": crashed}})
"""


def test_a_candidate_that_fails_to_start_is_shown_once(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(DATA.parents[1]))  # `tests.support` for the conftest
    conftest = CRASHING.format(log=str(DATA / "vllm-0.32-cpu-worker-import-failure.log"), root=ROOT)
    result = run_in_process(pytester, *write_gate(pytester, conftest, CONFIG))
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    errors = re.findall(r"^ERROR \S+::\S+\[ngram-\S+\]", out, re.M)
    assert len(errors) > 2, out  # every test of the candidate needed it
    # Counted above pytest's own summary, which repeats each message whole where CI is set
    body = out.split("short test summary info")[0]
    assert body.count("first error of each server process") == 1, out
    assert body.count("Traceback (most recent call last)") <= 1, out  # the log's tail, once
    pointers = re.findall(r"the ngram arm failed to start \(shown in full at (\S+)\)", body)
    assert len(pointers) == len(errors) - 1, out
    assert f"VllmWorker-0 pid=21143: {ROOT}" in out
