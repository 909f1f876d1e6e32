"""The crossover's plan across replicas (pure): what one and N crossovers can call, how many a
decision needs, how long they take, and where the noise it plans by comes from.

The run makes the plan's number of crossovers (each replica restarted into each arm once per
crossover), up to `[run] crossovers`, looks after each and stops once decided
(analysis/replicas/looks.py). What it plans by (`CrossoverKnown`, read by
run/crossover_known.py): per metric the restart noise known outside the run (the replicas'
host profiles, a stored run's repeated crossovers; else the assumption) and a request's spread
within its slot (a stored crossover run's slots, else the profiles' residual, else assumed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...analysis.replicas.crossover import METRICS
from ...analysis.replicas.looks import DETECT, CrossoverReach, crossovers_needed, reach
from ...analysis.variance.restarts import RestartNoise
from ...config.settings import Settings
from ..schedule import Timing
from ..text import noise_text

__all__ = ["BEYOND", "CrossoverKnown", "CrossoverPlan", "plan_of"]

BEYOND = 50  # past the most crossovers, how far the plan looks to say what a decision needs


@dataclass(frozen=True)
class CrossoverKnown:
    """What the plan knows before the run, per metric."""

    noise: Mapping[str, RestartNoise]  # one start's effect, known outside this run
    slot_var: Mapping[str, float]  # a request's variance within its slot (log scale)
    slot_source: str
    timing: Timing | None = None

    @property
    def measured(self) -> bool:
        return all(n.measured for n in self.noise.values())


@dataclass(frozen=True)
class CrossoverPlan:
    """How many crossovers, what they can call and how long they take."""

    planned: int  # crossovers the run makes at most (it stops once decided)
    most: int  # [run] crossovers
    needed: int | None  # crossovers a `detect` change needs at 80% power, up to `most`
    detect: float
    slots: int  # measured slots a period
    samples: int  # [run] samples: per prompt type, a period's slots
    periods: int  # a crossover's periods (its arms)
    known: CrossoverKnown
    reaches: Mapping[str, tuple[CrossoverReach, ...]] = field(default_factory=dict)  # N = 1..
    crossover_s: float | None = None  # one crossover's time, where a pace is known
    beyond: int | None = None  # past `most`: about how many it needs (None: over BEYOND)
    more_slots: tuple[int, int] | None = None  # (samples, crossovers) that fit in `most`

    def at(self, n: int, metric: str = "throughput") -> CrossoverReach:
        return self.reaches[metric][n - 1]

    def lines(self) -> list[str]:
        """The plan's words: the noise it plans by, what 1 and N crossovers call, the number
        the run makes and its time."""
        known, n = self.known, self.planned
        lines = ['crossovers (docs/replicas.md, "Repeated crossovers and the stop"):']
        for metric, noise in known.noise.items():
            lines.append(f"  restart noise, {metric}: {noise_text(noise)}")
        if not known.measured:
            lines.append(
                "  the restart noise is not measured: from the second crossover on, the run's own "
                "crossovers measure it and the assumption is set aside; the first crossover's "
                "look is not taken"
            )
        spread = ", ".join(
            f"{m} {math.sqrt(v):.1%}" for m, v in known.slot_var.items() if m in self.reaches
        )
        lines.append(f"  a request's spread within its slot: {spread} ({known.slot_source})")
        one, many = self._reach(1), self._reach(n)
        lines.append(
            f"  what 1 crossover ({self.periods} periods of {self.slots} slots, each replica "
            f"restarted {self.periods} times) can call with 80% power: {one}"
        )
        if n > 1:
            lines.append(f"  what {n} crossovers can call with 80% power: {many}")
        need = f"{self.detect:.0%} change"
        if self.needed is not None:
            lines.append(f"  a {need} needs {self.needed} crossover{_s(self.needed)} (80% power)")
        else:
            about = f"about {self.beyond}" if self.beyond is not None else f"more than {BEYOND}"
            lines.append(
                f"  a {need} needs {about} crossovers of {self.slots} slots a period: more than "
                f"this run makes ([run] crossovers, --spec-crossovers {self.most})"
                + (
                    "; soonest with "
                    + (
                        f"--spec-samples {self.more_slots[0]} and "
                        if self.more_slots[0] != self.samples
                        else ""
                    )
                    + f"--spec-crossovers {self.more_slots[1]}"
                    if self.more_slots
                    else ""
                )
            )
        lines.append(
            f"  this run makes up to {n} crossover{_s(n)}, "
            + (
                "looking after each and stopping once every candidate is decided"
                if n > 1
                else "one AB/BA (or one rotation), no look before its end"
            )
            + self._time(n)
        )
        return lines

    def _reach(self, n: int) -> str:
        parts = []
        for metric, found in self.reaches.items():
            r = found[n - 1]
            call = f"±{r.detectable:.1%}" if math.isfinite(r.detectable) else "no change"
            parts.append(f"{metric} {call} (its interval about ±{r.half_width:.1%})")
        return "; ".join(parts)

    def _time(self, n: int) -> str:
        if self.crossover_s is None or self.known.timing is None:
            return "; no pace known for these replicas, so no time"
        total = self.crossover_s * n
        return (
            f"; about {_minutes(self.crossover_s)} a crossover, {_minutes(total)} for {n} "
            f"({self.known.timing.source})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "most": self.most,
            "needed": self.needed,
            "beyond": self.beyond,
            "more_slots": list(self.more_slots) if self.more_slots else None,
            "detect": self.detect,
            "slots": self.slots,
            "restart_noise": {m: n.to_dict() for m, n in self.known.noise.items()},
            "slot_var": dict(self.known.slot_var),
            "slot_source": self.known.slot_source,
            "reach": {
                m: [
                    {"crossovers": r.crossovers, "detectable": _finite(r.detectable),
                     "half_width": _finite(r.half_width), "df": r.df}
                    for r in found
                ]
                for m, found in self.reaches.items()
            },
            "crossover_s": self.crossover_s,
        }  # fmt: skip


def plan_of(
    settings: Settings,
    known: CrossoverKnown,
    *,
    slots: int,
    warmup: int,
    detect: float | None = None,
) -> CrossoverPlan:
    """The plan: the fewest crossovers that call `detect` (else DETECT) with 80% power, up to
    `[run] crossovers`; at least two where the restart noise is not measured (one crossover
    cannot measure its own); the most, where the most cannot."""
    run = settings.run
    replicas = max(2, len(settings.replicas))
    arms = 1 + max(1, len(settings.candidates))
    family = (arms - 1) * len(METRICS)
    change = abs(detect) if detect else DETECT
    most = max(1, run.crossovers)
    common = dict(
        slots=max(1, slots), alpha=run.alpha, family=family, margin=run.min_effect,
        replicas=replicas, arms=arms,
    )  # fmt: skip
    needed = _needed(change, known, most=most, **common)
    beyond = (
        None if needed is not None else _needed(change, known, most=BEYOND, looks=False, **common)
    )
    more_slots = None if needed is not None else _cheapest(change, known, run, warmup, common)
    floor = 1 if known.measured else min(2, most)
    planned = min(most, max(floor, needed or most))
    reaches = {
        metric: tuple(
            reach(known.noise[metric], slot_var=known.slot_var[metric], crossovers=n, **common)
            for n in range(1, max(planned, 1) + 1)
        )
        for metric in METRICS
    }
    crossover_s = None
    timing = known.timing
    if timing is not None and timing.s_per_token is not None:
        slot_s = run.max_tokens * timing.s_per_token
        crossover_s = arms * (timing.start_s + (warmup + slots) * slot_s) * timing.pace
    return CrossoverPlan(
        planned, most, needed, change, slots, run.samples, arms, known, reaches, crossover_s,
        beyond, more_slots,
    )  # fmt: skip


def _cheapest(
    change: float, known: CrossoverKnown, run: Any, warmup: int, common: dict[str, Any]
) -> tuple[int, int] | None:
    """Past the most crossovers: the samples per prompt type and the crossovers that call
    `change` soonest (chosen at the fixed design's level, then counted with the looks'), by
    the pace where one is known, else by slots sent."""
    timing, slots = known.timing, common["slots"]
    found = []
    for factor in (1, 2, 4, 8, 16, 32, 64):
        wider = {**common, "slots": slots * factor}
        n = _needed(change, known, most=BEYOND, looks=False, **wider)
        if n is None:
            continue
        if timing is not None and timing.s_per_token is not None:
            slot_s = run.max_tokens * timing.s_per_token
            cost = n * (timing.start_s + (warmup + slots * factor) * slot_s)
        else:
            cost = float(n * (slots * factor + warmup))
        found.append((cost, factor, n))
    if not found:
        return None
    _, factor, n = min(found)
    wider = {**common, "slots": slots * factor}
    exact = _needed(change, known, most=BEYOND, **wider)  # with the looks' boundaries
    return run.samples * factor, exact or n


def _needed(change: float, known: CrossoverKnown, **common: Any) -> int | None:
    """The crossovers every metric needs (the most of theirs); None where one cannot."""
    found = 0
    for metric in METRICS:
        n = crossovers_needed(
            change, known.noise[metric], slot_var=known.slot_var[metric], **common
        )
        if n is None:
            return None
        found = max(found, n)
    return found


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def _s(n: int) -> str:
    return "" if n == 1 else "s"
