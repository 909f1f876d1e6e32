"""The reports of one real run on the embedded CPU vLLM (minutes): HTML, summary.md, plots."""

from __future__ import annotations

import html
import json
import re

import pytest

from pytest_specdecode.cli import compare

from ..support.embedded import write_experiment

PLOTS = ("throughput", "tpot", "acceptance")


def _html_data(text: str) -> dict:
    """The JSON blob pytest-html renders its environment and results from."""
    blob = re.search(r'data-jsonblob="([^"]*)"', text)
    assert blob, "no data-jsonblob in report.html"
    return json.loads(html.unescape(blob.group(1)))


def test_report_html_summary_and_plots_of_a_real_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = write_experiment(pytester, run={"samples": 5, "max_samples": 5, "max_tokens": 32})
    step_summary = pytester.path / "github-step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))

    result = pytester.runpytest_subprocess(
        *exp.args("--spec-config", "ngram", "--spec-workload", "coding", "--spec-aba", "-rA")
    )
    out, err = result.stdout.str(), result.stderr.str()
    run = exp.run_dir()
    data = json.loads((run / "results.json").read_text())
    analysis = data["analysis"]
    # The gate passes only on improved or equivalent, and a baseline that did not drift.
    expected = pytest.ExitCode.OK if analysis["passed"] else pytest.ExitCode.TESTS_FAILED
    assert result.ret == expected, out + err
    print(f"run folder: {run}")  # kept by pytester, for a look at report.html

    # The run folder holds everything a reviewer needs, and nothing else was overwritten.
    for name in ("report.html", "summary.md", "results.json", *(f"{p}.png" for p in PLOTS)):
        assert (run / name).is_file(), f"{name} missing in {sorted(p.name for p in run.iterdir())}"
    for plot in PLOTS:
        assert (run / f"{plot}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    # ABA: the original was started a second time, measured, and compared with the first.
    assert err.count("starting local vLLM process 'original'") == 2, err
    assert "drift check (ABA): measuring the original again" in err
    assert "restored to stopped" in err
    assert exp.leftover_servers() == []
    assert set(data["phases"]) == {"baseline", "ngram", "baseline-after"}
    assert analysis["drift"]["status"] in {"consistent", "drifted", "undecided"}
    assert analysis["drift"]["unreliable"] is (analysis["drift"]["status"] == "drifted")
    equivalence = analysis["equivalence"]["ngram"]["coding"]
    assert equivalence["n"] == 5 and equivalence["status"] in {"identical", "differs"}
    assert set(data["environment"]) == {"gpus", "git_commit", "vllm"}
    assert data["environment"]["vllm"]["version"] == "0.32.0"  # what the candidates were checked by
    assert data["environment"]["gpus"] is None  # no nvidia-smi on this machine

    # report.html: title, the seed-style table with its verdict, the three plots, the checks.
    page = (run / "report.html").read_text()
    assert '<title id="head-title">Speculative decoding: baseline vs ngram' in page
    summary = page[page.index("id='specdecode-summary'") :]
    for column in ("Prompt", "Baseline tok/s", "Candidate tok/s", "Change", "p", "Verdict"):
        assert f"<th>{column}</th>" in summary
    assert "<th>TPOT baseline → candidate</th>" in summary
    verdict = analysis["verdicts"]["ngram"]["coding"]["verdict"]
    assert re.search(rf"<td class='verdict [^']*'[^>]*>{verdict}</td>", summary)
    assert verdict in {"improved", "regressed", "equivalent", "inconclusive"}
    for plot in PLOTS:
        assert (
            f"<img id='specdecode-plot-{plot}' alt='{plot} plot' src='data:image/png;base64,"
            in (summary)
        )
    assert "(aba)" in summary.lower() and "Output, ngram/coding" in summary

    # The environment table: what was tested, where.
    blob = _html_data(page)
    env = blob["environment"]
    assert env["Model"] == "smollm2-135m-instruct"
    assert env["vLLM version"] == "0.32.0"
    assert env["Host"] == "localhost" and env["Backend"] == "local"
    assert env["GPUs"].startswith("none listed")
    assert set(env["Speculation configs"]) == {"ngram"}
    assert env["pytest-specdecode"] == "0.1.0"
    assert "Suite commit" in env and "Python" in env  # ours first, then pytest-metadata's

    # Per-test extras, attached in the call phase: the prompt type's row and acceptance.
    tests = blob["tests"]
    extras = {
        nodeid.split("::")[-1]: " ".join(
            e["content"] for t in entries for e in t["extras"] if e["format_type"] == "html"
        )
        for nodeid, entries in tests.items()
    }
    regress = extras["test_speculation_does_not_regress[ngram-coding]"]
    assert "specdecode-table" in regress and verdict in regress
    assert "<th>draft position</th>" in regress and "Output:" in regress
    assert "Median tok/s" in extras["test_throughput_threshold[baseline-coding]"]

    # summary.md, fit for a PR comment, and the same text in $GITHUB_STEP_SUMMARY.
    md = (run / "summary.md").read_text()
    assert (
        "| Prompt | Baseline tok/s | Candidate tok/s | Change | TPOT baseline → candidate |" in md
    )
    assert re.search(r"^\| coding \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% ", md, re.M), md
    assert verdict in md and "drift" in md.lower()
    assert step_summary.read_text().strip() == md.strip()

    # The terminal: table, checks and where the files are.
    assert re.search(r"^coding\s+ngram\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+%", out, re.M), out
    assert f"summary: {run / 'summary.md'}" in out
    assert "report.html" in out  # pytest-html's own line

    # The stored run serves as a baseline: a dry run with it plans one phase, starts nothing.
    dry = pytester.runpytest_subprocess(
        *exp.args(
            "--spec-config",
            "ngram",
            "--spec-workload",
            "coding",
            "--spec-dry-run",
            "--spec-baseline-from",
            str(run / "results.json"),
        )
    )
    dry_out = dry.stdout.str()
    assert dry.ret == pytest.ExitCode.OK, dry_out + dry.stderr.str()
    assert f"baseline: reused from {run / 'results.json'}" in dry_out
    assert "requests: 6 = 1 phases x 1 prompt types x (5 measured + 1 warm-up)" in dry_out
    assert f"from the stored run {run.name}" in dry_out  # the estimate uses this run's timings
    assert [p for p in exp.reports.iterdir() if p.is_dir()] == [run]

    # And two stored runs compare (here: the run with itself).
    assert compare.main([str(run / "results.json"), str(run)]) == 0
