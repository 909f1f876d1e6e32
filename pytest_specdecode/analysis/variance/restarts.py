"""Server starts, the unit of replication: each start's effect, the restart noise, the interval.

Every request of one server start shares that start's shift, so a metric is compared through
each start's effect in `log value = start + prompt + residual` (the prompts' own levels
removed, since every start sends the same prompts). The variance of one start's effect has two
parts: the restart noise `sigma_b^2`, and the residual's share over its requests.

That variance, `tau^2`, is known from three kinds of evidence, pooled by degrees of freedom:
- this run's own repeated starts (`--spec-repeats`, an A/A arm, the drift check's baseline):
  the spread of their effects, `starts - 1` degrees of freedom per configuration;
- outside knowledge: the restart noise measured by stored runs of this host (A/A runs), with
  its own degrees of freedom, or where nothing was measured, the assumed value as a prior with
  a stated weight (`ASSUMED_WEIGHT` degrees of freedom);
- and the residual, estimated from every request.

The interval is then `δ ± t·SE` on the pooled degrees of freedom, so that an estimate from few
starts widens the interval rather than passing for knowledge.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special as _special
from scipy import stats as _st

__all__ = [
    "ASSUMED_WEIGHT",
    "RestartNoise",
    "StartFit",
    "fit_starts",
    "interval_variance",
    "restart_noise_of",
]

# The assumed restart noise counts as this many degrees of freedom where nothing was measured:
# a guess that may be twice too small, not a measurement. At 8, false alarms stay within alpha
# up to a true restart noise of 10% (twice the default assumption); at 12, a 10% host saw 7%
# false "regressed" at one start per arm, and a CI A/A run of three starts per arm called a
# difference. docs/statistics.md has the calibration.
ASSUMED_WEIGHT = 8.0
PRIOR = "a prior"  # how the source of another machine's noise begins (verdict/noise.py)
CONFLICT_P = 0.05  # an assumption this run's own starts rule out at this level is set aside


@dataclass(frozen=True)
class RestartNoise:
    """How much a metric moves between two starts of one configuration (log scale, ~relative).

    Measured, it keeps what it was estimated from: the variance of one start's effect in the
    runs that measured it (`spread`), and that variance's within-start part (`within`), so that
    its own uncertainty (`2·spread²/df`) can be carried into an interval. Assumed, `df` is the
    weight the assumption is given.
    """

    sd: float
    df: float
    source: str
    measured: bool = True
    spread: float | None = None  # variance of one start's effect where measured; None: sd²
    within: float = 0.0  # its within-start part
    residual: float | None = None  # one request's variance around its start and prompt

    @property
    def variance(self) -> float:
        return self.sd**2

    @property
    def is_prior(self) -> bool:
        """Measured on another machine (verdict/noise.py → as_prior), not here nor assumed."""
        return self.source.startswith(PRIOR)

    @property
    def start_variance(self) -> float:
        """The variance of one start's effect in the runs this comes from."""
        return self.spread if self.spread is not None else self.sd**2

    def interval(self, confidence: float = 0.9) -> tuple[float, float]:
        """Where the restart noise lies, at this confidence, from its own degrees of freedom:
        a start's variance scaled by chi-square, less its within-start part (never below 0)."""
        if not self.measured or self.df <= 0:
            return math.nan, math.nan
        tail = (1 - confidence) / 2
        spread = self.start_variance
        low = spread * self.df / float(_st.chi2.ppf(1 - tail, self.df)) - self.within
        high = spread * self.df / float(_st.chi2.ppf(tail, self.df)) - self.within
        return math.sqrt(max(0.0, low)), math.sqrt(max(0.0, high))

    @classmethod
    def assumed(
        cls, sd: float, *, weight: float = ASSUMED_WEIGHT, note: str | None = None
    ) -> RestartNoise:
        """The documented assumption; `note`: what was found and not used, if anything."""
        return cls(
            sd,
            weight,
            f"unmeasured: assumed {sd:.0%}, weighted as {weight:g} degrees of freedom "
            "(measure it with --spec-config baseline --spec-repeats 4)"
            + (f"; {note}" if note else ""),
            measured=False,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "sd": self.sd,
            "df": self.df,
            "source": self.source,
            "measured": self.measured,
            "spread": self.spread,
            "within": self.within,
            "residual": self.residual,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RestartNoise:
        df = data.get("df")
        measured = bool(data.get("measured", df is not None))
        if df is None or not math.isfinite(float(df)):  # an earlier version's assumption
            return cls.assumed(float(data["sd"]))
        spread, residual = data.get("spread"), data.get("residual")
        return cls(
            float(data["sd"]),
            float(df),
            str(data["source"]),
            measured=measured,
            spread=None if spread is None else float(spread),
            within=float(data.get("within") or 0.0),
            residual=None if residual is None else float(residual),
        )


def pooled(estimates: Sequence[RestartNoise], *, source: str) -> RestartNoise | None:
    """Several measured estimates as one, weighted by their degrees of freedom."""
    found = [e for e in estimates if e.measured and e.df > 0]
    if not found:
        return None
    df = sum(e.df for e in found)
    spread = sum(e.df * e.start_variance for e in found) / df
    within = sum(e.df * e.within for e in found) / df
    between = sum(e.df * _between(e) for e in found) / df
    known = [e for e in found if e.residual is not None]
    residual = (
        sum(e.df * (e.residual or 0.0) for e in known) / sum(e.df for e in known) if known else None
    )
    return RestartNoise(math.sqrt(max(0.0, between)), df, source, True, spread, within, residual)


def _between(e: RestartNoise) -> float:
    """The unclipped estimate of sigma_b^2 (below 0: no more than the requests explain)."""
    return e.start_variance - e.within if e.spread is not None else e.sd**2


# --------------------------------------------------------------------------- the starts' effects


@dataclass(frozen=True)
class StartFit:
    """Each start's effect, with the prompts' own levels removed when the requests pair."""

    effects: np.ndarray  # one per start
    residual_var: float  # of one request around its start and prompt; nan where df is 0
    residual_df: float
    cov: np.ndarray  # the effects' covariance over the residual variance
    paired: bool

    def spread(self, members: Sequence[int]) -> tuple[float, float, float]:
        """For starts of one configuration: the sum of squares of their effects about their
        mean, its degrees of freedom, and the part of it the residual is expected to make."""
        e = self.effects[list(members)]
        n = e.size
        if n < 2:
            return 0.0, 0.0, 0.0
        centre = np.eye(n) - 1.0 / n
        part = float(np.trace(centre @ self.cov[np.ix_(members, members)] @ centre))
        within = self.residual_var * part if self.residual_df else 0.0
        return float(np.sum((e - e.mean()) ** 2)), float(n - 1), within


def fit_starts(
    starts: Sequence[np.ndarray], prompts: Sequence[Sequence[int]] | None = None
) -> StartFit:
    """Least squares on `log value = start + prompt + residual` over every start given.

    Without prompts (or where they do not link the starts), each start's effect is the mean of
    its log values and the residual is the pooled within-start variance.
    """
    if prompts is not None:
        fit = _paired(starts, prompts)
        if fit is not None:
            return fit
    df = sum(g.size - 1 for g in starts)
    var = sum(float(np.sum((g - g.mean()) ** 2)) for g in starts) / df if df else math.nan
    return StartFit(
        effects=np.array([g.mean() for g in starts]),
        residual_var=var,
        residual_df=float(df),
        cov=np.diag([1.0 / g.size for g in starts]),
        paired=False,
    )


def _paired(starts: Sequence[np.ndarray], prompts: Sequence[Sequence[int]]) -> StartFit | None:
    labels = sorted({i for start in prompts for i in start})
    if len(labels) < 2 or not _linked(prompts):
        return None  # the starts' effects and the prompts' levels are not all estimable
    index = {label: j for j, label in enumerate(labels)}  # the first prompt: the reference
    n_starts = len(starts)
    n_cols = n_starts + len(labels) - 1
    sizes = [len(p) for p in prompts]
    rows = np.arange(sum(sizes))
    column = np.array([index[label] for start in prompts for label in start], dtype=int)
    x = np.zeros((rows.size, n_cols))
    x[rows, np.repeat(np.arange(n_starts), sizes)] = 1.0
    other = column > 0
    x[rows[other], n_starts + column[other] - 1] = 1.0
    y = np.concatenate(starts)
    df = y.size - n_cols
    if df <= 0:
        return None
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ (x.T @ y)
    residual = y - x @ beta
    return StartFit(
        effects=beta[:n_starts],
        residual_var=float(residual @ residual) / df,
        residual_df=float(df),
        cov=inverse[:n_starts, :n_starts],
        paired=True,
    )


def _linked(prompts: Sequence[Sequence[int]]) -> bool:
    """Whether shared prompts join every start to every other (the design has full rank).

    The columns of `start + prompt` less one reference prompt are independent exactly when the
    graph of starts and the prompts they sent is connected; a start with no requests is not.
    """
    parent = list(range(len(prompts)))
    first: dict[int, int] = {}  # a prompt: the first start that sent it

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for s, start in enumerate(prompts):
        for label in start:
            other = first.setdefault(label, s)
            parent[root(s)] = root(other)
    return len({root(s) for s in range(len(prompts))}) == 1 and all(len(p) for p in prompts)


# --------------------------------------------------------------------------- restart noise


def restart_noise_of(
    configurations: Sequence[Sequence[StartFit | tuple[StartFit, Sequence[int]]]],
    *,
    source: str,
) -> RestartNoise | None:
    """The restart noise measured by configurations started more than once.

    Each configuration gives, per key (prompt type and level), a fit and the starts of it that
    belong to the configuration. The keys of one configuration share its starts, and a start's
    shift is shared by its keys: so they are averaged, and the configuration counts
    `starts - 1` degrees of freedom, however many keys it has. Configurations pool by df.
    """
    estimates = []
    for keys in configurations:
        parts, residuals = [], []
        for entry in keys:
            fit, members = entry if isinstance(entry, tuple) else (entry, range(len(entry.effects)))
            ss, df, within = fit.spread(list(members))
            if df:
                parts.append((ss / df, within / df, df))
            if fit.residual_df:
                residuals.append((fit.residual_var, fit.residual_df))
        if parts:
            estimates.append(over_keys(parts, residuals, source=source))
    return pooled(estimates, source=source)


def over_keys(
    parts: Sequence[tuple[float, float, float]],
    residuals: Sequence[tuple[float, float]],
    *,
    source: str,
) -> RestartNoise:
    """One configuration's estimate from its keys' (spread, within, df), which share its
    starts: averaged, counting the configuration's df once; the residuals pooled by df."""
    spread = float(np.mean([p[0] for p in parts]))
    within = float(np.mean([p[1] for p in parts]))
    df = max(p[2] for p in parts)
    residual = (
        sum(v * d for v, d in residuals) / sum(d for _, d in residuals) if residuals else None
    )
    between = max(0.0, spread - within)
    return RestartNoise(math.sqrt(between), df, source, True, spread, within, residual)


# --------------------------------------------------------------------------- the interval


@dataclass(frozen=True)
class Evidence:
    """One estimate of tau^2, the variance of one start's effect in this comparison."""

    variance: float
    df: float
    what: str


def interval_variance(
    fit: StartFit,
    *,
    baseline: Sequence[int],
    candidate: Sequence[int],
    groups: Sequence[Sequence[int]],
    outside: RestartNoise,
) -> tuple[float, float, list[Evidence]]:
    """The variance of one start's effect (tau^2) for this comparison, its degrees of freedom,
    and the evidence it was pooled from.

    `groups` are the starts of this run that share a configuration (each group about its own
    mean); `outside` is what stored runs measured, or the assumed value.
    """
    n_b, n_c = len(baseline), len(candidate)
    weights = np.zeros(len(fit.effects))
    weights[list(baseline)] = -1.0 / n_b
    weights[list(candidate)] = 1.0 / n_c
    arms = 1.0 / n_b + 1.0 / n_c
    within = fit.residual_var * float(weights @ fit.cov @ weights) / arms if fit.residual_df else 0
    ss = df = 0.0
    for members in groups:
        s, d, _ = fit.spread(members)
        ss, df = ss + s, df + d
    own = Evidence(ss / df, df, "this run's repeated starts") if df else None
    found = outside_evidence(outside, within=within, residual_df=fit.residual_df)
    return pool(own, found, set_aside=bool(df) and _contradicts(outside, ss, df, within))


def pool(
    own: Evidence | None, outside: Evidence, *, set_aside: bool
) -> tuple[float, float, list[Evidence]]:
    """This run's own evidence and the outside's (unless this run rules it out), pooled by
    degrees of freedom: the variance, its df, and the evidence kept."""
    evidence = [own] if own is not None else []
    if outside.df > 0 and not set_aside:
        evidence.append(outside)
    total = sum(e.df for e in evidence)
    if not total:
        return math.inf, 0.0, evidence
    return sum(e.df * e.variance for e in evidence) / total, total, evidence


def _contradicts(outside: RestartNoise, ss: float, df: float, within: float) -> bool:
    """An assumed restart noise that this run's own starts rule out (p < CONFLICT_P: their
    spread is far beyond what it allows) is set aside: the run's evidence then speaks alone."""
    if outside.measured:
        return False
    expected = outside.sd**2 + within
    return expected > 0 and float(_st.chi2.sf(ss / expected, df)) < CONFLICT_P


def outside_evidence(outside: RestartNoise, *, within: float, residual_df: float) -> Evidence:
    """The outside knowledge as an estimate of tau^2 for starts whose requests' share is
    `within`: its restart noise plus that share. Its degrees of freedom (Satterthwaite) carry
    the estimate's own uncertainty (its start variance over its df) and the residual's; they
    never fall below the fewest of its parts' own, nor below 1: where the restart noise's
    estimate clipped to 0, its start variance over its df alone would take them near 0, and
    the t quantile to infinity."""
    value = max(0.0, _between(outside)) + within
    if outside.df <= 0 or value <= 0:
        return Evidence(value, 0.0, outside.source)
    spread_part = outside.start_variance**2 / outside.df
    within_part = within**2 / residual_df if residual_df else (math.inf if within else 0.0)
    found = value**2 / (spread_part + within_part)
    floor = min(outside.df, residual_df) if within and residual_df else outside.df
    return Evidence(value, max(1.0, floor, found), outside.source)


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: scipy's `t.ppf`, through the function it calls (`stdtrit`) without
    its per-call argument handling (50 us a call against 1.5): the power search asks for it
    tens of times per comparison. The ends of (0, 1) go through `t.ppf`, whose they are."""
    if not math.isfinite(df):
        return float(_st.norm.ppf(p))
    if not 0.0 < p < 1.0:
        return float(_st.t.ppf(p, df))
    return float(_special.stdtrit(df, p))
