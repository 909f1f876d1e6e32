"""The reports on synthetic runs with known effects: table, summary, checks, plots."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import matplotlib.image
import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE_AFTER
from pytest_specdecode.config.prompts import Prompt
from pytest_specdecode.report import html, markdown, plan, write_reports
from pytest_specdecode.report.plan_reach import plan_time, time_lines
from pytest_specdecode.report.plots import write_plots
from pytest_specdecode.report.rows import TABLE_HEADER, checks, headline, rows

from ...support.synthetic import NGRAM_ACCEPTANCE, TEXT, add_phase, record, settings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run(tmp_path: Path):
    """coding: ngram 50% faster; math: ngram 30% slower. 6 vs 6 samples, tight spread."""
    rec = record(settings(tmp_path))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0}, seed=1)
    add_phase(rec, "ngram", {"coding": 30.0, "math": 11.2}, acceptance=NGRAM_ACCEPTANCE, seed=2)
    return rec


def test_table_rows_are_the_seed_table(run) -> None:
    found = rows(analyze(run))
    assert [(r.candidate, r.prompt_type, r.verdict) for r in found] == [
        ("ngram", "coding", "improved"),
        ("ngram", "math", "regressed"),
    ]
    coding = found[0]
    assert coding.baseline_tps == pytest.approx(20.0, rel=0.05)
    assert coding.candidate_tps == pytest.approx(30.0, rel=0.05)
    assert coding.change == pytest.approx(0.5, abs=0.06)
    assert coding.accepted_per_draft == 2.5
    assert coding.per_position == (0.55, 0.35, 0.3, 0.2, 0.1)
    cells = coding.cells()
    assert len(cells) == len(TABLE_HEADER) == 7
    assert TABLE_HEADER[4] == "TPOT baseline → candidate"
    assert cells[0] == "coding"
    assert re.fullmatch(r"\+\d+\.\d% \[\+\d+\.\d%, \+\d+\.\d%\]", cells[3]), cells[3]
    assert re.fullmatch(r"[\d.]+ → [\d.]+ ms \(-\d+\.\d%, p [\d.e-]+\)", cells[4]), cells[4]
    assert float(cells[5]) < 0.05
    assert re.fullmatch(r"improved \(throughput \+\d+\.\d% \[\+\d+\.\d%, \+\d+\.\d%\]\)", cells[6])
    assert analyze(run).outcome == "regressed"


def test_headline_names_the_regression_first(run) -> None:
    text = headline(analyze(run))
    assert text.startswith("Regression. ngram: ")
    assert "improved on coding" in text and "regressed on math" in text


def test_summary_markdown_is_a_pr_comment(run) -> None:
    md = markdown.summary(run, analyze(run), failed=["test_x[ngram-math]"], run_name="R")
    lines = md.splitlines()
    assert lines[0] == "## Speculative decoding: baseline vs ngram"
    header = "| " + " | ".join(TABLE_HEADER) + " |"
    start = lines.index(header)
    table = lines[start : start + 4]
    assert all(line.count("|") == 8 for line in table), table  # 7 columns, escaped cells
    assert table[2].startswith("| coding | ") and "| **improved (throughput +" in table[2]
    assert table[3].startswith("| math | ") and "| **regressed (throughput -" in table[3]
    assert table[2].endswith("])** |") and table[3].endswith("])** |")
    assert "**Result: Regression." in md
    assert "**Failed tests (1):** `test_x[ngram-math]`" in md
    assert (
        "Acceptance: 2.50 accepted per draft (vLLM's mean acceptance length: 1 + accepted "
        "tokens / drafting steps), draft acceptance 30.0%" in md
    )
    assert "per position [0.55, 0.35, 0.30, 0.20, 0.10]" in md
    assert "- Output, ngram/coding: identical to the baseline (6/6 outputs)" in md
    assert "vLLM 0.32.0" in md and "suite `0123456789ab`" in md
    assert "run folder `R`" in md
    # the restart noise behind the intervals, and where it came from
    assert "- The intervals' restart noise, throughput: unmeasured: assumed 5%" in md


def test_equivalence_exact_and_common_prefix(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, prompt_types=("coding",)))
    add_phase(rec, "baseline", {"coding": 20.0})
    changed = TEXT[:30] + "<b>X</b>" + TEXT[38:]
    add_phase(rec, "ngram", {"coding": 25.0}, texts={"coding": [TEXT, changed]})
    analysis = analyze(rec)
    entry = analysis.equivalence["ngram"]["coding"]
    assert entry.status == "differs"
    assert entry.n == 6 and entry.identical == 3
    assert entry.min_common_prefix_chars == 30
    assert entry.reference_chars == len(TEXT)
    assert entry.divergence is not None and entry.divergence["at_char"] == 30
    assert entry.text() == (
        f"differs from the baseline: 3/6 outputs identical, common prefix at least 30 of "
        f"{len(TEXT)} characters"
    )
    assert any("ngram/coding output differs" in w for w in analysis.warnings)
    # The model's text is escaped in the HTML: it is data, not markup.
    extra = html.extra(rec, analysis, "ngram", "coding")
    assert "&lt;b&gt;X" in extra and "<b>X" not in extra


QUIET = {"sd": 0.003, "df": 40.0, "source": "stored A/A runs", "measured": True}


def _aba(tmp_path: Path, after: float, samples: int, *, noise: dict | None = None):
    tmp_path.mkdir(exist_ok=True)
    rec = record(settings(tmp_path, samples=samples))
    if noise:
        rec.restart_noise_prior = {"throughput": noise, "tpot": noise}
    spread = 0.004 if noise else 0.02
    kw = {"spread": spread}
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0}, seed=1, **kw)
    add_phase(
        rec, "ngram", {"coding": 21.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE, seed=2, **kw
    )
    add_phase(rec, BASELINE_AFTER, {"coding": 20.0 * after, "math": 16.0 * after}, seed=3, **kw)
    return rec


def test_drift_check_flags_a_baseline_that_moved(tmp_path: Path) -> None:
    rec = _aba(tmp_path, after=0.75, samples=6)
    analysis = analyze(rec)
    drift = analysis.drift
    assert drift is not None
    assert drift.status == "drifted" and drift.unreliable is True
    assert drift.drifted == ["coding", "math"]
    assert drift.verdicts["coding"].throughput.verdict.value == "regressed"
    assert headline(analysis).startswith("UNRELIABLE (the baseline drifted during the run).")
    md = markdown.summary(rec, analysis)
    assert (
        "- ⚠ drift check (ABA): the baseline drifted on coding, math: the experiment is "
        "unreliable" in md
    )
    # ngram was measured and compared, but its phases do not include the ABA baseline.
    assert list(rec.phases) == ["baseline", "ngram", BASELINE_AFTER]
    assert [r.candidate for r in rows(analysis)] == ["ngram", "ngram"]


def test_drift_check_consistent_and_undecided(tmp_path: Path) -> None:
    # With the restart noise measured small, an unmoved baseline is shown to be unmoved.
    same = analyze(_aba(tmp_path / "a", after=1.0, samples=12, noise=QUIET)).drift
    assert same is not None and same.status == "consistent" and same.unreliable is False
    assert "no significant drift" in same.text()
    # Unmeasured (assumed 5%), a small move can be told neither way: not unreliable, undecided.
    unsure = analyze(_aba(tmp_path / "b", after=0.97, samples=6)).drift
    assert unsure is not None and unsure.status == "undecided" and unsure.unreliable is False
    assert "it cannot be told whether the baseline drifted" in unsure.text()
    assert "the restart noise is assumed" in unsure.text()


def test_no_drift_check_without_the_second_baseline(run) -> None:
    assert analyze(run).drift is None


def test_plots_are_valid_png_files(run, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    out.mkdir()
    plots = write_plots(run, analyze(run), out)
    assert set(plots) == {"throughput", "tpot", "acceptance", "time"}
    for name, path in plots.items():
        assert path == out / f"{name}.png"
        assert path.read_bytes().startswith(PNG_MAGIC)
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_plots_of_a_run_without_acceptance_or_candidates(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, candidates=()))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0})
    analysis = analyze(rec)
    plots = write_plots(rec, analysis, tmp_path)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in plots.values())
    assert analysis.outcome == "not measured"


def test_summary_html_has_table_verdicts_and_embedded_plots(run, tmp_path: Path) -> None:
    analysis = analyze(run)
    page = html.summary(run, analysis, write_plots(run, analysis, tmp_path))
    assert page.startswith("<section class='specdecode' id='specdecode-summary'>")
    assert "".join(f"<th>{h}</th>" for h in TABLE_HEADER) in page
    named = r" \(throughput [+-][\d.]+% \[[+-][\d.]+%, [+-][\d.]+%\]\)"
    assert re.search(rf"<td class='verdict v-improved' title='[^']+'>improved{named}</td>", page)
    assert re.search(rf"<td class='verdict v-regressed' title='[^']+'>regressed{named}</td>", page)
    for name in ("throughput", "tpot", "acceptance"):
        assert (
            f"<img id='specdecode-plot-{name}' alt='{name} plot' src='data:image/png;base64,"
            in (page)
        )
    assert "Result: Regression." in page
    assert "The intervals&#x27; restart noise, throughput: unmeasured: assumed 5%" in page or (
        "The intervals' restart noise, throughput: unmeasured: assumed 5%" in page
    )


def test_extra_html_per_test(run) -> None:
    analysis = analyze(run)
    candidate = html.extra(run, analysis, "ngram", "math")
    assert "<td>math</td>" in candidate and "<td>coding</td>" not in candidate
    assert "regressed" in candidate
    assert "2.50 accepted per draft" in candidate and "<th>draft position</th>" in candidate
    assert "Output: identical to the baseline (6/6 outputs)" in candidate
    baseline = html.extra(run, analysis, "baseline", "coding")
    assert "Median tok/s" in baseline and "<td>coding</td>" in baseline


def test_environment_table(run) -> None:
    env = html.environment(run)
    assert env["Model"] == "smollm2-135m-instruct"
    assert env["Host"] == "localhost" and env["Unit"] == "none (a local process)"
    assert env["vLLM version"] == "0.32.0"
    assert env["GPUs"] == "none listed (no nvidia-smi on localhost)"
    assert json.loads(env["Speculation configs"]["ngram"]) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    assert env["Suite commit"] == "0123456789abcdef0123"
    assert env["pytest-specdecode"] == "0.1.0"
    run.phases["ngram"].server_version = "0.33.0"
    run.environment["gpus"] = ["0: NVIDIA H100, 81559 MiB, driver 550"]
    env = html.environment(run)
    assert env["vLLM version"] == "baseline 0.32.0, ngram 0.33.0"
    assert env["GPUs"] == "0: NVIDIA H100, 81559 MiB, driver 550"


def test_write_reports_writes_files_and_the_step_summary(run, tmp_path: Path) -> None:
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    (tmp_path / "run").mkdir()
    written = write_reports(run, analyze(run), tmp_path / "run", failed=[], step_summary=str(step))
    assert written.summary == tmp_path / "run" / "summary.md"
    assert written.summary.read_text() == written.markdown
    assert step.read_text() == "earlier step\n" + written.markdown + "\n"  # appended
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in written.plots.values())


def test_reports_use_only_what_was_measured(tmp_path: Path) -> None:
    # Two candidates configured, the run stopped after the first: only it is reported.
    rec = record(settings(tmp_path, candidates=("ngram", "eagle")))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0})
    add_phase(rec, "ngram", {"coding": 22.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE)
    analysis = analyze(rec)
    assert list(analysis.verdicts) == ["ngram"]
    md = markdown.summary(rec, analysis)
    assert "### ngram" in md and "### eagle" not in md


def test_a_failed_candidate_is_named_with_its_cause(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, candidates=("ngram", "eagle")))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0})
    rec.failures["eagle"] = "ImportError: the draft model needs a package this server lacks"
    found = [c.text for c in checks(rec, analyze(rec)) if c.warn]
    assert found == ["eagle failed: ImportError: the draft model needs a package this server lacks"]


def test_dry_run_lines_count_requests_and_estimate(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=5, max_samples=16)
    timing = plan.Timing(start_s=50.0, s_per_token=0.02, source="from the stored run R")
    steps = ["start the original", "stop; start candidate ngram", "write /x:\n    [Unit]", "end"]
    time, stop = plan_time(s, {}, timing, baseline=True, aba=True, adopts_original=False)
    lines = plan.dry_run_lines(
        s,
        steps,
        host="localhost",
        aba=True,
        baseline_from=None,
        adopts_original=False,
        duration=time_lines(time, timing, stop),
    )
    text = "\n".join(lines)
    assert (
        "requests: 36 to 102 = 3 phases x 2 prompt types x (5 to 16 measured + 1 warm-up)" in text
    )
    assert "server starts, in order: baseline, ngram, baseline-after" in text
    # 3 starts x 50 s + at most 102 requests x 64 tokens x 20 ms = 281 s; token ids (6 x
    # 1.28 s) and the restore (3 x 5 s) on top
    assert "estimated duration: about 5 min in all (" in text
    assert "3 server starts at ~50 s (2 min)" in text
    assert "from the stored run R" in text
    assert lines.index(
        "  4. drift check (ABA): stop the last candidate, start the original "
        "and measure it again as 'baseline-after'"
    ) < lines.index("  5. end")
    assert "  3. write /x:\n         [Unit]" in text  # a unit file keeps its lines, indented
    reused = plan.dry_run_lines(
        s,
        steps,
        host="localhost",
        aba=False,
        baseline_from="old/results.json",
        adopts_original=False,
    )
    assert (
        "baseline: reused from old/results.json, not measured; the original is not started for it"
        in reused
    )
    assert any(line.startswith("requests: 12 to 34 = 1 phases") for line in reused)
    assert "server starts, in order: ngram" in reused


def test_a_figure_names_the_prompts_it_covers_where_the_arms_timed_different_ones(
    tmp_path: Path,
) -> None:
    """The H200's baseline stopped at 8 requests, its candidate ran 12: the figures are the
    candidate's level on the 8 prompts both timed, and the reports say so."""
    s = settings(tmp_path, samples=12)
    rec = record(s)
    rec.prompt_types = {
        name: dataclasses.replace(pt, prompts=tuple(Prompt(f"{name} {i}") for i in range(12)))
        for name, pt in rec.prompt_types.items()
    }
    add_phase(rec, "baseline", {"coding": 20.0, "math": 20.0})
    add_phase(rec, "ngram", {"coding": 15.0, "math": 15.0}, seed=1)
    for m in rec.phases["baseline"].measurements.values():
        for i, x in enumerate(m.samples):
            x.prompt_index = i
        m.samples = m.samples[:8]
    for m in rec.phases["ngram"].measurements.values():
        for i, x in enumerate(m.samples):
            x.prompt_index = i
    md = markdown.summary(rec, analyze(rec))
    assert (
        "Figures, ngram/coding: on the 8 prompts both arms timed (ngram timed 12, the baseline "
        "8): the candidate's figure is its level on the baseline's prompts" in md
    ), md
