"""Statistics for baseline vs candidate comparisons. Pure functions over per-request values.

The unit of replication is the server start, not the request: every request of one start
shares that start's shift (thread placement, memory layout, clocks, neighbours). So each
metric is compared on the log scale through the mean of each start, and the uncertainty of a
start's mean has two parts: the between-start variance (the restart noise) and the within-start
variance over its requests.

A verdict is decided in one place, :func:`decide`, from the interval of the change against the
margin (the minimum effect), adjusted for the family of comparisons:

- *regressed*: the whole interval lies beyond -margin (on the bad side);
- *improved*: the whole interval lies beyond +margin (on the good side);
- *equivalent*: the whole interval lies inside ±margin;
- *inconclusive*: otherwise; the reason says what a decision would need.

A difference is called only where the requests' ranks also agree (a Mann-Whitney U test, Holm
over the family): a distribution-free guard that needs no normality, and that tells before
anything starts whether a design can reach a verdict at all (:func:`minimum_requests`).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

from ..variance.pairs import PairFit, fit_pairs, pair_variance
from ..variance.power import MAX_STARTS, starts_to_decide
from ..variance.restarts import (
    RestartNoise,
    StartFit,
    fit_starts,
    interval_variance,
    t_quantile,
)
from ..variance.spending import fractions_of, nominal_level

__all__ = [
    "Comparison",
    "Interval",
    "Question",
    "RestartNoise",
    "Verdict",
    "arm_figures",
    "compare_family",
    "decide",
    "holm_adjust",
    "min_achievable_p",
    "minimum_requests",
    "nested_interval",
]


class Verdict(enum.StrEnum):
    """Outcome of one baseline vs candidate comparison."""

    IMPROVED = "improved"
    REGRESSED = "regressed"
    EQUIVALENT = "equivalent"
    INCONCLUSIVE = "inconclusive"
    INSUFFICIENT = "insufficient samples"
    CONTAMINATED = "contaminated"  # other clients' requests in a measured window


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


@dataclass(frozen=True)
class Comparison:
    """The answer to a Question: the interval, the guard's p, and the verdict with its reason."""

    key: str
    metric: str
    higher_is_better: bool
    n_baseline: int  # requests
    n_candidate: int
    starts_baseline: int
    starts_candidate: int
    # The arms' figures, the table's (docs/statistics.md, "One figure per arm"): the baseline's
    # is the geometric mean of its starts' geometric means; the candidate's is that times the
    # estimated ratio, its level on the baseline's prompts. So the two reproduce the change.
    baseline_center: float
    candidate_center: float
    interval: Interval
    p_value: float  # Mann-Whitney U over the requests, two-sided
    p_adjusted: float  # Holm over the family
    noise: RestartNoise
    verdict: Verdict
    reason: str

    @property
    def ratio(self) -> float:
        return self.interval.ratio

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return self.interval.ratio_ci

    @property
    def change(self) -> float:
        """Relative change of the candidate, e.g. -0.14 for 14% lower."""
        return self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; non-finite floats become ``None``."""
        low, high = self.ratio_ci
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "starts_baseline": self.starts_baseline,
            "starts_candidate": self.starts_candidate,
            "baseline_center": _json_float(self.baseline_center),
            "candidate_center": _json_float(self.candidate_center),
            "ratio": _json_float(self.ratio),
            "ratio_ci": [_json_float(low), _json_float(high)],
            "confidence": self.interval.confidence,
            "analysed_by": self.interval.by,
            "change": _json_float(self.change),
            "p_value": _json_float(self.p_value),
            "p_adjusted": _json_float(self.p_adjusted),
            "restart_noise": self.noise.to_dict(),
            "verdict": self.verdict.value,
            "reason": self.reason,
        }


def _json_float(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# --------------------------------------------------------------------------- primitives


def min_achievable_p(n_baseline: int, n_candidate: int) -> float:
    """Smallest two-sided exact Mann-Whitney p for these sizes: 2 / C(n1+n2, n1).

    Returns 1.0 if either size is 0 (or the formula exceeds 1, e.g. 1 vs 1).
    """
    if n_baseline < 0 or n_candidate < 0:
        raise ValueError(f"sample sizes must be >= 0, got {n_baseline} and {n_candidate}")
    if n_baseline == 0 or n_candidate == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_baseline + n_candidate, n_baseline))


def minimum_requests(family_size: int, alpha: float) -> int:
    """Requests per arm and prompt type without which no difference can ever be called.

    Even perfectly separated requests give Mann-Whitney's smallest p; Holm over the family
    multiplies it by the family size. Below this many, every verdict would be inconclusive.
    """
    n = 2
    while family_size * min_achievable_p(n, n) >= alpha:
        n += 1
    return n


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order (monotone, capped at 1)."""
    ps = [float(p) for p in p_values]
    for p in ps:
        if not 0.0 <= p <= 1.0:  # also rejects NaN
            raise ValueError(f"p-values must lie in [0, 1], got {p!r}")
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


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
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    adjusted = sequential_confidence(question, noise=noise, confidence=confidence)
    if adjusted != confidence:  # the stop rule's boundary holds for the pairs' interval
        found = paired_interval(question, noise=noise, confidence=adjusted)
        if found is not None:
            return found
    by_starts = _starts_interval(question, noise=noise, confidence=confidence)
    by_pairs = paired_interval(question, noise=noise, confidence=confidence)
    if by_pairs is None or _width(by_pairs) > _width(by_starts):
        return by_starts  # never wider than the same data analysed one arm at a time
    return by_pairs


