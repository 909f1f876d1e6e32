"""What a design can decide: the smallest change it calls with 80% power, and what it takes.

A verdict's interval is `δ ± t·SE` with `SE² = tau^2·(1/n_b + 1/n_c)` for `n` starts per arm and
`tau^2 = sigma_b^2 + sigma_w^2/k` for `k` requests per start (analysis/variance/restarts.py). A
change `Δ` is called (regressed, or improved) when the interval lies wholly beyond the margin `m`:
its probability is a noncentral t's, `P(T < -t)` with `T ~ t'(df, (m - |Δ|)/SE)`. These functions
invert that for the plan, the dry run and an inconclusive verdict's last words.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import optimize as _opt
from scipy import stats as _st

from .pairs import pair_outside_evidence
from .restarts import RestartNoise, outside_evidence, t_quantile

__all__ = [
    "ASSUMED_RESIDUAL_SD",
    "POWER",
    "DesignPower",
    "detectable_change",
    "starts_to_decide",
]

POWER = 0.8
ASSUMED_RESIDUAL_SD = 0.04  # a request's own spread where none was measured (log scale)
MAX_STARTS = 50


@dataclass(frozen=True)
class DesignPower:
    """A design (starts per arm, requests per start) and the smallest change it calls."""

    starts: int
    requests: int
    detectable: float  # relative change called with POWER; math.inf when none can be
    se: float
    df: float


def design_power(
    noise: RestartNoise,
    *,
    residual_var: float,
    starts: int,
    requests: int,
    family: int,
    alpha: float,
    margin: float,
    residual_df: float = 100.0,
    pairs: bool = False,
) -> DesignPower:
    """The smallest relative change (either way) this design calls with 80% power. `pairs`:
    side by side, `starts` pairs analysed by their slots (pairs.py; `noise` per server)."""
    within = residual_var / requests
    if pairs:  # a pair's mean: two servers' start effects and its slots' differences
        outside = pair_outside_evidence(noise, within=2.0 * within, slot_df=residual_df)
        run_df = float(starts - 1)
        in_run = 2.0 * (max(0.0, noise.sd**2) + within)
    else:
        outside = outside_evidence(noise, within=within, residual_df=residual_df)
        run_df = 2.0 * (starts - 1)
        in_run = max(0.0, noise.sd**2) + within  # what repeated starts would show
    df = run_df + outside.df
    if df <= 0:
        return DesignPower(starts, requests, math.inf, math.inf, 0.0)
    tau2 = (run_df * in_run + outside.df * outside.variance) / df
    se = math.sqrt(tau2 / starts if pairs else tau2 * 2.0 / starts)
    return DesignPower(starts, requests, _detectable(se, df, family, alpha, margin), se, df)


def detectable_change(se: float, df: float, *, family: int, alpha: float, margin: float) -> float:
    return _detectable(se, df, family, alpha, margin)


def _detectable(se: float, df: float, family: int, alpha: float, margin: float) -> float:
    """The relative change `d` at which P(called) = POWER."""
    if not (math.isfinite(se) and se > 0 and df > 0):
        return math.inf
    t = t_quantile(1 - alpha / family, df)
    m = math.log1p(margin)

    def shortfall(d: float) -> float:
        return float(_st.nct.cdf(-t, df, (m - d) / se)) - POWER

    high = m + (t + 4.0) * se * 4
    if shortfall(high) < 0:
        return math.inf
    d = _opt.brentq(shortfall, m, high, xtol=1e-6)
    return math.expm1(d)


def starts_to_decide(
    *,
    estimate: float,
    se: float,
    df: float,
    starts: tuple[int, int],
    family: int,
    alpha: float,
    margin: float,
) -> int | None:
    """Starts per arm after which an interval like this one, its centre where it is now,
    would lie wholly beyond or wholly inside the margin; None beyond MAX_STARTS."""
    if not (math.isfinite(se) and se > 0):
        return None
    tau2 = se**2 / (1.0 / starts[0] + 1.0 / starts[1])
    gap = abs(abs(estimate) - math.log1p(margin))
    now = max(starts)
    for n in range(now, MAX_STARTS + 1):
        grown = df + 2.0 * (n - now)  # each more start per arm adds one df per arm
        half = t_quantile(1 - alpha / family, grown) * math.sqrt(tau2 * 2.0 / n)
        if half < gap:
            return n
    return None


def designs(
    noise: RestartNoise,
    *,
    residual_var: float,
    requests: Sequence[int],
    family: int,
    alpha: float,
    margin: float,
) -> list[DesignPower]:
    """Every design up to MAX_STARTS starts per arm, at each request count given."""
    return [
        design_power(
            noise,
            residual_var=residual_var,
            starts=n,
            requests=k,
            family=family,
            alpha=alpha,
            margin=margin,
        )
        for n in range(1, MAX_STARTS + 1)
        for k in requests
    ]
