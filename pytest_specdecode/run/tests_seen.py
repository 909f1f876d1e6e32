"""What pytest saw of a run's tests, as its terminal counted them: which ran to their end, the
first error in a test's setup (the run's own fixtures), which failed or were undecided; and,
from these, whether the run was cut short (`cut_of`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from ..record.ending import RanTests, RunCut, run_cut
from ..record.schema import RunRecord
from .outcome import CATEGORY as UNDECIDED


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


def failed_tests(config: pytest.Config) -> list[str]:
    """The tests that failed, were undecided or errored, by name, for the reports."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    return [
        r.nodeid.split("::")[-1]
        + ("" if r.when == "call" else f" ({r.when})")
        + (f" ({UNDECIDED})" if key == UNDECIDED else "")
        for key in ("failed", UNDECIDED, "error")
        for r in reporter.stats.get(key, [])
        if getattr(r, "nodeid", None)
    ]


def cut_of(
    config: pytest.Config,
    record: RunRecord,
    *,
    stopped: tuple[str, str, float] | None,
    first_signal_at: float | None,
    started: float,
    step_at: Callable[[float], str | None],
    starts_planned: int,
    design_complete: bool,
    exit_code: int | None,
) -> RunCut | None:
    """Whether the run was cut short, and how to say so (record/ending.py → run_cut).

    `stopped`: what pytest saw end it (kind, by, wall time); `first_signal_at`: the first
    signal's time on the monotonic clock; `started`: the run's start on that clock.
    """
    stopped = stopped or (None if design_complete else setup_error(config))
    if record.ending is not None and record.ending.signals and first_signal_at is not None:
        wall = time.time() - (time.monotonic() - first_signal_at)
    elif stopped is not None:
        wall = stopped[2]
    else:
        wall = time.time()
    return run_cut(
        ending=record.ending,
        stopped=stopped[:2] if stopped else None,
        at_s=wall - (time.time() - (time.monotonic() - started)),
        at=datetime.fromtimestamp(wall, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        step=step_at(wall),
        measured=record.measured(starts_planned),
        tests=tests_run(config),
        design_complete=design_complete,
        exit_code=exit_code,
    )
