"""An undecided verdict says what would decide it in starts per arm, and in minutes at the run's
own pace (issue 29: "where it cannot decide, it states the cheapest design that would, in
minutes")."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.report.rows import pair_minutes, undecided

from ...support.synthetic import add_phase, record, settings


def timed(rec, name: str, *, startup_s: float, first: float, gap: float) -> None:
    """Space the phase's requests `gap` seconds apart from `first`, each 1 s long."""
    phase = rec.phases[name]
    phase.startup_s = startup_s
    for m in phase.measurements.values():
        m.samples[:] = [
            dataclasses.replace(s, started_at=first + i * gap, e2e_s=1.0)
            for i, s in enumerate(m.samples)
        ]


def test_an_undecided_line_gives_the_starts_it_needs_in_minutes_at_this_runs_pace(
    tmp_path: Path,
) -> None:
    rec = record(settings(tmp_path, prompt_types=("coding",)))
    add_phase(rec, BASELINE, {"coding": 20.0}, spread=0.2)
    add_phase(rec, "ngram", {"coding": 23.0}, seed=1, spread=0.2)
    timed(rec, BASELINE, startup_s=30.0, first=1000.0, gap=10.0)
    timed(rec, "ngram", startup_s=30.0, first=2000.0, gap=10.0)
    n = len(rec.phases[BASELINE].measurements["coding"].samples)
    per_phase = 30.0 + (n - 1) * 10.0 + 1.0
    assert pair_minutes(rec, "ngram") == pytest.approx(2 * per_phase / 60)

    lines = undecided(analyze(rec), rec)
    assert lines and all("--spec-repeats" in line for line in lines), lines
    for line in lines:
        repeats = int(line.split("--spec-repeats ")[1].split(";")[0])
        minutes = repeats * 2 * per_phase / 60
        assert f"about {minutes:.0f} min at this run's pace" in line, line
    # Without the record (a caller that has none), the line is as before.
    assert all("min at this run's pace" not in line for line in undecided(analyze(rec)))


def test_side_by_side_the_two_windows_overlap(tmp_path: Path) -> None:
    rec = record(settings(tmp_path, prompt_types=("coding",)))
    add_phase(rec, BASELINE, {"coding": 20.0})
    add_phase(rec, "ngram", {"coding": 23.0}, seed=1)
    timed(rec, BASELINE, startup_s=30.0, first=1000.0, gap=10.0)
    timed(rec, "ngram", startup_s=30.0, first=1005.0, gap=10.0)
    rec.phases["ngram"].together_with = BASELINE
    n = len(rec.phases[BASELINE].measurements["coding"].samples)
    assert pair_minutes(rec, "ngram") == pytest.approx((60.0 + (n - 1) * 10.0 + 1.0) / 60)
