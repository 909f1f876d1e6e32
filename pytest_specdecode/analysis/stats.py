"""Statistics for baseline vs speculative-decoding comparisons.

Pure functions over samples of a strictly positive metric (throughput, TPOT, ...):
a two-sided Mann-Whitney U test, Holm correction across a family of comparisons
(e.g. one per prompt type), a bootstrap CI for the ratio of medians and a verdict
that also requires a minimum practical effect. The verdict is decided in one place,
:func:`decide`.
"""

from __future__ import annotations

import enum
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

__all__ = [
    "Comparison",
    "Verdict",
    "compare",
    "compare_family",
    "holm_adjust",
    "min_achievable_p",
    "ratio_of_medians_ci",
]

# scipy >= 1.15 takes ``rng``; older releases only ``random_state``.
_RNG_KWARG = "rng" if "rng" in inspect.signature(_st.bootstrap).parameters else "random_state"


class Verdict(enum.StrEnum):
    """Outcome of one baseline vs candidate comparison."""

    IMPROVED = "improved"
    REGRESSED = "regressed"
    NO_DIFFERENCE = "no significant difference"
    INSUFFICIENT = "insufficient samples"


@dataclass(frozen=True)
class Comparison:
    """Result of comparing a candidate sample against a baseline sample for one metric."""

    metric: str
    higher_is_better: bool
    n_baseline: int
    n_candidate: int
    baseline_median: float
    candidate_median: float
    ratio: float
    ratio_ci: tuple[float, float]
    p_value: float
    p_adjusted: float
    verdict: Verdict
    reason: str

    @property
    def change(self) -> float:
        """Relative change of the candidate median, e.g. -0.14 for 14% lower."""
        return self.ratio - 1.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict; non-finite floats become ``None``."""
        return {
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "n_baseline": self.n_baseline,
            "n_candidate": self.n_candidate,
            "baseline_median": _json_float(self.baseline_median),
            "candidate_median": _json_float(self.candidate_median),
            "ratio": _json_float(self.ratio),
            "ratio_ci": [_json_float(self.ratio_ci[0]), _json_float(self.ratio_ci[1])],
            "change": _json_float(self.change),
            "p_value": _json_float(self.p_value),
            "p_adjusted": _json_float(self.p_adjusted),
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


def holm_adjust(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni step-down adjusted p-values, in the input order.

    The adjusted values are monotone in the raw p-values and capped at 1.
    """
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


def _as_sample(values: Sequence[float], name: str) -> np.ndarray:
    """Validate a sample: 1-D, finite, strictly positive."""
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got shape {arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{name} values must be finite and > 0; got {arr[i]!r} at index {i} "
            f"({bad.size} bad value(s))"
        )
    return arr


