"""Stop when decided (analysis/verdict/sequential.py, analysis/variance/spending.py): the
group-sequential boundaries, the false calls of the stop rule on simulated pairs, and the
rule wired into the rounds of a pair served side by side (measure/experiment/rounds.py)."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.variance.spending import (
    boundaries,
    fractions_of,
    look_slots,
    look_times,
    nominal_level,
    spent,
)
from pytest_specdecode.analysis.verdict.interval import (
    Question,
    nested_interval,
    paired_interval,
)
from pytest_specdecode.analysis.verdict.sequential import Simulated, expected_slots, simulate_cell
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.measurement import Measurement, SequentialLooks
from pytest_specdecode.record.store import RunStore, load_run
from pytest_specdecode.report import markdown
from pytest_specdecode.report.plan_reach import plan_time, time_lines
from pytest_specdecode.report.schedule import Timing

from ....support.scripted_target import Script, ScriptedTarget, Speed
from ....support.synthetic import record, settings
from ...measure.test_beside_many import ManyBoard
from ...measure.test_interleaved_order import together_experiment

# -- the boundaries, pure ---------------------------------------------------------------------


def test_obrien_fleming_spending_gives_the_published_boundaries() -> None:
    # Lan-DeMets O'Brien-Fleming type, four equal looks, one-sided 0.025 (Jennison & Turnbull
    # 2000, table 7.6: 4.33, 2.96, 2.36, 2.01)
    found = boundaries((0.25, 0.5, 0.75, 1.0), 0.025, rho=None)
    assert [round(c, 2) for c in found] == [4.33, 2.96, 2.36, 2.01]
    assert spent(1.0, 0.025, None) == 0.025 and spent(0.25, 0.025, None) < 1e-4
    # the power family the stop rule spends by (rho 3): alpha t^3
    assert spent(0.5, 0.025) == pytest.approx(0.025 / 8) and spent(1.0, 0.025) == 0.025
    # one look is the fixed design
    assert math.isclose(boundaries((1.0,), 0.025)[0], 1.95996, abs_tol=1e-4)


def test_the_boundaries_spend_alpha_on_correlated_looks() -> None:
    # Monte Carlo of the canonical process: crossing any look's boundary has chance alpha, and
    # the first look spends what the slots' schedule gives it, however correlated the looks
    rng = np.random.default_rng(0)
    times = look_times((12, 24, 36, 48), 48)
    for fractions in ((0.25, 0.5, 0.75, 1.0), (0.9, 0.95, 0.98, 1.0)):
        t = np.array(fractions)
        steps = rng.normal(size=(200_000, t.size)) * np.sqrt(np.diff(t, prepend=0.0))
        z = np.cumsum(steps, axis=1) / np.sqrt(t)
        for at in (None, times):
            crossed = z > np.array(boundaries(fractions, 0.05, at))
            assert float(np.mean(crossed.any(axis=1))) == pytest.approx(0.05, abs=0.003)
        first = float(np.mean(crossed[:, 0]))
        assert first == pytest.approx(spent(0.25, 0.05), rel=0.25), fractions


def test_spending_on_the_slots_schedule_keeps_the_last_look_near_the_fixed_level() -> None:
    times = look_times((12, 24, 36, 48), 48)
    # information fractions near 1 (the pair's offset dominates): the looks are correlated,
    # and the last look keeps nearly all of alpha
    near = fractions_of([1.05, 1.02, 1.01, 1.0], 1.0)
    assert near[-1] == 1.0 and near[0] >= 0.95
    assert nominal_level(near, 0.01, times) > 0.95 * 0.01
    # spent on the fractions themselves, nearly all of it would go at the first look
    assert nominal_level(near, 0.01) < 0.8 * 0.01
    # equal looks of independent slots: the last look keeps most of alpha, the first little
    equal = (0.25, 0.5, 0.75, 1.0)
    assert nominal_level(equal, 0.01, times) > 0.75 * 0.01
    assert nominal_level(equal[:1], 0.01, times[:1]) < 0.01 / 50
    assert look_slots(48) == (12, 24, 36, 48) and look_slots(3) == (2, 3)


def test_an_early_look_widens_the_interval_and_keeps_the_narrower_analysis() -> None:
    rng = np.random.default_rng(3)
    d = (-0.4 + rng.normal(0, 0.1, 24)).tolist()
    prompts = [i % 6 for i in range(24)]
    base = np.exp(rng.normal(0, 0.2, 24))
    q = Question(
        "coding", "throughput", True, [base.tolist()], [(base * np.exp(d)).tolist()],
        [prompts], [prompts], pairs=[d], pair_prompts=[prompts],
    )  # fmt: skip
    noise = Simulated().noise
    fixed = nested_interval(q, noise=noise, confidence=0.99)
    watched = replace(q, looks=(12, 24), planned_slots=48)
    early = nested_interval(watched, noise=noise, confidence=0.99)
    final = nested_interval(replace(q, looks=(24,), planned_slots=24), noise=noise,
                            confidence=0.99)  # fmt: skip
    assert early.confidence > fixed.confidence
    assert early.high - early.low > fixed.high - fixed.low
    assert final == fixed  # one look at every planned slot is the fixed design
    # at the boundary too, the narrower of the pairs and the starts (as the fixed design)
    pairs = paired_interval(watched, noise=noise, confidence=early.confidence)
    assert pairs is not None and pairs.confidence == early.confidence
    assert early.high - early.low <= pairs.high - pairs.low
    assert early.by == "starts"  # here the starts, which the boundary once left out


# -- the false calls, on simulated pairs ------------------------------------------------------

# per comparison and direction, alpha / family = 0.1: large enough to count in a few hundred
ALPHA, FAMILY, CELLS = 0.2, 2, 240
# many slots' noise, little pair offset: the looks' statistics nearly independent, where
# looking often without a boundary errs most
LOOSE = Simulated(offset_sd=0.005, slot_sd=0.1, speedup_sd=0.05)
H200 = Simulated(offset_sd=0.036, slot_sd=0.08, speedup_sd=0.3)


def false_calls(model: Simulated, **how: bool) -> tuple[Counter[Verdict], float]:
    rng = np.random.default_rng(2026)
    found = [
        simulate_cell(rng, model, alpha=ALPHA, min_effect=0.0, family=FAMILY, **how)
        for _ in range(CELLS)
    ]
    return Counter(v for v, _ in found), float(np.mean([n for _, n in found]))


def test_the_stop_rule_keeps_its_false_calls_within_alpha_where_looking_naively_does_not() -> None:
    # no change: each direction's claim errs at most alpha / family (compare_family's promise)
    allowed = ALPHA / FAMILY * CELLS
    slack = 2.0 * math.sqrt(allowed * (1 - ALPHA / FAMILY))
    # the offset small (the pairs' analysis kept), and the H200's (the starts' often kept)
    for model in (LOOSE, H200):
        calls, slots = false_calls(model, sequential=True)
        assert calls[Verdict.REGRESSED] <= allowed + slack, model
        assert calls[Verdict.IMPROVED] <= allowed + slack, model
        assert model is H200 or slots < model.planned  # it looked, and stopped some early
    naive, _ = false_calls(LOOSE, naive=True)  # the fixed quantile at every look
    assert naive[Verdict.REGRESSED] + naive[Verdict.IMPROVED] > 2 * (allowed + slack)


def test_the_stop_rule_calls_a_modest_change_about_as_often_as_the_fixed_design() -> None:
    """The main job's design on the H200's noise (one pair, its offset known on 3 df, the
    prompts' own speed-ups 30% apart), a true -20%, on the same cells: the stop rule calls it
    regressed within 3 points of the fixed design's power per prompt type. Analysing a watched
    cell by pairs alone, at boundaries spent on the information fractions, it called 13 of these
    cells where the fixed design called 56 (docs/statistics.md, "Stop when decided")."""
    model, cells = replace(H200, change=math.log(0.8)), 160
    found = {}
    for rule, sequential in (("fixed", False), ("stop", True)):
        rng = np.random.default_rng(7)
        found[rule] = [
            simulate_cell(rng, model, alpha=0.05, min_effect=0.03, family=8,
                          sequential=sequential)
            for _ in range(cells)
        ]  # fmt: skip
    fixed, stop = (sum(v is Verdict.REGRESSED for v, _ in found[r]) for r in ("fixed", "stop"))
    assert fixed >= 0.2 * cells  # within the design's reach at all
    assert stop >= fixed - 0.03 * cells, (stop, fixed)
    assert np.mean([n for _, n in found["stop"]]) < model.planned  # and some stopped early


def test_a_large_change_stops_early_and_no_change_runs_to_the_end() -> None:
    # the H200's main job: one pair, 48 slots, 4 prompt types and 2 metrics at alpha 0.05
    how = {"alpha": 0.05, "min_effect": 0.03, "family": 8, "draws": 30}
    assert expected_slots(replace(H200, change=math.log(0.55)), **how) <= 24
    assert expected_slots(H200, **how) == 48


# -- wired: a pair served side by side --------------------------------------------------------


def slow_candidate(tmp_path: Path, run_extra: str = ""):
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, samples=16, run_extra='arms = "together"\n' + run_extra)
    slow = Script({p: Speed(gap_s=0.02) for p in ("the coding prompt", "the math prompt")})
    target = ScriptedTarget(Script(), {"ngram": slow})
    board, exp, store = together_experiment(tmp_path, target, s)
    exp.arm("ngram")
    board.restore()
    return store


def test_a_decided_pair_stops_sending_and_records_its_looks(tmp_path: Path) -> None:
    store = slow_candidate(tmp_path)
    rec = store.record
    for name in ("coding", "math"):
        base, cand = rec.phases[BASELINE].measurements[name], rec.phases["ngram"].measurements[name]
        # half as fast: decided at the second look (4 slots each are too few for the ranks)
        assert len(base.samples) == len(cand.samples) == 8
        assert cand.sequential == SequentialLooks(16, [4, 8], stopped=True)
        assert base.sequential is None
    assert load_run(tmp_path / "run") == rec  # the looks round-trip through results.json
    verdicts = analyze(rec).verdicts["ngram"]
    for verdict in verdicts.values():
        assert verdict.verdict is Verdict.REGRESSED
        # the analysis takes the stopping look's boundary: a wider level than the fixed 1-2a/m
        assert verdict.throughput.interval.confidence > 1 - 2 * 0.05 / 4
        assert "looked at 4, 8 of 16 slots" in verdict.throughput.reason
        # stopped before its last look: the reason says how far an early stop overstates
        said = re.search(r"stopped early, at look 2 of 4: a cell stopping here prints "
                         r"([-+][\d.]+)% on average were the change the "
                         r"printed ([-+][\d.]+)%, and ([-+][\d.]+)% were it ([-+][\d.]+)%",
                         verdict.throughput.reason)  # fmt: skip
        assert said, verdict.throughput.reason
        at, printed, at_near, near = (float(x) for x in said.groups())
        assert printed == pytest.approx(100 * verdict.throughput.change, abs=0.05)
        assert near == pytest.approx(100 * (verdict.throughput.ratio_ci[1] - 1), abs=0.05)
        assert at < 0 and printed < near < 0
        # the smallest change the interval allows stops here only far beyond itself
        assert at_near < near - 5


def paced(tmp_path: Path, coding_gap: float, math_gap: float):
    """A pair side by side, each prompt type's candidate at its own pace (the baseline's gap is
    0.01 s), its report's analysis in results.json as the session writes it."""
    (tmp_path / "run").mkdir(parents=True)
    s = settings(tmp_path, samples=16, run_extra='arms = "together"\n')
    gaps = {"the coding prompt": coding_gap, "the math prompt": math_gap}
    speeds = {prompt: Speed(gap_s=gap) for prompt, gap in gaps.items()}
    target = ScriptedTarget(Script(), {"ngram": Script(speeds)})
    board, exp, store = together_experiment(tmp_path, target, s)
    exp.arm("ngram")
    board.restore()
    analysis = analyze(store.record)
    store.analysis = analysis.to_json()
    store.flush()
    return store, analysis


