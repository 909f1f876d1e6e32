"""The run's own pace (issue 50): after its first start and first round it says its estimate
once; its slots, as it timed them, are kept for the next plan (measure/experiment/rounds.py →
`Rounds._paced`; its starts: targets/lifecycle.py → `Switchboard.startups`; the line:
report/plan_reach.py → `estimate_line`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.report.plan import Timing, timed_pace
from pytest_specdecode.report.plan_reach import estimate_line, plan_time
from pytest_specdecode.targets.lifecycle import experiment_services

from ...support.scripted_target import Script, ScriptedTarget, Speed
from ...support.synthetic import record, settings


def test_the_first_round_gives_the_runs_own_estimate_once_and_the_pace_is_kept(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path, samples=4)
    slow = Script({p: Speed(gap_s=0.02) for p in ("the coding prompt", "the math prompt")})
    target = ScriptedTarget(slow, {"ngram": slow})
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run", record(s))
    seen: list[tuple[list[float], float]] = []
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    ) as board:  # fmt: skip
        exp = Experiment(
            s, board, store, progress=lambda _: None, transports=target.transports(),
            first_round=lambda slot_s: seen.append((list(board.startups), slot_s)),
        )  # fmt: skip
        exp.arm(s.candidates[0].name)
    assert len(seen) == 1  # once, over the two starts and their many rounds
    startups, slot_s = seen[0]
    assert len(startups) == 1 and slot_s > 0  # the first start only: the baseline's
    assert len(board.startups) == 2
    pace = store.record.environment["pace"]
    assert pace["max_tokens"] == 64.0 and pace["slot_s"] > 0
    # two starts of 2 prompt types x 4 slots, one server each: the warm-up aside
    assert pace["slots"] == 2 * 2 * 4
    assert pace["slot_s"] == pytest.approx(pace["rounds_s"] / pace["slots"])
    # the next plan reads it as this run timed it (the session adds its starts' mean)
    pace["start_s"] = sum(board.startups) / 2
    start_s, s_per_token = timed_pace(store.record)  # type: ignore[misc]
    assert start_s == pace["start_s"] and s_per_token == pytest.approx(pace["slot_s"] / 64)


def test_the_next_plan_takes_the_starts_after_the_first_which_compiled() -> None:
    from pytest_specdecode.record.schema import RunRecord

    def stored(pace: dict) -> RunRecord:
        rec = RunRecord.__new__(RunRecord)
        rec.environment = {"pace": {"slot_s": 0.9, "max_tokens": 256.0, **pace}}
        return rec

    # the H100 on 2026-12-07: the main job's starts, then the map's in the next run
    assert timed_pace(stored({"start_s": 103.0, "starts_s": [117.0, 89.0]}))[0] == 89.0  # type: ignore[index]
    six = [74.0, 63.0, 55.0, 51.0, 51.0, 48.0]
    assert timed_pace(stored({"start_s": 57.0, "starts_s": six}))[0] == 51.0  # type: ignore[index]
    # one start kept, or none listed (a run stored before the list): the mean as stored
    assert timed_pace(stored({"start_s": 100.0, "starts_s": [100.0]}))[0] == 100.0  # type: ignore[index]
    assert timed_pace(stored({"start_s": 95.0}))[0] == 95.0  # type: ignore[index]


def test_the_runs_estimate_names_the_plans_beside_its_own(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=12)
    planned, _ = plan_time(
        s, {}, Timing(60.0, 0.05, "assumed"), baseline=True, aba=False, adopts_original=False
    )
    quicker, _ = plan_time(
        s, {}, Timing(30.0, 0.025, "measured"), baseline=True, aba=False, adopts_original=False
    )
    line = estimate_line(quicker, planned, [31.0], 1.6, done_s=100.0)
    assert line.startswith("estimate after the first start and round: about ")
    assert f"(the plan said {planned.seconds / 60:.0f} min)" in line
    assert "starts of 31 s, a slot 1.60 s a server" in line
    assert quicker.seconds < planned.seconds