def sequential_confidence(question: Question, *, noise: RestartNoise, confidence: float) -> float:
    """Where the stop rule looked at the question's one pair: the confidence of its last
    look's group-sequential boundary (variance/spending.py), spending the same one-sided
    `(1 - confidence) / 2` over the looks; else `confidence` unchanged.

    The looks' information fractions come from this pair's variance at each look, `omega^2 +
    sigma_d^2 / n` (the pair's offset, pooled with the outside knowledge, and the slot noise)."""
    looks, planned = list(question.looks or ()), question.planned_slots
    fit = fit_pairs(
        [np.asarray(d, dtype=float) for d in question.pairs or ()], question.pair_prompts
    )
    if not looks or planned < 1 or fit is None or fit.pairs != 1:
        return confidence
    tau2, df, _ = pair_variance(fit, outside=noise, twin=_twin_fit(question))
    if not df or not math.isfinite(tau2):
        return confidence
    slot_var = fit.slot_var if fit.slot_df and math.isfinite(fit.slot_var) else math.nan
    offsets = max(0.0, tau2 - fit.within)

    def variance(n: int) -> float:  # with no slot noise known, as if the slots were all
        return offsets + slot_var / n if math.isfinite(slot_var) else 1.0 / n

    fractions = fractions_of([variance(n) for n in looks], variance(max(planned, looks[-1])))
    return 1.0 - 2.0 * nominal_level(fractions, (1.0 - confidence) / 2.0)


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
    base = _center(question.baseline)
    return base, base * ratio


# --------------------------------------------------------------------------- the verdict


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def decide(
    interval: Interval,
    *,
    higher_is_better: bool,
    min_effect: float,
    p_adjusted: float,
    alpha: float,
    noise: RestartNoise,
    family: int = 1,
    starts: tuple[int, int] = (1, 1),
    same_configuration: bool = False,
) -> tuple[Verdict, str]:
    """Where a verdict is decided: the interval of the change against the ±min_effect margin.

    `family` (the comparisons the interval is adjusted for), `starts` (per arm) and
    `same_configuration` (an A/A comparison: its starts measure the restart noise) only shape
    what an undecided verdict says it would take."""
    low, high = (math.expm1(min(x, 700.0)) for x in (interval.low, interval.high))
    by = " by pairs" if interval.by == "pairs" else ""
    where = f"the {interval.confidence:.2%} interval of the change{by} [{_pct(low)}, {_pct(high)}]"
    if not (math.isfinite(low) and math.isfinite(high)):
        return Verdict.INSUFFICIENT, (
            "no interval: one request per start and no restart noise known; take more requests"
        )
    margin = f"±{min_effect:.0%} margin"
    bad = high < -min_effect if higher_is_better else low > min_effect
    good = low > min_effect if higher_is_better else high < -min_effect
    ranks = f"ranks p_adj={p_adjusted:.3g}"
    if bad or good:
        if p_adjusted >= alpha:
            return Verdict.INCONCLUSIVE, (
                f"{where} lies beyond the {margin}, but the requests' ranks do not confirm "
                f"it ({ranks} >= {alpha:g}); take more requests"
            )
        verdict = Verdict.REGRESSED if bad else Verdict.IMPROVED
        side = "worse" if bad else "better"
        return verdict, f"{where} lies wholly beyond the {margin}, {side} ({ranks})"
    if -min_effect < low and high < min_effect:
        return Verdict.EQUIVALENT, f"{where} lies inside the {margin}"
    return Verdict.INCONCLUSIVE, f"{where} straddles the {margin}; " + _what_it_needs(
        interval,
        min_effect=min_effect,
        noise=noise,
        family=family,
        starts=starts,
        alpha=alpha,
        same_configuration=same_configuration,
    )