def _median_ratio(baseline: np.ndarray, candidate: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.median(candidate, axis=axis) / np.median(baseline, axis=axis)


def ratio_of_medians_ci(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap CI of median(candidate) / median(baseline).

    The two samples are resampled independently with a seeded generator. Degenerate
    input (every value on each side equal, or fewer than 2 values on a side, where
    there is nothing to resample) returns ``(ratio, ratio)``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples!r}")
    b = _as_sample(baseline, "baseline")
    c = _as_sample(candidate, "candidate")
    if b.size == 0 or c.size == 0:
        raise ValueError("ratio of medians needs at least one value on each side")
    ratio = float(np.median(c) / np.median(b))
    if b.size < 2 or c.size < 2 or (np.ptp(b) == 0 and np.ptp(c) == 0):
        return (ratio, ratio)
    res = _st.bootstrap(
        (b, c),
        _median_ratio,
        n_resamples=n_resamples,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        **{_RNG_KWARG: np.random.default_rng(seed)},
    )
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return (ratio, ratio)
    return (low, high)


# --------------------------------------------------------------------------- verdict


def _fmt_p(p: float) -> str:
    return f"{p:.1e}" if 0 < p < 0.001 else f"{p:.3f}"


def _fmt_pct(fraction: float) -> str:
    return f"{fraction * 100:g}%"


def _samples_needed(family_size: int, alpha: float) -> int:
    """Smallest equal per-side n with family_size * min_achievable_p(n, n) <= alpha."""
    n = 2
    while family_size * min_achievable_p(n, n) > alpha:
        n += 1
    return n


def decide(
    *,
    n_baseline: int,
    n_candidate: int,
    ratio: float,
    p_adjusted: float,
    family_size: int,
    higher_is_better: bool,
    alpha: float,
    min_effect: float,
) -> tuple[Verdict, str]:
    """Where a verdict is decided: sample-size feasibility, significance, practical effect."""
    need = _samples_needed(family_size, alpha)
    sizes = f"{n_baseline} vs {n_candidate} samples"
    if n_baseline < 2 or n_candidate < 2:
        return (
            Verdict.INSUFFICIENT,
            f"with {sizes} there is nothing to test; take at least {need} samples per side",
        )
    min_p = min_achievable_p(n_baseline, n_candidate)
    if family_size * min_p > alpha:
        holm = ""
        if family_size > 1:
            holm = f" (x{family_size} comparisons for Holm = {_fmt_p(family_size * min_p)})"
        return (
            Verdict.INSUFFICIENT,
            f"with {sizes} the smallest possible p is {_fmt_p(min_p)}{holm} > alpha {alpha:g}; "
            f"take at least {need} samples per side",
        )

    p_label = "p" if family_size == 1 else "p_adj"
    change = ratio - 1.0
    significant = p_adjusted < alpha
    if not significant:
        return (
            Verdict.NO_DIFFERENCE,
            f"not significant ({p_label}={_fmt_p(p_adjusted)} >= {alpha:g}; "
            f"change {change * 100:+.1f}%)",
        )
    if abs(change) < min_effect:
        return (
            Verdict.NO_DIFFERENCE,
            f"significant ({p_label}={_fmt_p(p_adjusted)} < {alpha:g}) but |change| "
            f"{abs(change) * 100:.1f}% is below the minimum practical effect "
            f"{_fmt_pct(min_effect)}",
        )
    if change == 0:
        return (
            Verdict.NO_DIFFERENCE,
            f"significant ({p_label}={_fmt_p(p_adjusted)} < {alpha:g}) but the medians are equal",
        )
    better = (change > 0) == higher_is_better
    return (
        Verdict.IMPROVED if better else Verdict.REGRESSED,
        f"{p_label}={_fmt_p(p_adjusted)} < {alpha:g} and {change * 100:+.1f}% beyond the "
        f"{_fmt_pct(min_effect)} minimum effect",
    )


# --------------------------------------------------------------------------- comparisons


def _check_params(alpha: float, min_effect: float) -> None:
    if not 0.0 < alpha < 1.0:  # also rejects NaN
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    if not (min_effect >= 0.0 and math.isfinite(min_effect)):
        raise ValueError(f"min_effect must be a finite number >= 0, got {min_effect!r}")


@dataclass(frozen=True)
class _Raw:
    """Per-pair quantities computed before the family correction."""

    n_baseline: int
    n_candidate: int
    baseline_median: float
    candidate_median: float
    ratio: float
    ratio_ci: tuple[float, float]
    p_value: float


def _raw(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    label: str,
    seed: int,
    n_resamples: int,
) -> _Raw:
    b = _as_sample(baseline, f"{label}baseline")
    c = _as_sample(candidate, f"{label}candidate")
    if b.size == 0 or c.size == 0:
        nan = float("nan")
        return _Raw(b.size, c.size, nan, nan, nan, (nan, nan), 1.0)
    p = float(_st.mannwhitneyu(b, c, alternative="two-sided", method="auto").pvalue)
    if not math.isfinite(p):
        p = 1.0
    b_med, c_med = float(np.median(b)), float(np.median(c))
    ci = ratio_of_medians_ci(b, c, n_resamples=n_resamples, seed=seed)
    return _Raw(b.size, c.size, b_med, c_med, c_med / b_med, ci, p)


def compare_family(
    pairs: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    metric: str,
    higher_is_better: bool,
    alpha: float,
    min_effect: float,
    seed: int = 0,
    n_resamples: int = 2000,
) -> dict[str, Comparison]:
    """Compare baseline vs candidate per key, Holm-correcting p-values across the keys.

    ``pairs`` maps a key (e.g. prompt type) to ``(baseline, candidate)`` samples.
    Verdicts use the Holm-adjusted p-value; the family size is ``len(pairs)``.
    """
    _check_params(alpha, min_effect)
    raws = {
        key: _raw(b, c, label=f"{key}: ", seed=seed, n_resamples=n_resamples)
        for key, (b, c) in pairs.items()
    }
    adjusted = holm_adjust([r.p_value for r in raws.values()])
    out: dict[str, Comparison] = {}
    for (key, r), p_adj in zip(raws.items(), adjusted, strict=True):
        verdict, reason = decide(
            n_baseline=r.n_baseline,
            n_candidate=r.n_candidate,
            ratio=r.ratio,
            p_adjusted=p_adj,
            family_size=len(raws),
            higher_is_better=higher_is_better,
            alpha=alpha,
            min_effect=min_effect,
        )
        out[key] = Comparison(
            metric=metric,
            higher_is_better=higher_is_better,
            n_baseline=r.n_baseline,
            n_candidate=r.n_candidate,
            baseline_median=r.baseline_median,
            candidate_median=r.candidate_median,
            ratio=r.ratio,
            ratio_ci=r.ratio_ci,
            p_value=r.p_value,
            p_adjusted=p_adj,
            verdict=verdict,
            reason=reason,
        )
    return out


def compare(
    baseline: Sequence[float],
    candidate: Sequence[float],
    *,
    metric: str,
    higher_is_better: bool,
    alpha: float,
    min_effect: float,
    seed: int = 0,
    n_resamples: int = 2000,
) -> Comparison:
    """Compare one baseline sample against one candidate sample (a family of one)."""
    _check_params(alpha, min_effect)
    b = _as_sample(baseline, "baseline")
    c = _as_sample(candidate, "candidate")
    return compare_family(
        {metric: (b, c)},
        metric=metric,
        higher_is_better=higher_is_better,
        alpha=alpha,
        min_effect=min_effect,
        seed=seed,
        n_resamples=n_resamples,
    )[metric]
