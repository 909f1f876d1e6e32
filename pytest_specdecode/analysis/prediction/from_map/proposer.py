"""A real n-gram server's own cost per step beyond the map's: its proposer, measured. Pure.

The map's servers (analysis/map/break_even.py) give what a speculative step of k costs on this
engine at each tokens per step. A real n-gram server costs more: its proposer looks up n-grams
over every request's context on the host, each step, and at a decode step of about 2 ms (a
135M model) the GPU waits on it. On the H100 (2026-12-07), n-gram ran at 0.52x and 0.53x on
math and explanatory, making 1.44-1.51 tokens a step: below the map's bands there ([0.56, 0.78]
and [0.56, 0.75]) and below the map's own point at 1.00 token a step (0.57x).

Measured (`proposer_cost`), per prompt type p of a measured n-gram candidate, in ms a step:

    the candidate's step:     t0 * tau / r      (r its throughput over the baseline's, tau the
                                                 tokens per step its server counted, t0 the
                                                 baseline's decode step, its TPOT)
    the map's step there:     t0 * tau / m(tau)  (m the map's line at the candidate's k and load)
    the proposer's cost:      d_p = t0 * tau * (1 / r - 1 / m(tau))

and pooled over the prompt types (their mean: a host cost per step, the same whatever the
prompt). Its interval comes from draws: the map's redrawn lines (each draw one line, at every
prompt type) and the candidate's ratio within its own interval (a t with the verdict's df on
the log scale, one draw shared by the prompt types: their start is shared), the central
`confidence` of the pooled mean.

Applied (`with_proposer`): a config making tau tokens a step on a map m runs at

    r = tau / (tau / m(tau) + d / t0)

with d in ms and t0 the baseline's step. On the same map the draws are paired (the cost was
measured against those lines, so a map that reads high reads the cost high too); on another map,
the served model's shape (`on_shape`, the map at the full depth and the shape's own baseline
step), the cost is the host's, independent of the model's size, and the two are drawn apart.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

__all__ = [
    "ProposerCost",
    "ShapePrediction",
    "StepEvidence",
    "central",
    "draws_of_band",
    "on_shape",
    "predict_on_shape",
    "proposer_cost",
    "with_proposer",
]

SEED = 20261207


@dataclass(frozen=True)
class StepEvidence:
    """One prompt type of a measured n-gram candidate beside the map at its tokens per step."""

    prompt_type: str
    tokens_per_step: float  # tau: output tokens after the first over decode steps, counted
    log_ratio: float  # the candidate's throughput over the baseline's, log scale
    se: float
    df: float
    step_ms: float  # the baseline's decode step (its TPOT), ms
    map_ratio: float  # the map's ratio at tau, for the candidate's k and load
    map_draws: tuple[float, ...]  # the same, one per redrawn line of the map

    def cost(self, ratio: float, map_ratio: float) -> float:
        """d = t0 * tau * (1/r - 1/m), ms a step."""
        return self.step_ms * self.tokens_per_step * (1.0 / ratio - 1.0 / max(map_ratio, 1e-9))


@dataclass(frozen=True)
class ProposerCost:
    """A measured n-gram candidate's cost per step beyond the map's, per prompt type and pooled."""

    candidate: str
    label: str  # its effective settings, e.g. "k=5 n=4..4"
    k: int
    level: str
    confidence: float
    per_type: Mapping[str, tuple[float, float, float]]  # ms a step: estimate, low, high
    draws: Mapping[str, tuple[float, ...]] = field(repr=False)  # per prompt type, ms per draw

    def pooled(self, names: Sequence[str] | None = None) -> tuple[float, np.ndarray] | None:
        """The mean over these prompt types (default: all): the estimate and its draws."""
        chosen = [n for n in (names if names is not None else self.per_type) if n in self.draws]
        if not chosen:
            return None
        point = float(np.mean([self.per_type[n][0] for n in chosen]))
        return point, np.mean([np.asarray(self.draws[n]) for n in chosen], axis=0)

    def without(self, prompt_type: str) -> tuple[float, np.ndarray, list[str]] | None:
        """The cost measured on the other prompt types: a prompt type's prediction never reads
        its own measurement. None where it was the only one."""
        others = [n for n in self.per_type if n != prompt_type]
        found = self.pooled(others)
        return (found[0], found[1], others) if found else None

    @property
    def estimate(self) -> tuple[float, float, float]:
        """The pooled cost, ms a step, with its central interval."""
        found = self.pooled()
        assert found is not None
        low, high = central(found[1], self.confidence)
        return found[0], low, high

    def text(self) -> str:
        ms, low, high = self.estimate
        each = ", ".join(f"{n} {v[0]:+.2f}" for n, v in self.per_type.items())
        return (
            f"{self.candidate}'s proposer ({self.label}): its step costs {ms:+.2f} ms "
            f"[{low:+.2f}, {high:+.2f}] more than the map's at k={self.k}, {self.level}, at the "
            f"same tokens per step ({self.confidence:.0%}; per prompt type {each})"
        )

    def to_json(self) -> dict[str, Any]:
        ms, low, high = self.estimate
        return {
            "candidate": self.candidate,
            "label": self.label,
            "k": self.k,
            "level": self.level,
            "confidence": self.confidence,
            "ms_per_step": ms,
            "ms_per_step_band": [low, high],
            "per_prompt_type": {n: list(v) for n, v in self.per_type.items()},
        }


def proposer_cost(
    evidence: Sequence[StepEvidence],
    *,
    candidate: str,
    label: str,
    k: int,
    level: str,
    confidence: float,
    seed: int = SEED,
) -> ProposerCost | None:
    """The cost per step of a measured n-gram candidate beyond the map's (module docstring);
    None without evidence."""
    usable = [e for e in evidence if _usable(e)]
    if not usable:
        return None
    n = min(len(e.map_draws) for e in usable)
    shared = np.random.default_rng(seed).uniform(size=n)  # one start: one draw for every type
    per_type: dict[str, tuple[float, float, float]] = {}
    draws: dict[str, tuple[float, ...]] = {}
    for e in usable:
        t = stats.t.ppf(shared, min(max(e.df, 1.0), 1e6))
        ratios = np.exp(e.log_ratio + e.se * t)
        maps = _positive(e.map_draws[:n])  # a redrawn line below 0 there: no step, left out
        values = e.step_ms * e.tokens_per_step * (1.0 / ratios - 1.0 / maps)
        low, high = central(values, confidence)
        per_type[e.prompt_type] = (e.cost(math.exp(e.log_ratio), e.map_ratio), low, high)
        draws[e.prompt_type] = tuple(float(v) for v in values)
    return ProposerCost(candidate, label, k, level, confidence, per_type, draws)


def _usable(e: StepEvidence) -> bool:
    figures = (e.tokens_per_step, e.log_ratio, e.se, e.step_ms, e.map_ratio)
    return (
        all(math.isfinite(x) for x in figures)
        and e.tokens_per_step > 0
        and e.step_ms > 0
        and e.map_ratio > 0
        and bool(e.map_draws)
    )


def with_proposer(
    tokens_per_step: float,
    step_ms: float,
    map_ratio: float,
    map_draws: Sequence[float] | np.ndarray,
    cost_ms: float,
    cost_draws: Sequence[float] | np.ndarray,
    *,
    confidence: float,
) -> tuple[float, float, float, np.ndarray]:
    """The ratio of a config making `tokens_per_step` a step, its step the map's plus the
    proposer's: r = tau / (tau/m + d/t0). The estimate, its band, and its draws (paired in
    order: the caller shuffles one side where the two were measured apart)."""
    tau = tokens_per_step
    n = min(len(map_draws), len(cost_draws))
    steps = tau / _positive(map_draws[:n]) + np.asarray(cost_draws[:n], dtype=float) / step_ms
    values = np.where(steps > 0, tau / np.where(steps > 0, steps, 1.0), np.nan)
    low, high = central(values, confidence)
    point = tau / max(tau / max(map_ratio, 1e-9) + cost_ms / step_ms, 1e-9)
    return point, low, high, values


@dataclass(frozen=True)
class ShapePrediction:
    """n-gram on the served model's shape, one prompt type: the shape's map plus the host's
    proposer cost."""

    prompt_type: str
    tokens_per_step: float  # replayed from stored token ids
    step_ms: float  # the shape's baseline decode step at its full depth
    map_ratio: tuple[float, float, float]  # the shape's map at tau, full depth: estimate, band
    proposer_ms: tuple[float, float, float]  # the host's cost, ms a step
    ratio: float
    low: float
    high: float

    def text(self) -> str:
        m, m_low, m_high = self.map_ratio
        d, d_low, d_high = self.proposer_ms
        return (
            f"{self.prompt_type}: {self.tokens_per_step:.2f} tokens per step, predicted "
            f"{self.ratio:.2f}x [{self.low:.2f}, {self.high:.2f}] (the map {m:.2f}x [{m_low:.2f}, "
            f"{m_high:.2f}] and the proposer {d:+.2f} ms [{d_low:+.2f}, {d_high:+.2f}] on a "
            f"{self.step_ms:.2f} ms step)"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            **self.__dict__,
            "map_ratio": list(self.map_ratio),
            "proposer_ms": list(self.proposer_ms),
        }


def draws_of_band(
    ratio: float, low: float, high: float, *, confidence: float, n: int, seed: int = SEED
) -> np.ndarray:
    """Draws of a ratio given as an estimate and its central band (log scale, each side its own
    spread): what a map that gives only `at(...)` gives the combination."""
    z = float(stats.norm.ppf(0.5 + confidence / 2))
    below = (math.log(ratio) - math.log(low)) / z if low > 0 else 0.0
    above = (math.log(high) - math.log(ratio)) / z if high > 0 else 0.0
    normal = np.random.default_rng(seed).standard_normal(n)
    return np.exp(math.log(ratio) + normal * np.where(normal < 0, below, above))


def on_shape(
    map_at: tuple[float, float, float],
    *,
    prompt_type: str,
    tokens_per_step: float,
    step_ms: float,
    cost: ProposerCost,
    seed: int = SEED,
) -> ShapePrediction:
    """n-gram on the shape at `tokens_per_step`: the shape map's ratio there (at its full
    depth: estimate and band) plus the host's proposer cost, drawn apart (two measurements)."""
    found = cost.pooled()
    assert found is not None, "a proposer cost of no prompt type"
    cost_ms, cost_draws = found
    rng = np.random.default_rng(seed + 1)
    shuffled = rng.permutation(cost_draws)
    maps = draws_of_band(*map_at, confidence=cost.confidence, n=len(shuffled), seed=seed)
    ratio, low, high, _ = with_proposer(
        tokens_per_step, step_ms, map_at[0], maps, cost_ms, shuffled, confidence=cost.confidence
    )
    return ShapePrediction(
        prompt_type, tokens_per_step, step_ms, map_at, cost.estimate, ratio, low, high
    )


def predict_on_shape(
    ratio_at: Callable[[int, float, str], tuple[float, float, float]],
    *,
    k: int,
    level: str,
    tokens_per_step: Mapping[str, float],
    step_ms: float,
    cost: ProposerCost,
) -> dict[str, ShapePrediction]:
    """Per prompt type, n-gram at k on the shape: `ratio_at(k, tokens per step, load)` is the
    shape's map at its full depth (a `MapLine.at` of the right line, or the depth fit's), the
    tokens per step are the replay of stored token ids, `step_ms` the shape's baseline step."""
    return {
        name: on_shape(
            ratio_at(k, tau, level),
            prompt_type=name,
            tokens_per_step=tau,
            step_ms=step_ms,
            cost=cost,
        )
        for name, tau in tokens_per_step.items()
    }


def _positive(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Ratios as an array, those at or below 0 (no step to speak of) as NaN."""
    found = np.asarray(values, dtype=float)
    return np.where(found > 0, found, np.nan)


def central(values: Sequence[float] | np.ndarray, confidence: float) -> tuple[float, float]:
    """The central `confidence` of some draws."""
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(finite, [tail, 1.0 - tail])
    return float(low), float(high)
