"""report.py on synthetic experiments with known effects: table, summary, checks, plots."""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib.image
import pytest

from pytest_specdecode.measure.experiment import BASELINE_AFTER
from pytest_specdecode.report import summary as report
from pytest_specdecode.report.summary import TABLE_HEADER

from .test_report_data import NGRAM_ACCEPTANCE, TEXT, add_phase, experiment, settings

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def run(tmp_path: Path):
    """coding: ngram 50% faster; math: ngram 30% slower. 6 vs 6 samples, tight spread."""
    exp = experiment(tmp_path, settings(tmp_path))
    add_phase(exp, "baseline", {"coding": 20.0, "math": 16.0}, seed=1)
    add_phase(exp, "ngram", {"coding": 30.0, "math": 11.2}, acceptance=NGRAM_ACCEPTANCE, seed=2)
    exp.verdicts("ngram")
    return exp


def test_table_rows_are_the_seed_table(run) -> None:
    rows = report.table_rows(run.results.data)
    assert [(r.candidate, r.prompt, r.verdict) for r in rows] == [
        ("ngram", "coding", "improved"),
        ("ngram", "math", "regressed"),
    ]
    coding = rows[0]
    assert coding.baseline_tps == pytest.approx(20.0, rel=0.05)
    assert coding.candidate_tps == pytest.approx(30.0, rel=0.05)
    assert coding.change == pytest.approx(0.5, abs=0.06)
    assert coding.acceptance_length == 2.5
    assert coding.per_position == (0.55, 0.35, 0.3, 0.2, 0.1)
    cells = coding.cells()
    assert len(cells) == len(TABLE_HEADER) == 7
    assert TABLE_HEADER[4] == "TPOT baseline → candidate"
    assert cells[0] == "coding"
    assert re.fullmatch(r"\+\d+\.\d% \[\+\d+\.\d%, \+\d+\.\d%\]", cells[3]), cells[3]
    assert re.fullmatch(r"[\d.]+ → [\d.]+ ms \(-\d+\.\d%, p [\d.e-]+\)", cells[4]), cells[4]
    assert float(cells[5]) < 0.05
    assert cells[6] == "improved"
    assert report.outcome(run.results.data) == "regressed"


def test_headline_names_the_regression_first(run) -> None:
    text = report.headline(run.results.data)
    assert text.startswith("Regression. ngram: ")
    assert "improved on coding" in text and "regressed on math" in text


def test_summary_markdown_is_a_pr_comment(run) -> None:
    run.results.data["equivalence"] = report.equivalence(run.results.data)
    md = report.summary_markdown(run.results.data, failed=["test_x[ngram-math]"], run_name="R")
    lines = md.splitlines()
    assert lines[0] == "## Speculative decoding: baseline vs ngram"
    header = "| " + " | ".join(TABLE_HEADER) + " |"
    start = lines.index(header)
    table = lines[start : start + 4]
    assert all(line.count("|") == 8 for line in table), table  # 7 columns, escaped cells
    assert table[2].startswith("| coding | ") and table[2].endswith("| **improved** |")
    assert table[3].startswith("| math | ") and table[3].endswith("| **regressed** |")
    assert "**Result: Regression." in md
    assert "**Failed tests (1):** `test_x[ngram-math]`" in md
    assert "Acceptance: mean length 2.50, draft acceptance 30.0%" in md
    assert "per position [0.55, 0.35, 0.30, 0.20, 0.10]" in md
    assert "- Output, ngram/coding: identical to the baseline (6/6 outputs)" in md
    assert "vLLM 0.32.0" in md and "suite `0123456789ab`" in md
    assert "run folder `R`" in md


