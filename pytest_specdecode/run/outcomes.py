"""What pytest saw of a run's tests, for a cut run's report: which ran to their end, and the
first error in a test's setup (the run's own fixtures), as pytest's terminal counted them."""

from __future__ import annotations

import pytest

from ..record.ending import RanTests


def _reports(config: pytest.Config) -> list[pytest.TestReport]:
    """The test reports pytest's terminal has counted, in order."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    found = [
        r
        for reports in reporter.stats.values()
        for r in reports
        if isinstance(r, pytest.TestReport)
    ]
    return sorted(found, key=lambda r: r.start)


def tests_run(config: pytest.Config) -> RanTests:
    """Which collected tests ran to their end (their body called, or skipped or failed in
    setup), and how each ended: a test cut in its setup or its body did not."""
    session = config.pluginmanager.get_plugin("session")
    outcomes: dict[str, str] = {}
    for r in _reports(config):
        if r.when == "call" or (r.when == "setup" and not r.passed):
            outcomes[r.nodeid] = "error" if r.when == "setup" and r.failed else r.outcome
        elif r.when == "teardown" and r.failed and r.nodeid in outcomes:
            outcomes[r.nodeid] = "error"
    counts: dict[str, int] = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return RanTests(
        collected=getattr(session, "testscollected", len(outcomes)),
        outcomes=counts,
        ran=[nodeid.split("::")[-1] for nodeid in outcomes],
    )


def setup_error(config: pytest.Config) -> tuple[str, str, float] | None:
    """The first error in a test's setup (the run's fixtures), as a run's cause: its last line."""
    for r in _reports(config):
        if r.when == "setup" and r.failed:
            text = str(r.longrepr).strip().splitlines() or ["an error in a test's setup"]
            return ("error", text[-1][:300], r.start)
    return None
