"""What an early stop does to the estimate (analysis/variance/stop_bias.py): the mean estimate
of the cells that stop at a look, on the canonical process, against what can be computed."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from pytest_specdecode.analysis.variance.stop_bias import DRAWS, overstated, stopped_mean

LOW, HIGH = math.log(0.97), math.log(1.03)  # a 3% margin


def truncated_mean(change: float, sd: float, below: float) -> float:
    """E[X | X < below] for X ~ N(change, sd^2)."""
    a = (below - change) / sd
    return change - sd * stats.norm.pdf(a) / stats.norm.cdf(a)


@pytest.mark.parametrize("change", [-0.25, -0.4, -0.7])
def test_at_the_first_look_the_stopped_cells_print_a_truncated_normal_mean(change: float) -> None:
    # one look: a cell stops where its interval lies below the margin, estimate + width < LOW
    sd, width = 0.1, 0.3
    found = stopped_mean(change, [sd], [width], low=LOW, high=HIGH, below=True)
    expected = truncated_mean(change, sd, LOW - width)
    assert found is not None
    # Monte Carlo error of a mean of at least 10% of the draws
    assert found == pytest.approx(expected, abs=4 * sd / math.sqrt(0.1 * DRAWS))


def test_a_modest_change_is_overstated_and_a_large_one_hardly() -> None:
    sds, widths = [0.1, 0.06], [0.45, 0.2]  # two looks, the first's boundary the stricter
    first = {"low": LOW, "high": HIGH, "below": True}
    # the first look stops an estimate below -48%: at -55% a quarter of cells go on
    modest = overstated(-0.55, sds[:1], widths[:1], **first)
    assert modest == pytest.approx(-0.55 - truncated_mean(-0.55, 0.1, LOW - 0.45), abs=0.01)
    assert modest > 0.03
    assert abs(overstated(-0.9, sds[:1], widths[:1], **first)) < 0.005  # nothing selected
    # the second look, at -30%: what stopped at the first is gone, the rest stop at -23%
    second = overstated(-0.3, sds, widths, **first)
    assert 0.0 < second < -0.3 - truncated_mean(-0.3, 0.06, LOW - 0.2) + 0.005
    # a change far inside the boundary: the few cells that stop print about the boundary's edge
    assert stopped_mean(-0.05, sds, widths, **first) is None
    assert overstated(-0.05, sds, widths, **first) == pytest.approx(-0.05 - (LOW - 0.2))
    # the good side mirrors the bad
    good = overstated(0.55, sds[:1], widths[:1], low=LOW, high=HIGH, below=False)
    assert good == pytest.approx(-0.55 - truncated_mean(-0.55, 0.1, -HIGH - 0.45), abs=0.01)
