"""Across replicas: the crossover (AB/BA), repeated, and a rotation for more replicas or arms.
Pure.

Two replicas of one model are not one machine (two leases of "the same" H200 ran 30% apart).
A candidate on replica B against the baseline on replica A measures the change plus B's own
speed. The crossover swaps them: period 1, replica A keeps its original (the baseline) and B
serves the candidate; period 2, A serves the candidate and B its original. Each slot's prompt
goes to every replica at once, so a slot costs one request's time and the moment it was sent
(and its prompt) is shared by both values. A run may repeat the crossover (periods 3 and 4 as 1
and 2, each replica restarted again), and stop once decided (looks.py).

The call (the orchestration builds the slots; nothing here touches a replica)::

    crossover_of(slots: Sequence[CrossoverSlot], *, alpha: float, margin: float,
                 restart_noise: Mapping[str, RestartNoise], planned: int = 1) -> CrossoverResult

    schedule = rotation(replicas=2, arms=2)      # ((0, 1), (1, 0)): per period, per replica
    result = crossover_of(slots, alpha=0.05, margin=0.03, restart_noise={"throughput": noise})
    result.metrics[0].change   # interval.Interval of log(candidate / baseline), by="crossover"
    result.metrics[0].verdict  # through stats.decide, as every verdict of the project
    result.of("throughput").lines()  # the change, the replica and period effects, as printed

Each `CrossoverSlot` holds its period (0-based, over every crossover: crossover `c`'s periods
are `c * arms ...`), its prompt, the arm each replica served in that period
(`rotation(...)[period % arms]`; 0: the baseline, 1.. the candidates) and per replica the
request's throughput and TPOT. `restart_noise` is, per metric, one start's effect as known
outside this run (the replicas' host profiles, a stored run's crossovers; else
`RestartNoise.assumed`); `planned`: the crossovers the run planned, whose looks set the
interval's level (looks.py).

**The model (two replicas, two periods).** Per slot, `d = log(B) - log(A)`. With `rho` the
replica effect (B's own speed against A's), `delta` the change and `o_p` period `p`'s offset
(the difference of the two servers' start effects: `2 sigma_b^2` of variance):

    period 1 (A baseline, B candidate):  d = rho + delta + o_1 + e
    period 2 (A candidate, B baseline):  d = rho - delta + o_2 + e

so `delta = (mean d_1 - mean d_2) / 2` and `rho = (mean d_1 + mean d_2) / 2`, each with variance
`sigma_b^2 + sigma_d^2 (1/n_1 + 1/n_2) / 4`: the four starts' effects (each weighed 1/2) and the
slots' own spread; over N crossovers, the mean of theirs. A period effect `pi`, a shift that hits
both replicas between the periods (drift, a neighbour, the time of day), cancels in every `d`;
it shows in the levels. Replica A moves by `pi + delta + e` between the periods (baseline to
candidate), B by `pi - delta + e` (candidate to baseline), so their average, the mean of both
replicas' log values in period 2 less that in period 1, is `pi`, with the same start part
`sigma_b^2` and the spread of the slots' own level.

**Many replicas, many arms.** `rotation` gives a cyclic Latin square: replica `r` serves arm
`(r + p) mod m` in period `p`, so each replica serves each arm once and the first replica keeps
its original in the first period. The analysis is one linear model within slots (model.py: each
slot's mean taken out, so its prompt and its moment cancel; each prompt's own effects where they
have degrees of freedom). The period effects come from the slots' means, their prompts' levels
and the fitted replica and arm effects taken out.

**The starts** (model.py). One crossover cannot measure its own starts: its `sigma_b^2` is the
outside's (measured, or assumed with its weight). From the second crossover on, the run's own
starts measure it (`df_Z`: `2N - 2` for N AB/BA crossovers), pooled with a measured outside by
degrees of freedom; an outside only assumed is then set aside (pooled, a 5% assumption on a host
whose starts move 10% let false calls reach twice alpha). Degrees of freedom are Satterthwaite's
over the starts' part and the slots', never below the fewer of the two parts' own, nor below 1.

**Verdicts.** Each candidate's change per metric is decided by `stats.decide` at the family's
`1 - 2 alpha / m` (m = candidates x metrics analysed; Bonferroni, as `compare_family`), or at the
look's boundary where the run planned several crossovers (looks.py). A metric some slot lacks
(TPOT, where a replica's output was one token) is left out of the analysis and of `m`, and the
result names it (`dropped`). The ranks' guard (guard.py) for two replicas and two arms is
Wilcoxon's signed-rank test over the matched slots' differences, Holm over the family; for a
larger rotation, the interval's own t p-value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats as _st

from ..variance.restarts import RestartNoise, t_quantile
from ..verdict.interval import Interval
from ..verdict.stats import Verdict, decide, holm_adjust
from .guard import ranks_p
from .looks import look_confidence
from .model import Fit, Table, design_of, fit, full_rank, known_noise, rotation, variance

__all__ = [
    "DECIDED",
    "METRICS",
    "CrossoverMetric",
    "CrossoverResult",
    "CrossoverSlot",
    "Effect",
    "crossover_of",
    "rotation",
]

METRICS = {"throughput": True, "tpot": False}  # metric: higher is better
DECIDED = (Verdict.REGRESSED, Verdict.IMPROVED, Verdict.EQUIVALENT)


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
    noise: RestartNoise | None = None  # the restart noise the change took (model.known_noise)
    prompt_terms: int = 0  # columns of each prompt's own effects fitted (0: none had df)

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
            "restart_noise": self.noise.to_dict() if self.noise else None,
            "prompt_terms": self.prompt_terms,
        }  # fmt: skip


@dataclass(frozen=True)
class CrossoverResult:
    """The crossover's analysis: per candidate and metric, the change and its verdict."""

    replicas: int
    arms: int
    periods: int
    slots: int
    metrics: tuple[CrossoverMetric, ...]
    crossovers: int = 1  # complete rotations analysed
    planned: int = 1  # the run's planned crossovers (looks.py)
    family: int = 1  # m: candidates x metrics analysed
    dropped: tuple[str, ...] = field(default=())  # a metric left out, and why

    def of(self, metric: str, arm: int = 1) -> CrossoverMetric:
        return next(m for m in self.metrics if m.metric == metric and m.arm == arm)

    def candidate_decided(self, arm: int) -> bool:
        """A candidate is decided where a metric regressed, or every metric is decided (as a
        side-by-side cell's stop: analysis/verdict/sequential.py)."""
        found = [m.verdict for m in self.metrics if m.arm == arm]
        return Verdict.REGRESSED in found or all(v in DECIDED for v in found)

    @property
    def decided(self) -> bool:
        """Every candidate decided: the run may stop."""
        return all(self.candidate_decided(a) for a in range(1, self.arms))

    @property
    def stops(self) -> bool:
        """At a look: no more crossovers. Every candidate decided, on a restart noise that was
        measured (an assumed one never stops a run that planned more than one crossover)."""
        return self.decided and self.measured

    @property
    def measured(self) -> bool:
        """Whether every metric's restart noise was measured (outside, or by this run's own
        crossovers): a run that planned several crossovers decides only on a measured one."""
        return all(m.noise is not None and m.noise.measured for m in self.metrics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "arms": self.arms,
            "periods": self.periods,
            "slots": self.slots,
            "crossovers": self.crossovers,
            "planned": self.planned,
            "family": self.family,
            "dropped": list(self.dropped),
            "metrics": [m.to_dict() for m in self.metrics],
        }


