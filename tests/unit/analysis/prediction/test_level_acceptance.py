"""Acceptance per request, prompt and level, from a run made of the real CPU vLLM's payloads."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.prediction.level_acceptance import acceptance_by_level
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.verdict.compare import compare_arms
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report import write_reports
from pytest_specdecode.report.sections import acceptance as report
from tests.support import synthetic


@pytest.fixture
def run(tmp_path: Path) -> RunRecord:
    return synthetic.per_request_run(tmp_path)


def test_per_level_figures_from_the_requests(run: RunRecord) -> None:
    found = {e.level: e for e in acceptance_by_level(run).levels}
    one, four = found["c1"], found["c4"]
    assert (one.source, four.source) == ("requests", "requests")
    assert one.measured is not None and four.measured is not None
    assert round(one.measured.mean_acceptance_length or 0, 2) == 3.68
    assert round(four.measured.mean_acceptance_length or 0, 2) == 3.58
    assert one.counters_check is None and four.counters_check is None  # sums = counters
    seed = next(p for p in one.per_prompt if p.prompt_index == 0)
    assert (seed.requests, seed.drafts, seed.accepted) == (1, 18, 64)
    assert len(four.per_prompt) == 12


def test_the_step_check_at_each_level(run: RunRecord) -> None:
    found = {e.level: e for e in acceptance_by_level(run).levels}
    one, four = found["c1"], found["c4"]
    assert one.steps is not None and one.steps.agreeing == 12
    assert four.steps is not None and (four.steps.agreeing, four.steps.by_first) == (
        5,
        {"outputs differ": 7},
    )
    assert four.own_steps is not None and four.own_steps.agreeing == 12
    # the prediction at c1 replays the baseline's own c1 outputs: the candidate's, here
    assert one.error == 0.0  # inside the range the last steps' unverified tokens leave
    assert one.predicted_range is not None and one.predicted_range[1] > one.predicted_range[0]
    # at c4 the outputs moved: 3.58 measured, below the replay of the c1 outputs
    assert four.predicted_range is not None and four.error is not None and four.error < 0
    assert four.basis == "the baseline's own outputs at c4, 12 requests"


def test_what_the_batch_taught(run: RunRecord) -> None:
    found = acceptance_by_level(run)
    assert found.batch_predictable is True
    assert found.batch_rule is not None
    assert "drafted exactly as the replay says on each request's own tokens" in found.batch_rule
    assert "7 of 12 requests here" in found.batch_rule


def test_a_drafting_departure_makes_it_unpredictable(run: RunRecord) -> None:
    """A server that left out drafts in the batch: the rule then says it cannot predict."""
    for s in run.phases["ngram"].measurements["math@c4"].samples:
        p = s.spec_decode
        assert p is not None
        keep = len(p["per_step_drafted"]) // 2
        drafted, accepted = p["per_step_drafted"][:keep], p["per_step_accepted"][:keep]
        hist = [0] * (p["num_spec_tokens"] + 1)
        for a in accepted:
            hist[a] += 1
        s.spec_decode = {
            **p,
            "per_step_drafted": drafted,
            "per_step_accepted": accepted,
            "acceptance_histogram": hist,
            "num_spec_steps": keep,
            "num_accepted_draft_tokens": sum(accepted),
            "num_draft_tokens": sum(drafted),
        }
    found = acceptance_by_level(run)
    assert found.batch_predictable is False
    assert found.batch_rule is not None and found.batch_rule.startswith("not predicted above")
    assert "no draft" in found.batch_rule
    four = next(e for e in found.levels if e.level == "c4")
    assert four.counters_check is not None and "do not sum" in four.counters_check
    assert any("do not sum" in w for w in analyze(run).warnings)


def test_other_clients_leave_the_requests_figures_exact(run: RunRecord) -> None:
    """A contaminated window: the counters moved with others' requests, the verdict's
    acceptance is still the requests' own, and no counters check is made there."""
    m = run.phases["ngram"].measurements["math@c4"]
    own = m.request_acceptance
    m.foreign = "3 requests of other clients"
    m.acceptance = synthetic.acceptance_of(500, 2500, 900, [300, 200, 150, 150, 100])
    assert m.request_check is None
    verdicts = compare_arms(
        run.arm_phases("baseline"), run.arm_phases("ngram"), alpha=0.05, min_effect=0.03,
        noise=analyze(run).noise,
    )  # fmt: skip
    assert verdicts["math@c4"].acceptance == own
    assert verdicts["math@c4"].contaminated


def test_reports_and_results(run: RunRecord, tmp_path: Path) -> None:
    analysis = analyze(run)
    data = json.loads(json.dumps(analysis.to_json()))
    levels = data["acceptance_by_level"]["levels"]
    assert [e["level"] for e in levels] == ["c1", "c4"]
    assert levels[1]["steps"]["by_first"] == {"outputs differ": 7}
    assert data["acceptance_by_level"]["batch_predictable"] is True
    text = "\n".join(report.markdown_lines(run, analysis))
    assert "| ngram (k=5 n=4..4) | math @ c4 | 12 | 3.58 (requests) |" in text
    assert "Above the first level: in a batch (c4)" in text
    terminal = "\n".join(report.terminal_lines(run, analysis))
    assert "math @ c4" in terminal and "5/12 requests agree step by step" in terminal
    run_dir = tmp_path / "out"
    run_dir.mkdir()
    written = write_reports(run, analysis, run_dir, failed=[], step_summary=None)
    assert written.plots[report.PLOT_NAME].stat().st_size > 5000
    assert "Acceptance per level" in written.summary.read_text()
    again = RunRecord.from_json(json.loads(json.dumps(run.to_json())))
    assert acceptance_by_level(again).to_json() == acceptance_by_level(run).to_json()


def test_why_no_per_request_metrics_is_said_once_for_the_starts_it_covers(run: RunRecord) -> None:
    """An H200 run of two starts per arm said it twice, once for ngram and once for ngram#2."""
    why = "none: vLLM 0.26.0 on localhost (python3) has no --per-request-spec-decode-metrics"
    run.phases["ngram"].request_metrics = why
    run.phases["ngram#2"] = dataclasses.replace(run.phases["ngram"], name="ngram#2")
    run.phases["baseline"].request_metrics = "none: another reason"
    said = report.notes(run, acceptance_by_level(run))[:2]
    assert said == [
        "baseline: no per-request metrics (another reason)",
        f"ngram, ngram#2: no per-request metrics ({why.removeprefix('none: ')})",
    ]
