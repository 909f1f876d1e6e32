"""Drift within a server start: throughput that wanders over seconds, beside the start effect.

Each request's log value is `start + prompt + drift(t) + request noise`. The start effect and
the prompts' own levels are removed (analysis/variance/restarts.py's model); what is left, in time
order within each start (`RequestSample.started_at`), is the drift plus the request's own
noise. The drift is modelled as AR(1) over the requests in time order:

    drift_i = phi·drift_(i-1) + innovation,   stationary SD `sd`

and the request noise as white. Their residuals' autocovariance at lag `k >= 1` is then
`sd²·phi^k`, at lag 0 `sd² + noise²`. `phi` and `sd` are fitted to the pooled autocovariances
at lags 1..MAX_LAG by least squares (each start's residuals about their own mean, so the
start effect never counts as drift). docs/statistics.md ("Drift within a start") has the
model, its checks and what it means for a design.

Where a start sent its prompt types one block after another, drift lands on a prompt type of
one start: the analysis then sees it as a start x prompt-type interaction, counted as restart
noise. Interleaved, it spreads over the prompt types; side by side, both arms share it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...record.schema import Phase

__all__ = [
    "MAX_LAG",
    "TimeDrift",
    "block_sd",
    "drift_of",
    "drift_of_phases",
    "drift_text",
    "mean_inflation",
    "sent_in_blocks",
    "start_residuals",
]

MAX_LAG = 5  # autocovariance lags fitted
MIN_REQUESTS = 8  # a start with fewer timed requests tells nothing of drift
MIN_PHI = 0.3  # below, drift has no memory to tell it from a request's own noise
_PHIS = np.linspace(MIN_PHI, 0.98, 69)


@dataclass(frozen=True)
class TimeDrift:
    """The drift within a start (log scale, ~relative): its stationary SD and its AR(1) phi,
    with the residuals' lag-1 autocorrelation it was fitted beside."""

    sd: float  # stationary SD of the drift
    phi: float  # AR(1) coefficient from one request to the next, in time order
    lag1: float  # the residuals' lag-1 autocorrelation (drift and request noise together)
    residual_sd: float  # the residuals' SD: drift and request noise together
    requests: int  # residuals it was fitted on
    starts: int
    seconds_per_request: float | None = None  # median gap between requests in a start
    blocked: bool | None = None  # each prompt type sent in one block per start (None: unknown)

    @property
    def innovation_sd(self) -> float:
        return self.sd * math.sqrt(max(0.0, 1.0 - self.phi**2))

    @property
    def noise_sd(self) -> float:
        """A request's own noise, the drift taken out."""
        return math.sqrt(max(0.0, self.residual_sd**2 - self.sd**2))

    def block_sd(self, seconds: float = 3.0) -> float | None:
        """The SD of the drift's mean over blocks of `seconds` (None: gaps not known)."""
        if not self.seconds_per_request:
            return None
        requests = max(1, round(seconds / self.seconds_per_request))
        return block_sd(self.sd, self.phi, requests)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sd": self.sd,
            "phi": self.phi,
            "lag1": self.lag1,
            "residual_sd": self.residual_sd,
            "requests": self.requests,
            "starts": self.starts,
            "seconds_per_request": self.seconds_per_request,
            "blocked": self.blocked,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TimeDrift:
        gap = data.get("seconds_per_request")
        return cls(
            sd=float(data["sd"]),
            phi=float(data["phi"]),
            lag1=float(data["lag1"]),
            residual_sd=float(data["residual_sd"]),
            requests=int(data["requests"]),
            starts=int(data["starts"]),
            seconds_per_request=None if gap is None else float(gap),
            blocked=data.get("blocked"),
        )


def block_sd(sd: float, phi: float, requests: int) -> float:
    """The SD of the mean of `requests` consecutive values of a stationary AR(1)."""
    return sd * math.sqrt(mean_inflation(phi, requests) / max(1, requests))


