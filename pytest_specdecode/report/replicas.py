"""The plan of a target of several replicas (pure): each replica, whether they are alike, and the
crossover's periods in words (docs/replicas.md)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from ..analysis.replicas_alike import Alike, ReplicaFacts
from ..config.replicas import ReplicaConfig, crossover_periods, restarts_of

STATISTICS = 'docs/statistics.md, "Across replicas: the crossover"'


def replicas_plan(
    replicas: Sequence[ReplicaConfig],
    facts: Sequence[ReplicaFacts],
    found: Alike,
    *,
    baseline: str,
    candidates: Sequence[str],
) -> list[str]:
    """The plan's lines: the replicas, what was read on each, the findings, the periods."""
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
    lines += schedule_lines([r.name for r in replicas], baseline, candidates)
    lines.append(
        "not yet built: the crossover run itself; a run (without --spec-dry-run) stops before "
        "anything is touched"
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


def schedule_lines(replicas: Sequence[str], baseline: str, candidates: Sequence[str]) -> list[str]:
    """The crossover's periods in words, and each replica's restarts."""
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
    restarts = ", ".join(f"{r} {restarts_of(periods, r, baseline)}" for r in replicas)
    lines.append(f"  restarts, each back to its original at the end: {restarts}")
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
