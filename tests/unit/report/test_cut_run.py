"""A run cut short says so: at the top of summary.md, report.html and the terminal, and in
results.json ("cut"), with a result marked partial where the design was not complete; pytest's
exit code stays non-zero. The pure part (record/ending.py → run_cut, the renderers) on a
synthetic run; the whole path through the real suite over scripted services, cut by a SIGINT
mid-window and by a Ctrl-C in a test."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.record.ending import Measured, RanTests, RunEnding, run_cut
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report import html, markdown, terminal
from pytest_specdecode.report.sections.cut import result_label

from ...support.synthetic import add_phase, record, settings
from ..plugin.test_gate import CONFIG  # the real suite over scripted services, two prompt types

REPO = Path(__file__).resolve().parents[3]


# -- the pure part -----------------------------------------------------------------------------


def cut_of(**changes):
    args = dict(
        ending=RunEnding(how="interrupted", signals=["SIGINT"], restore_s=3.0),
        stopped=None,
        at_s=995.2,
        at="2026-12-04 14:03:11 UTC",
        step="recording token ids of [map-k5-L3] coding",
        measured=Measured(6, 6, 48, 48, 576, 4),
        tests=RanTests(collected=24),
        design_complete=False,
        exit_code=2,
    )
    return run_cut(**{**args, **changes})


def test_a_whole_run_is_not_cut() -> None:
    whole = RanTests(collected=2, outcomes={"passed": 2}, ran=["a", "b"])
    assert cut_of(ending=RunEnding()) is None  # no signal, nothing stopped it
    assert cut_of(ending=None) is None
    # a signal during the restore, once the design was measured and every test ran, cuts nothing
    assert cut_of(design_complete=True, tests=whole) is None
    # ... but one test short of them all is a cut
    assert cut_of(design_complete=True, tests=RanTests(2, {"passed": 1}, ["a"])) is not None


def test_the_banner_says_what_when_where_what_was_measured_and_the_tests() -> None:
    cut = cut_of(ending=RunEnding(how="interrupted", signals=["SIGTERM", "SIGINT"]))
    assert cut is not None
    first, *rest = cut.lines()
    assert first == (
        "Cut short by SIGTERM, then SIGINT (a cancelled job, or a timeout's signal) 995 s into "
        "the run (2026-12-04 14:03:11 UTC), while recording token ids of [map-k5-L3] coding."
    )
    text = "\n".join(rest)
    assert "6 of 6 server starts, 48 of 48 cells, 576 requests; token ids of 4 cells" in text
    assert "Tests: no tests ran (none of 24)." in text
    assert "(partial)" in text
    assert "pytest's exit code: 2." in text
    assert "interrupted by SIGTERM, then SIGINT" in text  # the ending, as run.log says it


def test_the_banner_of_an_error_and_of_tests_that_ran(tmp_path: Path) -> None:
    tests = RanTests(collected=5, outcomes={"passed": 2, "failed": 1}, ran=["t1", "t2", "t3"])
    cut = cut_of(
        ending=RunEnding(), stopped=("error", "ServiceError: gone"), tests=tests, step=None
    )
    assert cut is not None and cut.kind == "error"
    assert cut.headline() == (
        "Cut short by an error: ServiceError: gone 995 s into the run (2026-12-04 14:03:11 UTC)."
    )
    assert "Tests: 3 of 5 tests ran (2 passed, 1 failed: t1, t2, t3); 2 did not run." in (
        cut.lines()
    )
    rec = whole_run(tmp_path)
    rec.cut = cut
    assert result_label(rec) == "Result (partial: cut by an error before the design was complete)"


def whole_run(tmp_path: Path) -> RunRecord:
    """A baseline and a candidate that regressed on math."""
    rec = record(settings(tmp_path))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0}, seed=1)
    add_phase(rec, "ngram", {"coding": 20.0, "math": 11.2}, seed=2)
    return rec


def cut_record(tmp_path: Path) -> RunRecord:
    rec = whole_run(tmp_path)
    rec.cut = cut_of(measured=rec.measured(starts_planned=4), tests=RanTests(collected=7))
    return rec


def test_results_json_keeps_the_cut(tmp_path: Path) -> None:
    rec = cut_record(tmp_path)
    data = json.loads(json.dumps(rec.to_json()))
    assert data["cut"]["by"] == "SIGINT" and data["cut"]["tests"]["ran"] == []
    again = RunRecord.from_json(data)
    assert again.cut == rec.cut
    assert again.cut is not None and again.cut.measured.starts == 2  # baseline and candidate
    assert again.cut.measured.starts_planned == 4 and again.cut.measured.cells == 4
    assert again.cut.measured.samples == 4 * rec.run.samples
    whole = whole_run(tmp_path)
    assert RunRecord.from_json(json.loads(json.dumps(whole.to_json()))).cut is None


def test_summary_md_opens_with_the_cut_and_a_partial_result(tmp_path: Path) -> None:
    rec = cut_record(tmp_path)
    text = markdown.summary(rec, analyze(rec))
    assert text.startswith("> **⚠ Cut short by SIGINT (Ctrl-C, or a timeout's signal) 995 s")
    top = text.split("## ")[0]  # everything above the title
    assert "no tests ran (none of 7)" in top and "2 of 4 server starts" in top
    assert re.search(r"^\*\*Result \(partial: cut by SIGINT before the design was complete\): ",
                     text, re.M), text  # fmt: skip
    whole = whole_run(tmp_path)
    plain = markdown.summary(whole, analyze(whole))
    assert plain.startswith("## ") and "Cut short" not in plain and "**Result: " in plain


def test_report_html_opens_with_the_cut(tmp_path: Path) -> None:
    rec = cut_record(tmp_path)
    page = html.summary(rec, analyze(rec), None)
    banner, headline = page.index("id='specdecode-cut'"), page.index("class='headline")
    assert banner < headline  # the first thing in the section
    assert "Cut short by SIGINT" in page and "no tests ran (none of 7)" in page
    assert "Result (partial: cut by SIGINT" in page[headline:]
    whole = whole_run(tmp_path)
    assert "id='specdecode-cut'" not in html.summary(whole, analyze(whole), None)


def test_the_terminal_opens_with_the_cut(tmp_path: Path) -> None:
    rec = cut_record(tmp_path)
    out = terminal.lines(rec, analyze(rec), files={})
    assert out[0].startswith("CUT SHORT: Cut short by SIGINT")
    assert any(line.startswith("Result (partial: cut by SIGINT") for line in out)
    # cut before anything was measured: the banner alone
    empty = record(settings(tmp_path))
    empty.cut = cut_of(step="starting baseline", measured=empty.measured(2))
    lines = terminal.lines(empty, analyze(empty), files={"results": Path("r.json")})
    assert lines[0].endswith("while starting baseline.") and lines[-1] == "results: r.json"


# -- the whole path: the real suite over scripted services --------------------------------------


# SIGINT as a terminal's Ctrl-C finds it (an xdist worker's children inherit it ignored); sent
# to this very process at the Nth timed request, as a test of the suite's own begins, or at the
# first readiness poll of a candidate's start.
CONFTEST = """
import json, os, signal
from tests.support.scripted_target import Script, ScriptedTarget, Speed

