"""An undecided verdict is pytest's own outcome: its word in the terminal, JUnit XML and
pytest-html, while the session still fails (the gate).

A tiny test raises `Undecided`, as the standard verdict test does when nothing was decided;
the whole standard run that ends undecided is `test_gate.py`'s `test_no_verdict_is_not_green`.
"""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from ...support.inprocess import run_in_process

REPO = Path(__file__).resolve().parents[3]

TESTS = """
import pytest
from pytest_specdecode.run.outcome import Undecided

def test_decided():
    pass

def test_undecided():
    raise Undecided("no verdict for ngram (inconclusive, throughput +7.2% [-2.5%, +17.7%])")

def test_regressed():
    pytest.fail("speculation ngram regressed on coding", pytrace=False)
"""

CONFTEST = """
def pytest_configure(config):
    from pytest_specdecode import html_hooks  # as plugin.py registers it for a run

    config.pluginmanager.register(html_hooks, "specdecode-html")
"""


@pytest.fixture(autouse=True)
def _this_checkout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the subprocess imports this checkout's plugin


@pytest.fixture
def outcome_run(pytester: pytest.Pytester) -> pytest.RunResult:
    pytester.makepyfile(test_verdicts=TESTS)
    pytester.makeconftest(CONFTEST)
    return run_in_process(
        pytester, "-v", "-p", "no:cacheprovider", "--junitxml=junit.xml", "--html=report.html"
    )


def test_the_terminal_counts_it_undecided_and_the_session_fails(
    outcome_run: pytest.RunResult,
) -> None:
    out = outcome_run.stdout.str()
    assert outcome_run.ret == pytest.ExitCode.TESTS_FAILED, out
    summary = out.strip().splitlines()[-1]
    assert re.search(r"\b1 failed, 1 passed, 1 undecided in ", summary), summary
    assert re.search(r"test_verdicts.py::test_undecided UNDECIDED", out), out
    assert re.search(r"test_verdicts.py::test_regressed FAILED", out), out
    # Listed with its message, as pytest lists a failed test; the failure stays a failure.
    assert re.search(
        r"^UNDECIDED test_verdicts.py::test_undecided - no verdict for ngram \(inconclusive",
        out,
        re.M,
    ), out
    assert re.search(r"^FAILED test_verdicts.py::test_regressed", out, re.M), out
    assert not re.search(r"^FAILED test_verdicts.py::test_undecided", out, re.M), out


def test_the_letter_is_u(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_verdicts=TESTS)
    result = run_in_process(pytester, "-p", "no:cacheprovider")
    assert re.search(r"^test_verdicts.py \.UF", result.stdout.str(), re.M), result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_junit_xml_says_undecided(pytester: pytest.Pytester, outcome_run: pytest.RunResult) -> None:
    root = ET.parse(pytester.path / "junit.xml").getroot()
    cases = {case.get("name"): case for case in root.iter("testcase")}
    undecided = cases["test_undecided"].find("failure")
    assert undecided is not None  # still a failure: CI counts it as one
    assert undecided.get("message", "").startswith("undecided: no verdict for ngram"), undecided
    props = {p.get("name"): p.get("value") for p in cases["test_undecided"].iter("property")}
    assert props == {"specdecode_outcome": "undecided"}
    regressed = cases["test_regressed"].find("failure")
    assert regressed is not None and not regressed.get("message", "").startswith("undecided")
    assert cases["test_decided"].find("failure") is None
    suite = root.find("testsuite")
    assert suite is not None and suite.get("failures") == "2"


def html_tests(page: str) -> dict[str, dict]:
    """pytest-html's data of each test, by its name, as the page's script reads it."""
    blob = re.search(r'data-jsonblob="([^"]*)"', page)
    assert blob is not None
    data = json.loads(html.unescape(blob.group(1)))  # as the browser reads the attribute
    return {nodeid.split("::")[-1]: runs[0] for nodeid, runs in data["tests"].items()}


def test_pytest_html_shows_undecided_and_files_it_under_failed(
    pytester: pytest.Pytester, outcome_run: pytest.RunResult
) -> None:
    page = (pytester.path / "report.html").read_text()
    tests = html_tests(page)
    row = "".join(tests["test_undecided"]["resultsTableRow"])
    # The visible result cell says Undecided; the row is filed, counted and coloured as failed
    # (pytest-html's filters know only their own results), so it is shown by default.
    assert '<td class="col-result">Undecided</td>' in row, row
    assert tests["test_undecided"]["result"] == "Failed"
    regressed = "".join(tests["test_regressed"]["resultsTableRow"])
    assert '<td class="col-result">Failed</td>' in regressed, regressed
    assert "undecided: no verdict for ngram" in tests["test_undecided"]["log"]
    assert re.search(r"2 Failed", page), page[:2000]