def mean_inflation(phi: float, requests: int) -> float:
    """How much an AR(1)'s autocorrelation inflates the variance of a mean of `requests`
    consecutive values over independent ones: `1 + 2·sum (1 - k/n)·phi^k`."""
    n = max(1, requests)
    k = np.arange(1, n)
    return float(1.0 + 2.0 * np.sum((1.0 - k / n) * phi**k))


def drift_of(
    series: Sequence[np.ndarray],
    *,
    seconds_per_request: float | None = None,
    blocked: bool | None = None,
) -> TimeDrift | None:
    """AR(1) drift plus white noise fitted to residual series, one per start, in time order;
    None where no start has MIN_REQUESTS residuals."""
    used = [np.asarray(s, dtype=float) for s in series if len(s) >= MIN_REQUESTS]
    if not used:
        return None
    centred = [s - s.mean() for s in used]
    observed = np.array([_autocovariance(centred, k) for k in range(MAX_LAG + 1)])
    weights = np.array([sum(max(0, s.size - k) for s in centred) for k in range(1, MAX_LAG + 1)])
    lag1 = observed[1] / observed[0] if observed[0] > 0 else 0.0
    # each start about its own mean: every autocovariance is short by the variance of that
    # mean, which depends on the fit; a few rounds correct it
    gamma, sd2, phi = observed, 0.0, 0.0
    for _ in range(4):
        sd2, phi = _fit_ar1(gamma[1:], weights)
        sd2 = min(sd2, max(gamma[0], 0.0))
        noise2 = max(0.0, gamma[0] - sd2)
        short = float(
            np.mean([(sd2 * mean_inflation(phi, s.size) + noise2) / s.size for s in used])
        )
        gamma = observed + short
    total = max(gamma[0], 0.0)
    return TimeDrift(
        sd=math.sqrt(sd2),
        phi=phi,
        lag1=float(lag1),
        residual_sd=math.sqrt(total),
        requests=sum(s.size for s in used),
        starts=len(used),
        seconds_per_request=seconds_per_request,
        blocked=blocked,
    )


def _autocovariance(series: Sequence[np.ndarray], lag: int) -> float:
    pairs = sum(max(0, s.size - lag) for s in series)
    if not pairs:
        return 0.0
    return float(sum(np.dot(s[: s.size - lag], s[lag:]) for s in series)) / pairs


