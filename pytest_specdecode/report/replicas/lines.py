"""The plan of a target of several replicas (pure): each replica, whether they are alike, and the
crossover's periods in words (docs/replicas.md)."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from ...analysis.replicas.alike import Alike, ReplicaFacts
from ...analysis.replicas.crossover import CrossoverMetric, CrossoverResult, Effect
from ...analysis.verdict.stats import Verdict
from ...config.replicas import ReplicaConfig, crossover_periods, restarts_of
from .crossovers import CrossoverPlan

STATISTICS = 'docs/statistics.md, "Across replicas: the crossover"'


def replicas_plan(
    replicas: Sequence[ReplicaConfig],
    facts: Sequence[ReplicaFacts],
    found: Alike,
    *,
    baseline: str,
    candidates: Sequence[str],
    crossovers: CrossoverPlan | None = None,
) -> list[str]:
    """The plan's lines: the replicas, what was read on each, the findings, the periods, and
    (`crossovers`) how many crossovers a decision needs."""
    lines = [
        f"pytest-specdecode dry run: a target of {len(replicas)} replicas; nothing was touched "
        "(only read on each host)",
        "replicas:",
    ]
    for replica in replicas:
        lines.append(f"  {replica.describe()}")
        if replica.drain or replica.undrain:
            drain = shlex.join(replica.drain) if replica.drain else "none"
            undrain = shlex.join(replica.undrain) if replica.undrain else "none"
            lines.append(
                f"    out of its load balancer before its candidate period: {drain}; "
                f"back after: {undrain}"
            )
    lines.append("read on each replica:")
    lines += [f"  {f.describe()}" for f in facts]
    if candidates:
        lines.append(
            f"validated the candidates ({', '.join(candidates)}) against each replica's vLLM "
            "(the offline list where one could not be asked)"
        )
    lines += alike_lines(found)
    planned = crossovers.planned if crossovers else 1
    lines += schedule_lines([r.name for r in replicas], baseline, candidates, planned)
    if crossovers is not None and candidates:
        lines += crossovers.lines()
    lines.append(
        "a run (without --spec-dry-run) checks the replicas again, then runs these periods; "
        "each replica is restored at the end, all at once, whatever happens"
    )
    return lines


def alike_lines(found: Alike) -> list[str]:
    """The alike check's findings: refused, differs, could not tell; or alike."""
    lines = [f"refused: {line}" for line in found.refusals]
    lines += [
        f"differs (the crossover cancels it as the replica effect): {line}"
        for line in found.differences
    ]
    lines += [f"could not compare: {line}" for line in found.unknown]
    if not found.refusals and not found.differences:
        lines.insert(0, "alike: the same model, vLLM, GPUs and driver on every replica read")
    return ["alike check:", *(f"  {line}" for line in lines)]


def schedule_lines(
    replicas: Sequence[str], baseline: str, candidates: Sequence[str], crossovers: int = 1
) -> list[str]:
    """The crossover's periods in words, and each replica's restarts (`crossovers`: as many
    as the plan makes at most)."""
    if not candidates:
        return [
            "crossover: no candidate given (--spec-config NAME): with one, period 1 has the "
            "first replica serve the baseline and the second the candidate, period 2 swaps them"
        ]
    arms = [baseline, *candidates]
    periods = crossover_periods(replicas, arms)
    kind = "AB/BA crossover" if len(arms) == 2 and len(replicas) == 2 else "rotation"
    lines = [f"crossover ({kind}: each replica serves each arm once; slots sent to all at once):"]
    for period in periods:
        first = period.number == 1
        serving = ", ".join(_serves(r, arm, baseline, first) for r, arm in period.serving)
        lines.append(f"  period {period.number}: {serving}")
    if crossovers > 1:
        lines.append(
            f"  then again, up to {crossovers} crossovers in all ({len(arms) * crossovers} "
            "periods, each replica restarted at each): a look after each, no more once decided"
        )
    every = crossover_periods(replicas, arms, crossovers)
    restarts = ", ".join(f"{r} {restarts_of(every, r, baseline)}" for r in replicas)
    most = " at most" if crossovers > 1 else ""
    lines.append(f"  restarts{most}, each back to its original at the end: {restarts}")
    lines.append(
        "  the change: the mean of the periods' differences; the replica effect: half their "
        f"difference ({STATISTICS})"
    )
    return lines


