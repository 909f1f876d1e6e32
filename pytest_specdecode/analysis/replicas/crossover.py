"""Across replicas: the crossover (AB/BA), and a rotation for more replicas or arms. Pure.

Two replicas of one model are not one machine (two leases of "the same" H200 ran 30% apart).
A candidate on replica B against the baseline on replica A measures the change plus B's own
speed. The crossover swaps them: period 1, replica A keeps its original (the baseline) and B
serves the candidate; period 2, A serves the candidate and B its original. Each slot's prompt
goes to every replica at once, so a slot costs one request's time and the moment it was sent
(and its prompt) is shared by both values.

The call (the orchestration builds the slots; nothing here touches a replica)::

    crossover_of(slots: Sequence[CrossoverSlot], *, alpha: float, margin: float,
                 restart_noise: Mapping[str, RestartNoise]) -> CrossoverResult

    schedule = rotation(replicas=2, arms=2)      # ((0, 1), (1, 0)): per period, per replica
    result = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise={"throughput": noise})
    result.metrics[0].change   # interval.Interval of log(candidate / baseline), by="crossover"
    result.metrics[0].verdict  # through stats.decide, as every verdict of the project
    result.of("throughput").lines()  # the change, the replica and period effects, as printed

Each `CrossoverSlot` holds its period (0-based), its prompt, the arm each replica served in that
period (`rotation(...)[period]`; 0: the baseline, 1.. the candidates) and per replica the
request's throughput and TPOT. `restart_noise` is, per metric, one start's effect as the
project knows it (verdict/noise.py chooses it; `RestartNoise.assumed` where nothing was measured).

**The model (two replicas, two periods).** Per slot, `d = log(B) - log(A)`. With `rho` the
replica effect (B's own speed against A's), `delta` the change and `o_p` period `p`'s offset
(the difference of the two servers' start effects: `2 sigma_b^2` of variance):

    period 1 (A baseline, B candidate):  d = rho + delta + o_1 + e
    period 2 (A candidate, B baseline):  d = rho - delta + o_2 + e

so `delta = (mean d_1 - mean d_2) / 2` and `rho = (mean d_1 + mean d_2) / 2`, each with variance
`sigma_b^2 + sigma_d^2 (1/n_1 + 1/n_2) / 4`: the four starts' effects (each weighed 1/2) and the
slots' own spread. A period effect `pi`, a shift that hits both replicas between the periods
(drift, a neighbour, the time of day), cancels in every `d`; it shows in the levels. Replica A
moves by `pi + delta + e` between the periods (baseline to candidate), B by `pi - delta + e`
(candidate to baseline), so their average, the mean of both replicas' log values in period 2
less that in period 1, is `pi`, with the same start part `sigma_b^2` and the spread of the slots'
own level (the moment's noise, shared by both replicas, does not cancel there).

**Many replicas, many arms.** `rotation` gives a cyclic Latin square: replica `r` serves arm
`(r + p) mod m` in period `p`, so each replica serves each arm once and the first replica keeps
its original in the first period. The analysis is one linear model within slots (each slot's
mean taken out, so its prompt and its moment cancel): `log value = replica + arm + e`, with each
prompt's own replica and arm effects (sum-to-zero coding, so an arm's change is the prompt set's
mean, as analysis/variance/pairs.py takes it) where every prompt repeats across the periods,
numpy's least squares, the residual's df. The 2x2 case is the closed form above
(tests/unit/analysis/replicas/test_crossover.py). The period effects come from the slots'
means, their prompts' levels and the fitted replica and arm effects taken out.

**The starts.** Each replica is started once per period (period 1's original too was started
once), and each start shifts all its requests. An estimate `c'beta` then has variance `sigma_b^2
g + sigma_e^2 h`, with `h = c'(X'X)^-1 c` and `g = |c'(X'X)^-1 X'Z|^2` for `Z` the starts'
indicators. Two periods cannot measure `sigma_b^2` themselves (four starts, four effects), so it
is the restart noise the project knows of the host (analysis/variance/restarts.py: measured by
an A/A run, a prior, or assumed, each with its df); the degrees of freedom are Satterthwaite's
over the two parts, never below the fewer of the two parts' own, nor below 1. So the interval
never collapses to one pair's df, and is honest when the restarts move the servers.

**Verdicts.** Each candidate's change per metric is decided by `stats.decide` at the family's
`1 - 2 alpha / m` (m = candidates x metrics; Bonferroni, as `compare_family`). The ranks' guard
is Koch's test for two replicas: Mann-Whitney of the period-1 differences against period 2's
(each prompt's mean difference taken out), Holm over the family; for a larger rotation, the
interval's own t p-value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

from ..variance.restarts import RestartNoise, _between, t_quantile
from ..verdict.interval import Interval
from ..verdict.stats import Verdict, decide, holm_adjust

__all__ = [
    "METRICS",
    "CrossoverMetric",
    "CrossoverResult",
    "CrossoverSlot",
    "Effect",
    "crossover_of",
    "rotation",
]

METRICS = {"throughput": True, "tpot": False}  # metric: higher is better


@dataclass(frozen=True)
class CrossoverSlot:
    """One slot: its prompt sent to every replica at once, in one period."""

    period: int  # 0-based
    prompt: object
    arms: tuple[int, ...]  # per replica, the arm it served this period (0: the baseline)
    throughput: tuple[float, ...]  # per replica, the request's output tok/s (> 0)
    tpot: tuple[float, ...] | None = None  # per replica, seconds per output token (> 0)

    def values(self, metric: str) -> tuple[float, ...] | None:
        return self.throughput if metric == "throughput" else self.tpot


@dataclass(frozen=True)
class Effect:
    """One effect on the log scale with its interval: a replica's or a period's."""

    name: str  # e.g. "replica 2 against replica 1", "period 2 against period 1" (1-based)
    estimate: float
    low: float
    high: float
    se: float
    df: float

    @property
    def ratio(self) -> float:
        return math.exp(self.estimate)

    def text(self) -> str:
        return (
            f"{self.name}: {math.expm1(self.estimate):+.1%} "
            f"[{math.expm1(self.low):+.1%}, {math.expm1(self.high):+.1%}] ({self.df:.0f} df)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "estimate": self.estimate,
            "low": self.low,
            "high": self.high,
            "se": self.se,
            "df": self.df,
        }


@dataclass(frozen=True)
class CrossoverMetric:
    """One metric of one candidate: the change, its verdict, the replicas' and periods' own."""

    metric: str
    arm: int  # the candidate (1..)
    higher_is_better: bool
    change: Interval  # log(candidate / baseline), by="crossover"
    replicas: tuple[Effect, ...]  # each replica against the first
    periods: tuple[Effect, ...]  # each period against the first
    p_value: float  # the ranks' guard
    p_adjusted: float
    verdict: Verdict
    reason: str

    def lines(self) -> list[str]:
        """What a report prints: the change with its verdict, the replicas', the periods'."""
        low, high = (math.expm1(x) for x in (self.change.low, self.change.high))
        head = (
            f"{self.metric}, arm {self.arm} against the baseline: "
            f"{math.expm1(self.change.estimate):+.1%} [{low:+.1%}, {high:+.1%}] "
            f"({self.change.confidence:.1%}, {self.change.df:.0f} df): {self.verdict.value}"
        )
        return [head, *(e.text() for e in self.replicas), *(e.text() for e in self.periods)]

    def to_dict(self) -> dict[str, Any]:
        c = self.change
        return {
            "metric": self.metric,
            "arm": self.arm,
            "higher_is_better": self.higher_is_better,
            "change": {"estimate": c.estimate, "low": c.low, "high": c.high, "se": c.se,
                       "df": c.df, "confidence": c.confidence},
            "replicas": [e.to_dict() for e in self.replicas],
            "periods": [e.to_dict() for e in self.periods],
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "verdict": self.verdict.value,
            "reason": self.reason,
        }  # fmt: skip


@dataclass(frozen=True)
class CrossoverResult:
    """The crossover's analysis: per candidate and metric, the change and its verdict."""

    replicas: int
    arms: int
    periods: int
    slots: int
    metrics: tuple[CrossoverMetric, ...]

    def of(self, metric: str, arm: int = 1) -> CrossoverMetric:
        return next(m for m in self.metrics if m.metric == metric and m.arm == arm)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "arms": self.arms,
            "periods": self.periods,
            "slots": self.slots,
            "metrics": [m.to_dict() for m in self.metrics],
        }


