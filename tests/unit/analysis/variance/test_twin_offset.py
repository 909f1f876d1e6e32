"""A twin baseline's slots as the pair offset's evidence of this run (issue 41, item 3b; the
pure part: analysis/variance/pairs.py → `pair_variance(twin=)`, `expected_pair_variance(twins=)`,
analysis/verdict/interval.py → `Question.twin`, analysis/verdict/design.py → `twin_plan`). The
twin's start and slots are not served yet: docs/statistics.md, "A twin baseline"."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.variance.pairs import (
    expected_pair_variance,
    fit_pairs,
    pair_variance,
)
from pytest_specdecode.analysis.variance.restarts import RestartNoise
from pytest_specdecode.analysis.verdict.design import TWIN_GAIN, twin_plan
from pytest_specdecode.analysis.verdict.interval import Question, nested_interval, paired_interval

from ..verdict.test_plan_reach import SLOT_SD, _main_job, _prior

PROMPTS = (np.arange(48) % 12).tolist()


def _question(rng: np.random.Generator, *, twin_offset: float | None) -> Question:
    """One pair's 48 slots of a -40% change, and where given, a twin's slots beside them."""
    side = SLOT_SD / math.sqrt(2.0)
    levels = rng.normal(0.0, 0.3, 12)[PROMPTS]
    base = levels + rng.normal(0.0, side, 48)
    cand = levels - 0.5 + rng.normal(0.0, side, 48)
    twin = None
    if twin_offset is not None:
        twin = [(levels + twin_offset + rng.normal(0.0, side, 48) - base).tolist()]
    return Question(
        "coding", "throughput", True, [np.exp(base).tolist()], [np.exp(cand).tolist()],
        [PROMPTS], [PROMPTS], pairs=[(cand - base).tolist()], pair_prompts=[PROMPTS],
        twin=twin, twin_prompts=[PROMPTS] if twin else None,
    )  # fmt: skip


def test_the_twin_adds_a_df_of_offsets_and_never_moves_the_estimate() -> None:
    rng = np.random.default_rng(5)
    noise = _prior()["throughput"]
    q = _question(rng, twin_offset=0.01)
    alone = paired_interval(
        replace(q, twin=None, twin_prompts=None), noise=noise, confidence=0.9875
    )
    both = paired_interval(q, noise=noise, confidence=0.9875)
    assert alone is not None and both is not None
    assert both.estimate == alone.estimate  # the twin's samples are no part of the change
    assert both.df == pytest.approx(alone.df + 1.0)
    assert both.high - both.low < alone.high - alone.low  # a small offset: narrower


def test_a_far_twin_widens_the_interval_it_measured() -> None:
    """A twin that ran 30% away from the baseline says the offsets are large here."""
    rng = np.random.default_rng(5)
    noise = _prior()["throughput"]
    near = nested_interval(_question(rng, twin_offset=0.0), noise=noise, confidence=0.9875)
    rng = np.random.default_rng(5)
    far = paired_interval(_question(rng, twin_offset=0.3), noise=noise, confidence=0.9875)
    assert far is not None and far.high - far.low > 2.0 * (near.high - near.low)


def test_the_plans_twin_pooling_is_the_analysis_pooling() -> None:
    """Given the slot noise the run measures and the offsets' expected spread, the df agree."""
    rng = np.random.default_rng(9)
    noise = _prior()["throughput"]
    fit = fit_pairs([rng.normal(0.0, SLOT_SD, 48)], [PROMPTS])
    twin = fit_pairs([rng.normal(0.0, SLOT_SD, 48)], [PROMPTS])
    assert fit is not None and twin is not None
    _, df, evidence = pair_variance(fit, outside=noise, twin=twin)
    _, planned = expected_pair_variance(
        noise, slot_var=fit.slot_var, slots=48, slot_df=fit.slot_df, pairs=1, twins=1
    )
    assert planned == pytest.approx(df)
    assert any("twin" in e.what for e in evidence)


def test_auto_takes_a_twin_where_it_narrows_the_reach_and_the_room_exists(tmp_path: Path) -> None:
    s = _main_job(tmp_path)
    thin = {m: replace(n, df=1.0) for m, n in _prior().items()}  # a prior of 1 df
    found = twin_plan(s, thin, room=True, accelerator="gpu")
    assert found is not None and found.gain >= TWIN_GAIN and found.chosen
    assert found.with_twin < found.without
    assert not twin_plan(s, thin, room=False, accelerator="gpu").chosen  # no room, no twin
    assert not twin_plan(s, thin, room=True, accelerator="gpu", twin=False).chosen
    # eight A/A df already known: a twin's one df narrows by less than TWIN_GAIN
    known = {m: replace(n, df=8.0) for m, n in _prior().items()}
    rich = twin_plan(s, known, room=True, accelerator="gpu")
    assert rich is not None and rich.gain < TWIN_GAIN and not rich.chosen
    assert twin_plan(s, known, room=True, accelerator="gpu", twin=True).chosen


