"""Side by side, analysed by pairs (analysis/variance/pairs.py, interval.paired_interval): each
slot's log(candidate/baseline), the drift both servers share cancelled in it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_specdecode.analysis.variance.pairs import (
    fit_pairs,
    pair_noise,
    pair_outside_evidence,
)
from pytest_specdecode.analysis.variance.restarts import RestartNoise, outside_evidence
from pytest_specdecode.analysis.verdict.interval import (
    Question,
    _starts_interval,
    nested_interval,
    paired_interval,
)

CONFIDENCE = 1 - 2 * 0.05 / 8  # four prompt types, two metrics


def drift(n: int, sd: float, phi: float, rng: np.random.Generator) -> np.ndarray:
    out = np.zeros(n)
    out[0] = rng.normal(0, sd)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + rng.normal(0, sd * math.sqrt(1 - phi**2))
    return out


def side_by_side(
    rng: np.random.Generator,
    *,
    pairs: int = 1,
    slots: int = 48,
    change: float = 0.0,
    start_sd: float = 0.015,
    request_sd: float = 0.09,
    drift_sd: float = 0.10,
    prompts: int = 12,
) -> Question:
    """Pairs of starts on one host: both servers of a pair see its drift at each slot."""
    level = rng.normal(0, 0.1, prompts)
    base, cand, base_p, cand_p, diffs = [], [], [], [], []
    for _ in range(pairs):
        shared = drift(slots, drift_sd, 0.88, rng)
        prompt = np.arange(slots) % prompts
        own_b, own_c = rng.normal(0, start_sd, 2)
        b = 30 * np.exp(own_b + level[prompt] + shared + rng.normal(0, request_sd, slots))
        c = 30 * np.exp(change + own_c + level[prompt] + shared + rng.normal(0, request_sd, slots))
        base.append(list(b))
        cand.append(list(c))
        base_p.append(list(prompt))
        cand_p.append(list(prompt))
        diffs.append(list(np.log(c) - np.log(b)))
    return Question(
        "coding", "throughput", True, base, cand, base_p, cand_p, pairs=diffs,
        same_configuration=change == 0.0,
    )  # fmt: skip


# A side-by-side A/A run kept the drift in its starts' residual: its restart noise clipped to 0
# (spread below within), the failure that gave Satterthwaite 0.1-0.5 df and intervals to 1e304.
CLIPPED = RestartNoise(0.0, 1.0, "an A/A pair", True, spread=0.004, within=0.006, residual=0.02)


@pytest.mark.parametrize("seed", range(20))
def test_one_aa_pair_with_shared_drift_gives_a_finite_interval_no_wider_than_by_starts(seed):
    q = side_by_side(np.random.default_rng(seed))
    by_starts = _starts_interval(q, noise=CLIPPED, confidence=CONFIDENCE)
    by_pairs = paired_interval(q, noise=CLIPPED, confidence=CONFIDENCE)
    chosen = nested_interval(q, noise=CLIPPED, confidence=CONFIDENCE)
    assert by_pairs is not None and math.isfinite(by_pairs.low) and math.isfinite(by_pairs.high)
    assert by_pairs.df >= 1
    assert chosen.high - chosen.low <= by_starts.high - by_starts.low
    # the drift both servers shared is not in the pairs' interval: far narrower here
    assert chosen.by == "pairs" and (chosen.high - chosen.low) < (by_starts.high - by_starts.low)
    # Its one df of outside knowledge keeps it wide. Where the servers' start effects are as
    # small as the H200's (0.1%), A/A pairs that measured them with more df (here 8) bring
    # one pair's interval under ±7% wide (here 48 slots of 9% requests).
    q = side_by_side(np.random.default_rng(seed), start_sd=0.001)
    known = RestartNoise(0.002, 8.0, "8 A/A pairs", True, spread=0.0002, within=0.0002)
    found = nested_interval(q, noise=known, confidence=CONFIDENCE)
    assert found.by == "pairs" and (found.high - found.low) / 2 < 0.07, found


def test_the_shared_drift_cancels_in_pairs():
    """The same requests with and without a large shared drift: the pairs' interval barely
    moves; by starts, it widens with the drift."""
    calm = side_by_side(np.random.default_rng(7), drift_sd=0.0)
    drifted = side_by_side(np.random.default_rng(7), drift_sd=0.3)
    width = {
        name: {
            by: (i.high - i.low)
            for by, i in (
                ("pairs", paired_interval(q, noise=CLIPPED, confidence=CONFIDENCE)),
                ("starts", _starts_interval(q, noise=CLIPPED, confidence=CONFIDENCE)),
            )
        }
        for name, q in (("calm", calm), ("drifted", drifted))
    }
    assert width["drifted"]["pairs"] == pytest.approx(width["calm"]["pairs"], rel=0.05)
    assert width["drifted"]["starts"] > 1.5 * width["calm"]["starts"]


def test_no_interval_is_wider_than_by_starts_where_nothing_is_shared():
    """Where the servers share nothing (no drift, independent requests), pairs gain nothing:
    the interval is never the wider of the two."""
    for seed in range(30):
        q = side_by_side(np.random.default_rng(seed), drift_sd=0.0, request_sd=0.05)
        by_starts = _starts_interval(q, noise=CLIPPED, confidence=CONFIDENCE)
        chosen = nested_interval(q, noise=CLIPPED, confidence=CONFIDENCE)
        assert chosen.high - chosen.low <= by_starts.high - by_starts.low + 1e-12


def test_the_degrees_of_freedom_never_fall_below_the_evidence_nor_below_one():
    for outside in (CLIPPED, RestartNoise(0.0, 0.4, "few", True, spread=0.01, within=0.02)):
        starts = outside_evidence(outside, within=0.0004, residual_df=40)
        pairs = pair_outside_evidence(outside, within=0.0004, slot_df=40)
        for found in (starts, pairs):
            assert found.df >= max(1.0, min(outside.df, 40.0)), found
    # and an assumption keeps its weight
    assumed = RestartNoise.assumed(0.05)
    assert pair_outside_evidence(assumed, within=0.0004, slot_df=40).df >= 8.0


def test_pairs_measure_the_offset_and_the_slot_noise():
    """Many A/A pairs of a known offset and slot noise: the per-server figures come back."""
    rng = np.random.default_rng(3)
    start_sd, request_sd = 0.03, 0.06
    diffs = [
        rng.normal(0, start_sd * math.sqrt(2)) + rng.normal(0, request_sd * math.sqrt(2), 40)
        for _ in range(400)
    ]
    fit = fit_pairs(diffs)
    assert fit is not None and fit.pairs == 400 and fit.slot_df == 400 * 39
    noise = pair_noise(fit, about_zero=True, source="sim")
    assert noise is not None and noise.df == 400
    assert noise.sd == pytest.approx(start_sd, rel=0.15)
    assert math.sqrt(noise.residual or 0) == pytest.approx(request_sd, rel=0.05)
    # one pair of a candidate measures nothing of the offsets; an A/A pair, one df
    one = fit_pairs(diffs[:1])
    assert one is not None
    assert pair_noise(one, about_zero=False, source="sim") is None
    assert pair_noise(one, about_zero=True, source="sim").df == 1  # type: ignore[union-attr]


def test_an_aa_run_side_by_side_reports_its_places_own_speeds(tmp_path) -> None:
    """The second place 8% faster, the places alternated over four A/A pairs: the bias comes
    back from the record (noise.position_bias), and the run's checks name it."""
    from pytest_specdecode.analysis.run import analyze
    from pytest_specdecode.analysis.verdict import noise
    from pytest_specdecode.config.arms import AA_ARM, BASELINE
    from pytest_specdecode.report.rows import checks

    from ....support.synthetic import add_phase, record, settings

    s = settings(tmp_path, candidates=("baseline",), samples=12)
    rec = record(s)
    rng = np.random.default_rng(4)
    for p in range(4):
        swapped = p % 2 == 1
        names = (BASELINE, AA_ARM) if p == 0 else (f"{BASELINE}#{p + 1}", f"{AA_ARM}#{p + 1}")
        places = (1, 0) if swapped else (0, 1)
        phases = []
        for name, arm, place in zip(names, (BASELINE, AA_ARM), places, strict=True):
            rate = 20.0 * (1.08 if place == 1 else 1.0)
            phase = add_phase(rec, name, {"coding": rate, "math": rate}, arm=arm, seed=p)
            phase.position = place
            for m in phase.measurements.values():
                for i, x in enumerate(m.samples):
                    x.slot = i
                    x.e2e_s *= math.exp(rng.normal(0, 0.01))
            phases.append(phase)
        phases[0].together_with, phases[1].together_with = phases[1].name, phases[0].name
    bias = noise.position_bias(rec)["throughput"]
    assert bias.pairs == 4 and bias.alternated
    assert math.expm1(bias.estimate) == pytest.approx(0.08, abs=0.01)
    assert bias.low is not None and bias.low < bias.estimate < (bias.high or 0)
    shown = [c.text for c in checks(rec, analyze(rec))]
    assert any(t.startswith("Position bias side by side, throughput: the second place ran +")
               for t in shown), shown  # fmt: skip


