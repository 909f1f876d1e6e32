"""The search as a reader meets it: the answer, each reload and why, and specdecode-predict's
search plan from stored runs (synthetic runs with a known step cost, support/search_sim.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.search.answer import search_answer
from pytest_specdecode.analysis.search.policy import SearchPolicy
from pytest_specdecode.cli.predict import main as predict
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.report.sections import search as report

from ....support.search_sim import Truth, measure, run_search, search_record, verdicts

TRUTH = Truth(cost={"c1": (0.1, 0.03)})
K2 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
K6 = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
      "prompt_lookup_max": 4}  # fmt: skip


def store(reports: Path, name: str, rec: RunRecord) -> Path:
    folder = reports / name
    folder.mkdir(parents=True)
    RunStore(folder, rec)
    return folder


def test_the_answer_and_each_reload_in_every_report(tmp_path: Path) -> None:
    rec = search_record(tmp_path, TRUTH)
    run_search(rec, SearchPolicy(margin=0.03, max_reloads=2), TRUTH)
    rec.search.prior = "none"  # type: ignore[union-attr]
    answer = search_answer(rec, verdicts(rec))
    assert answer is not None
    (first,) = report.answer_lines(answer)
    assert first == f"Answer: {answer.paragraph}"
    terminal = report.terminal_lines(rec, answer)
    assert terminal[0] == f"{report.TITLE} (2 of 2 reloads, margin +3%):"
    assert any(line.startswith("  search-1: k=") and "[teach]" in line for line in terminal)
    assert "    no band before this reload (the cost was unknown)" in terminal
    assert any("inside the band predicted before its reload" in line for line in terminal)
    md = report.answer_markdown(answer)
    assert md[0] == f"> **Answer:** {answer.paragraph}"
    page = report.answer_html(answer) + report.html_section(rec, answer)
    assert "id='specdecode-answer'" in page and "id='specdecode-search'" in page
    assert "&#x27;" in page or "'" not in answer.paragraph  # escaped


def test_specdecode_predict_prints_the_search_plan_from_stored_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "reports"
    older = search_record(tmp_path / "a", TRUTH)
    measure(older, "k2", K2, TRUTH)
    measure(older, "k6", K6, TRUTH, seed=3)
    store(reports, "20261201T090000Z-k2-k6", older)
    now = search_record(tmp_path / "b", TRUTH, seed=7)
    run = store(reports, "20261201T100000Z-baseline-only", now)
    assert predict([str(run)]) == 0
    out = capsys.readouterr().out
    assert (
        "band coverage over 1 stored run(s) with more than one measured n-gram config "
        "(20261201T090000Z-k2-k6)" in out
    )
    assert "  coding: 2 of 2 measured tok/s inside the predicted band (100%; nominal 95%)" in out
    assert "cost prior at c1: 24 observations (k=2, k=6) from 1 stored run of this host, " in out
    plan = out[out.index("search plan (--spec-search ngram, margin +3%): next reload: k=") :]
    assert "[predicted best]" in plan.splitlines()[0]
    assert "over speculation off at c1" in plan and "20261201T090000Z-k2-k6" in plan
    assert "  predicted on coding: " in plan and "  predicted on math: " in plan
    assert predict([str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["search_plan"]["next"]["kind"] == "predicted best"
    assert data["search_plan"]["prior"]["c1"]["runs"] == ["20261201T090000Z-k2-k6"]


def test_without_stored_runs_the_plan_teaches_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = store(
        tmp_path / "reports", "20261201T100000Z-baseline-only", search_record(tmp_path, TRUTH)
    )
    assert predict([str(run / "results.json")]) == 0
    out = capsys.readouterr().out
    assert "band coverage: unknown: none of 1 stored run(s) of this host and model measured" in out
    assert "cost prior: none (no stored run of this host, model, vLLM version and GPUs" in out
    assert "next reload: k=" in out and "[teach]" in out and "lies mid-way" in out
