"""Statistics for baseline vs candidate comparisons. Pure functions over per-request values.

A verdict is decided in one place, :func:`decide`, from the interval of the change
(interval.py → `nested_interval`: requests nested within server starts) against the margin
(the minimum effect), adjusted for the family of comparisons:

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

from ..variance.power import MAX_STARTS, starts_to_decide
from ..variance.restarts import RestartNoise
from ..variance.spending import look_slots
from .interval import Interval, Question, center, nested_interval, stop_overstated

__all__ = [
    "Comparison",
    "RestartNoise",
    "Verdict",
    "compare_family",
    "decide",
    "holm_adjust",
    "min_achievable_p",
    "minimum_requests",
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
        base_center = center(q.baseline)
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
            if verdict in (Verdict.REGRESSED, Verdict.IMPROVED):
                reason += _early_stop(q, interval, n_noise, alpha / m, min_effect)
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


def _early_stop(
    q: Question, interval: Interval, noise: RestartNoise, one_sided: float, min_effect: float
) -> str:
    """What the reason says of a call stopped before its cell's planned slots: what a cell that
    stops there prints on average, at the printed change and at the interval's end nearer no
    change (interval.py → `stop_overstated`)."""
    found = stop_overstated(q, interval, noise=noise, one_sided=one_sided, min_effect=min_effect)
    if found is None:
        return ""
    below = interval.estimate < 0
    near = interval.high if below else interval.low

    def printed(change: float, over: float) -> str:
        return _pct(math.expm1(change - over if below else change + over))

    look, looks = len(q.looks or ()), len(look_slots(q.planned_slots))
    return (
        f"; stopped early, at look {look} of {looks}: a cell stopping here prints "
        f"{printed(interval.estimate, found[0])} on average were the "
        f"change the printed {_pct(math.expm1(interval.estimate))}, and "
        f"{printed(near, found[1])} were it {_pct(math.expm1(near))}, the interval's end "
        f"nearer no change (simulated on its looks)"
    )


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


def _check_params(alpha: float, min_effect: float) -> None:
    if not 0.0 < alpha < 1.0:  # also rejects NaN
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not (min_effect >= 0.0 and math.isfinite(min_effect)):
        raise ValueError(f"min_effect must be a finite number >= 0, got {min_effect!r}")