def bounds(interval) -> tuple[float, ...]:
    return (interval.estimate, interval.low, interval.high, interval.df, interval.confidence)


# math's candidate 23% slower: undecided at each of its looks over the run's family (2 prompt
# types x 2 metrics); decided at the third look were the family only the cells still measuring
SLOW, NEAR = 0.02, 0.0123


def test_cells_that_decide_at_different_looks_keep_their_own_looks(tmp_path: Path) -> None:
    store, analysis = paced(tmp_path / "both", SLOW, NEAR)
    rec = store.record
    base, cand = rec.phases[BASELINE].measurements, rec.phases["ngram"].measurements
    # coding stops at its second look and sends no more slots; math goes on to its last
    assert len(base["coding"].samples) == len(cand["coding"].samples) == 8
    assert len(base["math"].samples) == len(cand["math"].samples) == 16
    assert cand["coding"].sequential == SequentialLooks(16, [4, 8], stopped=True)
    assert cand["math"].sequential == SequentialLooks(16, [4, 8, 12, 16], stopped=False)
    verdicts = analysis.verdicts["ngram"]
    assert verdicts["coding"].verdict is Verdict.REGRESSED
    assert verdicts["math"].verdict is Verdict.INCONCLUSIVE
    for name, looks in (("coding", "4, 8"), ("math", "4, 8, 12, 16")):
        for c in verdicts[name].comparisons:
            assert f"looked at {looks} of 16 slots" in c.reason, (name, c.reason)
    # each cell's interval and verdict are what they would be beside a cell that stopped with
    # it, or beside none that stopped (only the ranks' Holm step, over the family, may differ)
    alone = {
        "coding": paced(tmp_path / "coding", SLOW, SLOW)[1].verdicts["ngram"]["coding"],
        "math": paced(tmp_path / "math", 0.01, NEAR)[1].verdicts["ngram"]["math"],
    }
    for name, other in alone.items():
        for c, o in zip(verdicts[name].comparisons, other.comparisons, strict=True):
            assert c.verdict is o.verdict, name
            assert bounds(c.interval) == pytest.approx(bounds(o.interval), rel=1e-9), name
    assert (
        verdicts["coding"].throughput.interval.confidence
        != verdicts["math"].throughput.interval.confidence
    )  # each at its own look's boundary
    # results.json and summary.md say each cell's own looks
    data = json.loads(store.path.read_text())
    stored = data["phases"]["ngram"]["measurements"]
    assert stored["coding"]["sequential"] == {"planned": 16, "looks": [4, 8], "stopped": True}
    assert stored["math"]["sequential"]["looks"] == [4, 8, 12, 16]
    assert not stored["math"]["sequential"]["stopped"]
    found = data["analysis"]["verdicts"]["ngram"]
    assert "looked at 4, 8 of 16 slots" in found["coding"]["throughput"]["reason"]
    assert "looked at 4, 8, 12, 16 of 16 slots" in found["math"]["throughput"]["reason"]
    for name in ("coding", "math"):
        assert found[name]["throughput"]["confidence"] == pytest.approx(
            verdicts[name].throughput.interval.confidence
        )
    summary = markdown.summary(rec, analysis)
    (undecided,) = [x for x in summary.splitlines() if x.startswith("- Not decided:")]
    assert "ngram on math" in undecided and "looked at 4, 8, 12, 16 of 16 slots" in undecided
    assert "coding" not in undecided