signal.signal(signal.SIGINT, signal.default_int_handler)
CUT_AT_STREAM = {stream}
CUT_AT_TEST = {test!r}
CUT_AT_START = {start!r}


class CutTarget(ScriptedTarget):
    sent = 0

    async def _stream(self, request):
        CutTarget.sent += 1
        if CutTarget.sent == CUT_AT_STREAM:
            os.kill(os.getpid(), signal.SIGINT)
        return await super()._stream(request)

    def candidate(self, spec):
        service = super().candidate(spec)
        if spec.name == CUT_AT_START:
            ready = service.ready

            def cut_while_starting():
                if not getattr(service, "cut", False):
                    service.cut = True
                    os.kill(os.getpid(), signal.SIGINT)
                return ready()

            service.ready = cut_while_starting
        return service

    def close(self):
        super().close()
        with open("events.json", "w") as out:  # the starts and stops, for the test to read
            json.dump(self.events, out)


def pytest_runtest_call(item):
    if CUT_AT_TEST and CUT_AT_TEST in item.name:
        os.kill(os.getpid(), signal.SIGINT)


def pytest_specdecode_open_target(config, settings, log_dir):
    return CutTarget(Script(), {{"ngram": Script({{"math": Speed(gap_s=0.005)}})}},
                     running={running})
