"""The map on the shape from one run's record: the depth arms read by their step alone, the map
carried to the full depth, the drafters' pay-offs, and the report's lines that say it is an
extrapolation."""

from __future__ import annotations

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.counters import Acceptance
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report.sections import break_even as section
from pytest_specdecode.run.map_on_shape import with_map_on_shape
from tests.support import synthetic
from tests.unit.analysis.map.test_depth import BASE, FULL, K3, TRUE_BREAK_EVEN, _truth
from tests.unit.run.test_map_on_shape import _served, _settings


def _rate(step_ms: float, x: float) -> float:
    """tokens/s of a request of 64 tokens whose TPOT is step_ms / x (ttft 0.08 s)."""
    return 64 / (0.08 + 63 * step_ms / x / 1000)


def _counted(x: float, k: int = 3) -> Acceptance:
    steps = 6 * 63 / x
    return Acceptance(present=True, drafts=steps, draft_tokens=k * steps, accepted=(x - 1) * steps)


def _shape_run(tmp_path, served_depth: int = 8, *, extra: str = "") -> RunRecord:
    asked = _settings(tmp_path, extra, ks="3", levels="[1]")
    settings, served = with_map_on_shape(asked, _served("llama-3.1-8b", served_depth, tmp_path))
    rec = synthetic.record(settings)
    rec.shape = served
    for name in [BASELINE, *rec.candidates]:
        if name == "ngram":
            continue
        depth = 4 if name.startswith("map-d4-") else served_depth
        if name.endswith("baseline"):
            rate, acc = _rate(_truth(BASE, depth), 1), None
        else:
            x = 1.0 if name.endswith("L1") else 3.6
            rate, acc = _rate(_truth(K3, depth), x), _counted(x)
        synthetic.add_phase(
            rec, name, {"coding": rate, "math": rate}, spread=0.0, acceptance=acc, seed=depth
        )
    return rec


def test_a_run_at_two_depths_carries_its_map_to_the_full_depth(tmp_path) -> None:
    rec = _shape_run(tmp_path)
    found = analyze(rec)
    assert not found.verdicts  # no hypothesis measured; the depth arms are no verdicts either
    assert set(found.map_verdicts) == {"map-k3-L1", "map-k3-L4"}
    assert [p.candidate for p in found.break_even.line(3, "c1").points] == [
        "map-k3-L1",
        "map-k3-L4",
    ]  # the map at the depth served: the depth arms are not its points
    shape = found.map_on_shape
    assert shape.extrapolated and shape.depths == (4, 8) and shape.full == FULL
    line = shape.carried.line(3, "c1")
    assert line.carrier == "eagle3"
    assert line.break_even.estimate == pytest.approx(TRUE_BREAK_EVEN, rel=1e-3)
    (pay,) = [p for p in shape.payoffs if p.level == "c1"]
    assert pay.where == "carried to 32 layers from 4 and 8 served"
    assert pay.break_even.estimate == pytest.approx(TRUE_BREAK_EVEN, rel=1e-3)
    assert "map_on_shape" in found.to_json()
    said = section.markdown_lines(found)
    assert "### The map carried to 32 layers (an extrapolation)" in said
    text = "\n".join(said)
    assert "An extrapolation: each server's step measured at 4 and 8 of 32 layers" in text
    assert "The baseline's step at c1: 4.00 ms at 4, 6.00 ms at 8 layers" in text
    assert "Pay-off: an EAGLE-3 head of the target's shape, k=3 at c1 (carried to 32" in text
    assert any(t.startswith("map on the shape: An extrapolation") for t in
               section.terminal_lines(found))  # fmt: skip
    assert "an extrapolation" in section.html_section(found)


def test_a_shape_served_whole_tells_the_pay_off_at_its_depth(tmp_path) -> None:
    found = analyze(_shape_run(tmp_path, served_depth=32)).map_on_shape
    assert not found.extrapolated and found.depths == (32,)
    (pay,) = found.payoffs
    assert pay.where == "as served"
    assert pay.break_even.estimate == pytest.approx(TRUE_BREAK_EVEN, rel=0.05)
    assert found.statement() == "Measured at the depth served"
    # the prediction's reading: a step of k=3 over a plain one, at the depth measured only
    cost = found.steps.step_cost(3, "c1", FULL)
    assert cost.estimate == pytest.approx(TRUE_BREAK_EVEN, rel=1e-3)
    assert found.steps.step_ms(BASELINE, "c1", FULL).estimate == pytest.approx(18.0, rel=1e-3)
    assert found.steps.step_cost(3, "c1", 16) is None and not found.steps.carried


def test_the_carried_map_is_the_step_reader_at_any_depth(tmp_path) -> None:
    found = analyze(_shape_run(tmp_path)).map_on_shape
    assert found.steps is found.carried and found.steps.reaches(61)
    half = found.steps.step_cost(3, "c1", 16, tokens_per_step=2.0)
    assert half.estimate == pytest.approx(_truth(K3, 16) / _truth(BASE, 16), rel=1e-3)