def test_summary_md_says_where_each_cell_stopped_and_why(tmp_path: Path) -> None:
    """Issue 50: the terminal, run.log, results.json and report.html said where each cell
    stopped; summary.md did not. Decided at a look, or every slot sent."""
    from pytest_specdecode.report.markdown import summary

    (tmp_path / "slow").mkdir()
    rec = slow_candidate(tmp_path / "slow").record
    text = summary(rec, analyze(rec))
    assert (
        "Where each prompt type stopped: coding decided at look 2 of 4 (8 of 16 slots); math "
        "decided at look 2 of 4 (8 of 16 slots)." in text
    )
    (tmp_path / "alike" / "run").mkdir(parents=True)
    s = settings(tmp_path / "alike", samples=16, run_extra='arms = "together"')
    target = ScriptedTarget(Script(), {"ngram": Script()})  # as fast as the baseline
    board, exp, store = together_experiment(tmp_path / "alike", target, s)
    exp.arm("ngram")
    board.restore()
    text = summary(store.record, analyze(store.record))
    assert "coding all slots run (16): not decided at an earlier look" in text
    off = slow_candidate(tmp_path, "sequential = false").record  # no rule: nothing to say
    assert "Where each prompt type stopped" not in summary(off, analyze(off))


def test_without_the_rule_every_slot_is_sent(tmp_path: Path) -> None:
    rec = slow_candidate(tmp_path, "sequential = false").record
    m = rec.phases["ngram"].measurements["coding"]
    assert len(m.samples) == 16 and m.sequential is None