def _fit_ar1(gamma: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """`gamma[k-1] ≈ sd²·phi^k` by weighted least squares over a grid of phi; (0, 0) where the
    residuals are not positively correlated."""
    if gamma[0] <= 0:
        return 0.0, 0.0
    lags = np.arange(1, gamma.size + 1)
    best = (math.inf, 0.0, 0.0)
    for phi in _PHIS:
        shape = phi**lags
        sd2 = max(0.0, float(np.sum(weights * gamma * shape) / np.sum(weights * shape**2)))
        loss = float(np.sum(weights * (gamma - sd2 * shape) ** 2))
        if loss < best[0]:
            best = (loss, sd2, float(phi))
    return best[1], best[2]


# --------------------------------------------------------------------------- from a record


def start_residuals(
    phases: Sequence[Phase], values: str = "tokens_per_s"
) -> tuple[list[np.ndarray], float | None]:
    """Each start's residuals in time order (log scale) and the median gap between requests
    (s): `log value = start + prompt`, backfitted over every key (prompt type and level) of
    these phases at once, so that one start's shift is shared by its keys and what one key
    of one start has of its own (a block's drift) stays in its residuals.

    A prompt's own level is removed where it was measured in more than one start of these
    phases; otherwise its key's mean (the prompts' spread then counts as request noise, not as
    drift: it has no order in time)."""
    rows = [
        (s_index, sample.started_at, math.log(v), key, sample.prompt_index)
        for s_index, phase in enumerate(phases)
        for key, m in phase.measurements.items()
        for sample in m.samples
        if not sample.warmup
        for v in [_value(sample, values)]
        if v is not None
    ]
    seen: dict[tuple[str, int | None], set[int]] = {}
    for s_index, _, _, key, prompt in rows:
        seen.setdefault((key, prompt), set()).add(s_index)
    labels = [
        (key, prompt if prompt is not None and len(seen[(key, prompt)]) > 1 else None)
        for _, _, _, key, prompt in rows
    ]
    residuals = _two_way([r[0] for r in rows], labels, np.array([r[2] for r in rows]))
    cells: list[list[tuple[float, float]]] = [[] for _ in phases]
    for (s_index, at, *_), residual in zip(rows, residuals, strict=True):
        cells[s_index].append((at, float(residual)))
    series, gaps = [], []
    for cell in cells:
        cell.sort()
        series.append(np.array([r for _, r in cell]))
        times = np.array([t for t, _ in cell])
        if times.size > 1 and times[-1] > times[0]:
            gaps.append(float(np.median(np.diff(times))))
    gap = float(np.median(gaps)) if gaps and np.median(gaps) > 0 else None
    return series, gap


def _value(sample: Any, values: str) -> float | None:
    if values == "tokens_per_s":
        v = sample.tokens_per_s
    else:
        tpot = sample.tpot_s
        v = tpot * 1000 if tpot else 0.0
    return v if math.isfinite(v) and v > 0 else None


def _two_way(starts: Sequence[int], labels: Sequence[object], y: np.ndarray) -> np.ndarray:
    """Residuals of `y = start + label`, backfitted (unbalanced designs included)."""
    if not len(y):
        return y
    start = np.asarray(starts)
    index = {label: i for i, label in enumerate(dict.fromkeys(labels))}
    label = np.array([index[x] for x in labels])
    effect = np.zeros_like(y)
    shift = np.zeros_like(y)
    for _ in range(50):
        shift = (np.bincount(start, y - effect) / np.bincount(start))[start]
        new = (np.bincount(label, y - shift) / np.bincount(label))[label]
        if np.allclose(new, effect, atol=1e-10):
            effect = new
            break
        effect = new
    return y - shift - effect


def sent_in_blocks(phases: Sequence[Phase]) -> bool | None:
    """Whether every start sent each key (prompt type and level) in one block, one after
    another; None where no start has two keys."""
    found = []
    for phase in phases:
        timed = sorted(
            (s.started_at, key)
            for key, m in phase.measurements.items()
            for s in m.samples
            if not s.warmup
        )
        keys = [key for _, key in timed]
        if len(set(keys)) < 2:
            continue
        switches = sum(a != b for a, b in itertools.pairwise(keys))
        found.append(switches == len(set(keys)) - 1)
    return all(found) if found else None


def drift_of_phases(phases: Sequence[Phase], values: str = "tokens_per_s") -> TimeDrift | None:
    """The drift within the starts of one configuration (phases of its arms, not reused)."""
    used = [p for p in phases if not p.reused_from]
    series, gap = start_residuals(used, values)
    return drift_of(series, seconds_per_request=gap, blocked=sent_in_blocks(used))


def drift_text(drift: TimeDrift) -> str:
    """`drift 6.1% within a start (lag-1 r = 0.41, AR(1) phi 0.72; 3-s blocks ±7.9%, ...)`,
    and where the order was blocked, what that did to the start effects."""
    block = drift.block_sd()
    blocks = f"; 3-s blocks ±{2 * block:.1%} (2 SD)" if block is not None else ""
    text = (
        f"drift {drift.sd:.1%} within a start (lag-1 r = {drift.lag1:.2f}, AR(1) phi "
        f"{drift.phi:.2f}{blocks}; {drift.requests} requests of {drift.starts} starts)"
    )
    if drift.blocked and drift.sd > 0:
        text += (
            "; the prompt types were sent one block after another, so the drift also landed "
            "on single prompt types of single starts: it inflates the start x prompt-type "
            "interaction, counted as restart noise"
        )
    return text
