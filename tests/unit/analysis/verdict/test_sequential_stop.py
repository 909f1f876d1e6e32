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
    nominal_level,
    spent,
)
from pytest_specdecode.analysis.verdict.interval import Question, nested_interval
from pytest_specdecode.analysis.verdict.sequential import Simulated, expected_slots, simulate_cell
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.measurement import Measurement, SequentialLooks
from pytest_specdecode.record.store import RunStore, load_run
from pytest_specdecode.report import markdown
from pytest_specdecode.report.plan_reach import design_lines
from pytest_specdecode.report.schedule import Timing

from ....support.scripted_target import Script, ScriptedTarget, Speed
from ....support.synthetic import record, settings
from ...measure.test_beside_many import ManyBoard
from ...measure.test_interleaved_order import together_experiment

# -- the boundaries, pure ---------------------------------------------------------------------


def test_obrien_fleming_spending_gives_the_published_boundaries() -> None:
    # Lan-DeMets O'Brien-Fleming type, four equal looks, one-sided 0.025 (Jennison & Turnbull
    # 2000, table 7.6: 4.33, 2.96, 2.36, 2.01)
    found = boundaries((0.25, 0.5, 0.75, 1.0), 0.025)
    assert [round(c, 2) for c in found] == [4.33, 2.96, 2.36, 2.01]
    assert spent(1.0, 0.025) == 0.025 and spent(0.25, 0.025) < 1e-4
    # one look is the fixed design
    assert math.isclose(boundaries((1.0,), 0.025)[0], 1.95996, abs_tol=1e-4)


def test_the_boundaries_spend_alpha_on_correlated_looks() -> None:
    # Monte Carlo of the canonical process: crossing any look's boundary has chance alpha
    rng = np.random.default_rng(0)
    for fractions in ((0.25, 0.5, 0.75, 1.0), (0.9, 0.95, 0.98, 1.0)):
        t = np.array(fractions)
        steps = rng.normal(size=(200_000, t.size)) * np.sqrt(np.diff(t, prepend=0.0))
        z = np.cumsum(steps, axis=1) / np.sqrt(t)
        crossed = float(np.mean((z > np.array(boundaries(fractions, 0.05))).any(axis=1)))
        assert crossed == pytest.approx(0.05, abs=0.003), fractions


def test_where_the_pairs_offset_dominates_an_early_look_costs_little() -> None:
    # information fractions near 1: the last look's level stays near the fixed alpha
    near = fractions_of([1.05, 1.02, 1.01, 1.0], 1.0)
    assert near[-1] == 1.0 and near[0] >= 0.95
    assert nominal_level(near, 0.01) > 0.5 * 0.01
    # equal looks of independent slots: the first look's level is far below alpha
    assert nominal_level((0.25,), 0.01) < 0.01 / 100
    assert look_slots(48) == (12, 24, 36, 48) and look_slots(3) == (2, 3)


def test_an_early_look_widens_the_interval_the_analysis_gives() -> None:
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
    early = nested_interval(replace(q, looks=(12, 24), planned_slots=48), noise=noise,
                            confidence=0.99)  # fmt: skip
    final = nested_interval(replace(q, looks=(24,), planned_slots=24), noise=noise,
                            confidence=0.99)  # fmt: skip
    assert early.by == "pairs" and early.confidence > fixed.confidence
    assert early.high - early.low > final.high - final.low
    assert early.estimate == pytest.approx(final.estimate)


# -- the false calls, on simulated pairs ------------------------------------------------------

# per comparison and direction, alpha / family = 0.1: large enough to count in a few hundred
ALPHA, FAMILY, CELLS = 0.2, 2, 240
# many slots' noise, little pair offset: the looks' statistics nearly independent, where
# looking often without a boundary errs most
LOOSE = Simulated(offset_sd=0.005, slot_sd=0.1, speedup_sd=0.05)


def false_calls(model: Simulated, **how: bool) -> tuple[int, float]:
    rng = np.random.default_rng(2026)
    found = [
        simulate_cell(rng, model, alpha=ALPHA, min_effect=0.0, family=FAMILY, **how)
        for _ in range(CELLS)
    ]
    calls = Counter(v for v, _ in found)
    return calls[Verdict.REGRESSED] + calls[Verdict.IMPROVED], float(np.mean([n for _, n in found]))


def test_the_stop_rule_keeps_its_false_calls_within_alpha_where_looking_naively_does_not() -> None:
    # no change: each direction's claim errs at most alpha / family (compare_family's promise)
    allowed = 2 * ALPHA / FAMILY * CELLS
    slack = 2.0 * math.sqrt(allowed * (1 - 2 * ALPHA / FAMILY))
    calls, slots = false_calls(LOOSE, sequential=True)
    assert calls <= allowed + slack
    assert slots < LOOSE.planned  # it looked, and stopped some cells early
    naive, _ = false_calls(LOOSE, naive=True)  # the fixed quantile at every look
    assert naive > allowed + slack


def test_a_large_change_stops_early_and_no_change_runs_to_the_end() -> None:
    # the H200's main job: one pair, 48 slots, 4 prompt types and 2 metrics at alpha 0.05
    h200 = Simulated(offset_sd=0.036, slot_sd=0.08, speedup_sd=0.3)
    how = {"alpha": 0.05, "min_effect": 0.03, "family": 8, "draws": 30}
    assert expected_slots(replace(h200, change=math.log(0.55)), **how) <= 24
    assert expected_slots(h200, **how) == 48


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
    return design_lines(
        s, {"throughput": prior, "tpot": prior}, detect=None,
        timing=Timing(60.0, 0.01, "stored runs"), baseline=True, aba=False,
        adopts_original=False,
    )  # fmt: skip


def test_the_plan_gives_the_expected_and_the_largest_slots(tmp_path: Path) -> None:
    lines = [x for x in plan_lines(tmp_path, 'arms = "together"') if x.startswith("stops")]
    assert len(lines) == 1
    found = re.search(
        r"looks at 12, 24, 36, 48 slots\): expected (\d+) slots at a change of (-\d+)% "
        r"\(about (.+?) in all\), (\d+) at none \((.+?)\); at most 48 \((.+?)\)",
        lines[0],
    )
    assert found, lines[0]
    at, none = int(found[1]), int(found[4])
    assert at < none <= 48  # a change the design can call stops early; none does not
    assert found[3] != found[6]  # and takes less time
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