def rotation(replicas: int, arms: int) -> tuple[tuple[int, ...], ...]:
    """Per period, the arm each replica serves: replica `r` serves `(r + p) mod arms` in period
    `p`, over `arms` periods, so each replica serves each arm once, replica 0 keeps the baseline
    (arm 0) in period 0, and with as many replicas as arms each period serves each arm once."""
    if replicas < 2 or arms < 2:
        raise ValueError(f"a rotation needs two replicas and two arms, got {replicas} and {arms}")
    return tuple(tuple((r + p) % arms for r in range(replicas)) for p in range(arms))


# --------------------------------------------------------------------------- the fit


@dataclass(frozen=True)
class _Design:
    x: np.ndarray  # within-slot centred columns: replicas 1.., arms 1.., prompt terms
    z: np.ndarray  # each observation's start (replica, period) indicator
    y: np.ndarray  # within-slot centred log values
    df: float  # residual df: observations - slots - columns
    replicas: int
    arms: int


def _columns(slots: Sequence[CrossoverSlot], replicas: int, arms: int, prompts: bool) -> list:
    """Per observation (slot, replica), the uncentred row of the within-slot model."""
    labels = sorted({s.prompt for s in slots}, key=repr) if prompts else []
    code = {label: j for j, label in enumerate(labels[:-1])}
    rows = []
    for s in slots:
        dev = np.zeros(max(0, len(labels) - 1))
        if labels:
            if s.prompt in code:
                dev[code[s.prompt]] = 1.0
            else:
                dev[:] = -1.0  # the last prompt: sum-to-zero coding
        for r in range(replicas):
            rep = np.zeros(replicas - 1)
            arm = np.zeros(arms - 1)
            if r:
                rep[r - 1] = 1.0
            if s.arms[r]:
                arm[s.arms[r] - 1] = 1.0
            parts = [rep, arm]
            if labels:
                parts += [np.outer(rep, dev).ravel(), np.outer(arm, dev).ravel()]
            rows.append(np.concatenate(parts))
    return rows