def test_the_looks_read_back_from_json() -> None:
    m = Measurement("coding", sequential=SequentialLooks(48, [12, 24], stopped=True))
    back = Measurement.from_json(m.to_json())
    assert back.sequential == m.sequential
    assert back.sequential is not None and back.sequential.schedule(24) == [12, 24]
    assert SequentialLooks(48, [12, 24, 36]).schedule(40) == [12, 24, 36, 40]
    assert Measurement.from_json(Measurement("math").to_json()).sequential is None


# -- the plan ---------------------------------------------------------------------------------


def plan_lines(tmp_path: Path, run_extra: str) -> list[str]:
    s = settings(tmp_path, prompt_types=("coding", "math", "structured", "explanatory"),
                 samples=48, run_extra=run_extra)  # fmt: skip
    prior = RestartNoise(0.036, 3.0, "a prior", measured=False, residual=0.08**2)
    time, stop = plan_time(
        s, {"throughput": prior, "tpot": prior}, Timing(60.0, 0.01, "stored runs"),
        baseline=True, aba=False, adopts_original=False,
    )  # fmt: skip
    return time_lines(time, Timing(60.0, 0.01, "stored runs"), stop)


def test_the_plan_gives_the_expected_and_the_largest_slots(tmp_path: Path) -> None:
    lines = [x for x in plan_lines(tmp_path, 'arms = "together"') if x.startswith("stops")]
    assert len(lines) == 1
    found = re.search(
        r"looks at 12, 24, 36, 48 slots\): about (\d+) slots where its change is about what "
        r"the design can call \((-\d+)%\), (\d+) where there is none; at most 48",
        lines[0],
    )
    assert found, lines[0]
    at, none = int(found[1]), int(found[3])
    assert at < none <= 48  # a change the design can call stops early; none does not
    timed = next(x for x in plan_lines(tmp_path, 'arms = "together"') if "duration" in x)
    # the time: the stop's expected slots, within every cell at its first look to every slot
    times = re.search(r"about (.+?) in all \((.+?) to (.+?)\)", timed)
    assert times and times[1] != times[3], timed  # every slot sent takes longer
    assert not any(x.startswith("stops") for x in plan_lines(tmp_path, ""))  # one at a time
    off = plan_lines(tmp_path, 'arms = "together"\nsequential = false')
    assert not any(x.startswith("stops") for x in off)
    pairs = plan_lines(tmp_path, 'arms = "together"\nrepeats = 2')  # several pairs: not watched
    assert not any(x.startswith("stops") for x in pairs)


