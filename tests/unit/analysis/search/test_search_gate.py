"""`--spec-search ngram` through pytest, fast: the real suite over scripted services.

The search's slots are collected before anything is measured (search-1 .. search-N), each
resolved at run time to the config the search chose; a slot it did not reach is skipped with
the reason. Whatever happens, no candidate is left running: the conftest writes the scripted
target's state after the run, and the tests read it.
"""

from __future__ import annotations

import json
import re

import pytest

from pytest_specdecode.record.store import RunStore

from ....support.inprocess import run_in_process
from ....support.search_sim import Truth, measure, search_record
from ...plugin.test_gate import _importable_support, write_gate  # noqa: F401  (PYTHONPATH for the conftest)

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
max_tokens = 24
max_samples = 5
[thresholds]
min_tokens_per_s = 1.0
[prompt_types.coding]
prompt = "coding"
[prompt_types.math]
prompt = "math"
"""

TRUTH = Truth(cost={"c1": (0.1, 0.03)})
CONFTEST = """
import json
from pathlib import Path

from pytest_specdecode.analysis.search.policy import SearchPolicy
from tests.support.scripted_target import Script, ScriptedTarget, Speed

TEXT = "x = x + 1 ;"  # six words: the ids repeat, so n-grams draft
TARGETS = []


def speculative(spec):
    k = int(spec.values["num_speculative_tokens"])
    speed = Speed(gap_s=0.010 * (1 + 0.05 * k), tokens=24, tokens_per_chunk=min(k, 3) + 1,
                  text=TEXT)
    return Script({{"coding": speed, "math": speed}}, token_ids=True)


def pytest_specdecode_open_target(config, settings, log_dir):
    base = Speed(gap_s=0.010, tokens=24, text=TEXT)
    target = ScriptedTarget(Script({{"coding": base, "math": base}}, token_ids=True),
                            running=True, speculative=speculative)
    TARGETS.append(target)
    return target


FAIL_AT = {fail_at}
if FAIL_AT:
    real = SearchPolicy.next
    calls = []

    def next_or_fail(self, record, verdicts, **kw):
        calls.append(1)
        if len(calls) == FAIL_AT:
            raise RuntimeError("the policy failed while choosing")
        return real(self, record, verdicts, **kw)

    SearchPolicy.next = next_or_fail


def pytest_unconfigure(config):
    if TARGETS:
        t = TARGETS[-1]
        state = {{
            "events": t.events,
            "active": [c.name for c in t.candidates if c.active],
            "candidates": [c.name for c in t.candidates],
            "serving": t.serving.name if t.serving else None,
        }}
        (Path(config.rootpath) / "target-state.json").write_text(json.dumps(state))
