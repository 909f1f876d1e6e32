"""The interval of the change: log(candidate / baseline) of one Question, with its uncertainty.

The unit of replication is the server start, not the request: every request of one start
shares that start's shift (thread placement, memory layout, clocks, neighbours). So each
metric is compared on the log scale through the mean of each start, and the uncertainty of a
start's mean has two parts: the between-start variance (the restart noise) and the within-start
variance over its requests. Side by side, the pairs' slots give a second analysis
(analysis/variance/pairs.py); the narrower of the two is kept, and where the stop rule looked
at the one pair, both take its last look's group-sequential boundary. The verdict is read from
it in stats.py → `decide`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..variance.pairs import PairFit, fit_pairs, pair_variance
from ..variance.restarts import (
    RestartNoise,
    StartFit,
    fit_starts,
    interval_variance,
    t_quantile,
)
from ..variance.spending import fractions_of, look_times, nominal_level
from ..variance.stop_bias import overstated

__all__ = [
    "Interval",
    "Question",
    "Watched",
    "arm_figures",
    "center",
    "nested_interval",
    "paired_interval",
    "sequential_confidence",
    "stop_overstated",
    "watched",
]


@dataclass(frozen=True)
class Interval:
    """The change of a metric, candidate against baseline, on the log scale."""

    estimate: float
    low: float
    high: float
    se: float
    df: float
    confidence: float
    by: str = "starts"  # "pairs": side by side, each slot's difference (variance/pairs.py)

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return math.exp(min(self.low, 700.0)), math.exp(min(self.high, 700.0))


@dataclass(frozen=True)
class Question:
    """One comparison to make: a metric of one prompt type, values grouped by server start."""

    key: str
    metric: str
    higher_is_better: bool
    baseline: Sequence[Sequence[float]]  # per start, the per-request values (> 0)
    candidate: Sequence[Sequence[float]]
    # Per start, the prompt each request sent (aligned with the values); None: not recorded
    baseline_prompts: Sequence[Sequence[int | None]] | None = None
    candidate_prompts: Sequence[Sequence[int | None]] | None = None
    # Other starts of this run in the baseline's configuration (the original started again:
    # an A/A arm, the drift check's baseline): not compared, but they tell the restart noise
    kin: Sequence[Sequence[float]] = ()
    kin_prompts: Sequence[Sequence[int | None]] | None = None
    same_configuration: bool = False  # both sides run the original's configuration
    # Side by side: per pair of starts served together, each shared slot's log(c) - log(b)
    pairs: Sequence[Sequence[float]] | None = None
    pair_prompts: Sequence[Sequence[object]] | None = None  # each slot's prompt(s), aligned
    # One pair watched by the stop rule (sequential.py): the slot counts it looked at, the last
    # the one analysed, and the cell's planned slots; the interval takes that look's boundary
    looks: Sequence[int] | None = None
    planned_slots: int = 0
    # Side by side with a twin: per pair, each slot's log(twin) - log(baseline), a second
    # baseline served beside (an A/A pair of this run: the offsets' evidence, never the change)
    twin: Sequence[Sequence[float]] | None = None
    twin_prompts: Sequence[Sequence[object]] | None = None

    @property
    def sides(
        self,
    ) -> list[tuple[Sequence[Sequence[float]], Sequence[Sequence[int | None]] | None]]:
        out = [(self.baseline, self.baseline_prompts), (self.candidate, self.candidate_prompts)]
        return out + ([(self.kin, self.kin_prompts)] if self.kin else [])

    @property
    def prompts(self) -> list[list[list[int]]] | None:
        """The prompt indices of every side (baseline, candidate, kin) when the requests pair
        by prompt: recorded for every request, and more than one prompt shared by the two
        compared sides."""
        sides = []
        for values, prompts in self.sides:
            if prompts is None or [len(p) for p in prompts] != [len(v) for v in values]:
                return None
            if any(i is None for start in prompts for i in start):
                return None
            sides.append([[int(i) for i in start if i is not None] for start in prompts])
        shared = {i for start in sides[0] for i in start} & {i for start in sides[1] for i in start}
        return sides if len(shared) > 1 else None


def _logs(groups: Sequence[Sequence[float]], name: str) -> list[np.ndarray]:
    """Per start, the log values; each finite and > 0, each start with at least one."""
    out = []
    for i, group in enumerate(groups):
        arr = np.asarray(group, dtype=float)
        if arr.ndim != 1 or arr.size == 0:
            raise ValueError(f"{name}: start {i} must hold a 1-D, non-empty list of values")
        if not np.all(np.isfinite(arr) & (arr > 0)):
            raise ValueError(f"{name}: start {i} has values that are not finite and > 0")
        out.append(np.log(arr))
    if not out:
        raise ValueError(f"{name}: no start")
    return out


def nested_interval(question: Question, *, noise: RestartNoise, confidence: float) -> Interval:
    """Interval of log(candidate / baseline), requests nested within server starts; side by
    side, within the pairs' slots too, where that is the narrower.

    Each start is summarised by its effect in `log value = start + prompt + residual` (the
    prompts' own levels removed where the requests pair by prompt; else its mean). The variance
    of a start's effect, τ², is pooled by degrees of freedom from this run's repeated starts and
    from `noise` (measured by stored runs, or assumed), each with the residual's share added
    (analysis/variance/restarts.py); the t quantile is taken on the pooled degrees of freedom.
    Where the stop rule watched the one pair, both analyses take its last look's boundary
    (`sequential_confidence`), and the narrower is kept there too.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    confidence = sequential_confidence(question, noise=noise, confidence=confidence)
    by_starts = _starts_interval(question, noise=noise, confidence=confidence)
    by_pairs = paired_interval(question, noise=noise, confidence=confidence)
    if by_pairs is None or _width(by_pairs) > _width(by_starts):
        return by_starts  # never wider than the same data analysed one arm at a time
    return by_pairs


@dataclass(frozen=True)
class Watched:
    """The looks the stop rule took at one pair: the slots of each, the cell's planned slots,
    and the change's variance at `n` slots, `offsets + slot_var / n` (this pair's fit)."""

    looks: tuple[int, ...]
    planned: int
    offsets: float
    slot_var: float  # nan: no slot noise known (the variance is then taken as 1 / n)

    def variance(self, n: int) -> float:
        return self.offsets + self.slot_var / n if math.isfinite(self.slot_var) else 1.0 / n

    @property
    def fractions(self) -> tuple[float, ...]:
        final = self.variance(max(self.planned, self.looks[-1]))
        return fractions_of([self.variance(n) for n in self.looks], final)

    def level(self, one_sided: float, look: int | None = None) -> float:
        """The one-sided nominal level of a look's boundary (the last, where None)."""
        k = len(self.looks) if look is None else look + 1
        times = look_times(self.looks[:k], self.planned)
        return nominal_level(self.fractions[:k], one_sided, times)


def watched(question: Question, *, noise: RestartNoise) -> Watched | None:
    """Where the stop rule looked at the question's one pair: its looks and variance; else
    None. The variance's parts are the pair's offset, pooled with the outside knowledge
    (pairs.py), less the slot part, and this pair's slot noise."""
    looks, planned = tuple(question.looks or ()), question.planned_slots
    fit = fit_pairs(
        [np.asarray(d, dtype=float) for d in question.pairs or ()], question.pair_prompts
    )
    if not looks or planned < 1 or fit is None or fit.pairs != 1:
        return None
    tau2, df, _ = pair_variance(fit, outside=noise, twin=_twin_fit(question))
    if not df or not math.isfinite(tau2):
        return None
    slot_var = fit.slot_var if fit.slot_df and math.isfinite(fit.slot_var) else math.nan
    return Watched(looks, planned, max(0.0, tau2 - fit.within), slot_var)


def sequential_confidence(question: Question, *, noise: RestartNoise, confidence: float) -> float:
    """Where the stop rule looked at the question's one pair: the confidence of its last
    look's group-sequential boundary (variance/spending.py), spending the same one-sided
    `(1 - confidence) / 2` over the looks; else `confidence` unchanged.

    The looks spend on the slots' schedule (`look_times`); their correlation comes from this
    pair's variance at each look, `omega^2 + sigma_d^2 / n` (`watched`)."""
    found = watched(question, noise=noise)
    if found is None:
        return confidence
    return 1.0 - 2.0 * found.level((1.0 - confidence) / 2.0)


def stop_overstated(
    question: Question,
    interval: Interval,
    *,
    noise: RestartNoise,
    one_sided: float,
    min_effect: float,
) -> tuple[float, float] | None:
    """Where the stop rule stopped the question's pair before its planned slots with a call
    beyond the margin: how much further from no change than the change a cell that stops at
    this look prints on average (log; variance/stop_bias.py), were the change the interval's
    estimate, and were it the interval's end nearer no change. On each look's standard error
    (the interval's, scaled by the pair's variance at that look) and half-width (what the stop
    rule saw: the pairs' interval on the slots sent by then, at that look's boundary, spending
    `one_sided`; the last look's, the interval's own); None where it did not stop early."""
    found = watched(question, noise=noise)
    if found is None or found.looks[-1] >= found.planned:
        return None
    if not (interval.df and math.isfinite(interval.se) and interval.se > 0):
        return None
    margin = min(min_effect, 0.999)
    low, high = math.log1p(-margin), math.log1p(margin)
    if not (interval.high < low or interval.low > high):
        return None
    below = interval.high < low
    last = found.variance(found.looks[-1])
    sds = [interval.se * math.sqrt(found.variance(n) / last) for n in found.looks]
    widths = [
        _look_width(question, found, j, noise=noise, one_sided=one_sided)
        for j in range(len(found.looks) - 1)
    ]
    widths.append((interval.high - interval.low) / 2.0)
    if not all(math.isfinite(w) for w in widths):
        return None
    near = interval.high if below else interval.low
    at = overstated(interval.estimate, sds, widths, low=low, high=high, below=below)
    return at, overstated(near, sds, widths, low=low, high=high, below=below)


def _look_width(
    question: Question, found: Watched, look: int, *, noise: RestartNoise, one_sided: float
) -> float:
    """The half-width the pairs' interval had at an earlier look, on the slots sent by then, at
    that look's boundary: what the stop rule saw there."""
    n = found.looks[look]
    pairs = [list(d)[:n] for d in question.pairs or ()]
    prompts = [list(p)[:n] for p in question.pair_prompts] if question.pair_prompts else None
    then = replace(question, pairs=pairs, pair_prompts=prompts, looks=found.looks[: look + 1])
    level = found.level(one_sided, look)
    at = paired_interval(then, noise=noise, confidence=1.0 - 2.0 * level)
    return (at.high - at.low) / 2.0 if at is not None else math.inf


def _twin_fit(question: Question) -> PairFit | None:
    """The twin's slots less the baseline's, fitted as pairs (pairs.py); None without one."""
    if not question.twin:
        return None
    return fit_pairs([np.asarray(d, dtype=float) for d in question.twin], question.twin_prompts)


def _width(interval: Interval) -> float:
    return interval.high - interval.low


def paired_interval(
    question: Question, *, noise: RestartNoise, confidence: float
) -> Interval | None:
    """Side by side: the change as the mean of each pair's mean slot difference, its variance
    the pairs' offsets and the slot-to-slot spread (analysis/variance/pairs.py); None where
    the arms were not served side by side."""
    fit = fit_pairs(
        [np.asarray(d, dtype=float) for d in question.pairs or ()], question.pair_prompts
    )
    if fit is None:
        return None
    estimate = fit.estimate
    tau2, df, _ = pair_variance(fit, outside=noise, twin=_twin_fit(question))
    if not df or not math.isfinite(tau2):
        return Interval(estimate, -math.inf, math.inf, math.inf, 0.0, confidence, by="pairs")
    se = math.sqrt(tau2 / fit.pairs)
    t = t_quantile(0.5 + confidence / 2, df)
    return Interval(estimate, estimate - t * se, estimate + t * se, se, df, confidence, "pairs")


def _starts_interval(question: Question, *, noise: RestartNoise, confidence: float) -> Interval:
    """Each server start on its own: the starts' effects, their variance pooled (restarts.py)."""
    fit, members = _fit(question)
    baseline, candidate = members[0], members[1]
    kin = members[2] if len(members) > 2 else []
    groups = (
        [baseline, candidate, kin] if question.same_configuration else [baseline + kin, candidate]
    )
    estimate = float(fit.effects[candidate].mean() - fit.effects[baseline].mean())
    tau2, df, _ = interval_variance(
        fit, baseline=baseline, candidate=candidate, groups=groups, outside=noise
    )
    if not df or not math.isfinite(tau2):
        return Interval(estimate, -math.inf, math.inf, math.inf, 0.0, confidence)
    se = math.sqrt(tau2 * (1.0 / len(baseline) + 1.0 / len(candidate)))
    t = t_quantile(0.5 + confidence / 2, df)
    return Interval(estimate, estimate - t * se, estimate + t * se, se, df, confidence)


_SIDE_NAMES = ("baseline", "candidate", "kin")


def _fit(question: Question) -> tuple[StartFit, list[list[int]]]:
    """The one fit of a question's starts (every side's), and each side's starts in it."""
    sides = [_logs(v, name) for (v, _), name in zip(question.sides, _SIDE_NAMES, strict=False)]
    starts = [g for side in sides for g in side]
    prompts = question.prompts
    fit = fit_starts(starts, [p for side in prompts for p in side] if prompts else None)
    index, members = 0, []
    for side in sides:
        members.append(list(range(index, index + len(side))))
        index += len(side)
    return fit, members


def arm_figures(question: Question) -> tuple[float, float]:
    """The two arms' figures of a question, as its Comparison gives them (baseline_center,
    candidate_center), without the interval: what a band check puts against its band."""
    fit, members = _fit(question)
    ratio = math.exp(float(fit.effects[members[1]].mean() - fit.effects[members[0]].mean()))
    base = center(question.baseline)
    return base, base * ratio


def center(starts: Sequence[Sequence[float]]) -> float:
    """The geometric mean of the starts' geometric means: the baseline's figure."""
    logs = _logs(starts, "center")
    return math.exp(float(np.mean([g.mean() for g in logs])))
