"""Side by side, the unit is the slot: two servers started as a pair, each slot's prompt sent to
both, one right after the other. Pure.

Each slot gives one difference `d = log(candidate) - log(baseline)`: the prompt's own level and
the drift both servers share cancel in it. Within pair `p`,

    d = change + offset_p + slot noise

where the pair's offset is the difference of its two servers' start effects (and, where the
two places differ, the position's bias), and the slot noise is each server's own part of the
request. A pair's mean slot difference then has variance `omega^2 + sigma_d^2 / k`:

- `sigma_d^2`, the slot-to-slot spread within pairs: many degrees of freedom, from this run;
- `omega^2`, the pairs' offsets: from this run's own pairs where there are two or more (their
  means' spread, `pairs - 1` degrees of freedom), and from outside: side-by-side A/A pairs
  (a profile entry of the "together" design) or any restart noise known of the host, as
  `2 sigma_b^2`, pooled by degrees of freedom as the starts' evidence is (restarts.py).

Outside knowledge is kept per server, as a `RestartNoise` whose `sd` is one server's start
effect and whose `residual` is half a slot difference's variance: so a pair's variance is
`2 tau^2` for the `tau^2` of one start, and the design's power (power.py) reads it unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from .restarts import (
    CONFLICT_P,
    Evidence,
    RestartNoise,
    _between,
    over_keys,
    pool,
    pooled,
)


@dataclass(frozen=True)
class PairFit:
    """The slots of a comparison's pairs: each pair's mean difference, and the spread."""

    means: np.ndarray  # per pair, the mean of its slots' differences
    slots: np.ndarray  # per pair, how many slots
    slot_var: float  # of one slot's difference about its pair's mean; nan without df
    slot_df: float

    @property
    def pairs(self) -> int:
        return int(self.means.size)

    @property
    def estimate(self) -> float:
        return float(self.means.mean())

    @property
    def within(self) -> float:
        """The slot noise's share of one pair's mean (of its variance)."""
        if not self.slot_df:
            return 0.0
        return self.slot_var * float(np.mean(1.0 / self.slots))

    def spread(self, *, about_zero: bool = False) -> tuple[float, float]:
        """The pairs' means' sum of squares and its degrees of freedom: about their mean, or
        about zero where the two sides run one configuration (an A/A run)."""
        if about_zero:
            return float(np.sum(self.means**2)), float(self.pairs)
        if self.pairs < 2:
            return 0.0, 0.0
        return float(np.sum((self.means - self.means.mean()) ** 2)), float(self.pairs - 1)


def fit_pairs(
    diffs: Sequence[np.ndarray], prompts: Sequence[Sequence[object]] | None = None
) -> PairFit | None:
    """Per pair, its slots' log differences; None where no pair has a slot.

    `prompts`: each slot's prompt. Where prompts repeat (a pair sends each more than once, or
    two pairs send the same), each prompt's own difference is fitted and taken out of the slot
    noise, as the starts' analysis takes out each prompt's level: a candidate whose speed-up
    differs from prompt to prompt (n-gram's: from 0.3x to 2x over one prompt set on the H200)
    is then not taken for noise. The estimate is each pair's difference at the prompt set's
    mean. Without repeats, the slot noise holds both.
    """
    found = [np.asarray(d, dtype=float) for d in diffs if len(d)]
    if not found:
        return None
    fitted = _with_prompts(diffs, prompts) if prompts is not None else None
    if fitted is not None:
        return fitted
    df = sum(d.size - 1 for d in found)
    ss = sum(float(np.sum((d - d.mean()) ** 2)) for d in found)
    return PairFit(
        means=np.array([d.mean() for d in found]),
        slots=np.array([d.size for d in found], dtype=float),
        slot_var=ss / df if df else math.nan,
        slot_df=float(df),
    )


def _with_prompts(
    diffs: Sequence[np.ndarray], prompts: Sequence[Sequence[object]]
) -> PairFit | None:
    """Least squares on `d = pair + prompt + slot noise`; None where no prompt repeats."""
    kept = [(np.asarray(d, dtype=float), list(p)) for d, p in zip(diffs, prompts, strict=True)]
    kept = [(d, p) for d, p in kept if d.size and len(p) == d.size]
    labels = sorted({label for _, p in kept for label in p}, key=repr)
    n, pairs = sum(d.size for d, _ in kept), len(kept)
    if not kept or len(labels) < 2 or n - pairs - (len(labels) - 1) <= 0:
        return None
    column = {label: pairs + j for j, label in enumerate(labels[1:])}
    x = np.zeros((n, pairs + len(labels) - 1))
    r = 0
    for i, (_, p) in enumerate(kept):
        for label in p:
            x[r, i] = 1.0
            if label in column:
                x[r, column[label]] = 1.0
            r += 1
    y = np.concatenate([d for d, _ in kept])
    beta, _, rank, _ = np.linalg.lstsq(x, y, rcond=None)
    df = n - int(rank)
    if rank < x.shape[1] or df <= 0:
        return None
    residual = y - x @ beta
    prompt_mean = float(np.sum(beta[pairs:])) / len(labels)  # the reference prompt's is 0
    return PairFit(
        means=beta[:pairs] + prompt_mean,
        slots=np.array([d.size for d, _ in kept], dtype=float),
        slot_var=float(residual @ residual) / df,
        slot_df=float(df),
    )


def pair_noise(fit: PairFit, *, about_zero: bool, source: str) -> RestartNoise | None:
    """What pairs measure of the host, per server (the module's docstring): one start's effect
    from the spread of the pairs' means less the slot noise, halved; None without df."""
    ss, df = fit.spread(about_zero=about_zero)
    if not df:
        return None
    spread = ss / df / 2.0
    within = fit.within / 2.0
    residual = fit.slot_var / 2.0 if fit.slot_df else None
    between = max(0.0, spread - within)
    return RestartNoise(math.sqrt(between), df, source, True, spread, within, residual)


def pair_variance(
    fit: PairFit, *, outside: RestartNoise, twin: PairFit | None = None
) -> tuple[float, float, list[Evidence]]:
    """The variance of one pair's mean difference, its degrees of freedom, and the evidence it
    was pooled from: this run's pairs (two or more) and the outside knowledge. `twin`: a
    second baseline's slots less the baseline's, per pair (an A/A pair of this run: its
    offsets' spread about zero, one df a twin, with its own slot noise's share)."""
    within = fit.within
    ss, df = fit.spread()
    if twin is not None and twin.pairs:
        twin_ss, twin_df = twin.spread(about_zero=True)
        ss, df = ss + twin_ss + twin_df * (within - twin.within), df + twin_df
    own = (
        Evidence(ss / df, df, "this run's pairs" + (" and its twin" if twin else ""))
        if df
        else None
    )
    found = pair_outside_evidence(outside, within=within, slot_df=fit.slot_df)
    return pool(own, found, set_aside=bool(df) and _contradicts_pairs(outside, ss, df, within))


def pair_outside_evidence(outside: RestartNoise, *, within: float, slot_df: float) -> Evidence:
    """The outside knowledge as the variance of one pair's mean: two servers' start effects and
    this run's slot noise. Its degrees of freedom (Satterthwaite) never fall below the fewest of
    its parts' own, nor below 1."""
    offsets = 2.0 * max(0.0, _between(outside))
    value = offsets + within
    if outside.df <= 0 or value <= 0:
        return Evidence(value, 0.0, outside.source)
    offset_part = (2.0 * outside.start_variance) ** 2 / outside.df
    within_part = within**2 / slot_df if slot_df else (math.inf if within else 0.0)
    found = value**2 / (offset_part + within_part)
    floor = min(outside.df, slot_df) if within and slot_df else outside.df
    return Evidence(value, max(1.0, floor, found), outside.source)


def design_slot_df(pairs: int, slots: int, prompts: int) -> float:
    """The slot noise's degrees of freedom `fit_pairs` will have: every slot less one mean per
    pair, and where prompts repeat (more slots a pair than prompts), one level per prompt
    less the reference's."""
    n = pairs * slots
    fitted = pairs + (prompts - 1 if 1 < prompts < slots else 0)
    return float(max(0, n - fitted))


def expected_pair_variance(
    outside: RestartNoise,
    *,
    slot_var: float,
    slots: int,
    slot_df: float,
    pairs: int,
    twins: int = 0,
) -> tuple[float, float]:
    """What `pair_variance` will give before the run, for `pairs` pairs of `slots` slots whose
    one difference has variance `slot_var`: the variance of the estimate (the pairs' mean) and
    its degrees of freedom. The same pooling: this run's own pairs (two or more) as the
    offsets' expected spread with `pairs - 1` df, and the outside knowledge with its slot
    noise (pair_outside_evidence). One pair's slots tell the slot noise, not its offset.
    `twins`: a twin baseline served beside each pair adds one df of offsets measured in this
    run (`pair_variance`'s `twin`)."""
    within = slot_var / max(1, slots)
    expected = 2.0 * max(0.0, _between(outside)) + within
    own_df = float(max(0, pairs - 1) + twins)
    own = Evidence(expected, own_df, "this run's pairs") if own_df else None
    found = pair_outside_evidence(outside, within=within, slot_df=slot_df)
    tau2, df, _ = pool(own, found, set_aside=False)
    return tau2 / max(1, pairs), df


def _contradicts_pairs(outside: RestartNoise, ss: float, df: float, within: float) -> bool:
    """An assumed restart noise that this run's own pairs rule out (p < CONFLICT_P) is set
    aside, as restarts.py does for starts."""
    if outside.measured:
        return False
    expected = 2.0 * outside.sd**2 + within
    return expected > 0 and float(_st.chi2.sf(ss / expected, df)) < CONFLICT_P


def pair_noise_of(
    configurations: Sequence[tuple[Sequence[PairFit], bool]], *, source: str
) -> RestartNoise | None:
    """What a run's pairs measured, per server: each configuration's pairs (with whether it is
    the original's again, an A/A arm) over its keys. A pair's offset is shared by its keys, so
    they are averaged and the configuration counts its pairs' degrees of freedom once; the
    configurations pool by df (restarts.pooled)."""
    estimates = []
    for fits, about_zero in configurations:
        found = [(n, f) for f in fits if (n := pair_noise(f, about_zero=about_zero, source=source))]
        if found:
            parts = [(n.start_variance, n.within, n.df) for n, _ in found]
            residuals = [(n.residual, f.slot_df) for n, f in found if n.residual is not None]
            estimates.append(over_keys(parts, residuals, source=source))
    return pooled(estimates, source=source)


@dataclass(frozen=True)
class PositionBias:
    """Side by side, an A/A run: how much faster the second place ran than the first (log)."""

    estimate: float
    low: float | None  # its 90% interval; None from one pair
    high: float | None
    pairs: int
    alternated: bool  # the places alternated between pairs

    def text(self) -> str:
        where = (
            f" [{math.expm1(self.low):+.1%}, {math.expm1(self.high):+.1%}] (90% interval)"
            if self.low is not None and self.high is not None
            else " (one pair: no interval)"
        )
        how = (
            "the places alternated between pairs, so it weighs on both arms alike"
            if self.alternated
            else "the places did not alternate: each arm kept its own"
        )
        return (
            f"the second place ran {math.expm1(self.estimate):+.1%}{where} beside the first, "
            f"over {self.pairs} A/A pair{'s' if self.pairs != 1 else ''}; {how}"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "pairs": self.pairs,
            "alternated": self.alternated,
        }


def bias_of(second_minus_first: Sequence[float], *, alternated: bool) -> PositionBias | None:
    """From each A/A pair's mean log difference, the second place's less the first's."""
    values = np.asarray(second_minus_first, dtype=float)
    if values.size == 0:
        return None
    estimate = float(values.mean())
    if values.size < 2:
        return PositionBias(estimate, None, None, 1, alternated)
    half = (
        float(_st.t.ppf(0.95, values.size - 1)) * float(values.std(ddof=1)) / math.sqrt(values.size)
    )
    return PositionBias(estimate, estimate - half, estimate + half, int(values.size), alternated)
