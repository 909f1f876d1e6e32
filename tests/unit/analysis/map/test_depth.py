"""The map carried to the full depth: the per-layer fit, its extrapolation and its interval, on a
known linear truth with noise; and the cells read from runs at two depths."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdecode.analysis.map.depth import StepCell, fit_depths
from pytest_specdecode.analysis.map.shape import cells_of_runs, step_cells
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.record.counters import Acceptance
from tests.support import synthetic

FULL = 32
# The truth, ms per decode step at n layers: the baseline 2 + 0.5 n; a step of k=3 drafts costs
# 1.0 ms more outside the layers (the proposer) and 10% more in each (verifying 4 tokens).
BASE = (2.0, 0.5)
K3 = (3.0, 0.55)


def _truth(ab: tuple[float, float], n: int) -> float:
    return ab[0] + ab[1] * n


TRUE_BREAK_EVEN = _truth(K3, FULL) / _truth(BASE, FULL)  # r(x) = x * T_base / T_k3 = 1


def _cells(depths, *, noise=0.0, seed=0, requests=12, lengths=(1.0, 4.0)) -> list[StepCell]:
    rng = np.random.default_rng(seed)

    def strata(mean: float) -> tuple[tuple[float, ...], ...]:
        return tuple(
            tuple(mean * (1 + noise * rng.standard_normal(requests))) for _ in ("coding", "math")
        )

    out = []
    for n in depths:
        out.append(StepCell(BASELINE, "c1", n, strata(_truth(BASE, n))))
        for length in lengths:
            name = f"map-k3-L{length:g}"
            out.append(StepCell(name, "c1", n, strata(_truth(K3, n)), length, "eagle3", 3, length))
    return out


def test_the_fit_recovers_a_linear_truth_exactly_and_carries_it_to_the_full_depth() -> None:
    found = fit_depths(_cells((4, 8)), FULL, draws=200)
    base = found.fit(BASELINE, "c1")
    assert base.intercept_ms.estimate == pytest.approx(2.0)
    assert base.per_layer_ms.estimate == pytest.approx(0.5)
    assert base.full_ms.estimate == pytest.approx(18.0)
    line = found.line(3, "c1")
    assert line is not None and line.carrier == "eagle3"
    assert line.break_even.estimate == pytest.approx(TRUE_BREAK_EVEN)
    assert line.ceiling.estimate == pytest.approx(4 / TRUE_BREAK_EVEN)
    assert found.depths == (4, 8) and found.full_depth == FULL
    # wt-predict's reading: what a step of k=3 costs over a plain step, at any depth
    cost = found.step_cost(3, "c1", FULL)
    assert cost.estimate == pytest.approx(TRUE_BREAK_EVEN)
    shallow = found.step_cost(3, "c1", 4)
    assert shallow.estimate == pytest.approx(_truth(K3, 4) / _truth(BASE, 4))
    assert found.step_ms(BASELINE, "c1", 61).estimate == pytest.approx(_truth(BASE, 61))
    assert found.step_cost(5, "c1", FULL) is None and found.step_ms("nope", "c1", 8) is None
    # the prediction's reading of the map at the full depth (predict_on_shape's ratio_at)
    ratio, low, high = found.ratio_at(3, 2.0, "c1")
    assert ratio == pytest.approx(2.0 / TRUE_BREAK_EVEN) and low <= ratio <= high
    assert found.ratio_at(3, 2.0, "c1", carrier="ngram") is None


def test_with_noise_the_interval_holds_the_truth_and_narrows_with_more_requests() -> None:
    held, widths = 0, {}
    for seed in range(30):
        found = fit_depths(_cells((4, 8, 16), noise=0.05, seed=seed), FULL, draws=400, seed=seed)
        band = found.line(3, "c1").break_even
        held += band.low <= TRUE_BREAK_EVEN <= band.high
        widths.setdefault(12, []).append(band.high - band.low)
    assert held >= 25  # a 95% interval, 30 runs: fewer than 26 would be rare (p < 0.01)
    for seed in range(5):
        more = fit_depths(_cells((4, 8, 16), noise=0.05, seed=seed, requests=120), FULL, draws=400)
        band = more.line(3, "c1").break_even
        widths.setdefault(120, []).append(band.high - band.low)
    assert np.mean(widths[120]) < 0.5 * np.mean(widths[12])


def test_the_restart_noise_widens_the_interval_and_depths_far_apart_narrow_it() -> None:
    cells = _cells((4, 8), noise=0.02, seed=3)
    quiet = fit_depths(cells, FULL, draws=400).line(3, "c1").break_even
    noisy = fit_depths(cells, FULL, draws=400, restart_noise=0.02).line(3, "c1").break_even
    assert noisy.high - noisy.low > 2 * (quiet.high - quiet.low)
    apart = fit_depths(_cells((4, 16), noise=0.02, seed=3), FULL, draws=400, restart_noise=0.02)
    band = apart.line(3, "c1").break_even
    assert band.high - band.low < noisy.high - noisy.low


def test_three_depths_tell_whether_the_layers_are_alike() -> None:
    two = fit_depths(_cells((4, 8)), FULL, draws=100)
    assert two.fit(BASELINE, "c1").worst_residual is None  # a line meets two points
    three = fit_depths(_cells((4, 8, 16)), FULL, draws=100)
    assert three.fit(BASELINE, "c1").worst_residual == pytest.approx(0.0, abs=1e-9)
    bent = [
        StepCell(c.server, c.level, c.depth, tuple(tuple(v * (1.3 if c.depth == 8 else 1)
                 for v in s) for s in c.strata), c.tokens_per_step, c.carrier, c.k, c.length)
        for c in _cells((4, 8, 16))
    ]  # fmt: skip
    assert fit_depths(bent, FULL, draws=100).fit(BASELINE, "c1").worst_residual > 0.1


def test_a_step_too_dear_never_breaks_even_within_k_plus_one() -> None:
    cells = [
        StepCell(c.server, c.level, c.depth, tuple(tuple(v * 5 for v in s) for s in c.strata),
                 c.tokens_per_step, c.carrier, c.k, c.length) if c.k else c
        for c in _cells((4, 8))
    ]  # fmt: skip
    line = fit_depths(cells, FULL, draws=100).line(3, "c1")
    assert not line.pays and line.break_even.estimate > 4
    assert line.ceiling.estimate < 1
    assert math.isfinite(line.to_dict()["break_even"]["estimate"])


def test_one_depth_or_no_baseline_is_refused() -> None:
    with pytest.raises(ConfigError, match="two served depths"):
        fit_depths(_cells((8,)), FULL)
    without = [c for c in _cells((4, 8)) if c.server != BASELINE]
    with pytest.raises(ConfigError, match="baseline"):
        fit_depths(without, FULL)


def _run_at(tmp_path, n: int):
    """A run that served n layers: the baseline and two eagle3 map servers at k=3, their
    requests' TPOT the truth's step over their tokens per step (counted: 1 and 3.6)."""
    (tmp_path / f"d{n}").mkdir()
    s = synthetic.settings(tmp_path / f"d{n}", candidates=(), run_extra='break_even = "3"')
    rec = synthetic.record(s)
    for name in ("map-k3-L1", "map-k3-L4"):
        rec.candidates[name] = {**rec.candidates[name], "method": "eagle3", "model": "/h"}

    def rate(step_ms: float, x: float) -> float:  # tokens/s whose TPOT is step_ms / x
        return 64 / (0.08 + 63 * step_ms / x / 1000)

    synthetic.add_phase(rec, BASELINE, {"coding": rate(_truth(BASE, n), 1)}, spread=0)
    for name, x in (("map-k3-L1", 1.0), ("map-k3-L4", 3.6)):
        steps = 6 * 63 / x
        counted = Acceptance(present=True, drafts=steps, draft_tokens=3 * steps,
                             accepted=(x - 1) * steps)  # fmt: skip
        synthetic.add_phase(rec, name, {"coding": rate(_truth(K3, n), x)}, spread=0,
                            acceptance=counted)  # fmt: skip
    return rec


def test_the_cells_of_runs_at_two_depths_give_the_same_map(tmp_path) -> None:
    runs = [(4, _run_at(tmp_path, 4)), (8, _run_at(tmp_path, 8))]
    cells = step_cells(runs[0][1], 4)
    assert {c.server for c in cells} == {BASELINE, "map-k3-L1", "map-k3-L4"}
    tokens = {c.server: c.tokens_per_step for c in cells}
    assert tokens["map-k3-L4"] == pytest.approx(3.6) and tokens[BASELINE] == 1.0
    assert all(c.carrier == "eagle3" for c in cells if c.k)
    found = fit_depths(cells_of_runs(runs), FULL, draws=100)
    assert found.fit(BASELINE, "c1").per_layer_ms.estimate == pytest.approx(0.5, rel=1e-6)
    assert found.line(3, "c1").break_even.estimate == pytest.approx(TRUE_BREAK_EVEN, rel=1e-6)
    with pytest.raises(ConfigError, match="one run per depth"):
        cells_of_runs([runs[0], (4, runs[1][1])])
