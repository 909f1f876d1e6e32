"""Two quantities, two names (issue 41): "accepted per draft" (vLLM's mean acceptance length,
1 + accepted tokens / drafting steps) and "tokens per step" (output tokens / decode steps, the
break-even map's axis). A run whose n-gram candidate drafts on few steps has the two far apart;
every renderer must show each under its own name and never under the other's."""

from __future__ import annotations

import html as html_module
import re
from pathlib import Path
from typing import Any

import pytest
from matplotlib.axes import Axes

from pytest_specdecode.analysis.run import RunAnalysis, analyze
from pytest_specdecode.record.counters import (
    ACCEPTED_PER_DRAFT,
    TOKENS_PER_STEP,
    Acceptance,
)
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report import html, markdown, terminal, write_reports
from pytest_specdecode.report.rows import rows

from ...support import synthetic

# The old words, each of which named both quantities somewhere.
RETIRED = ("acceptance length", "tokens a step", "accept len", "tok/step", "tokens/step")


def _map_run(tmp_path: Path) -> RunRecord:
    """A break-even map at k=3 and 5 (every map step drafts), and an n-gram k=5 candidate that
    drafts on a fifth of its steps: 4.4 accepted per draft, 1.5 tokens per step."""
    s = synthetic.settings(tmp_path, run_extra='break_even = "auto"', samples=8)
    rec = synthetic.record(s)
    rates = {"coding": 100.0, "math": 50.0}
    decoded = 8 * 63  # 8 requests of 64 tokens, the first of each from prefill

    def counted(k: int, accepted_per_draft: float, tokens_per_step: float) -> Acceptance:
        steps = decoded / tokens_per_step
        accepted = decoded - steps
        drafts = accepted / (accepted_per_draft - 1) if accepted_per_draft > 1 else steps
        return Acceptance(present=True, drafts=drafts, draft_tokens=k * drafts,
                          accepted=accepted, mean_acceptance_length=1 + accepted / drafts,
                          per_position_rates=[0.9, 0.8, 0.6, 0.5, 0.4][:k])  # fmt: skip

    synthetic.add_phase(rec, "baseline", rates, seed=1)
    for name, k, length, cost in (("map-k3-L1", 3, 1, 1.2), ("map-k3-L4", 3, 4, 1.2),
                                  ("map-k5-L1", 5, 1, 1.4), ("map-k5-L6", 5, 6, 1.4)):  # fmt: skip
        synthetic.add_phase(rec, name, {w: r * length / cost for w, r in rates.items()},
                            seed=k + length, acceptance=counted(k, length, length))  # fmt: skip
    synthetic.add_phase(rec, "ngram", {w: r * 1.5 / 1.4 for w, r in rates.items()}, seed=9,
                        acceptance=counted(5, 4.4, 1.5))  # fmt: skip
    return rec


def _figures(analysis: RunAnalysis) -> tuple[str, str]:
    """The candidate's accepted per draft and its tokens per step on the map, as printed."""
    [row] = [r for r in rows(analysis, "ngram") if r.prompt_type == "coding"]
    [check] = [c for c in analysis.candidate_predictions if c.prompt_type == "coding"]
    assert row.accepted_per_draft is not None
    return f"{row.accepted_per_draft:.2f}", f"{check.tokens_per_step:.2f}"


def _named_apart(text: str, per_draft: str, per_step: str) -> None:
    """Each figure beside its own name, never beside the other's, and no retired word."""
    lowered = text.lower().replace("vllm's mean acceptance length", "")
    for word in RETIRED:
        assert word not in lowered, (word, text)
    assert f"{per_step} {TOKENS_PER_STEP}" in text, text
    assert f"{per_draft} {TOKENS_PER_STEP}" not in text
    assert f"{per_step} {ACCEPTED_PER_DRAFT}" not in text
    assert f"{ACCEPTED_PER_DRAFT} {per_step}" not in text
    assert f"{TOKENS_PER_STEP} {per_draft}" not in text


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunRecord, RunAnalysis]:
    rec = _map_run(tmp_path_factory.mktemp("names"))
    return rec, analyze(rec)


def test_the_two_figures_differ_in_this_run(run: tuple[RunRecord, RunAnalysis]) -> None:
    per_draft, per_step = _figures(run[1])
    assert abs(float(per_draft) - float(per_step)) > 2.0, (per_draft, per_step)


def test_the_terminal_table_shows_accepted_per_draft_under_its_own_column(
    run: tuple[RunRecord, RunAnalysis],
) -> None:
    rec, analysis = run
    per_draft, per_step = _figures(analysis)
    out = terminal.lines(rec, analysis, files={})
    [header] = [line for line in out if line.startswith("prompt ")]
    assert TOKENS_PER_STEP not in header
    end = header.index(ACCEPTED_PER_DRAFT) + len(ACCEPTED_PER_DRAFT)
    [row] = [line for line in out if line.startswith("coding ") and " ngram " in line]
    assert row[:end].endswith(per_draft), (header, row)  # right-aligned under its header
    assert any("vLLM's mean acceptance length" in line for line in out)
    _named_apart("\n".join(out), per_draft, per_step)


def test_summary_md_and_the_html_name_each_quantity_apart(
    run: tuple[RunRecord, RunAnalysis],
) -> None:
    rec, analysis = run
    per_draft, per_step = _figures(analysis)
    md = markdown.summary(rec, analysis)
    assert f"Acceptance: {per_draft} {ACCEPTED_PER_DRAFT} (vLLM's mean acceptance length" in md
    assert "measured points (tokens per step: ratio [band])" in md
    _named_apart(md, per_draft, per_step)
    page = html_module.unescape(re.sub(r"<[^>]+>", " ", html.summary(rec, analysis, None)))
    page = re.sub(r"[ \t]+", " ", page)
    assert f"{per_draft} {ACCEPTED_PER_DRAFT}" in page
    _named_apart(page, per_draft, per_step)


def test_the_plots_label_each_quantity_by_its_name(
    run: tuple[RunRecord, RunAnalysis], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rec, analysis = run
    labels: list[str] = []

    def spy(method: str) -> Any:
        original = getattr(Axes, method)

        def wrapped(self: Axes, *args: Any, **kwargs: Any) -> Any:
            labels.extend(str(a) for a in args[:1] if isinstance(a, str))
            if isinstance(kwargs.get("label"), str):
                labels.append(kwargs["label"])
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Axes, method, wrapped)

    for method in ("set_xlabel", "set_ylabel", "plot", "bar"):
        spy(method)
    written = write_reports(rec, analysis, tmp_path, failed=[], step_summary=None)
    assert "break-even" in written.plots and "acceptance" in written.plots
    assert any(label.startswith(TOKENS_PER_STEP) for label in labels), labels
    assert any(label.endswith(f"{ACCEPTED_PER_DRAFT})") for label in labels), labels
    text = "\n".join(labels).lower()
    for word in RETIRED:
        assert word not in text, (word, labels)
