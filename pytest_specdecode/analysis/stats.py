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

__all__ = [
    "Comparison",
    "Interval",
    "Question",
    "RestartNoise",
    "Verdict",
    "compare_family",
    "decide",
    "holm_adjust",
    "min_achievable_p",
    "minimum_requests",
    "nested_interval",
    "restart_noise_from_starts",
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
class RestartNoise:
    """How much a metric moves between two starts of the same server (log scale, ~relative)."""

    sd: float
    df: float  # degrees of freedom of the estimate; math.inf for an assumed value
    source: str  # where it comes from, as the report says it

    @property
    def measured(self) -> bool:
        return math.isfinite(self.df)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sd": self.sd,
            "df": self.df if self.measured else None,
            "source": self.source,
            "measured": self.measured,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RestartNoise:
        df = data.get("df")
        return cls(float(data["sd"]), math.inf if df is None else float(df), data["source"])


@dataclass(frozen=True)
class Interval:
    """The change of a metric, candidate against baseline, on the log scale."""

    estimate: float
    low: float
    high: float
    se: float
    df: float
    confidence: float

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    @property
    def ratio_ci(self) -> tuple[float, float]:
        return math.exp(self.low), math.exp(self.high)


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

    @property
    def prompts(self) -> tuple[list[list[int]], list[list[int]]] | None:
        """The prompt indices of both sides when the requests pair by prompt: recorded for
        every request, and more than one prompt shared by the two sides."""
        sides = []
        for values, prompts in (
            (self.baseline, self.baseline_prompts),
            (self.candidate, self.candidate_prompts),
        ):
            if prompts is None or [len(p) for p in prompts] != [len(v) for v in values]:
                return None
            if any(i is None for start in prompts for i in start):
                return None
            sides.append([[int(i) for i in start if i is not None] for start in prompts])
        shared = {i for start in sides[0] for i in start} & {i for start in sides[1] for i in start}
        return (sides[0], sides[1]) if len(shared) > 1 else None


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
    baseline_center: float  # geometric mean of the starts' geometric means
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


def _within(groups: Sequence[np.ndarray]) -> tuple[float, float]:
    """Pooled within-start variance of the log values, and its degrees of freedom."""
    df = sum(g.size - 1 for g in groups)
    if df == 0:
        return math.nan, 0.0
    return sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / df, float(df)


def _satterthwaite(parts: Sequence[tuple[float, float]]) -> float:
    """Degrees of freedom of a sum of variance estimates, each (variance, df)."""
    total = sum(v for v, _ in parts)
    denominator = sum(v * v / df for v, df in parts if v > 0 and math.isfinite(df))
    if total <= 0 or denominator == 0:
        return math.inf
    return total * total / denominator


def nested_interval(
    baseline: Sequence[Sequence[float]],
    candidate: Sequence[Sequence[float]],
    *,
    noise: RestartNoise,
    confidence: float,
    prompts: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]] | None = None,
) -> Interval:
    """Interval of log(candidate / baseline), requests nested within server starts.

    Each start is summarised by the mean of its log values. The variance of a start's mean is
    the restart noise plus the within-start variance over its requests. Where an arm was
    started more than once, the spread of its start means measures that variance directly,
    pooled (weighted by degrees of freedom) with what the restart noise says when that was
    measured too; an assumed restart noise is used only where nothing was measured.

    With `prompts` (per start, the prompt of each request, as `Question.prompts` gives them)
    the design is paired: each start's summary is its effect in `log value = start + prompt +
    residual`, so the differences between prompts leave the comparison, and the within-start
    variance is the residual's (:func:`_paired_starts`).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    b, c = _logs(baseline, "baseline"), _logs(candidate, "candidate")
    paired = _paired_starts(b, c, prompts) if prompts else None
    if paired is not None:
        means, s_w2, df_w, contrast = paired
        inv_k = contrast / (1.0 / len(b) + 1.0 / len(c))
    else:
        means = [np.array([g.mean() for g in arm]) for arm in (b, c)]
        s_w2, df_w = _within([*b, *c])
        inv_k = float(np.mean([1.0 / g.size for g in (*b, *c)]))
    estimate = float(means[1].mean() - means[0].mean())
    parts: list[tuple[float, float]] = []  # (variance of one start's mean, df)
    run_df = sum(m.size - 1 for m in means)
    if run_df:
        spread = sum(float(np.sum((m - m.mean()) ** 2)) for m in means) / run_df
        parts.append((spread, float(run_df)))
    if noise.measured or not run_df:
        within = s_w2 * inv_k if df_w else 0.0
        prior = noise.sd**2 + within
        prior_df = _satterthwaite([(noise.sd**2, noise.df), (within, df_w or math.inf)])
        if not df_w and noise.sd == 0:
            prior_df = 0.0  # one request per start and nothing known: no interval
        parts.append((prior, prior_df))
    usable = [(v, df) for v, df in parts if df > 0]
    if not usable:
        return Interval(estimate, -math.inf, math.inf, math.inf, 0.0, confidence)
    weights = [min(df, 1e6) for _, df in usable]
    tau2 = sum(w * v for w, (v, _) in zip(weights, usable, strict=True)) / sum(weights)
    df = sum(df for _, df in usable)
    se = math.sqrt(tau2 * (1.0 / len(b) + 1.0 / len(c)))
    t = (
        float(_st.t.ppf(0.5 + confidence / 2, df))
        if math.isfinite(df)
        else float(_st.norm.ppf(0.5 + confidence / 2))
    )
    return Interval(estimate, estimate - t * se, estimate + t * se, se, df, confidence)


def _paired_starts(
    b: Sequence[np.ndarray],
    c: Sequence[np.ndarray],
    prompts: tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]],
) -> tuple[list[np.ndarray], float, float, float] | None:
    """The starts' effects with the prompts' own effects removed, by least squares on
    `log value = start + prompt + residual` over both arms: (per arm, its starts' effects; the
    residual variance; its df; the variance of the arms' contrast over the residual variance).
    None where the prompts do not link every start to the others, or leave no residual."""
    groups = [*b, *c]
    per_start = [*prompts[0], *prompts[1]]
    labels = sorted({i for start in per_start for i in start})
    column = {label: j for j, label in enumerate(labels[1:])}  # the first prompt: the reference
    n_starts, n_cols = len(groups), len(groups) + len(labels) - 1
    rows = []
    for s, start in enumerate(per_start):
        for label in start:
            row = np.zeros(n_cols)
            row[s] = 1.0
            if label in column:
                row[n_starts + column[label]] = 1.0
            rows.append(row)
    x, y = np.array(rows), np.concatenate(groups)
    rank = int(np.linalg.matrix_rank(x))
    df = y.size - rank
    if rank < n_cols or df <= 0:
        return None
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ beta
    weights = np.zeros(n_cols)
    weights[: len(b)] = -1.0 / len(b)
    weights[len(b) : n_starts] = 1.0 / len(c)
    contrast = float(weights @ np.linalg.pinv(x.T @ x) @ weights)
    effects = [beta[: len(b)], beta[len(b) : n_starts]]
    return effects, float(residual @ residual) / df, float(df), contrast


def restart_noise_from_starts(
    groups: Sequence[Sequence[Sequence[float]]], *, source: str
) -> RestartNoise | None:
    """The restart noise, from several starts of one configuration (several such sets pooled).

    `groups` holds sets of starts, each set one configuration (per prompt type, say), each start
    its per-request values. The spread of the start means beyond what their requests explain is
    the between-start variance. None where no set has two starts.
    """
    ss, df, within = 0.0, 0, []
    for starts in groups:
        logs = _logs(starts, "restart noise") if len(starts) >= 2 else []
        if not logs:
            continue
        m = np.array([g.mean() for g in logs])
        ss += float(np.sum((m - m.mean()) ** 2))
        df += m.size - 1
        s_w2, df_w = _within(logs)
        if df_w:
            within.append(s_w2 * float(np.mean([1.0 / g.size for g in logs])))
    if not df:
        return None
    variance = max(0.0, ss / df - (float(np.mean(within)) if within else 0.0))
    return RestartNoise(math.sqrt(variance), float(df), source)


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
) -> tuple[Verdict, str]:
    """Where a verdict is decided: the interval of the change against the ±min_effect margin."""
    low, high = (math.exp(x) - 1 for x in (interval.low, interval.high))
    where = f"the {interval.confidence:.2%} interval of the change [{_pct(low)}, {_pct(high)}]"
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
        interval, min_effect=min_effect, noise=noise
    )


def _what_it_needs(interval: Interval, *, min_effect: float, noise: RestartNoise) -> str:
    """How narrow the interval must get to decide, and what would get it there."""
    margin = math.log1p(min_effect)
    needed = abs(abs(interval.estimate) - margin)
    half = (interval.high - interval.low) / 2
    text = f"a decision needs it about {half / max(needed, 1e-9):.1f}x narrower"
    if needed < 0.1 * half:
        text += " (the estimate sits on the margin: only many more starts would settle it)"
    else:
        text += ": more server starts per arm (--spec-repeats), more requests per start"
    if not noise.measured:
        text += f"; the restart noise is {noise.source}"
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
        interval = nested_interval(
            q.baseline, q.candidate, noise=n_noise, confidence=confidence, prompts=q.prompts
        )
        verdict, reason = decide(
            interval,
            higher_is_better=q.higher_is_better,
            min_effect=min_effect,
            p_adjusted=p_adj,
            alpha=alpha,
            noise=n_noise,
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
                baseline_center=_center(q.baseline),
                candidate_center=_center(q.candidate),
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