def beside_two(tmp_path: Path, eagle_gap: float):
    """ngram half as fast as the baseline, and eagle at `eagle_gap`, both beside one start."""
    (tmp_path / "run").mkdir(parents=True)
    s = settings(tmp_path, candidates=("ngram", "eagle"), samples=16,
                 run_extra='arms = "together"\nbeside = 2')  # fmt: skip
    prompts = ("the coding prompt", "the math prompt")
    scripts = {"ngram": Script({p: Speed(gap_s=0.02) for p in prompts}),
               "eagle": Script({p: Speed(gap_s=eagle_gap) for p in prompts})}  # fmt: skip
    target = ScriptedTarget(Script(), scripts)
    store = RunStore(tmp_path / "run", record(s))
    board = ManyBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    for name in ("ngram", "eagle"):
        exp.arm(name)
    board.restore()
    return store.record


def test_beside_several_a_cell_stops_once_every_candidate_is_decided(tmp_path: Path) -> None:
    rec = beside_two(tmp_path / "a", 0.02)  # both decided at the second look
    for name in (BASELINE, "ngram", "eagle"):
        assert len(rec.phases[name].measurements["coding"].samples) == 8
    assert rec.phases["eagle"].measurements["coding"].sequential == SequentialLooks(
        16, [4, 8], True
    )
    # eagle as fast as the baseline: never decided (no futility stop), so all three send all
    rec = beside_two(tmp_path / "b", 0.01)
    for name in (BASELINE, "ngram", "eagle"):
        assert len(rec.phases[name].measurements["coding"].samples) == 16
    looks = rec.phases["ngram"].measurements["coding"].sequential
    assert looks == SequentialLooks(16, [4, 8, 12, 16], stopped=False)
