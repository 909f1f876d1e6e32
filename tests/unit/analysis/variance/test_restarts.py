"""analysis/variance/restarts.py: the starts' effects and the restart noise they measure (no
server)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdecode.analysis.variance.restarts import (
    RestartNoise,
    fit_starts,
    pooled,
    restart_noise_of,
    t_quantile,
)


def _configuration(
    rng: np.random.Generator, *, starts: int, keys: int, start_sd: float, prompt_sd: float
) -> list:
    """One configuration started `starts` times, on `keys` prompt types of 12 prompts each (16
    requests per start: prompts 0..11, 0..3), every prompt type of a start shifted alike."""
    shifts = rng.normal(0.0, start_sd, starts)
    fits = []
    for _ in range(keys):
        levels = rng.normal(0.0, prompt_sd, 12)
        prompts = [[i % 12 for i in range(16)] for _ in range(starts)]
        logs = [
            np.array([shift + levels[i] + rng.normal(0.0, 0.04) for i in p])
            for shift, p in zip(shifts, prompts, strict=True)
        ]
        fits.append(fit_starts(logs, prompts))
    return fits


def test_the_spread_between_prompts_is_not_restart_noise() -> None:
    """Prompts whose levels spread by 10%, no restart noise at all: the paired fit finds none;
    the start means' within-start spread (what an unpaired estimate subtracts) is mostly the
    prompts'."""
    rng = np.random.default_rng(1)
    estimates, residuals = [], []
    for _ in range(40):
        fits = _configuration(rng, starts=4, keys=4, start_sd=0.0, prompt_sd=0.10)
        assert all(f.paired for f in fits)
        residuals += [f.residual_var for f in fits]
        found = restart_noise_of([fits], source="sim")
        assert found is not None
        estimates.append(found.sd)
    assert float(np.mean(residuals)) == pytest.approx(0.04**2, rel=0.05)  # a request's own
    assert float(np.median(estimates)) < 0.005


def test_the_restart_noise_is_recovered_through_a_prompt_set() -> None:
    rng = np.random.default_rng(2)
    found = [
        restart_noise_of(
            [_configuration(rng, starts=8, keys=4, start_sd=0.046, prompt_sd=0.10)], source="s"
        )
        for _ in range(60)
    ]
    variances = [f.variance for f in found if f is not None]
    assert math.sqrt(float(np.mean(variances))) == pytest.approx(0.046, rel=0.15)


def test_prompt_types_sharing_a_start_count_its_starts_once() -> None:
    """Four prompt types of one configuration started 8 times: 7 degrees of freedom, not 28;
    two configurations pool to 14."""
    rng = np.random.default_rng(3)
    one = _configuration(rng, starts=8, keys=4, start_sd=0.02, prompt_sd=0.1)
    two = _configuration(rng, starts=8, keys=4, start_sd=0.02, prompt_sd=0.1)
    found = restart_noise_of([one], source="x")
    assert found is not None and found.df == 7
    both = restart_noise_of([one, two], source="x")
    assert both is not None and both.df == 14
    assert restart_noise_of([[fit_starts([np.log([1.0, 2.0])])]], source="x") is None  # 1 start


def test_pooled_estimates_weigh_by_their_degrees_of_freedom() -> None:
    a = RestartNoise(0.01, 3.0, "a", spread=0.0002, within=0.0001)
    b = RestartNoise(0.03, 9.0, "b", spread=0.0010, within=0.0001)
    found = pooled([a, b, RestartNoise.assumed(0.05)], source="both")  # assumed: left out
    assert found is not None and found.df == 12
    assert found.variance == pytest.approx((3 * 0.0001 + 9 * 0.0009) / 12)


def test_an_assumed_noise_round_trips_as_an_assumption() -> None:
    noise = RestartNoise.assumed(0.05)
    back = RestartNoise.from_dict(noise.to_dict())
    assert not back.measured and back.df == noise.df and back.sd == 0.05
    legacy = RestartNoise.from_dict({"sd": 0.05, "df": None, "source": "x", "measured": False})
    assert not legacy.measured and legacy.df == noise.df  # an earlier version's results.json


