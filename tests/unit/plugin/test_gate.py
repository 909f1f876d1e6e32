"""The gate's failure path, fast: the real suite over scripted services with known effects.

pytest's exit code is the CI gate. A known throughput regression and a known TPOT-only
regression must each fail exactly the verdict test of their prompt type.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from ...support.inprocess import run_in_process
from ..run.test_undecided_outcome import html_tests

REPO = Path(__file__).resolve().parents[3]

CONFIG = """
reports_dir = "{reports}"
[target]
api_base = "http://scripted.invalid:8000"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
startup_timeout_s = 5
[run]
samples = 5
warmup = 1
max_tokens = 8
max_samples = 5
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompt = "coding"
[prompt_types.math]
prompt = "math"
"""

CONFTEST = """
from tests.support.scripted_target import Script, ScriptedTarget, Speed

def pytest_specdecode_open_target(config, settings, log_dir):
    return ScriptedTarget(
        Script({{"coding": {base_coding}, "math": Speed()}}),
        {{"ngram": Script({{"coding": {cand_coding}, "math": Speed(gap_s=0.005)}})}},
    )
"""


@pytest.fixture(autouse=True)
def _importable_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests.support` for the copied conftest


def write_gate(pytester: pytest.Pytester, conftest: str, config: str = CONFIG) -> list[str]:
    """The suite, a config and a conftest with the scripted target; returns pytest's args."""
    shutil.copytree(
        REPO / "suites", pytester.path / "suites", ignore=shutil.ignore_patterns("*.toml")
    )
    path = pytester.path / "experiment.toml"
    path.write_text(config.format(reports=pytester.path / "reports"))
    (pytester.path / "suites" / "conftest.py").write_text(conftest)
    suite = str(pytester.path / "suites")
    return [suite, "--spec-file", str(path), "--spec-config", "ngram", "-p", "no:cacheprovider"]


def run_gate(pytester: pytest.Pytester, base_coding: str, cand_coding: str) -> pytest.RunResult:
    conftest = CONFTEST.format(base_coding=base_coding, cand_coding=cand_coding)
    return run_in_process(pytester, *write_gate(pytester, conftest))


def failed_ids(result: pytest.RunResult) -> set[str]:
    return set(re.findall(r"^FAILED \S+::(\S+)", result.stdout.str(), re.M))


def undecided_ids(result: pytest.RunResult) -> set[str]:
    return set(re.findall(r"^UNDECIDED \S+::(\S+)", result.stdout.str(), re.M))


def test_a_throughput_regression_fails_its_verdict_test(pytester: pytest.Pytester) -> None:
    # coding: the candidate takes twice as long per token; math: it is twice as fast.
    result = run_gate(pytester, "Speed()", "Speed(gap_s=0.020)")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert failed_ids(result) == {"test_speculation_does_not_regress[ngram-coding]"}, out
    assert "speculation ngram regressed on coding, by throughput -" in out, out
    assert re.search(r"^math\s+ngram\s.*improved \(throughput \+[\d.]+% \[\+", out, re.M), out