def _periods(
    table: Table,
    metric: str,
    fit: Fit,
    noise: RestartNoise,
    periods: int,
    confidence: float,
) -> tuple[Effect, ...]:
    """Each period against the first, from the slots' means less their replicas' and arms'
    fitted effects, on period and prompt terms (between slots)."""
    k, arms = fit.design.replicas, fit.design.arms
    replica = np.concatenate([[0.0], fit.beta[: k - 1]])
    arm = np.concatenate([[0.0], fit.beta[k - 1 : k - 1 + arms - 1]])
    logs, period = table.logs[metric], table.period
    n = period.size
    yy = logs.mean(axis=1) - (replica[None, :] + arm[table.arms]).mean(axis=1)
    x = np.zeros((n, periods - 1 + len(table.labels)))
    later = period > 0
    x[np.flatnonzero(later), period[later] - 1] = 1.0
    x[np.arange(n), periods - 1 + table.prompt] = 1.0
    df = n - x.shape[1]
    if df <= 0 or not full_rank(x):
        return ()
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ (x.T @ yy)
    resid = yy - x @ beta
    resid_var = float(resid @ resid) / df
    # each period effect's weights on the starts: a slot's level holds each of its period's k
    # starts at 1/k, so the weights are the same for every replica's start of a period
    per_period = np.stack(
        [np.bincount(period, weights=x[:, j], minlength=periods) for j in range(x.shape[1])]
    )
    starts = inverse[: periods - 1] @ per_period / k
    out = []
    for p in range(1, periods):
        g = float(k * np.sum(starts[p - 1] ** 2))
        var, pdf = variance(g, float(inverse[p - 1, p - 1]), resid_var, float(df), noise)
        out.append(
            _effect(f"period {p + 1} against period 1", float(beta[p - 1]), var, pdf, confidence)
        )
    return tuple(out)


