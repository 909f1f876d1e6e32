"""pytest-html hooks: title, environment, the summary section with plots, per-test extras.

Registered by plugin.pytest_configure only when pytest-html is present and an experiment runs.
What the report says comes from html.py; these hooks hand it to pytest-html at the right time.
"""

from __future__ import annotations

import html as _html
import sys
from typing import Any

import pytest
from pytest_html import extras

from .config.arms import cell_key
from .report import html
from .report.text import title
from .run import outcome
from .run.session import PLUGIN_NAME, SpecDecodeSession

REPORT_FILE = "report.html"


def register(config: pytest.Config, session: SpecDecodeSession) -> None:
    """Register these hooks. Without --html, the report goes into the run folder, one file."""
    config.pluginmanager.register(sys.modules[__name__], "specdecode-html")
    if not config.getoption("htmlpath"):
        config.option.htmlpath = str(session.run_dir / REPORT_FILE)
        config.option.self_contained_html = True


def disable(config: pytest.Config) -> None:
    """No HTML report after all (a refused run): pytest-html's report object goes."""
    from pytest_html.basereport import BaseReport

    for plugin in list(config.pluginmanager.get_plugins()):
        if isinstance(plugin, BaseReport):
            config.pluginmanager.unregister(plugin)


def _session(config: pytest.Config) -> SpecDecodeSession | None:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


def pytest_html_report_title(report: Any) -> None:
    found = _session(report.config)
    if found is None:
        return
    settings = found.settings
    host = (settings.target.host or "localhost").removeprefix("ssh://")
    report.title = title([c.name for c in settings.candidates], settings.target.model, host)


def pytest_html_results_summary(
    prefix: list[str], summary: list[str], postfix: list[str], session: pytest.Session
) -> None:
    found = _session(session.config)
    if found is None:
        return
    written = found.finish(int(session.exitstatus))  # idempotent: may be written already
    analysis = found.analysis()
    section = getattr(found, "html_section", None)  # a crossover across replicas: its own
    if section is not None and (text := section()):
        prefix.append(text)
        return
    if found.experiment is None or analysis is None:
        return
    record = found.experiment.record
    prefix.append(html.summary(record, analysis, written.plots if written else None))
    _environment(session.config, html.environment(record))


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
            {_html.escape(str(k)): _html.escape(str(v)) for k, v in value.items()}
            if isinstance(value, dict)
            else _html.escape(str(value))
        )
        for key, value in table.items()
    }
    rest = {k: v for k, v in metadata.items() if k not in ours}
    metadata.clear()  # in place: pytest-html holds this very dict
    metadata.update(ours)
    metadata.update(rest)


def pytest_html_results_table_row(report: pytest.TestReport, cells: list[str]) -> None:
    outcome.html_result_cells(report, cells)  # an undecided verdict: Undecided, not Failed


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    report = yield
    if report.when == "call":  # pytest-html takes extras from the call phase only
        content = _extra(item)
        if content:
            report.extras = [*getattr(report, "extras", []), extras.html(content)]
    return report


def _extra(item: pytest.Item) -> str | None:
    found = _session(item.config)
    callspec = getattr(item, "callspec", None)
    if found is None or found.experiment is None or callspec is None:
        return None
    params = callspec.params
    phase = params.get("specdecode_phase", params.get("specdecode_candidate"))
    record = found.experiment.record
    if phase not in record.phases:  # never measure here: only what was measured
        return None
    try:
        analysis = found.analysis()  # None before the design is complete: the phase's own table
        name = params.get("specdecode_prompt_type")
        levels = record.run.levels
        level = params.get("specdecode_level") or levels[0]
        key = cell_key(name, level, several=len(levels) > 1) if name else None
        return html.extra(record, analysis, phase, key)
    except Exception as exc:  # a report must not turn a test result into an internal error
        return (
            f"<p>pytest-specdecode could not render this test's data: {_html.escape(repr(exc))}</p>"
        )
