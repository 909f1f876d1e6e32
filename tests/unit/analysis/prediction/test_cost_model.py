"""The cost model on synthetic data with known parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdecode.analysis.prediction.bands.bounded import recommend
from pytest_specdecode.analysis.prediction.cost_model import (
    BaselineTiming,
    CandidateTiming,
    CostPrior,
    cost_points,
    fit_cost,
    predict,
    relative_noise,
)
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings, ReplayStats

S = NgramSettings


def stats_for(settings: NgramSettings, *, tau: float, m: float, n_out: int = 129) -> ReplayStats:
    """Replay figures with the given tokens and draft tokens per decode step (1 request)."""
    decode_steps = round((n_out - 1) / tau)
    return ReplayStats(
        settings=settings,
        requests=1,
        output_tokens=n_out,
        steps=1 + decode_steps,
        drafts=decode_steps,
        draft_tokens=round(m * decode_steps),
        accepted=n_out - 1 - decode_steps,
        accepted_per_position=(0,) * settings.num_speculative_tokens,
    )


K = {"coding": 2, "math": 5, "structured": 3, "explanatory": 4}  # a k per prompt type


def candidate(name: str, base: BaselineTiming, tau: float, m: float, b: float, c: float, k=None):
    tpot = base.tpot_s * (1 + b + c * m) / tau
    k = k or K[name]
    return CandidateTiming(name, f"k={k} n=4..4", tpot, tau, m, k=k)


BASES = {
    "coding": BaselineTiming(tpot_s=0.030, ttft_s=0.10, output_tokens=128),
    "math": BaselineTiming(tpot_s=0.032, ttft_s=0.12, output_tokens=128),
    "structured": BaselineTiming(tpot_s=0.031, ttft_s=0.11, output_tokens=128),
    "explanatory": BaselineTiming(tpot_s=0.029, ttft_s=0.10, output_tokens=128),
}
SHAPES = {
    "coding": (1.1, 0.4),
    "math": (1.9, 3.5),
    "structured": (1.5, 2.0),
    "explanatory": (1.3, 1.0),
}


def test_least_squares_recovers_known_parameters_and_predicts_exactly():
    b, c = 0.08, 0.05
    cands = [candidate(n, BASES[n], tau, m, b, c) for n, (tau, m) in SHAPES.items()]
    fit = fit_cost(BASES, cands)
    assert fit is not None and fit.method == "least-squares" and fit.observations == 4
    assert fit.overhead == pytest.approx(b, abs=1e-9) and fit.per_token == pytest.approx(c)
    point, low, high = fit.step_cost(2.0)
    assert point == pytest.approx(1 + b + 2 * c) and high - low < 1e-6
    assert "least squares over 4" in fit.describe()
    # A config the fit never saw: its TPOT follows the model.
    other = S(3, 2, 3)
    replays = {"math": {other: stats_for(other, tau=1.6, m=2.4)}}
    pred = predict(BASES, replays, fit)["math"][other]
    r = replays["math"][other]
    tpot = BASES["math"].tpot_s * (1 + b + c * r.draft_tokens_per_step) / r.decode_tokens_per_step
    expected = 128 / (0.12 + 127 * tpot)
    assert pred.tokens_per_s == pytest.approx(expected)
    assert pred.speedup == pytest.approx(expected / BASES["math"].tokens_per_s)
    assert pred.verdict == "faster" and pred.p_faster == pytest.approx(1.0)


def test_negative_parameters_are_clipped_to_zero():
    # Speculative steps cheaper than plain ones would be noise: b is held at 0.
    cands = [candidate(n, BASES[n], tau, m, -0.05, 0.04) for n, (tau, m) in SHAPES.items()]
    fit = fit_cost(BASES, cands)
    assert fit is not None and fit.overhead == pytest.approx(0.0, abs=1e-12) and fit.per_token > 0


def test_band_covers_the_truth_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    b, c, noise = 0.1, 0.06, 0.03
    covered, trials = 0, 400
    for _ in range(trials):
        cands = []
        for n, (tau, m) in SHAPES.items():
            for jitter in (0.0, 0.3):  # two candidates per prompt type: 8 observations
                true = candidate(n, BASES[n], tau + jitter, m + 2 * jitter, b, c)
                tpot = true.tpot_s * (1 + rng.normal(0, noise))
                cands.append(CandidateTiming(n, "x", tpot, tau + jitter, m + 2 * jitter, k=K[n]))
        fit = fit_cost(BASES, cands)
        assert fit is not None
        # A new observation at m = 2.5: the band is a prediction interval for it.
        true_r = b + c * 2.5 + rng.normal(0, noise * (1 + b + c * 2.5))
        _, low, high = fit.step_cost(2.5)
        covered += low <= 1 + true_r <= high
    assert 0.9 <= covered / trials <= 0.995


def test_one_observation_spans_fixed_and_per_token_cost():
    base = BASES["math"]
    cand = candidate("math", base, 1.9, 3.5, 0.0, 0.04)  # r = 0.14
    fit = fit_cost(BASES, [cand])
    assert fit is not None and fit.method == "bounds" and not fit.separated
    # halfway between the extremes (0, 0.04) and (0.14, 0)
    assert (fit.overhead, fit.per_token) == (pytest.approx(0.07), pytest.approx(0.02))
    assert "not separable, one k measured (k=5)" in fit.describe()
    # At m = 1 the two hypotheses differ: 1 + 0.04 (per token) vs 1 + 0.14 (fixed).
    point, low, high = fit.step_cost(1.0)
    assert point == pytest.approx(1.09) and low == pytest.approx(1.04)
    assert high == pytest.approx(1.14)
    noisy = fit_cost(
        {"math": BaselineTiming(base.tpot_s, base.ttft_s, 128, tpot_noise=0.05)}, [cand]
    )
    assert noisy is not None
    _, low_n, high_n = noisy.step_cost(1.0)
    assert low_n == pytest.approx(1.04 * 0.95) and high_n == pytest.approx(1.14 * 1.05)


def test_no_candidate_gives_the_ceiling_only():
    s = S(5, 4, 4)
    replays = {"coding": {s: stats_for(s, tau=1.14, m=0.4)}}
    assert fit_cost(BASES, []) is None
    pred = predict(BASES, replays, None)["coding"][s]
    base = BASES["coding"]
    tau = replays["coding"][s].decode_tokens_per_step
    assert pred.ceiling_tokens_per_s == pytest.approx(128 / (0.10 + 127 * base.tpot_s / tau))
    assert pred.tokens_per_s is None and pred.speedup_band is None
    assert pred.verdict == "cost unknown" and pred.ceiling_speedup > 1
    rec = recommend({"coding": {s: pred}})
    assert rec.settings is None and "unknown until one candidate is measured" in rec.reason
    assert "k=5 n=4..4" in rec.reason


def test_recommend_the_best_unmeasured_config_or_none():
    fit = fit_cost(
        BASES, [candidate(n, BASES[n], t, m, 0.05, 0.05) for n, (t, m) in SHAPES.items()]
    )
    good, meh, measured = S(3, 2, 3), S(8, 1, 1), S(5, 4, 4)
    replays = {
        n: {
            good: stats_for(good, tau=1.8, m=1.5),
            meh: stats_for(meh, tau=1.05, m=6.0),
            measured: stats_for(measured, tau=2.5, m=1.0),
        }
        for n in BASES
    }
    preds = predict(BASES, replays, fit)
    assert preds["coding"][meh].verdict == "slower"
    rec = recommend(preds, measured=[measured])
    assert rec.settings == good and "worth a reload" in rec.reason
    assert f"faster on 4 of 4 ({', '.join(BASES)})" in rec.reason
    assert rec.mean_speedup is not None and rec.mean_speedup > 1
    only_bad = {n: {meh: preds[n][meh]} for n in preds}
    rec = recommend(only_bad)
    assert rec.settings is None and "not worth it" in rec.reason and "k=8 n=1..1" in rec.reason
    assert "slower on 4 of 4" in rec.reason
    # The only config predicted was measured already: nothing to recommend, and why.
    done = recommend({n: {measured: preds[n][measured]} for n in preds}, measured=[measured])
    assert done.settings is None and done.reason == "every predicted config was measured already"


def test_relative_noise():
    assert relative_noise([0.03]) == 0.0
    assert relative_noise([0.03, 0.03, 0.03]) == 0.0
    values = [0.030, 0.031, 0.029, 0.030, 0.032]
    expected = 2.7764451051977987 * np.std(values, ddof=1) / math.sqrt(5) / np.mean(values)
    assert relative_noise(values) == pytest.approx(expected)


def test_band_low_end_floored_at_a_plain_step_less_noise():
    # Observations only at small m: extrapolating the intercept's uncertainty far would let the
    # band fall below a plain step's cost; it stops at 1 - t * s.
    rng = np.random.default_rng(4)
    cands = [
        CandidateTiming(
            n, "x", BASES[n].tpot_s * (1.02 + rng.normal(0, 0.05)) / 1.1, 1.1, m, k=K[n]
        )
        for n in BASES
        for m in (0.1, 0.2, 0.3)
    ]
    fit = fit_cost(BASES, cands)
    assert fit is not None and fit.method == "least-squares"
    point, low, high = fit.step_cost(0.0)
    assert low == pytest.approx(1.0 - fit.t_quantile * math.sqrt(fit.residual_var))
    assert low < point < high


def test_baseline_noise_widens_the_band_in_quadrature():
    fit = fit_cost(BASES, [candidate("math", BASES["math"], 1.9, 3.5, 0.0, 0.04)])
    s = S(3, 2, 3)
    replays = {"math": {s: stats_for(s, tau=1.6, m=2.4)}}
    quiet = predict(BASES, replays, fit)["math"][s]
    noisy_base = {"math": BaselineTiming(0.032, 0.12, 128, tpot_noise=0.1)}
    noisy = predict(noisy_base, replays, fit)["math"][s]
    assert noisy.tokens_per_s == pytest.approx(quiet.tokens_per_s)
    assert quiet.tokens_per_s_band is not None and noisy.tokens_per_s_band is not None
    assert noisy.tokens_per_s_band[0] < quiet.tokens_per_s_band[0]
    assert noisy.tokens_per_s_band[1] > quiet.tokens_per_s_band[1]
    cost, _, high = fit.step_cost(replays["math"][s].draft_tokens_per_step)
    tau = replays["math"][s].decode_tokens_per_step
    slowest_tpot = 0.032 * cost / tau * (1 + math.hypot((high - cost) / cost, 0.1))
    assert noisy.tokens_per_s_band[0] == pytest.approx(128 / (0.12 + 127 * slowest_tpot), rel=1e-3)


def test_the_restart_noise_widens_the_band_of_a_new_start():
    # The predicted config runs in a start of its own: a 4% shift of that start against the
    # baseline's stays inside the band only once the restart noise is in it.
    cands = [candidate(n, BASES[n], tau, m, 0.08, 0.03) for n, (tau, m) in SHAPES.items()]
    fit = fit_cost(BASES, cands)
    assert fit is not None
    other = S(3, 2, 3)
    replays = {"math": {other: stats_for(other, tau=1.6, m=2.4)}}
    quiet = predict(BASES, replays, fit)["math"][other]
    noisy = predict(BASES, replays, fit, restart_sd=0.03)["math"][other]
    assert noisy.tokens_per_s == pytest.approx(quiet.tokens_per_s)
    shifted = quiet.tokens_per_s * 0.96
    assert quiet.tokens_per_s_band[0] > shifted  # without it, a slower start falls outside
    low, high = noisy.tokens_per_s_band
    assert low < shifted < quiet.tokens_per_s < high
    # 95% of the difference of two starts: 1.96 * 3% * sqrt(2) = 8.3%, in quadrature.
    assert 1 - low / noisy.tokens_per_s == pytest.approx(0.083, abs=0.02)


def test_the_restart_noise_widens_both_ends_of_the_band() -> None:
    cands = [candidate(n, BASES[n], tau, m, 0.08, 0.03) for n, (tau, m) in SHAPES.items()]
    fit = fit_cost(BASES, cands)
    s = S(3, 2, 3)
    replays = {"math": {s: stats_for(s, tau=1.6, m=2.4)}}
    (q_low, q_high), (n_low, n_high) = (
        predict(BASES, replays, fit, restart_sd=sd)["math"][s].speedup_band for sd in (0.0, 0.03)
    )
    assert n_low < q_low and n_high > q_high
    # 1.96 * 3% * sqrt(2) = 8.3% of TPOT, in quadrature with the cost's own band, each way
    assert n_high / q_high > 1.05 and q_low / n_low > 1.05


def test_least_squares_needs_three_observations() -> None:
    # Two observations with a spread in draft tokens: a line through two points has no
    # residual to go on, so the band would be NaN. The bounds method takes them.
    cands = [candidate("coding", BASES["coding"], 1.1, 0.4, 0.08, 0.05)]
    cands.append(candidate("math", BASES["math"], 1.9, 3.5, 0.08, 0.05))
    fit = fit_cost(BASES, cands)
    assert fit is not None and fit.method == "bounds" and fit.observations == 2
    point, low, high = fit.step_cost(2.0)
    assert all(math.isfinite(v) for v in (point, low, high)) and low <= point <= high
    three = fit_cost(
        BASES, [*cands, candidate("structured", BASES["structured"], 1.5, 2.0, 0.08, 0.05)]
    )
    assert three is not None and three.method == "least-squares"


def test_one_k_cannot_separate_fixed_and_per_token_cost() -> None:
    # Many observations of one k, spread in draft tokens per step: a cost per drafting step
    # and a cost per draft token both grow with the drafting share, so no least squares.
    rng = np.random.default_rng(7)
    cands = [
        candidate(n, BASES[n], 1.2 + d, 0.5 + 3 * d, 0.1, 0.02, k=5)
        for n in BASES
        for d in rng.uniform(0, 0.6, 3)
    ]
    fit = fit_cost(BASES, cands)
    assert fit is not None and fit.method == "bounds" and fit.ks == (5,)
    other_k = [candidate(n, BASES[n], 1.1, 0.3, 0.1, 0.02, k=2) for n in BASES]
    both = fit_cost(BASES, [*cands, *other_k])
    assert both is not None and both.separated and both.ks == (2, 5)
    assert both.overhead == pytest.approx(0.1, abs=1e-6)
    assert both.per_token == pytest.approx(0.02, abs=1e-6)


def test_a_prior_from_stored_runs_separates_what_one_k_cannot() -> None:
    b, c = 0.06, 0.04
    own = [candidate(n, BASES[n], tau, m, b, c, k=5) for n, (tau, m) in SHAPES.items()]
    stored = cost_points(
        BASES, [candidate(n, BASES[n], 1.3, 0.8, b, c, k=2) for n in ("coding", "math")]
    )
    prior = CostPrior(tuple(stored), ("20261130T100649Z-ngram",))
    alone = fit_cost(BASES, own)
    pooled = fit_cost(BASES, own, prior=prior)
    assert alone is not None and not alone.separated
    assert pooled is not None and pooled.separated and pooled.prior_observations == 2
    assert pooled.overhead == pytest.approx(b, abs=1e-6) and pooled.per_token == pytest.approx(c)
    assert "2 from stored runs 20261130T100649Z-ngram" in pooled.describe()
    assert "20261130T100649Z-ngram" in prior.text
    # Once the run measured two k of its own, the prior is left out.
    two = [*own, *(candidate(n, BASES[n], 1.2, 0.5, b, c, k=3) for n in BASES)]
    mine = fit_cost(BASES, two, prior=prior)
    assert mine is not None and mine.separated and mine.prior_observations == 0


def test_widen_scales_a_prompt_types_band() -> None:
    fit = fit_cost(
        BASES, [candidate(n, BASES[n], t, m, 0.08, 0.03) for n, (t, m) in SHAPES.items()]
    )
    s = S(3, 2, 3)
    replays = {
        "math": {s: stats_for(s, tau=1.6, m=2.4)},
        "coding": {s: stats_for(s, tau=1.6, m=2.4)},
    }
    plain = predict(BASES, replays, fit, restart_sd=0.03)
    wide = predict(BASES, replays, fit, restart_sd=0.03, widen={"math": 2.0})
    assert wide["coding"][s].tokens_per_s_band == plain["coding"][s].tokens_per_s_band
    (lo, hi), (wlo, whi) = plain["math"][s].tokens_per_s_band, wide["math"][s].tokens_per_s_band
    assert wide["math"][s].tokens_per_s == plain["math"][s].tokens_per_s
    assert wlo < lo and whi > hi