def _what_it_needs(
    interval: Interval,
    *,
    min_effect: float,
    noise: RestartNoise,
    family: int,
    starts: tuple[int, int],
    alpha: float,
    same_configuration: bool = False,
) -> str:
    """What would decide it: starts per arm, were the change to stay where it is now."""
    needed = starts_to_decide(
        estimate=interval.estimate,
        se=interval.se,
        df=interval.df,
        starts=starts,
        family=family,
        alpha=alpha,
        margin=min_effect,
    )
    now = f"{starts[1]} start{'s' if starts[1] != 1 else ''} per arm now"
    if needed is None:
        text = (
            f"the change ({_pct(interval.ratio - 1)}) sits too near the margin to settle in "
            f"{MAX_STARTS} starts per arm ({now})"
        )
    else:
        text = (
            f"it would take about {needed} starts per arm (--spec-repeats {needed}; {now}), "
            f"were the change to stay near {_pct(interval.ratio - 1)}"
        )
    if not noise.measured and same_configuration:
        text += (
            "; the restart noise is assumed outside this run, and its own starts of the "
            "original measure it"
        )
    elif not noise.measured and noise.is_prior:
        text += (
            "; the restart noise is a prior from another machine: an A/A run here "
            "(--spec-config baseline --spec-repeats 4) measures it"
        )
    elif not noise.measured:
        text += (
            "; the restart noise is assumed: an A/A run (--spec-config baseline --spec-repeats "
            "4) measures it"
        )
    return text


def compare_family(
    questions: Sequence[Question],
    *,
    alpha: float,
    min_effect: float,
    noise: dict[str, RestartNoise],
) -> list[Comparison]:
    """Answer every question of a family; the intervals and the guard adjusted for its size.

    Each interval is two-sided at 1 - 2·alpha/m, so that each one-sided claim (regressed,
    improved) errs with probability at most alpha/m, and the family at most alpha (Bonferroni).
    The guard's p-values are Holm-adjusted over the same family.
    """
    _check_params(alpha, min_effect)
    m = len(questions)
    if not m:
        return []
    confidence = 1 - 2 * alpha / m
    raw = [_rank_p(q) for q in questions]
    adjusted = holm_adjust(raw)
    out = []
    for q, p, p_adj in zip(questions, raw, adjusted, strict=True):
        n_noise = noise[q.metric]
        interval = nested_interval(q, noise=n_noise, confidence=confidence)
        base_center = _center(q.baseline)
        verdict, reason = decide(
            interval,
            higher_is_better=q.higher_is_better,
            min_effect=min_effect,
            p_adjusted=p_adj,
            alpha=alpha,
            noise=n_noise,
            family=m,
            starts=(len(q.baseline), len(q.candidate)),
            same_configuration=q.same_configuration,
        )
        if q.looks and interval.confidence != confidence:
            reason += (
                f"; looked at {', '.join(map(str, q.looks))} of {q.planned_slots} slots, the "
                f"interval at the last look's sequential boundary"
            )
        out.append(
            Comparison(
                key=q.key,
                metric=q.metric,
                higher_is_better=q.higher_is_better,
                n_baseline=sum(len(s) for s in q.baseline),
                n_candidate=sum(len(s) for s in q.candidate),
                starts_baseline=len(q.baseline),
                starts_candidate=len(q.candidate),
                baseline_center=base_center,
                candidate_center=base_center * interval.ratio,
                interval=interval,
                p_value=p,
                p_adjusted=p_adj,
                noise=n_noise,
                verdict=verdict,
                reason=reason,
            )
        )
    return out


def _rank_p(q: Question) -> float:
    """Mann-Whitney over the requests; when they pair by prompt, over their aligned values
    (each log value less its prompt's mean over both arms: Hodges-Lehmann alignment), so that
    the spread between prompts does not hide a shift."""
    b = np.concatenate([np.asarray(s, dtype=float) for s in q.baseline])
    c = np.concatenate([np.asarray(s, dtype=float) for s in q.candidate])
    if b.size == 0 or c.size == 0:
        return 1.0
    prompts = q.prompts
    if prompts is not None:
        prompts = prompts[:2]
        b, c = np.log(b), np.log(c)
        pb = np.concatenate([np.asarray(s, dtype=int) for s in prompts[0]])
        pc = np.concatenate([np.asarray(s, dtype=int) for s in prompts[1]])
        both, labels = np.concatenate([b, c]), np.concatenate([pb, pc])
        centre = {label: both[labels == label].mean() for label in set(labels.tolist())}
        b = b - np.array([centre[label] for label in pb.tolist()])
        c = c - np.array([centre[label] for label in pc.tolist()])
    p = float(_st.mannwhitneyu(b, c, alternative="two-sided", method="auto").pvalue)
    return p if math.isfinite(p) else 1.0


def _center(starts: Sequence[Sequence[float]]) -> float:
    logs = _logs(starts, "center")
    return math.exp(float(np.mean([g.mean() for g in logs])))


def _check_params(alpha: float, min_effect: float) -> None:
    if not 0.0 < alpha < 1.0:  # also rejects NaN
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not (min_effect >= 0.0 and math.isfinite(min_effect)):
        raise ValueError(f"min_effect must be a finite number >= 0, got {min_effect!r}")
