"""The side-by-side calibration table (benchmarks/calibration.py → `sides_table`) gives power
per prompt type and per run, each under its own name, and the widest interval it saw:
docs/statistics.md quotes it. A few seeded runs through the whole chain."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.calibration import SIDE_HOSTS, SIDE_ROUTES, sides_table


def test_the_side_by_side_table_gives_power_per_prompt_type_and_per_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that calls any prompt type counts once per run but only for that prompt type per
    prompt type, so per run is never below per prompt type; both are printed, named."""
    hosts = {"start effects 0.1%": SIDE_HOSTS["start effects 0.1%"]}
    routes = {
        k: SIDE_ROUTES[k] for k in ("A/A of 3 pairs, then 1 pair", "A/A of 3 pairs, then 3 pairs")
    }
    rows = sides_table(runs=5, seed=23, tmp=tmp_path, hosts=hosts, routes=routes)
    printed = capsys.readouterr().out
    assert [(r.host, r.route) for r in rows] == [(h, k) for h in hosts for k in routes]
    assert "power per prompt type, true -10%" in printed, printed
    assert "power per run, true -10%" in printed, printed
    for row in rows:
        assert 0.0 <= row.power_per_type <= row.power_per_run <= 1.0, row
        assert row.widest >= max(row.aa.widest, row.power.widest) > 0.0, row
        assert f"{row.power_per_type:.1%} | {row.power_per_run:.1%}" in printed, printed
    # the -10% is called somewhere (a table of zeros would hold the inequality trivially)
    assert max(r.power_per_type for r in rows) > 0.0, rows