"""


def search_args(pytester: pytest.Pytester, *, fail_at: int = 0) -> list[str]:
    args = write_gate(pytester, CONFTEST.format(fail_at=fail_at), CONFIG)
    args.remove("--spec-config")
    args.remove("ngram")
    return [*args, "--spec-search", "ngram", "-rs", "-v"]


def run_search(pytester: pytest.Pytester, *extra: str, fail_at: int = 0) -> pytest.RunResult:
    args = [*search_args(pytester, fail_at=fail_at), *extra]
    if fail_at:  # its conftest patches SearchPolicy.next: a process of its own
        return run_in_process(pytester, *args)
    return run_in_process(pytester, *args)


def outcomes(result: pytest.RunResult) -> dict[str, str]:
    outcome = r"::(test_\w+\[[^\]]+\]) (PASSED|FAILED|UNDECIDED|SKIPPED|ERROR)"
    found = re.findall(outcome, result.stdout.str())
    return dict(found)


def state(pytester: pytest.Pytester) -> dict:
    return json.loads((pytester.path / "target-state.json").read_text())


def test_a_search_fills_its_slots_and_skips_the_rest_with_the_reason(
    pytester: pytest.Pytester,
) -> None:
    # A margin of +50% that no config reaches: the search stops after its first reload.
    result = run_search(pytester, "--spec-max-reloads", "3", "--spec-min-effect", "0.5")
    out = result.stdout.str()
    found = outcomes(result)
    ran = ("PASSED", "FAILED", "UNDECIDED")
    assert found["test_speculation_does_not_regress[search-1-coding]"] in ran
    for slot in ("search-2", "search-3"):
        assert found[f"test_speculation_does_not_regress[{slot}-math]"] == "SKIPPED", out
        assert found[f"test_throughput_threshold[{slot}-coding]"] == "SKIPPED", out
    assert re.search(
        r"SKIPPED .*the search stopped before search-2: no untried config is predicted to beat "
        r"the best measured by the margin \(\+50%\)",
        out,
    ), out
    summary = out[out.index("speculative decoding: baseline vs candidates") :]
    assert next(line for line in summary.splitlines()[1:] if line).startswith("Answer: ")
    assert "Reloads: 1 of 3. The search stopped: no untried config" in summary
    assert re.search(r"search-1: k=\d n=\d\.\.\d \[teach\]", summary), summary
    (run,) = (pytester.path / "reports").iterdir()
    assert run.name.endswith("-search-ngram")
    log = (run / "run.log").read_text()
    assert "plan: candidates chosen by --spec-search ngram: up to 3 reloads, search-1" in log
    assert re.search(r"search: reload 1 of 3: search-1 = k=\d n=\d\.\.\d \[teach\]", log), log
    assert "search: stopped after 1 of 3 reloads: no untried config" in log
    md = (run / "summary.md").read_text()
    assert md.splitlines()[2].startswith("> **Answer:** ")
    html = (run / "report.html").read_text()
    assert html.index("id='specdecode-answer'") < html.index("class='headline")
    data = json.loads((run / "results.json").read_text())
    assert data["search"]["reloads"][0]["kind"] == "teach"
    assert data["analysis"]["search"]["paragraph"] in md
    seen = state(pytester)
    assert seen["candidates"] == ["search-1"] and seen["active"] == []
    assert seen["serving"] == "original" and seen["events"][-2:] == ["start original", "close"]


def test_an_exception_mid_search_leaves_no_candidate_running(pytester: pytest.Pytester) -> None:
    result = run_search(pytester, "--spec-max-reloads", "3", fail_at=2)
    out = result.stdout.str()
    found = outcomes(result)
    assert found["test_throughput_threshold[search-1-coding]"] == "PASSED", out
    assert found["test_throughput_threshold[search-2-coding]"] == "ERROR", out
    assert "RuntimeError: the policy failed while choosing" in out
    assert found["test_throughput_threshold[search-3-coding]"] == "SKIPPED", out
    assert "the search stopped before search-3: choosing reload 2 failed: RuntimeError" in out
    seen = state(pytester)
    assert seen["candidates"] == ["search-1"] and seen["active"] == []
    assert seen["events"][-3:] == ["stop search-1", "start original", "close"]
    data = json.loads(
        next((pytester.path / "reports").iterdir()).joinpath("results.json").read_text()
    )
    assert data["search"]["stopped"].startswith("choosing reload 2 failed: RuntimeError")
    assert data["restore"] is not None


def test_search_with_candidates_is_refused_before_anything_starts(
    pytester: pytest.Pytester,
) -> None:
    args = write_gate(
        pytester,
        CONFTEST.format(fail_at=0),
        CONFIG + '[presets]\nngram = {{ method = "ngram", num_speculative_tokens = 2 }}\n',
    )
    result = run_in_process(pytester, *args, "--spec-search", "ngram")
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--spec-search ngram chooses its own candidates: drop --spec-config ngram" in out
    assert not (pytester.path / "target-state.json").exists()


def test_the_dry_run_shows_the_search_and_its_first_reload(pytester: pytest.Pytester) -> None:
    config = CONFIG.replace('prompt = "coding"', 'prompt = "the coding prompt"').replace(
        'prompt = "math"', 'prompt = "the math prompt"'
    )
    args = write_gate(pytester, CONFTEST.format(fail_at=0), config)
    args = [a for a in args if a not in ("--spec-config", "ngram")]
    stored = search_record(pytester.path / "sim", TRUTH)
    stored.target.host = "scripted-host"
    measure(stored, "k2", {"method": "ngram", "num_speculative_tokens": 2}, TRUTH)
    measure(stored, "k6", {"method": "ngram", "num_speculative_tokens": 6}, TRUTH, seed=3)
    (pytester.path / "reports" / "20261201T090000Z-k2-k6").mkdir(parents=True)
    RunStore(pytester.path / "reports" / "20261201T090000Z-k2-k6", stored)
    result = run_in_process(
        pytester, *args, "--spec-search", "ngram", "--spec-max-reloads", "2", "--spec-dry-run"
    )
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "candidates: chosen by --spec-search ngram: up to 2 reloads, search-1, search-2" in out
    assert "server starts, in order: baseline (as it runs), search-1, search-2" in out
    assert (
        "the search's first reload, predicted from the stored baseline of "
        "20261201T090000Z-k2-k6 (prompt types with the same prompts: coding, math):" in out
    )
    timed = sum(len(m.samples) for a in ("k2", "k6") for p in stored.arm_phases(a)
                for m in p.measurements.values())  # fmt: skip
    assert f"cost prior at c1: {timed} observations (k=2, k=6) from 1 stored run" in out
    assert re.search(r"search plan \(--spec-search ngram, margin \+3%, up to 2 reloads\): next "
                     r"reload: k=\d n=\d\.\.\d \[predicted best\]", out), out  # fmt: skip
    assert list((pytester.path / "reports").iterdir()) == [
        pytester.path / "reports" / "20261201T090000Z-k2-k6"
    ]  # nothing written


def test_a_search_on_a_reused_baseline_learns_its_cost_from_the_stored_run(
    pytester: pytest.Pytester,
) -> None:
    """`--spec-baseline-from` with `--spec-search`: no baseline measured, and the stored run's
    measured config is the cost prior, so the first reload is predicted, not a teaching one."""
    args = [*search_args(pytester), "--spec-max-reloads", "1"]
    first = run_in_process(pytester, *args)
    assert first.ret in (0, 1), first.stdout.str()
    (stored,) = (pytester.path / "reports").iterdir()
    result = run_in_process(pytester, *args, "--spec-baseline-from", str(stored / "results.json"))
    out = result.stdout.str()
    assert result.ret in (0, 1), out
    (run,) = [p for p in (pytester.path / "reports").iterdir() if p != stored]
    log = (run / "run.log").read_text()
    assert f"baseline: reused from {stored / 'results.json'}, not measured" in log, log
    assert "[baseline]" not in log  # nothing measured for it
    data = json.loads((run / "results.json").read_text())
    assert data["baseline_from"]["path"] == str((stored / "results.json").resolve())
    assert (
        f"search: cost prior: c1: 10 observations (k=2) from 1 stored run of this host, model, "
        f"vLLM version and GPUs: {stored.name}" in log
    ), log
    assert data["search"]["reloads"][0]["kind"] == "predicted best", log
    assert state(pytester)["active"] == []
