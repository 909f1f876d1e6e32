"""`--spec-search ngram` end to end on the real CPU vLLM (minutes; run under the lock).

One run of the tool itself, `pytest suites/ --spec-search ngram --spec-max-reloads 2`, on two
prompt types, in a fresh reports folder (no stored run: no cost prior, no coverage from before).
Three server starts: the baseline, then two reloads the search picks by prediction: the first
to teach the cost model (nothing is known of a step's cost yet), the second the predicted best,
confirmed by its own reload and verdict tests. The run ends with the answer in one paragraph,
at the top of the terminal summary, summary.md and report.html. The confirmed config's measured
tok/s must lie inside the band predicted before its reload on each prompt type, or the answer
and the coverage lines must flag that prompt type. The figures are printed (-s) for the issue's
closing note.

Lean for CI: 5 timed requests (the least two prompt types can reach a verdict with) of 32
tokens, one warm-up, one load level. `math` is a shipped prompt; `list129` a repeating list on
which n-gram speculation pays several times over on this CPU (docs/predict.md), so the predicted
best is worth its reload whatever the teaching reload measured.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.config.prompts import shipped_set
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import load_run

from ..support.embedded import EmbeddedExperiment, require_embedded, write_experiment
from .test_prediction_real import LIST129

PROMPTS = {"math": shipped_set("math")[0].text, "list129": LIST129}
SLOTS = ("search-1", "search-2")


@dataclass
class Run:
    exp: EmbeddedExperiment
    stdout: str
    stderr: str
    returncode: int
    record: RunRecord
    data: dict[str, Any]
    log: str


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    require_embedded()
    where = tmp_path_factory.mktemp("search-real")
    tables = "\n".join(
        f"[prompt_types.{name}]\nprompt = {json.dumps(text)}" for name, text in PROMPTS.items()
    )
    exp = write_experiment(
        where,
        run={
            "samples": 5,
            "max_samples": 5,
            "warmup": 1,
            "max_tokens": 32,
            "record_token_ids": True,
        },
        prompt_types=tables,
    )
    args = exp.args("--spec-search", "ngram", "--spec-max-reloads", "2", "-v", "-rs")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert exp.reports.exists(), (done.stdout + done.stderr)[-3000:]  # refused: no run folder
    folder = exp.run_dir()
    results = folder / "results.json"
    return Run(exp, done.stdout, done.stderr, done.returncode, load_run(results),
               json.loads(results.read_text()), (folder / "run.log").read_text())  # fmt: skip


def outcomes(out: str) -> dict[str, str]:
    return dict(re.findall(r"::(test_\w+\[[^\]]+\]) (PASSED|FAILED|SKIPPED|ERROR)", out))


def test_the_search_picks_its_reloads_by_prediction(run: Run) -> None:
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    search = run.record.search
    assert search is not None, run.stdout[-3000:]
    print(f"\nsearch: {search.used} of {search.max_reloads} reloads; stopped: {search.stopped}")
    for reload in search.reloads:
        print(f"  {reload.arm} {reload.label} [{reload.kind}]: {reload.why}")
    assert [r.arm for r in search.reloads] == list(SLOTS), search.stopped
    teach, best = search.reloads
    # Nothing was known of a step's cost: the first reload is the one that teaches the most.
    assert teach.kind == "teach"
    assert "the cost of a speculative step is unknown here" in teach.why
    # Then the best the replay and the cost model now predict, with its band on each prompt type.
    assert best.kind == "predicted best" and best.values != teach.values
    assert "is predicted" in best.why and "cost model at c1: t_step = t0 * (1 + " in best.why
    assert set(best.predicted) == set(PROMPTS)
    assert re.search(r"search: reload 1 of 2: search-1 = k=\d n=\d\.\.\d \[teach\]", run.log)
    assert re.search(r"search: reload 2 of 2: search-2 = k=\d n=\d\.\.\d \[predicted best\]",
                     run.log)  # fmt: skip


def test_each_reload_is_an_ordinary_candidate_and_none_is_left_running(run: Run) -> None:
    assert set(run.record.phases) == {BASELINE, *SLOTS}
    assert {arm: run.record.candidates[arm] for arm in SLOTS} == {
        r.arm: r.values
        for r in run.record.search.reloads  # type: ignore[union-attr]
    }
    found = outcomes(run.stdout)
    for slot in SLOTS:  # confirmed by its own verdict tests, none skipped
        for name in PROMPTS:
            assert found[f"test_speculation_does_not_regress[{slot}-{name}]"] in (
                "PASSED",
                "FAILED",
            ), run.stdout[-3000:]
    assert run.record.restore is not None
    assert run.exp.leftover_servers() == []


def test_the_run_ends_with_the_one_paragraph_answer(run: Run) -> None:
    answer = run.data["analysis"]["search"]
    paragraph = answer["paragraph"]
    print(f"\nAnswer: {paragraph}")
    assert paragraph.startswith(("Turn on ngram ", "Turn on n-gram ", "Leave speculation off: "))
    assert "Reloads: 2 of 2." in paragraph
    summary = run.stdout[run.stdout.index("speculative decoding: baseline vs candidates") :]
    assert next(line for line in summary.splitlines()[1:] if line) == f"Answer: {paragraph}"
    folder = run.exp.run_dir()
    md = (folder / "summary.md").read_text()
    assert f"> **Answer:** {paragraph}" in md
    assert md.index("> **Answer:**") < md.index("`smollm2-135m-instruct` on")
    html = (folder / "report.html").read_text()
    assert html.index("id='specdecode-answer'") < html.index("class='headline")


def test_the_confirmed_config_lies_inside_its_band_or_the_coverage_flags_it(run: Run) -> None:
    answer = run.data["analysis"]["search"]
    checks = {c["prompt_type"]: c for c in answer["checks"] if c["arm"] == "search-2"}
    print("\nsearch-2 measured against the band predicted before its reload:")
    for name, c in checks.items():
        low, high = c["band"]
        print(f"  {name:<8} predicted {c['predicted']:6.1f} [{low:6.1f}, {high:6.1f}] "
              f"measured {c['measured']:6.1f} inside={c['inside']}")  # fmt: skip
    print("coverage:", *answer["coverage_lines"], sep="\n  ")
    assert set(checks) == set(PROMPTS)
    for name, c in checks.items():
        low, high = c["band"]
        assert c["inside"] == (low <= c["measured"] <= high)
        measured = [
            v for p in run.record.arm_phases("search-2") for v in p.measurements[name].tokens_per_s
        ]
        assert min(measured) <= c["measured"] <= max(measured)  # the median of its requests
        if not c["inside"]:  # the coverage check must say so, in the answer and below it
            inside, total = answer["coverage"][name]
            assert inside < total
            assert re.search(rf"The band held less often than its nominal 95% on [^.]*\b{name}\b",
                             answer["paragraph"]), answer["paragraph"]  # fmt: skip
            assert f"{name}: {inside} of {total} measured tok/s inside" in run.stdout