def _effect(name: str, estimate: float, var: float, df: float, confidence: float) -> Effect:
    se = math.sqrt(var)
    t = t_quantile(0.5 + confidence / 2, df)
    return Effect(name, estimate, estimate - t * se, estimate + t * se, se, df)


def _what_it_needs(share: float, own: float | None) -> str:
    """An undecided crossover: what would narrow it, from the starts' share of its variance;
    `own`: the df the run's own starts gave it (repeated crossovers), else None."""
    if own is not None:
        return (
            f"its variance is this run's own, on the starts' {own:g} degrees of freedom: another "
            "crossover would narrow it and add to them"
        )
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
    planned: int = 1,
) -> CrossoverResult:
    """The crossover's change, replica and period effects and verdicts, per candidate and metric
    (the module's docstring). `restart_noise`: per metric, one start's effect as known outside
    this run (`RestartNoise.assumed` where nothing was measured); `margin`: the minimum effect,
    as `--spec-min-effect`; `planned`: the crossovers the run planned (looks.py)."""
    if not slots:
        raise ValueError("the crossover has no slot")
    replicas = len(slots[0].arms)
    if replicas < 2 or any(len(s.arms) != replicas for s in slots):
        raise ValueError("every slot must name the arm of each of two or more replicas")
    arms = max(a for s in slots for a in s.arms) + 1
    periods = max(s.period for s in slots) + 1
    metrics, dropped = _metrics(slots, replicas)
    table = Table.of(slots, metrics)
    missing = [m for m in metrics if m not in restart_noise]
    if missing:
        raise ValueError(f"no restart noise given for {', '.join(missing)}")
    family = (arms - 1) * len(metrics)
    crossovers = max(1, periods // arms)
    confidence = look_confidence(crossovers, planned, alpha=alpha, family=family)
    found = []
    for metric in metrics:
        model = fit(design_of(table, metric, arms, periods))
        outside = restart_noise[metric]
        noise = known_noise(model.starts, outside, crossovers=crossovers)
        rep = []
        for r in range(1, replicas):
            c = np.zeros(model.beta.size)
            c[r - 1] = 1.0
            est, var, df = model.contrast(c, outside)
            rep.append(_effect(f"replica {r + 1} against replica 1", est, var, df, confidence))
        per = _periods(table, metric, model, noise, periods, confidence)
        for arm in range(1, arms):
            c = np.zeros(model.beta.size)
            c[replicas - 1 + arm - 1] = 1.0
            est, var, df = model.contrast(c, outside)
            se = math.sqrt(var)
            t = t_quantile(0.5 + confidence / 2, df)
            interval = Interval(est, est - t * se, est + t * se, se, df, confidence, "crossover")
            if replicas == 2 and arms == 2:
                p = ranks_p(table, metric)
            else:
                p = float(2.0 * _st.t.sf(abs(est) / se, df)) if se > 0 else 1.0
            share = model.starts_share(c, noise)
            own = model.starts.df if model.starts is not None else None
            terms = model.design.prompt_terms
            found.append((metric, arm, interval, tuple(rep), per, p, noise, (share, own), terms))
    adjusted = holm_adjust([f[5] for f in found])
    out = []
    for (metric, arm, interval, rep, per, p, noise, (share, own), terms), p_adj in zip(
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
            starts=(crossovers * replicas, crossovers * replicas),
        )
        reason = reason.replace("interval of the change", "interval of the change by crossover", 1)
        if verdict is Verdict.INCONCLUSIVE and "straddles" in reason:
            reason = reason.split("; ")[0] + "; " + _what_it_needs(share, own)
        out.append(
            CrossoverMetric(
                metric, arm, METRICS[metric], interval, rep, per, p, p_adj, verdict, reason,
                noise, terms,
            )
        )  # fmt: skip
    return CrossoverResult(
        replicas, arms, periods, len(slots), tuple(out), crossovers, max(planned, crossovers),
        family, dropped,
    )  # fmt: skip


def _metrics(slots: Sequence[CrossoverSlot], replicas: int) -> tuple[list[str], tuple[str, ...]]:
    """The metrics every slot has, and per metric left out, why (its first slot without)."""
    kept, dropped = [], []
    for m in METRICS:
        lacking = next((s for s in slots if (v := s.values(m)) is None or len(v) != replicas), None)
        if lacking is None:
            kept.append(m)
        else:
            dropped.append(
                f"{m}: not analysed, a slot of period {lacking.period + 1} (prompt "
                f"{lacking.prompt}) has none on a replica (a one-token output has no {m})"
            )
    return kept, tuple(dropped)