"""


@pytest.fixture(autouse=True)
def _importable_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests.support` for the copied conftest


def run_cut_suite(
    pytester: pytest.Pytester,
    *,
    stream: int = 0,
    test: str = "",
    start: str = "",
    running: bool = False,
) -> tuple:
    shutil.copytree(
        REPO / "suites", pytester.path / "suites", ignore=shutil.ignore_patterns("*.toml")
    )
    config = pytester.path / "experiment.toml"
    config.write_text(CONFIG.format(reports=pytester.path / "reports"))
    (pytester.path / "suites" / "conftest.py").write_text(
        CONFTEST.format(stream=stream, test=test, start=start, running=running)
    )
    result = pytester.runpytest_subprocess(
        str(pytester.path / "suites"),
        "--spec-file",
        str(config),
        "--spec-config",
        "ngram",
        "-p",
        "no:cacheprovider",
    )
    (run,) = [p for p in (pytester.path / "reports").iterdir() if p.is_dir()]
    return result, run, json.loads((run / "results.json").read_text())


def test_a_sigint_mid_window_is_said_at_the_top_of_every_report(pytester: pytest.Pytester) -> None:
    # 2 warm-up requests, then 10 slots of the baseline (5 per prompt type): cut in the 6th
    result, run, data = run_cut_suite(pytester, stream=8)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out
    assert "no tests ran" in out
    cut = data["cut"]
    assert cut["by"] == "SIGINT" and cut["kind"] == "signal", cut
    assert re.fullmatch(r"measuring slot 6 of 10 \((coding|math)\) on baseline", cut["step"]), cut
    assert cut["tests"]["ran"] == [] and cut["tests"]["collected"] > 0
    assert cut["measured"]["starts"] == 1 and cut["measured"]["starts_planned"] == 2, cut
    assert cut["measured"]["samples"] == 5  # the five slots before the sixth
    assert cut["design_complete"] is False and cut["exit_code"] == pytest.ExitCode.INTERRUPTED
    assert 0 <= cut["at_s"] < 120
    summary = (run / "summary.md").read_text()
    assert summary.startswith("> **⚠ Cut short by SIGINT (Ctrl-C, or a timeout's signal)"), summary
    assert f"while {cut['step']}." in summary.splitlines()[0]
    assert "**Result (partial: cut by SIGINT" in summary
    page = (run / "report.html").read_text()
    assert "Cut short by SIGINT" in page and "no tests ran" in page
    section = out.split("speculative decoding: baseline vs candidates")[1]
    assert section.lstrip(" =\n").startswith("CUT SHORT: Cut short by SIGINT"), section
    assert "restored to stopped" in result.stderr.str()
    assert "run cut: Cut short by SIGINT" in (run / "run.log").read_text()


def test_a_ctrl_c_in_a_test_after_the_design_names_the_tests_that_ran(
    pytester: pytest.Pytester,
) -> None:
    # the suite's own test (suites/, where the conftest's hook applies) runs after the standard
    # tests of the first load: cut as its first case begins
    result, run, data = run_cut_suite(pytester, test="test_speculation_keeps_the_first_token")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out
    cut = data["cut"]
    assert cut["kind"] == "signal" and cut["design_complete"] is True, cut
    assert cut["step"] == "running the tests (the design was measured)"
    ran = cut["tests"]["ran"]
    assert ran and not any("first_token" in name for name in ran), ran
    assert any("does_not_regress" in name for name in ran), ran
    assert len(ran) < cut["tests"]["collected"]
    summary = (run / "summary.md").read_text()
    assert summary.startswith("> **⚠ Cut short by SIGINT")
    assert f"{len(ran)} of {cut['tests']['collected']} tests ran" in summary
    assert "**Result: " in summary and "partial" not in summary  # the design was measured


def test_a_sigint_during_a_candidates_start_restores_the_original_and_keeps_the_baseline(
    pytester: pytest.Pytester,
) -> None:
    # the original serves before the run; the baseline is measured as it runs, then ngram's
    # start is cut at its first readiness poll
    result, run, data = run_cut_suite(pytester, start="ngram", running=True)
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.INTERRUPTED, out + err
    cut = data["cut"]
    assert cut["by"] == "SIGINT" and cut["kind"] == "signal", cut
    assert cut["step"] == "starting ngram", cut
    assert cut["design_complete"] is False
    ran = cut["tests"]["ran"]  # the baseline's own tests ran; none that needs ngram
    assert ran and all("baseline" in name for name in ran), ran
    # nothing measured is lost: the baseline's start, every one of its slots
    assert cut["measured"]["starts"] == 1 and cut["measured"]["starts_planned"] == 2, cut
    assert cut["measured"]["samples"] == 10  # 5 slots of each of the two prompt types
    assert set(data["phases"]) == {"baseline"} and not data["failures"]  # ngram: cut, not failed
    stored = data["phases"]["baseline"]["measurements"]
    assert {name: len(m["samples"]) for name, m in stored.items()} == {"coding": 5, "math": 5}
    journal = (run / "samples.jsonl").read_text().splitlines()
    assert sum('"warmup": false' in line for line in journal) == 10
    # the restore ran: the candidate stopped, the original started again and serving
    assert data["ending"]["how"] == "interrupted" and data["ending"]["signals"] == ["SIGINT"]
    assert data["ending"]["restore_observed"] is True
    assert "restored to active and serving" in err, err
    events = json.loads((pytester.path / "events.json").read_text())
    assert [e for e in events if e.startswith(("start", "stop"))] == [
        "stop original", "start ngram", "stop ngram", "start original",
    ]  # fmt: skip
    summary = (run / "summary.md").read_text()
    assert summary.startswith("> **⚠ Cut short by SIGINT") and "while starting ngram." in summary