def test_a_measured_noise_has_an_interval_from_its_degrees_of_freedom() -> None:
    few = RestartNoise(0.02, 3.0, "a", spread=0.0005, within=0.0001)
    many = RestartNoise(0.02, 30.0, "b", spread=0.0005, within=0.0001)
    (lo_few, hi_few), (lo_many, hi_many) = few.interval(), many.interval()
    assert lo_few <= lo_many < 0.02 < hi_many < hi_few
    assert all(math.isnan(x) for x in RestartNoise.assumed(0.05).interval())  # not measured


def test_t_quantile_is_scipys_t_ppf_at_every_probability_and_df() -> None:
    """The fast path gives exactly what `scipy.stats.t.ppf` gives: fractional and large df,
    both tails, the ends of (0, 1), a df that is no df; the normal's where df is infinite."""
    from scipy import stats

    rng = np.random.default_rng(7)
    ps = [*rng.uniform(0.0, 1.0, 200), 1e-12, 0.025, 0.5, 0.975, 1 - 1e-12, 0.0, 1.0]
    dfs = [*rng.uniform(0.3, 60.0, 40), 1.0, 2.0, 1e6, 1e300, 0.0, -1.0]
    for df in dfs:
        for p in ps:
            expected = float(stats.t.ppf(p, df))
            got = t_quantile(p, df)
            assert got == expected or (math.isnan(got) and math.isnan(expected)), (p, df)
    for p in ps:
        assert t_quantile(p, math.inf) == float(stats.norm.ppf(p)), p


def _paired_by_rank(starts: list, prompts: list) -> tuple | None:
    """The paired fit as it was first written: a row at a time, full rank by the matrix's SVD."""
    labels = sorted({i for start in prompts for i in start})
    if len(labels) < 2:
        return None
    column = {label: j for j, label in enumerate(labels[1:])}
    n_starts, n_cols = len(starts), len(starts) + len(labels) - 1
    x = np.zeros((sum(len(p) for p in prompts), n_cols))
    r = 0
    for s, start in enumerate(prompts):
        for label in start:
            x[r, s] = 1.0
            if label in column:
                x[r, n_starts + column[label]] = 1.0
            r += 1
    y = np.concatenate(starts)
    xtx = x.T @ x
    rank = int(np.linalg.matrix_rank(xtx))
    if rank < n_cols or y.size - rank <= 0:
        return None
    inverse = np.linalg.inv(xtx)
    beta = inverse @ (x.T @ y)
    residual = y - x @ beta
    return (
        beta[:n_starts],
        float(residual @ residual) / (y.size - rank),
        inverse[:n_starts, :n_starts],
    )


def test_the_paired_fit_is_the_row_by_row_least_squares_on_linked_and_unlinked_designs() -> None:
    """The fit builds its design at once and reads full rank off the starts' shared prompts:
    exactly the effects, residual and covariance of the row-by-row build with an SVD rank, and
    no paired fit wherever that one found the design short of full rank (starts that share no
    prompt, one prompt, no residual df)."""
    rng = np.random.default_rng(11)
    seen = {"paired": 0, "unpaired": 0}
    for _ in range(400):
        n_starts = int(rng.integers(1, 6))
        pool = int(rng.integers(1, 14))
        prompts = [
            [int(p) for p in rng.choice(pool, int(rng.integers(1, 9)))] for _ in range(n_starts)
        ]
        if rng.uniform() < 0.3:  # two groups of starts on prompts of their own
            prompts = [[p + 100 * (s % 2) for p in start] for s, start in enumerate(prompts)]
        starts = [rng.normal(0.0, 0.05, len(p)) for p in prompts]
        if sum(len(p) for p in prompts) == 0:
            continue
        expected = _paired_by_rank(starts, prompts)
        fit = fit_starts(starts, prompts)
        seen["paired" if expected is not None else "unpaired"] += 1
        if expected is None:
            assert not fit.paired, prompts
            continue
        effects, residual_var, cov = expected
        assert fit.paired, prompts
        assert np.array_equal(fit.effects, effects), prompts
        assert fit.residual_var == residual_var or (
            math.isnan(fit.residual_var) and math.isnan(residual_var)
        )
        assert np.array_equal(fit.cov, cov), prompts
    assert min(seen.values()) >= 50, seen  # both kinds of design were tried