def _serves(replica: str, arm: str, baseline: str, first: bool) -> str:
    if arm != baseline:
        return f"{replica} candidate {arm}"
    how = "its original, not restarted" if first else "its original, restarted back"
    return f"{replica} the {baseline} ({how})"


# --------------------------------------------------------------------------- after the run

SCALE = "log-ratio"  # every estimate: log(candidate / baseline); exp(x) - 1 is the percent


def candidate_verdict(metrics: Sequence[CrossoverMetric]) -> Verdict:
    """One candidate's verdict over its metrics: regressed where any metric regressed;
    improved where one improved and none regressed; equivalent where all are; else
    inconclusive (the gate fails on it, as on any undecided verdict)."""
    found = {m.verdict for m in metrics}
    if Verdict.REGRESSED in found:
        return Verdict.REGRESSED
    if Verdict.IMPROVED in found:
        return Verdict.IMPROVED
    if found == {Verdict.EQUIVALENT}:
        return Verdict.EQUIVALENT
    return Verdict.INCONCLUSIVE


def _bounds(estimate: float, low: float, high: float, df: float) -> dict[str, float]:
    return {"estimate": estimate, "low": low, "high": high, "df": df}


def _effect(effect: Effect) -> dict[str, Any]:
    return {"name": effect.name, **_bounds(effect.estimate, effect.low, effect.high, effect.df)}


def crossover_json(result: CrossoverResult, candidates: Sequence[str]) -> dict[str, Any]:
    """results.json's `crossover`: per candidate, per metric, the change, the replica effect and
    the period effect, each with its interval and df (log-ratio), and the candidate's verdict."""
    out: dict[str, Any] = {}
    for arm, name in enumerate(candidates, start=1):
        metrics = [m for m in result.metrics if m.arm == arm]
        entry: dict[str, Any] = {"scale": SCALE, "verdict": candidate_verdict(metrics).value}
        for m in metrics:
            c = m.change
            entry[m.metric] = {
                "scale": SCALE,
                "change": _bounds(c.estimate, c.low, c.high, c.df),
                "replica_effect": _effect(m.replicas[0]) if m.replicas else None,
                "period_effect": _effect(m.periods[0]) if m.periods else None,
                "replica_effects": [_effect(e) for e in m.replicas],
                "period_effects": [_effect(e) for e in m.periods],
                "confidence": c.confidence,
                "verdict": m.verdict.value,
                "reason": m.reason,
                "restart_noise": m.noise.to_dict() if m.noise else None,
                "prompt_terms": m.prompt_terms,
            }
        entry.update(
            slots=result.slots,
            periods=result.periods,
            replicas=result.replicas,
            crossovers=result.crossovers,
            planned=result.planned,
            family=result.family,
            dropped=list(result.dropped),
        )
        noise = next((m.noise for m in metrics if m.noise), None)
        entry["restart_noise"] = noise.source if noise else None
        out[name] = entry
    return out


def look_line(result: CrossoverResult, candidates: Sequence[str], *, decided: bool) -> str:
    """The look after a crossover, one line: each candidate's metrics and what comes next."""
    parts = []
    for arm, name in enumerate(candidates, start=1):
        for m in (m for m in result.metrics if m.arm == arm):
            c = m.change
            parts.append(
                f"{name} {m.metric} {math.expm1(c.estimate):+.1%} [{math.expm1(c.low):+.1%}, "
                f"{math.expm1(c.high):+.1%}] ({c.confidence:.2%}): {m.verdict.value}"
            )
    head = f"look after crossover {result.crossovers} of {result.planned}: " + "; ".join(parts)
    if decided:
        return f"{head}; decided: no more crossovers"
    if not result.measured:
        return f"{head}; not taken (the restart noise is not measured yet): crossover " + str(
            result.crossovers + 1
        )
    return f"{head}; not decided: crossover {result.crossovers + 1}"


