"""What a drafter must accept to pay: its break-even as accepted per draft and as a draft
acceptance rate, and its ceiling, from the map's lines (served depth and carried)."""

from __future__ import annotations

import math

import pytest

from pytest_specdecode.analysis.map.break_even import ALL_PROMPTS, MapLine, MapPoint, fit_line
from pytest_specdecode.analysis.map.depth import fit_depths
from pytest_specdecode.analysis.map.payoff import payoffs_at_depth, payoffs_of_map
from pytest_specdecode.analysis.run import analyze
from tests.support import synthetic
from tests.unit.analysis.map.test_depth import FULL, TRUE_BREAK_EVEN, _cells


def _line(carrier: str, cost: float, k: int = 3, drafts: float | None = 3.0) -> MapLine:
    """A carrier's line where a step costs `cost` plain steps: r(x) = x / cost."""
    points = tuple(
        MapPoint(f"m{x}", k, x, "c1", ALL_PROMPTS, math.log(x / cost), 0.02, 30, x, drafts, x)
        for x in (1.0, k + 1.0)
    )
    a, b, draws = fit_line(points, confidence=0.95)
    return MapLine(k, "c1", ALL_PROMPTS, points, a, b, 0.95, draws, carrier)


def test_a_heads_break_even_is_its_accepted_per_draft_and_its_rate() -> None:
    (pay,) = payoffs_of_map([_line("eagle3", 1.6), _line("ngram", 1.2)], "4 of 32 layers served")
    assert pay.carrier == "eagle3" and pay.pays
    assert pay.break_even.estimate == pytest.approx(1.6)
    assert pay.acceptance_rate.estimate == pytest.approx(0.6 / 3)  # (L - 1) / k
    assert pay.break_even.low < 1.6 < pay.break_even.high
    assert pay.acceptance_rate.low <= 0.2 <= pay.acceptance_rate.high
    assert pay.ceiling.estimate == pytest.approx(4 / 1.6)
    text = pay.text()
    assert text.startswith("an EAGLE-3 head of the target's shape, k=3 at c1 (4 of 32 layers")
    assert "pays above 1.60 [" in text and "acceptance rate of 20%" in text
    assert pay.to_dict()["break_even_acceptance_rate"]["estimate"] == pytest.approx(0.2)


def test_a_drafter_too_dear_never_pays_and_says_how_far_it_is() -> None:
    (pay,) = payoffs_of_map([_line("draft_model:llama-3.2-1b", 5.0)], "8 of 32 layers served")
    assert not pay.pays and pay.ceiling.estimate == pytest.approx(0.8)
    assert "a draft model of llama-3.2-1b's shape" in pay.text()
    assert "never pays" in pay.text() and "5.00 tokens per step, beyond 4" in pay.text()


def test_servers_that_proposed_short_of_k_say_the_figures_read_low() -> None:
    (pay,) = payoffs_of_map([_line("eagle3", 1.5, drafts=2.4)], "here")
    assert pay.drafted == pytest.approx(0.8) and "proposed 80% of k" in pay.text()


def test_the_carried_map_gives_each_drafters_pay_off_at_the_full_depth() -> None:
    found = fit_depths(_cells((4, 8)), FULL, draws=200)
    (pay,) = payoffs_at_depth(found.lines, found.depths, FULL)
    assert pay.break_even.estimate == pytest.approx(TRUE_BREAK_EVEN)
    assert pay.where == "carried to 32 layers from 4 and 8 served"


def test_a_run_with_two_drafters_gets_a_line_and_a_pay_off_each(tmp_path) -> None:
    s = synthetic.settings(tmp_path, candidates=(), run_extra='break_even = "3"', samples=8)
    rec = synthetic.record(s)
    for name in ("map-eagle3-k3-L1", "map-eagle3-k3-L4"):
        rec.candidates[name] = {**rec.candidates[name.replace("eagle3-", "")],
                                "method": "eagle3", "model": "/heads/e3"}  # fmt: skip
    rates = {"coding": 100.0, "math": 50.0}
    synthetic.add_phase(rec, "baseline", rates, seed=1)
    servers = (("map-k3-L1", 1, 1.2), ("map-k3-L4", 4, 1.2),
               ("map-eagle3-k3-L1", 1, 1.6), ("map-eagle3-k3-L4", 4, 1.6))  # fmt: skip
    for name, length, cost in servers:
        synthetic.add_phase(rec, name, {w: r * length / cost for w, r in rates.items()},
                            seed=len(name) + length)  # fmt: skip
    found = analyze(rec).break_even
    assert found.carriers == ["ngram", "eagle3"]
    assert found.line(3, "c1").carrier == "ngram"  # the map's own by default
    head = found.line(3, "c1", carrier="eagle3")
    assert head.break_even[0] == pytest.approx(1.6, rel=0.1) and head.name == "k=3 (eagle3)"
    assert found.ks == [3]
    # a measured candidate is checked against the lines of its own method, where measured
    assert found.near(3, "c1", ALL_PROMPTS, "eagle3").carrier == "eagle3"
    assert found.near(5, "c1", ALL_PROMPTS, "eagle3").k == 3  # the nearest k of that carrier
    assert found.near(3, "c1", ALL_PROMPTS, "suffix").carrier == "ngram"  # else the map's own
    (pay,) = payoffs_of_map(found.overall, "the depth served")
    assert pay.carrier == "eagle3" and pay.break_even.estimate == pytest.approx(1.6, rel=0.1)