def test_a_speedup_that_differs_by_prompt_is_not_taken_for_noise_where_prompts_repeat() -> None:
    """n-gram on the H200 ran from 0.3x to 2x of the baseline from one prompt to the next (one
    pair, 12 slots over 12 prompts: intervals of ±60%). Where each prompt is sent more than once
    (48 slots over 12 prompts), each prompt's own difference is fitted, and the interval is the
    noise's, around the prompt set's mean change."""
    rng = np.random.default_rng(11)
    prompts = 12
    own = rng.normal(0, 0.5, prompts)
    own -= own.mean()  # the prompt set's mean change is the change
    change = math.log(0.6)

    def one_pair(slots: int) -> Question:
        prompt = np.arange(slots) % prompts
        d = change + own[prompt] + rng.normal(0, 0.06, slots)
        base = 400 * np.exp(rng.normal(0, 0.05, slots))
        return Question(
            "coding", "throughput", True, [list(base)], [list(base * np.exp(d))],
            [list(prompt)], [list(prompt)], pairs=[list(d)], pair_prompts=[list(prompt)],
        )  # fmt: skip

    known = RestartNoise(0.002, 8.0, "8 A/A pairs", True, spread=0.0002, within=0.0002)
    once = paired_interval(one_pair(12), noise=known, confidence=CONFIDENCE)
    four_times = paired_interval(one_pair(48), noise=known, confidence=CONFIDENCE)
    assert once is not None and four_times is not None
    assert (once.high - once.low) / 2 > 0.3  # the prompts' own changes read as noise
    assert (four_times.high - four_times.low) / 2 < 0.1  # taken out
    assert four_times.low < change < four_times.high