def test_equivalence_exact_and_common_prefix(tmp_path: Path) -> None:
    exp = experiment(tmp_path, settings(tmp_path, workloads=("coding",)))
    add_phase(exp, "baseline", {"coding": 20.0})
    changed = TEXT[:30] + "<b>X</b>" + TEXT[38:]
    add_phase(exp, "ngram", {"coding": 25.0}, texts={"coding": [TEXT, changed]})
    entry = report.equivalence(exp.results.data)["ngram"]["coding"]
    assert entry["status"] == "differs"
    assert entry["n"] == 6 and entry["identical"] == 3
    assert entry["min_common_prefix_chars"] == 30
    assert entry["reference_chars"] == len(TEXT)
    assert entry["divergence"]["at_char"] == 30
    text = report.equivalence_text(entry)
    assert text == (
        f"differs from the baseline: 3/6 outputs identical, common prefix at least 30 of "
        f"{len(TEXT)} characters"
    )
    exp.results.data["equivalence"] = report.equivalence(exp.results.data)
    assert any("ngram/coding output differs" in w for w in report.warnings_of(exp.results.data))
    # The model's text is escaped in the HTML: it is data, not markup.
    extra = report.extra_html(exp.results.data, "ngram", "coding")
    assert "&lt;b&gt;X" in extra and "<b>X" not in extra


def _aba(tmp_path: Path, after: float, samples: int):
    tmp_path.mkdir(exist_ok=True)
    exp = experiment(tmp_path, settings(tmp_path, samples=samples))
    add_phase(exp, "baseline", {"coding": 20.0, "math": 16.0}, seed=1)
    add_phase(exp, "ngram", {"coding": 21.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE, seed=2)
    add_phase(exp, BASELINE_AFTER, {"coding": 20.0 * after, "math": 16.0 * after}, seed=3)
    exp.verdicts("ngram")
    return exp


def test_drift_check_flags_a_baseline_that_moved(tmp_path: Path) -> None:
    doc = _aba(tmp_path, after=0.75, samples=6).results.data
    drift = report.drift_check(doc)
    assert drift["status"] == "drifted" and drift["unreliable"] is True
    assert drift["drifted"] == ["coding", "math"]
    assert drift["throughput"]["coding"]["verdict"] == "regressed"
    doc["drift"] = drift
    assert report.headline(doc).startswith("UNRELIABLE (the baseline drifted during the run).")
    md = report.summary_markdown(doc)
    assert (
        "- ⚠ Drift (ABA): the baseline drifted on coding, math: the experiment is unreliable" in md
    )
    # ngram was measured and compared, but its phases do not include the ABA baseline.
    assert report.phase_order(doc) == ["baseline", "ngram", BASELINE_AFTER]
    assert [r.candidate for r in report.table_rows(doc)] == ["ngram", "ngram"]


def test_drift_check_consistent_and_insufficient(tmp_path: Path) -> None:
    same = report.drift_check(_aba(tmp_path / "a", after=1.0, samples=6).results.data)
    assert same["status"] == "consistent" and same["unreliable"] is False
    few = report.drift_check(_aba(tmp_path / "b", after=0.5, samples=3).results.data)
    assert few["status"] == "insufficient samples" and few["unreliable"] is False
    assert "take at least" in few["text"]


def test_no_drift_check_without_the_second_baseline(run) -> None:
    assert report.drift_check(run.results.data) is None


def test_plots_are_valid_png_files(run, tmp_path: Path) -> None:
    out = tmp_path / "plots"
    out.mkdir()
    plots = report.write_plots(run.results.data, out)
    assert set(plots) == {"throughput", "tpot", "acceptance"}
    for name, path in plots.items():
        assert path == out / f"{name}.png"
        assert path.read_bytes().startswith(PNG_MAGIC)
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
        assert image[..., :3].std() > 0.05  # something was drawn, not a blank canvas


def test_plots_of_a_run_without_acceptance_or_candidates(tmp_path: Path) -> None:
    exp = experiment(tmp_path, settings(tmp_path, candidates=()))
    add_phase(exp, "baseline", {"coding": 20.0, "math": 16.0})
    plots = report.write_plots(exp.results.data, tmp_path)
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in plots.values())
    assert report.outcome(exp.results.data) == "not measured"


def test_summary_html_has_table_verdicts_and_embedded_plots(run, tmp_path: Path) -> None:
    doc = run.results.data
    plots = report.write_plots(doc, tmp_path)
    page = report.summary_html(doc, plots)
    assert page.startswith("<section class='specdecode' id='specdecode-summary'>")
    assert "".join(f"<th>{h}</th>" for h in TABLE_HEADER) in page
    assert re.search(r"<td class='verdict v-improved' title='[^']+'>improved</td>", page)
    assert re.search(r"<td class='verdict v-regressed' title='[^']+'>regressed</td>", page)
    for name in ("throughput", "tpot", "acceptance"):
        assert (
            f"<img id='specdecode-plot-{name}' alt='{name} plot' src='data:image/png;base64,"
            in (page)
        )
    assert "Result: Regression." in page


