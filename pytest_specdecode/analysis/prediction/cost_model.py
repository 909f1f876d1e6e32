"""How much a speculative step costs, fitted from measured runs; predicted tok/s for n-gram configs.

The model. A baseline decode step yields one token and takes t0, the baseline's TPOT for that
prompt type. A speculative decode step that verifies 1 + m tokens (m draft tokens) takes

    t_step = t0 * (1 + b + c * m)

- b: the fixed extra cost of a speculative step (proposer, rejection sampler, batch shape);
- c: the extra cost per draft token verified, in baseline steps (on a large MoE model,
  verifying more tokens activates more experts).

The cost is linear in m, so a mean over steps needs only m_bar, the mean draft tokens per decode
step. With tau the tokens per decode step, a candidate's TPOT is t0 * (1 + b + c * m_bar) / tau.
Every measured (prompt type, candidate) pair therefore gives one observation

    r = TPOT_candidate * tau / t0 - 1 = b + c * m_bar.

Fitting (:func:`fit_cost`):
- at least 3 observations whose m_bar spread by >= 0.1, from at least two measured k
  (`num_speculative_tokens`): least squares for b and c (both >= 0, scipy's `lsq_linear`). One
  k cannot separate them: with one k, a cost per drafting step and a cost per draft token both
  grow with the share of steps that draft, so the fit's split between b and c would rest on
  nothing, and so would its extrapolation to another k. The band is a 95% prediction interval
  for a new observation, t(n - 2) * sqrt(x' S x + s^2), from the parameter covariance S and the
  residual variance s^2.
  Its low end stays at or above 1 - t(n - 2) * s: a speculative step does more work than a
  plain one, so it cannot cost less, except by measurement noise. One observation per timed
  request (rather than per median) gives the fit its degrees of freedom;
- otherwise b and c cannot be told apart. The band spans both extremes, all cost per draft
  token (b = 0) and all cost fixed per step (c = 0), widened by the measured TPOT noise. The
  point estimate lies halfway between them.

A prior (:class:`CostPrior`): the observations of this host's stored runs (same model, vLLM
version and GPUs), each relative to its own run's baseline. While the run's own observations
cannot separate b and c, they are pooled with the prior's; once the run measured two k of its
own, its own fit stands alone.

Prediction (:func:`predict`): for each replayed config, TPOT = t0 * (1 + b + c * m_bar) / tau,
tok/s = N / (TTFT + (N - 1) * TPOT) with the baseline's TTFT and output length, and the
speedup against the baseline by the same formula. The band of the TPOT combines the step
cost's band with the baseline TPOT's own noise (`BaselineTiming.tpot_noise`), in quadrature:
the prediction scales with t0, which the baseline measured from a few requests, and the errors
this shares across a prompt type's observations are not in the fit's residuals. So does the
restart noise: the config would run in a server start of its own. Where the band's coverage over
stored runs fell short of its nominal 95% (analysis/prediction/bands/coverage.py), `widen` scales
it per prompt type.
Without a measured candidate the cost is
unknown: only the ceiling (tok/s if a speculative step cost no more than a plain one) is given.
Whether a prediction's band bounds, and the reload recommended from those that do:
analysis/prediction/bands/bounded.py.

Only replayable methods are predicted: suffix decoding is not, and draft-model, EAGLE or MTP
methods cannot be (see `ngram_types.unsupported_reason`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import optimize, stats

from .ngram_types import NgramSettings, ReplayStats

__all__ = [
    "BaselineTiming",
    "CandidateTiming",
    "CostFit",
    "CostPoint",
    "CostPrior",
    "Prediction",
    "fit_cost",
    "predict",
    "relative_noise",
]

_Z95 = 1.959963984540054
_MIN_SPREAD = 0.1  # draft tokens per step: less spread than this cannot separate b from c


@dataclass(frozen=True)
class BaselineTiming:
    """The baseline of one prompt type: medians over its measured requests."""

    tpot_s: float
    ttft_s: float
    output_tokens: float  # mean output tokens per request
    tpot_noise: float = 0.0  # relative half-width of a 95% CI of the TPOT (see relative_noise)

    @property
    def tokens_per_s(self) -> float:
        return _tokens_per_s(self, self.tpot_s)


@dataclass(frozen=True)
class CandidateTiming:
    """A measured candidate on one prompt type, with its steps from counters or the replay."""

    prompt_type: str
    label: str
    tpot_s: float
    decode_tokens_per_step: float  # tau
    draft_tokens_per_step: float  # m_bar
    tpot_noise: float = 0.0
    k: int | None = None  # num_speculative_tokens of the measured config

    @classmethod
    def from_replay(
        cls, prompt_type: str, replay: ReplayStats, tpot_s: float, tpot_noise: float = 0.0
    ) -> CandidateTiming:
        return cls(
            prompt_type=prompt_type,
            label=replay.settings.label,
            tpot_s=tpot_s,
            decode_tokens_per_step=replay.decode_tokens_per_step,
            draft_tokens_per_step=replay.draft_tokens_per_step,
            tpot_noise=tpot_noise,
            k=replay.settings.num_speculative_tokens,
        )


@dataclass(frozen=True)
class CostPoint:
    """One observation as the fit reads it: r = b + c * m, measured at m with this k."""

    draft_tokens_per_step: float  # m
    relative_cost: float  # r: the step's extra cost in baseline steps
    k: int | None
    noise: float = 0.0  # the larger of its own and its baseline's relative TPOT noise

    def to_json(self) -> list[Any]:
        return [round(self.draft_tokens_per_step, 5), round(self.relative_cost, 5), self.k,
                round(self.noise, 5)]  # fmt: skip

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> CostPoint:
        return cls(float(row[0]), float(row[1]), None if row[2] is None else int(row[2]),
                   float(row[3]))  # fmt: skip


@dataclass(frozen=True)
class CostPrior:
    """What this host's stored runs measured of a speculative step's cost, and which runs."""

    points: tuple[CostPoint, ...]
    runs: tuple[str, ...]  # the stored runs' folder names

    @property
    def ks(self) -> list[int]:
        return sorted({p.k for p in self.points if p.k is not None})

    @property
    def text(self) -> str:
        if not self.points:
            return "no stored run of this host, model, vLLM version and GPUs measured n-gram"
        ks = ", ".join(f"k={k}" for k in self.ks)
        return (
            f"{len(self.points)} observations ({ks}) from {len(self.runs)} stored run"
            f"{'s' if len(self.runs) != 1 else ''} of this host, model, vLLM version and GPUs: "
            + ", ".join(self.runs)
        )


@dataclass(frozen=True)
class CostFit:
    """b and c of the model, and what is needed for the band of a prediction."""

    overhead: float  # b
    per_token: float  # c
    method: Literal["least-squares", "bounds"]
    observations: int
    covariance: tuple[tuple[float, float], tuple[float, float]] | None = None
    residual_var: float = 0.0
    t_quantile: float = _Z95
    extremes: tuple[tuple[float, float], ...] = ()  # (b, c) pairs spanned by the bounds method
    noise: float = 0.0  # relative TPOT noise added to the bounds method's band
    ks: tuple[int, ...] = ()  # the measured k the observations came from
    prior_runs: tuple[str, ...] = ()  # stored runs whose observations were pooled in
    prior_observations: int = 0

    @property
    def separated(self) -> bool:
        """Whether b and c were told apart (two k or more measured, by the run or its prior)."""
        return self.method == "least-squares"

    def step_cost(self, draft_tokens_per_step: float) -> tuple[float, float, float]:
        """A speculative step's cost in baseline steps, 1 + b + c*m: (estimate, low, high)."""
        m = draft_tokens_per_step
        point = 1.0 + self.overhead + self.per_token * m
        if self.method == "least-squares" and self.covariance is not None:
            cov = np.asarray(self.covariance)
            x = np.array([1.0, m])
            half = self.t_quantile * math.sqrt(max(float(x @ cov @ x), 0.0) + self.residual_var)
            noise = self.t_quantile * math.sqrt(self.residual_var)
            low, high = max(point - half, 1.0 - noise), point + half
        else:
            costs = [1.0 + b + c * m for b, c in self.extremes] or [point]
            low = min(costs) * (1.0 - self.noise)
            high = max(costs) * (1.0 + self.noise)
        return point, max(low, 1e-6), max(high, 1e-6)

    def describe(self) -> str:
        ks = ", ".join(f"k={k}" for k in self.ks)
        own = self.observations - self.prior_observations
        if self.method == "least-squares":
            how = f"least squares over {self.observations} observations ({ks})"
        else:
            why = f"one k measured ({ks})" if ks else "one k measured"
            how = (
                f"{self.observations} observation(s): fixed and per-token cost not separable, "
                f"{why}; the band spans both"
            )
        if self.prior_observations:
            how += (
                f"; {own} of this run, {self.prior_observations} from stored runs "
                f"{', '.join(self.prior_runs)}"
            )
        return (
            f"t_step = t0 * (1 + {self.overhead:.3f} + {self.per_token:.3f} * draft tokens) ({how})"
        )