def _design(
    slots: Sequence[CrossoverSlot], metric: str, replicas: int, arms: int, periods: int
) -> _Design:
    logs = np.log(np.array([s.values(metric) for s in slots], dtype=float))
    n = len(slots)
    y = (logs - logs.mean(axis=1, keepdims=True)).ravel()
    z = np.zeros((n * replicas, replicas * periods))
    for i, s in enumerate(slots):
        for r in range(replicas):
            z[i * replicas + r, r * periods + s.period] = 1.0
    for prompts in (True, False):  # each prompt's own effects, where the slots support them
        raw = np.array(_columns(slots, replicas, arms, prompts)).reshape(n, replicas, -1)
        x = (raw - raw.mean(axis=1, keepdims=True)).reshape(n * replicas, -1)
        rank = int(np.linalg.matrix_rank(x)) if x.size else 0
        df = n * replicas - n - rank
        if rank == x.shape[1] and df > 0:
            return _Design(x, z, y, float(df), replicas, arms)
    raise ValueError(
        f"{metric}: the crossover's slots do not separate the replicas from the arms "
        f"({n} slots over {periods} periods); each replica must serve more than one arm"
    )


def _variance(
    part_starts: float, part_resid: float, resid_var: float, resid_df: float, noise: RestartNoise
) -> tuple[float, float]:
    """`sigma_b^2 g + sigma_e^2 h` and its Satterthwaite df (the module's docstring)."""
    starts = part_starts * max(0.0, _between(noise))
    slots = part_resid * resid_var
    value = starts + slots
    if value <= 0:
        return 0.0, resid_df
    if starts > 0 and noise.df <= 0:  # a restart noise of no weight: one df, the least
        return value, 1.0
    start_term = (part_starts * noise.start_variance) ** 2 / noise.df if noise.df > 0 else 0.0
    slot_term = slots**2 / resid_df if resid_df else math.inf
    found = value**2 / (start_term + slot_term) if start_term + slot_term else math.inf
    parts = [d for d, v in ((noise.df, starts), (resid_df, slots)) if v > 0 and d > 0]
    return value, max(1.0, min(parts) if parts else 1.0, found)