def test_extra_html_per_test(run) -> None:
    doc = run.results.data
    candidate = report.extra_html(doc, "ngram", "math")
    assert "<td>math</td>" in candidate and "<td>coding</td>" not in candidate
    assert "regressed" in candidate
    assert "mean length 2.50" in candidate and "<th>draft position</th>" in candidate
    assert "Output: identical to the baseline (6/6 outputs)" in candidate
    baseline = report.extra_html(doc, "baseline", "coding")
    assert "Median tok/s" in baseline and "<td>coding</td>" in baseline
    assert report.extra_html(doc, "eagle", "coding") is None  # not measured: nothing


def test_environment_table(run) -> None:
    env = report.environment_table(run.results.data)
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
    run.results.data["phases"]["ngram"]["server_version"] = "0.33.0"
    run.results.data["environment"]["gpus"] = ["0: NVIDIA H100, 81559 MiB, driver 550"]
    env = report.environment_table(run.results.data)
    assert env["vLLM version"] == "baseline 0.32.0, ngram 0.33.0"
    assert env["GPUs"] == "0: NVIDIA H100, 81559 MiB, driver 550"


def test_finish_writes_files_and_the_step_summary(run, tmp_path: Path) -> None:
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    written = report.finish(run, tmp_path / "run", failed=(), step_summary=str(step))
    assert written.summary == tmp_path / "run" / "summary.md"
    assert written.summary.read_text() == written.markdown
    assert step.read_text() == "earlier step\n" + written.markdown + "\n"  # appended
    assert all(p.read_bytes().startswith(PNG_MAGIC) for p in written.plots.values())
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    assert stored["equivalence"]["ngram"]["math"]["status"] == "identical"
    assert set(stored["verdicts"]["ngram"]) == {"coding", "math"}


def test_finish_computes_verdicts_only_from_what_was_measured(tmp_path: Path) -> None:
    # Two candidates configured, the run stopped after the first: nothing is started here.
    exp = experiment(tmp_path, settings(tmp_path, candidates=("ngram", "eagle")))
    exp.board.activate = None  # would fail if anything tried to start a service
    add_phase(exp, "baseline", {"coding": 20.0, "math": 16.0})
    add_phase(exp, "ngram", {"coding": 22.0, "math": 16.0}, acceptance=NGRAM_ACCEPTANCE)
    written = report.finish(exp, tmp_path / "run")
    assert list(exp.results.data["verdicts"]) == ["ngram"]
    assert "### ngram" in written.markdown and "### eagle" not in written.markdown


def test_dry_run_lines_count_requests_and_estimate(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=5)
    timing = report.Timing(start_s=50.0, s_per_token=0.02, source="from the stored run R")
    steps = ["start the original", "stop; start candidate ngram", "write /x:\n    [Unit]", "end"]
    lines = report.dry_run_lines(
        s, steps, host="localhost", timing=timing, aba=True, baseline_from=None
    )
    text = "\n".join(lines)
    assert "requests: 36 = 3 phases x 2 prompt types x (5 measured + 1 warm-up)" in text
    # 3 starts x 50 s + 36 requests x 64 tokens x 20 ms = 196 s
    assert "estimated duration: about 3 min (3 server starts at ~50s" in text
    assert "from the stored run R" in text
    assert lines.index(
        "  4. drift check (ABA): stop the last candidate, start the original "
        "and measure it again as 'baseline-after'"
    ) < lines.index("  5. end")
    assert "  3. write /x:\n         [Unit]" in text  # a unit file keeps its lines, indented
    reused = report.dry_run_lines(
        s, steps, host="localhost", timing=timing, aba=False, baseline_from="old/results.json"
    )
    assert (
        "baseline: reused from old/results.json, not measured; the original is not started for it"
        in reused
    )
    assert any(line.startswith("requests: 12 = 1 phases") for line in reused)