def _made_lines(entry: Mapping[str, Any]) -> list[str]:
    """How many crossovers were made and why no more; a metric left out, with the family and
    level it leaves."""
    lines = []
    made, planned = entry.get("crossovers", 1), entry.get("planned", 1)
    if planned > 1:
        lines.append(
            f"  {made} crossover{'s' if made != 1 else ''} of {planned} planned "
            f"({entry.get('stopped') or 'as planned'})"
        )
    for text in entry.get("dropped") or ():
        family = entry.get("family", 1)
        level = next((entry[m]["confidence"] for m in ("throughput", "tpot") if entry.get(m)), None)
        at = f", each interval at {level:.1%}" if level is not None else ""
        lines.append(f"  {text}: the family is {family} (candidates x metrics analysed){at}")
    return lines


def _noise_lines(metric: str, found: Mapping[str, Any]) -> list[str]:
    """The restart noise the change took, and whether each prompt's own effects were fitted."""
    lines = []
    noise = found.get("restart_noise")
    if noise:
        sd = f"{noise['sd']:.1%}, " if noise.get("measured") else ""
        lines.append(f"  {metric}: restart noise {sd}{noise['source']}")
    if "prompt_terms" in found:
        lines.append(
            f"  {metric}: each prompt's own change and replica effect fitted"
            if found["prompt_terms"]
            else f"  {metric}: each prompt's own effects not fitted (each prompt once a period "
            "leaves them no degrees of freedom: they land in the residual)"
        )
    return lines


def _pct(x: Mapping[str, float]) -> str:
    return (
        f"{math.expm1(x['estimate']):+.1%} [{math.expm1(x['low']):+.1%}, "
        f"{math.expm1(x['high']):+.1%}] ({x['df']:.0f} df)"
    )


def crossover_lines(
    crossover: Mapping[str, Any] | None,
    replicas: Sequence[Mapping[str, Any]],
    *,
    names: Sequence[str],
    why_none: str | None = None,
) -> list[str]:
    """The crossover's result in words, for the terminal and summary.md: per candidate and
    metric the change, the replica effect and the period effect with their intervals (each
    replica and period against the first, named); per replica, what it was and how it was
    left, and its starts."""
    lines: list[str] = []
    first, second = (names[0], names[1]) if len(names) > 1 else ("the first", "the second")
    if crossover is None:
        lines.append(f"crossover: no analysis ({why_none or 'nothing was measured'})")
    else:
        for name, entry in crossover.items():
            lines.append(f"crossover: {name} against the baseline: {entry['verdict']}")
            lines += _made_lines(entry)
            for metric in ("throughput", "tpot"):
                found = entry.get(metric)
                if not found:
                    continue
                lines.append(f"  {metric}: change {_pct(found['change'])}: {found['verdict']}")
                if found.get("replica_effect"):
                    lines.append(
                        f"  {metric}: replica effect ({second} against {first}) "
                        f"{_pct(found['replica_effect'])}"
                    )
                if found.get("period_effect"):
                    lines.append(
                        f"  {metric}: period effect (period 2 against period 1) "
                        f"{_pct(found['period_effect'])}"
                    )
                lines.append(f"  {metric}: {found['reason']}")
                lines += _noise_lines(metric, found)
    for replica in replicas:
        unit = f"unit {replica['unit']} on " if replica.get("unit") else ""
        lines.append(
            f"replica {replica['name']} ({unit}{replica['host']}): was {replica['was']}, "
            f"left {replica['left']}; {replica['starts']} start(s) by this run"
        )
    return lines
