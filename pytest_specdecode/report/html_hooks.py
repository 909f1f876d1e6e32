"""pytest-html hooks: title, environment, summary section with plots, per-test extras.

Registered by `plugin.pytest_configure` only when pytest-html is present. What the report says
comes from `report.py`; these hooks only hand it to pytest-html at the right moment.
"""

from __future__ import annotations

import html
import sys
from typing import Any

import pytest
from pytest_html import extras

from ..measure.experiment import BASELINE
from ..session import EXPERIMENT_KEY, RUN_DIR_KEY, SETTINGS_KEY, finish_reports
from . import summary as reports

REPORT_FILE = "report.html"


def register(config: pytest.Config) -> None:
    """Register these hooks. Without --html, the report goes into the run folder, one file."""
    config.pluginmanager.register(sys.modules[__name__], "specdecode-html")
    if RUN_DIR_KEY in config.stash and not config.getoption("htmlpath"):
        config.option.htmlpath = str(config.stash[RUN_DIR_KEY] / REPORT_FILE)
        config.option.self_contained_html = True


def pytest_html_report_title(report: Any) -> None:
    settings = report.config.stash.get(SETTINGS_KEY, None)
    if settings is None:
        return
    host = (settings.target.host or "localhost").removeprefix("ssh://")
    report.title = reports.title([c.name for c in settings.candidates], settings.target.model, host)


def pytest_html_results_summary(
    prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
) -> None:
    written = finish_reports(session.config)  # idempotent: the files may be written already
    experiment = session.config.stash.get(EXPERIMENT_KEY, None)
    if experiment is None:
        return
    doc = experiment.results.data
    prefix.append(reports.summary_html(doc, written.plots if written else None))
    _environment(session.config, reports.environment_table(doc))


def _environment(config: pytest.Config, table: dict[str, Any]) -> None:
    """First in pytest-metadata's table, which pytest-html renders (as HTML: escape it)."""
    try:
        from pytest_metadata.plugin import metadata_key
    except ImportError:  # pragma: no cover - pytest-html depends on pytest-metadata
        return
    metadata = config.stash.get(metadata_key, None)
    if metadata is None:
        return
    ours = {
        key: (
            {html.escape(str(k)): html.escape(str(v)) for k, v in value.items()}
            if isinstance(value, dict)
            else html.escape(str(value))
        )
        for key, value in table.items()
    }
    rest = {k: v for k, v in metadata.items() if k not in ours}
    metadata.clear()  # in place: pytest-html holds this very dict
    metadata.update(ours)
    metadata.update(rest)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call":  # pytest-html takes extras from the call phase only
        content = _extra(item)
        if content:
            report.extras = [*getattr(report, "extras", []), extras.html(content)]
    return report


def _extra(item: pytest.Item) -> str | None:
    experiment = item.config.stash.get(EXPERIMENT_KEY, None)
    callspec = getattr(item, "callspec", None)
    if experiment is None or callspec is None:
        return None
    params = callspec.params
    phase = params.get("specdecode_phase", params.get("specdecode_candidate"))
    if phase not in experiment.phases:  # never measure here: only what was measured
        return None
    try:
        if experiment.phases[phase].spec is not None and BASELINE in experiment.phases:
            experiment.verdicts(phase)
        return reports.extra_html(experiment.results.data, phase, params.get("specdecode_workload"))
    except Exception as exc:  # a report must not turn a test result into an internal error
        return (
            f"<p>pytest-specdecode could not render this test's data: {html.escape(repr(exc))}</p>"
        )