def test_no_twin_where_the_arms_are_not_side_by_side(tmp_path: Path) -> None:
    s = _main_job(tmp_path)
    apart = replace(s, run=replace(s.run, arms="one-at-a-time"))
    assert twin_plan(apart, _prior(), room=True) is None


def test_an_assumption_the_twin_rules_out_is_set_aside() -> None:
    """The twin's df join this run's own pairs: an assumed offset noise they rule out is set
    aside, as for two or more pairs (pairs.py → `_contradicts_pairs`); one they agree with
    is pooled."""
    noise = RestartNoise.assumed(0.05)
    rng = np.random.default_rng(2)
    fit = fit_pairs([rng.normal(0.0, SLOT_SD, 48)], [PROMPTS])
    far = fit_pairs([0.6 + rng.normal(0.0, SLOT_SD, 48)], [PROMPTS])
    near = fit_pairs([0.02 + rng.normal(0.0, SLOT_SD, 48)], [PROMPTS])
    assert fit is not None and far is not None and near is not None
    _, df, evidence = pair_variance(fit, outside=noise, twin=far)
    assert df == 1.0 and [e.what for e in evidence] == ["this run's pairs and its twin"]
    _, df, evidence = pair_variance(fit, outside=noise, twin=near)
    assert df > 1.0 and len(evidence) == 2


# -- served: the original's configuration beside the baseline start, as a twin ---------------


def test_a_baseline_served_beside_is_the_candidates_twin_through_results_json(
    tmp_path: Path,
) -> None:
    """`--spec-config baseline,ngram` with `beside = 2` on the scripted target: the original
    again beside the baseline start, with n-gram: its slots join n-gram's pair offsets (one df
    more than without it), the change unmoved; results.json gives the same back."""
    from pytest_specdecode.analysis.run import analyze
    from pytest_specdecode.config.arms import AA_ARM, BASELINE
    from pytest_specdecode.measure.experiment.arms import Experiment
    from pytest_specdecode.record.schema import RunRecord
    from pytest_specdecode.record.store import RunStore

    from ....support.scripted_target import Script, ScriptedTarget, Speed
    from ....support.synthetic import record, settings
    from ...measure.test_beside_many import ManyBoard

    (tmp_path / "run").mkdir()
    s = settings(
        tmp_path, candidates=("baseline", "ngram"), samples=6,
        run_extra='arms = "together"\nbeside = 2\nsequential = false',
    )  # fmt: skip
    prompts = ("the coding prompt", "the math prompt")
    scripts = {
        AA_ARM: Script({p: Speed(gap_s=0.005) for p in prompts}),
        "ngram": Script({p: Speed(gap_s=0.008) for p in prompts}),
    }
    target = ScriptedTarget(Script({p: Speed(gap_s=0.005) for p in prompts}), scripts)
    store = RunStore(tmp_path / "run", record(s))
    board = ManyBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    for name in (AA_ARM, "ngram"):
        exp.arm(name)
    board.restore()
    rec = store.record
    twin, cand = rec.phases[AA_ARM], rec.phases["ngram"]
    assert twin.together_with == BASELINE == cand.together_with  # one start, both beside it
    assert [n for n, _ in board.started] == [AA_ARM, "ngram"]  # the twin: one start more
    slots = {x.slot for m in cand.measurements.values() for x in m.samples}
    assert {x.slot for m in twin.measurements.values() for x in m.samples} == slots

    found = analyze(rec).verdicts["ngram"]
    alone = analyze(_without(rec, AA_ARM)).verdicts["ngram"]
    for name, verdict in found.items():
        with_twin, without = verdict.throughput.interval, alone[name].throughput.interval
        assert with_twin.by == "pairs" and with_twin.estimate == pytest.approx(without.estimate)
        assert with_twin.df == pytest.approx(without.df + 1.0)
    again = RunRecord.from_json(rec.to_json())
    assert {n: v.throughput.interval for n, v in analyze(again).verdicts["ngram"].items()} == {
        n: v.throughput.interval for n, v in found.items()
    }


def _without(rec, arm: str):
    """The same record without one arm's start (as if the twin had not served)."""
    return replace(rec, phases={n: p for n, p in rec.phases.items() if p.arm != arm})


def test_the_plan_says_what_a_twin_would_give(tmp_path: Path) -> None:
    from pytest_specdecode.report.plan_reach import design_lines
    from pytest_specdecode.report.schedule import Timing

    s = _main_job(tmp_path)
    lines = design_lines(
        s, _prior(), detect=None, timing=Timing(60.0, 0.002, "stored runs"),
        baseline=True, aba=False, adopts_original=False, accelerator="gpu",
    )  # fmt: skip
    found = twin_plan(s, _prior(), room=True, accelerator="gpu")
    assert found is not None
    line = next(x for x in lines if x.startswith("a twin baseline"))
    assert (
        f"±{found.with_twin:.1%} with every slot sent, where this design prints "
        f"±{found.without:.1%}" in line
    )
    # the same figure the plan prints for what the run will print with every slot sent
    printed = next(x for x in lines if x.startswith("the interval it will print"))
    assert f"±{found.without:.1%} at 48" in printed
    assert line.endswith("not worth it at 20%")  # 3 df known: one more df is not worth it