@dataclass(frozen=True)
class Prediction:
    """One config on one prompt type."""

    prompt_type: str
    settings: NgramSettings
    decode_tokens_per_step: float
    draft_tokens_per_step: float
    ceiling_tokens_per_s: float  # if a speculative step cost what a plain one does
    ceiling_speedup: float
    tokens_per_s: float | None = None  # None: the cost is unknown
    tokens_per_s_band: tuple[float, float] | None = None
    speedup: float | None = None
    speedup_band: tuple[float, float] | None = None
    p_faster: float | None = None  # P(speedup > 1), reading the band as a normal 95% interval
    withheld: str | None = None  # why this is no prediction (bounded.py → `withheld_reason`)
    basis: str | None = None  # read from the map (from_map/read.py); None: this cost model

    @property
    def verdict(self) -> str:
        if self.withheld is not None:
            return "no prediction"
        if self.speedup_band is None:
            return "cost unknown"
        low, high = self.speedup_band
        if low > 1.0:
            return "faster"
        if high < 1.0:
            return "slower"
        return "uncertain"


def relative_noise(samples: Sequence[float]) -> float:
    """Relative half-width of a 95% t-interval of the mean: a TPOT's measurement noise."""
    values = np.asarray([v for v in samples if v is not None and math.isfinite(v)], dtype=float)
    if values.size < 2 or values.mean() <= 0:
        return 0.0
    t = float(stats.t.ppf(0.975, values.size - 1))
    return float(t * values.std(ddof=1) / math.sqrt(values.size) / values.mean())