@dataclass(frozen=True)
class _Fit:
    beta: np.ndarray
    inverse: np.ndarray
    resid_var: float
    resid_df: float
    design: _Design

    def contrast(self, c: np.ndarray, noise: RestartNoise) -> tuple[float, float, float]:
        """An estimate `c'beta`, its variance and df."""
        a = c @ self.inverse
        g = float(np.sum((a @ self.design.x.T @ self.design.z) ** 2))
        h = float(a @ c)
        var, df = _variance(g, h, self.resid_var, self.resid_df, noise)
        return float(c @ self.beta), var, df

    def starts_share(self, c: np.ndarray, noise: RestartNoise) -> float:
        """The starts' share of an estimate's variance (the rest: the slots')."""
        a = c @ self.inverse
        starts = float(np.sum((a @ self.design.x.T @ self.design.z) ** 2)) * _between(noise)
        slots = float(a @ c) * self.resid_var
        return max(0.0, starts) / (max(0.0, starts) + slots) if starts + slots > 0 else 0.0


def _fit(design: _Design) -> _Fit:
    xtx = design.x.T @ design.x
    inverse = np.linalg.inv(xtx)
    beta = inverse @ (design.x.T @ design.y)
    resid = design.y - design.x @ beta
    return _Fit(beta, inverse, float(resid @ resid) / design.df, design.df, design)


def _effect(name: str, estimate: float, var: float, df: float, confidence: float) -> Effect:
    se = math.sqrt(var)
    t = t_quantile(0.5 + confidence / 2, df)
    return Effect(name, estimate, estimate - t * se, estimate + t * se, se, df)


def _periods(
    slots: Sequence[CrossoverSlot],
    metric: str,
    fit: _Fit,
    noise: RestartNoise,
    periods: int,
    confidence: float,
) -> tuple[Effect, ...]:
    """Each period against the first, from the slots' means less their replicas' and arms'
    fitted effects, on period and prompt terms (between slots)."""
    k, arms = fit.design.replicas, fit.design.arms
    effects = (
        np.concatenate([[0.0], fit.beta[: k - 1]]),
        np.concatenate([[0.0], fit.beta[k - 1 : k - 1 + arms - 1]]),
    )
    labels = sorted({s.prompt for s in slots}, key=repr)
    prompt_of = {label: j for j, label in enumerate(labels)}
    y, rows, z = [], [], []
    for s in slots:
        level = float(np.mean(np.log(np.asarray(s.values(metric), dtype=float))))
        fitted = float(np.mean([effects[0][r] + effects[1][s.arms[r]] for r in range(k)]))
        y.append(level - fitted)
        row = np.zeros(periods - 1 + len(labels))
        if s.period:
            row[s.period - 1] = 1.0
        row[periods - 1 + prompt_of[s.prompt]] = 1.0
        rows.append(row)
        cells = np.zeros(k * periods)
        cells[[r * periods + s.period for r in range(k)]] = 1.0 / k
        z.append(cells)
    x, zz, yy = np.array(rows), np.array(z), np.array(y)
    rank = int(np.linalg.matrix_rank(x))
    df = len(slots) - rank
    if rank < x.shape[1] or df <= 0:
        return ()
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ (x.T @ yy)
    resid = yy - x @ beta
    resid_var = float(resid @ resid) / df
    out = []
    for p in range(1, periods):
        c = np.zeros(x.shape[1])
        c[p - 1] = 1.0
        a = c @ inverse
        g = float(np.sum((a @ x.T @ zz) ** 2))
        var, pdf = _variance(g, float(a @ c), resid_var, float(df), noise)
        out.append(
            _effect(f"period {p + 1} against period 1", float(beta[p - 1]), var, pdf, confidence)
        )
    return tuple(out)


def _koch_p(slots: Sequence[CrossoverSlot], metric: str) -> float:
    """Two replicas: Mann-Whitney of the first period's differences against the second's, each
    prompt's mean difference over both periods taken out (Koch's test for a 2x2 crossover)."""
    d = np.array([math.log(s.values(metric)[1] / s.values(metric)[0]) for s in slots])
    prompts = [s.prompt for s in slots]
    centre = {p: float(d[[q == p for q in prompts]].mean()) for p in set(prompts)}
    aligned = d - np.array([centre[p] for p in prompts])
    first = aligned[[s.period == 0 for s in slots]]
    second = aligned[[s.period == 1 for s in slots]]
    if not first.size or not second.size:
        return 1.0
    p = float(_st.mannwhitneyu(first, second, alternative="two-sided").pvalue)
    return p if math.isfinite(p) else 1.0