def test_a_tpot_only_regression_fails_its_verdict_test(pytester: pytest.Pytester) -> None:
    # coding: the candidate's first token comes sooner, every later one later: the same time
    # per request (throughput unchanged), twice the time per output token.
    result = run_gate(
        pytester, "Speed(ttft_s=0.100, gap_s=0.010)", "Speed(ttft_s=0.030, gap_s=0.020)"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert failed_ids(result) == {"test_speculation_does_not_regress[ngram-coding]"}, out
    # by TPOT, not "no verdict": named, with TPOT's interval, wholly above zero
    decided = r"TPOT \+[\d.]+% \[\+[\d.]+%, \+[\d.]+%\]"
    assert re.search(rf"speculation ngram regressed on coding, by {decided}:", out), out
    assert re.search(rf"^coding\s+ngram\s.*regressed \({decided}\)$", out, re.M), out
    assert re.search(r"TPOT [\d.]+ → [\d.]+ ms \(\+\d+\.\d%", out), out


def test_no_regression_passes_the_gate(pytester: pytest.Pytester) -> None:
    result = run_gate(pytester, "Speed()", "Speed(gap_s=0.005)")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert failed_ids(result) == set()


REFUSING = """
from tests.support.scripted_target import Script, ScriptedTarget

def pytest_specdecode_open_target(config, settings, log_dir):
    return ScriptedTarget(Script(), refuse="unit x on h is inactive/dead, not active")
"""


def test_a_refused_run_leaves_nothing_behind(pytester: pytest.Pytester) -> None:
    result = run_in_process(pytester, *write_gate(pytester, REFUSING))
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "pytest-specdecode: unit x on h is inactive/dead, not active" in out
    assert "refused, nothing was touched" in out
    assert "Generated html report" not in out
    assert not (pytester.path / "reports").exists()


def test_collect_only_writes_nothing(pytester: pytest.Pytester) -> None:
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed()")
    result = run_in_process(pytester, *write_gate(pytester, conftest), "--collect-only")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out
    assert "<Function test_speculation_does_not_regress[ngram-coding]>" in out
    assert "Generated html report" not in out
    assert not (pytester.path / "reports").exists()


def test_no_verdict_is_not_green(pytester: pytest.Pytester) -> None:
    # The candidate runs exactly as fast: with the restart noise unmeasured (assumed 5%), one
    # start per arm cannot tell "no change" from a change of a few percent.
    # It fails the gate, under pytest's own word for it: undecided, not failed.
    result = run_gate(pytester, "Speed()", "Speed()")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert failed_ids(result) == set(), out
    assert undecided_ids(result) == {"test_speculation_does_not_regress[ngram-coding]"}, out
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\b1 undecided\b", summary), summary
    assert "failed" not in summary, summary
    assert "no verdict for ngram (inconclusive, throughput " in out
    # The run's own reports say so too: summary.md's list, pytest-html's result column.
    (run_dir,) = (pytester.path / "reports").iterdir()
    md = (run_dir / "summary.md").read_text()
    assert "**Failed tests (1, 1 of them undecided):** `test_speculation_does_not" in md, md
    assert "`test_speculation_does_not_regress[ngram-coding] (undecided)`" in md, md
    rows = html_tests((run_dir / "report.html").read_text())
    row = "".join(rows["test_speculation_does_not_regress[ngram-coding]"]["resultsTableRow"])
    assert '<td class="col-result">Undecided</td>' in row, row
    assert "restart noise unmeasured: assumed 5%" in out


DRIFTING = """
from tests.support.scripted_target import Script, ScriptedTarget, Speed

def pytest_specdecode_open_target(config, settings, log_dir):
    fast = {"coding": Speed(gap_s=0.005), "math": Speed(gap_s=0.005)}
    slow = {"coding": Speed(gap_s=0.020), "math": Speed(gap_s=0.020)}
    return ScriptedTarget(Script(restarted=slow), {"ngram": Script(fast)})
"""


def test_a_drifting_baseline_fails_the_gate(pytester: pytest.Pytester) -> None:
    # The candidate looks 2x faster, but the original, started again last, is 2x slower than
    # at first: the comparison cannot be trusted, and the gate says so. The drift is restart
    # noise too, so the candidate's intervals widen to match: no verdict either.
    result = run_in_process(pytester, *write_gate(pytester, DRIFTING), "--spec-aba")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert "test_baseline_did_not_drift" in failed_ids(result), out  # drift fails, not undecided
    assert "the run is unreliable: the baseline drifted on coding, math" in out
    assert "improved" not in out.split("speculative decoding: baseline vs candidates")[1]


AA = """
from tests.support.scripted_target import Script, ScriptedTarget

def pytest_specdecode_open_target(config, settings, log_dir):
    return ScriptedTarget(Script(), {"baseline-again": Script()})
"""


def test_an_aa_run_passes_unless_it_calls_a_false_difference(pytester: pytest.Pytester) -> None:
    args = write_gate(pytester, AA)
    args[args.index("ngram")] = "baseline"  # --spec-config baseline: the A/A candidate
    result = run_in_process(pytester, *args, "-v")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out
    for prompt_type in ("coding", "math"):  # each ran, and passed: no false difference
        assert f"test_speculation_does_not_regress[baseline-again-{prompt_type}] PASSED" in out


TRAFFIC = """
from tests.support.scripted_target import Script, ScriptedTarget, Speed

def pytest_specdecode_open_target(config, settings, log_dir):
    fast = {{"coding": Speed(gap_s=0.005), "math": Speed(gap_s=0.005)}}
    target = ScriptedTarget(Script(), {{"ngram": Script(fast)}}, neighbour={neighbour})
    return target
"""
TRAFFIC_RUN = "\ntraffic_watch_s = 0.2\nquiet_wait_s = 0.5\ntraffic_attempts = 2\n"


def traffic_gate(pytester: pytest.Pytester, neighbour: int) -> pytest.RunResult:
    config = CONFIG.replace("max_tokens = 8\n", "max_tokens = 8" + TRAFFIC_RUN)
    args = write_gate(pytester, TRAFFIC.format(neighbour=neighbour), config)
    return run_in_process(pytester, *args)


def test_other_clients_in_every_window_give_no_verdict(pytester: pytest.Pytester) -> None:
    result = traffic_gate(pytester, neighbour=10_000)  # someone sends all along
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, out
    assert failed_ids(result) == set(), out
    assert undecided_ids(result) == {
        "test_speculation_does_not_regress[ngram-coding]",
        "test_speculation_does_not_regress[ngram-math]",
    }, out
    assert "no verdict for ngram (contaminated)" in out
    assert re.search(r"during the window \(\d+ other requests finished", err), err
    assert "measuring again (attempt 2 of 2) once the server is quiet" in err
    assert "kept, marked contaminated" in err
    assert re.search(r"^coding\s+ngram\s.*contaminated$", out, re.M), out


def test_a_window_with_other_clients_is_measured_again(pytester: pytest.Pytester) -> None:
    result = traffic_gate(pytester, neighbour=3)  # three foreign requests: two in the warm-ups
    # (one a prompt type), one in the baseline's first round
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, out
    assert "measuring again (attempt 2 of 2) once the server is quiet" in err
    assert "contaminated" not in out
    assert re.search(
        r"baseline/(coding|math): measured again after other clients' traffic \(\d+ requests", out
    )


BUSY = """
from tests.support.scripted_target import Script, ScriptedTarget

def pytest_specdecode_open_target(config, settings, log_dir):
    return ScriptedTarget(Script(), {"ngram": Script()}, running=True, background=True)
"""


def test_a_busy_running_service_is_refused_before_anything_is_touched(
    pytester: pytest.Pytester,
) -> None:
    config = CONFIG.replace("max_tokens = 8\n", "max_tokens = 8" + TRAFFIC_RUN)
    args = write_gate(pytester, BUSY, config)
    result = run_in_process(pytester, *args)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "traffic before the run: 300.0 requests/min" in out
    assert "is serving other clients" in out and "--spec-allow-traffic" in out
    assert "stopping" not in out  # the original was never touched
    allowed = run_in_process(pytester, *args, "--spec-allow-traffic")
    assert "is serving other clients" not in allowed.stdout.str() + allowed.stderr.str()
    assert "contaminated" in allowed.stdout.str()  # each window then shows the other client


def test_a_design_that_cannot_reach_a_verdict_is_refused_before_anything_starts(
    pytester: pytest.Pytester,
) -> None:
    # 2 prompt types x 2 metrics: Holm over 4 comparisons needs 5 requests a side at least.
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed()")
    result = run_in_process(pytester, *write_gate(pytester, conftest), "--spec-samples", "4")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert (
        "with 4 requests per prompt type and server start, and 1 start per arm, no verdict can "
        "be reached: 4 comparisons (2 prompt types x throughput and TPOT) at alpha 0.05 need at "
        "least 5 requests per comparison and arm. Take --spec-samples 5 (or --spec-repeats 2); "
        "nothing was started"
    ) in out
    assert "starting" not in out
    assert not (pytester.path / "reports").exists()


def test_the_example_tests_fixture_is_one_shape_at_several_levels_and_starts(
    pytester: pytest.Pytester,
) -> None:
    """suites/test_time_to_first_token.py asks for `specdecode`: with two load levels and two
    starts per arm it runs once per candidate, prompt type and level, and passes."""
    config = CONFIG.replace("max_samples = 5\n", "max_samples = 5\nconcurrency = [1, 2]\n")
    config = config.replace("warmup = 1\n", "warmup = 1\nrepeats = 2\n")
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed(gap_s=0.005)")
    args = write_gate(pytester, conftest, config)
    result = run_in_process(pytester, *args, "-k", "first_token", "-rA")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    passed = set(re.findall(r"^PASSED \S+::(\S+)", out, re.M))
    assert passed == {
        f"test_speculation_keeps_the_first_token_prompt[ngram-{t}-c{n}]"
        for t in ("coding", "math")
        for n in (1, 2)
    }, out
    data = json.loads(next((pytester.path / "reports").glob("*/results.json")).read_text())
    starts = [p["name"] for p in data["phases"].values()]
    assert len(starts) == 4, starts  # two starts of each arm, each measured at both levels


def test_the_fixture_object_names_its_cell_and_computes_the_verdict_once() -> None:
    from pytest_specdecode import SpecDecodeCase
    from pytest_specdecode.config.load import LoadLevel
    from pytest_specdecode.config.settings import PromptType

    asked: list[int] = []
    case = SpecDecodeCase(
        candidate="ngram",
        prompt_type=PromptType("coding", "p", 8, None, None),
        level=LoadLevel(concurrency=4),
        baseline=None,  # type: ignore[arg-type]
        speculative=None,  # type: ignore[arg-type]
        _verdict=lambda: asked.append(1) or "verdict",  # type: ignore[arg-type,func-returns-value]
    )
    assert case.where == "ngram on coding at c4"
    assert case.verdict == "verdict" and case.verdict == "verdict" and asked == [1]