def cost_points(
    baselines: Mapping[str, BaselineTiming], candidates: Sequence[CandidateTiming]
) -> list[CostPoint]:
    """Each measured candidate's request as the fit reads it, relative to its baseline."""
    return [
        CostPoint(
            c.draft_tokens_per_step,
            c.tpot_s * c.decode_tokens_per_step / baselines[c.prompt_type].tpot_s - 1.0,
            c.k,
            max(c.tpot_noise, baselines[c.prompt_type].tpot_noise),
        )
        for c in candidates
        if c.prompt_type in baselines and c.decode_tokens_per_step > 0
    ]


def fit_cost(
    baselines: Mapping[str, BaselineTiming],
    candidates: Sequence[CandidateTiming],
    *,
    prior: CostPrior | None = None,
) -> CostFit | None:
    """b and c from measured candidates (see the module docstring); None without any.

    With a `prior`, the run's own observations are pooled with the stored runs' until they
    separate b and c by themselves.
    """
    own = cost_points(baselines, candidates)
    if _separable(own) or prior is None or not prior.points:
        return fit_points(own)
    return fit_points([*own, *prior.points], prior=prior)


def fit_points(points: Sequence[CostPoint], *, prior: CostPrior | None = None) -> CostFit | None:
    """The fit over these observations: least squares where they separate b and c."""
    if not points:
        return None
    m = np.array([p.draft_tokens_per_step for p in points])
    r = np.array([p.relative_cost for p in points])
    ks = tuple(sorted({p.k for p in points if p.k is not None}))
    from_prior = len(prior.points) if prior else 0
    pooled = {"ks": ks, "prior_runs": prior.runs if prior else (), "prior_observations": from_prior}
    if _separable(points):
        design = np.column_stack([np.ones_like(m), m])
        solution = optimize.lsq_linear(design, r, bounds=(0.0, np.inf))
        b, c = (float(v) for v in solution.x)
        dof = len(points) - 2
        residual_var = float(np.sum((r - design @ solution.x) ** 2) / dof)
        cov = residual_var * np.linalg.inv(design.T @ design)
        return CostFit(
            overhead=b,
            per_token=c,
            method="least-squares",
            observations=len(points),
            covariance=((cov[0, 0], cov[0, 1]), (cov[1, 0], cov[1, 1])),
            residual_var=residual_var,
            t_quantile=float(stats.t.ppf(0.975, dof)),
            **pooled,
        )
    r_mean = max(float(r.mean()), 0.0)
    m_mean = float(m.mean())
    noise = max((p.noise for p in points), default=0.0)
    per_token_only = (0.0, r_mean / m_mean) if m_mean > 0 else (r_mean, 0.0)
    fixed_only = (r_mean, 0.0)
    return CostFit(
        overhead=(per_token_only[0] + fixed_only[0]) / 2,  # halfway between the extremes
        per_token=(per_token_only[1] + fixed_only[1]) / 2,
        method="bounds",
        observations=len(points),
        extremes=(per_token_only, fixed_only),
        noise=noise,
        **pooled,
    )