def _what_it_needs(share: float) -> str:
    """An undecided crossover: what would narrow it, from the starts' share of its variance."""
    if share >= 0.5:
        return (
            f"the starts make {share:.0%} of its variance, which more slots cannot average out: "
            "another crossover (two more periods, each replica restarted again) would narrow it"
        )
    return f"the slots make {1 - share:.0%} of its variance: more slots per period would narrow it"


# --------------------------------------------------------------------------- the entry


def crossover_of(
    slots: Sequence[CrossoverSlot],
    *,
    alpha: float,
    margin: float,
    restart_noise: Mapping[str, RestartNoise],
) -> CrossoverResult:
    """The crossover's change, replica and period effects and verdicts, per candidate and metric
    (the module's docstring). `restart_noise`: per metric, one start's effect as the project
    knows it (analysis/verdict/noise.py; `RestartNoise.assumed` where nothing was measured);
    `margin`: the minimum effect, as `--spec-min-effect`."""
    if not slots:
        raise ValueError("the crossover has no slot")
    replicas = len(slots[0].arms)
    if replicas < 2 or any(len(s.arms) != replicas for s in slots):
        raise ValueError("every slot must name the arm of each of two or more replicas")
    arms = max(a for s in slots for a in s.arms) + 1
    periods = max(s.period for s in slots) + 1
    metrics = [
        m for m in METRICS if all((v := s.values(m)) is not None and len(v) == replicas
                                  for s in slots)
    ]  # fmt: skip
    for i, s in enumerate(slots):
        for m in metrics:
            if not all(math.isfinite(v) and v > 0 for v in s.values(m) or ()):
                raise ValueError(f"slot {i} (period {s.period}): {m} must be finite and > 0")
    missing = [m for m in metrics if m not in restart_noise]
    if missing:
        raise ValueError(f"no restart noise given for {', '.join(missing)}")
    family = (arms - 1) * len(metrics)
    confidence = 1.0 - 2.0 * alpha / family
    found = []
    for metric in metrics:
        fit = _fit(_design(slots, metric, replicas, arms, periods))
        noise = restart_noise[metric]
        rep = []
        for r in range(1, replicas):
            c = np.zeros(fit.beta.size)
            c[r - 1] = 1.0
            est, var, df = fit.contrast(c, noise)
            rep.append(_effect(f"replica {r + 1} against replica 1", est, var, df, confidence))
        per = _periods(slots, metric, fit, noise, periods, confidence)
        for arm in range(1, arms):
            c = np.zeros(fit.beta.size)
            c[replicas - 1 + arm - 1] = 1.0
            est, var, df = fit.contrast(c, noise)
            se = math.sqrt(var)
            t = t_quantile(0.5 + confidence / 2, df)
            interval = Interval(est, est - t * se, est + t * se, se, df, confidence, "crossover")
            if replicas == 2 and arms == 2:
                p = _koch_p(slots, metric)
            else:
                p = float(2.0 * _st.t.sf(abs(est) / se, df)) if se > 0 else 1.0
            share = fit.starts_share(c, noise)
            found.append((metric, arm, interval, tuple(rep), per, p, noise, share))
    adjusted = holm_adjust([f[5] for f in found])
    out = []
    for (metric, arm, interval, rep, per, p, noise, share), p_adj in zip(
        found, adjusted, strict=True
    ):
        verdict, reason = decide(
            interval,
            higher_is_better=METRICS[metric],
            min_effect=margin,
            p_adjusted=p_adj,
            alpha=alpha,
            noise=noise,
            family=family,
            starts=(replicas, replicas),
        )
        reason = reason.replace("interval of the change", "interval of the change by crossover", 1)
        if verdict is Verdict.INCONCLUSIVE and "straddles" in reason:
            reason = reason.split("; ")[0] + "; " + _what_it_needs(share)
        out.append(
            CrossoverMetric(
                metric, arm, METRICS[metric], interval, rep, per, p, p_adj, verdict, reason
            )
        )
    return CrossoverResult(replicas, arms, periods, len(slots), tuple(out))