def _separable(points: Sequence[CostPoint]) -> bool:
    """Enough observations, spread in draft tokens per step, from two k or more."""
    if len(points) < 3 or len({p.k for p in points if p.k is not None}) < 2:
        return False
    m = [p.draft_tokens_per_step for p in points]
    return max(m) - min(m) >= _MIN_SPREAD


def predict(
    baselines: Mapping[str, BaselineTiming],
    replays: Mapping[str, Mapping[NgramSettings, ReplayStats]],
    fit: CostFit | None,
    *,
    restart_sd: float = 0.0,
    widen: Mapping[str, float] | None = None,
) -> dict[str, dict[NgramSettings, Prediction]]:
    """tok/s and speedup, with a band, for every replayed config and prompt type.

    `restart_sd` is the restart noise (log scale): the config would run in a server start of
    its own, compared with the baseline's, so 95% of that difference of two starts joins the band.
    `widen` scales a prompt type's band (its coverage over stored runs fell short, see
    analysis/prediction/bands/coverage.py).
    """
    start = _Z95 * restart_sd * math.sqrt(2.0)
    out: dict[str, dict[NgramSettings, Prediction]] = {}
    for name, by_config in replays.items():
        base = baselines.get(name)
        if base is None:
            continue
        base_rate = base.tokens_per_s
        out[name] = {}
        for settings, replay in by_config.items():
            tau = replay.decode_tokens_per_step
            m = replay.draft_tokens_per_step
            ceiling = _tokens_per_s(base, base.tpot_s / tau)
            pred = Prediction(
                prompt_type=name,
                settings=settings,
                decode_tokens_per_step=tau,
                draft_tokens_per_step=m,
                ceiling_tokens_per_s=ceiling,
                ceiling_speedup=ceiling / base_rate,
            )
            if fit is not None:
                cost, cost_low, cost_high = fit.step_cost(m)
                tpot = base.tpot_s * cost / tau
                # The prediction scales with t0, itself measured: its noise joins the band.
                scale = (widen or {}).get(name, 1.0)
                below = scale * math.hypot((cost - cost_low) / cost, base.tpot_noise, start)
                above = scale * math.hypot((cost_high - cost) / cost, base.tpot_noise, start)
                rate = _tokens_per_s(base, tpot)
                band = (
                    _tokens_per_s(base, tpot * (1.0 + above)),
                    _tokens_per_s(base, tpot * max(1.0 - below, 1e-6)),
                )
                speed = rate / base_rate
                speed_band = (band[0] / base_rate, band[1] / base_rate)
                pred = dataclasses.replace(
                    pred,
                    tokens_per_s=rate,
                    tokens_per_s_band=band,
                    speedup=speed,
                    speedup_band=speed_band,
                    p_faster=_p_above_one(speed, speed_band),
                )
            out[name][settings] = pred
    return out


def _tokens_per_s(base: BaselineTiming, tpot_s: float) -> float:
    n = base.output_tokens
    return n / (base.ttft_s + max(n - 1.0, 0.0) * tpot_s)


def _p_above_one(estimate: float, band: tuple[float, float]) -> float:
    sigma = (band[1] - band[0]) / (2 * _Z95)
    if sigma <= 0:
        return 1.0 if estimate > 1.0 else 0.0
    return float(stats.norm.sf(1.0, loc=estimate, scale=sigma))
