"""Where speculation stops paying: the paying load. Pure.

The paying load of one prompt type and candidate is the load at which its speedup crosses 1.0:
where speculation stops paying (or, rising, starts to). It is read off the per-level speedups
(candidate over baseline, per-request output tok/s) and their confidence intervals:

- the estimate is where the point speedups cross 1.0, interpolated linearly in log(load) vs
  log(ratio) between the two bracketing levels (a level at exactly 1.0 is the crossing itself);
- its uncertainty runs from where the interval stops lying wholly on the starting side of 1.0
  to where it first lies wholly on the far side, each interpolated the same way on that bound;
  an end with no such level is open ("below" or "beyond the measured range");
- a crossing counts when an interval confirms it (at least one end is bounded); the first such
  crossing is reported. Points on both sides of 1.0 with no confirmed crossing are "mixed".

The per-level points (`LevelPoint`) are also what the dynamic-k table reads (dynamic_k.py).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

__all__ = ["LevelPoint", "PayingLoad", "PayingLoadKind", "log_crossing", "paying_load"]


@dataclass(frozen=True)
class LevelPoint:
    """One load level of one prompt type and candidate: the speedup and its interval.

    `load` is the x value: the level's concurrency, or its request rate for open-loop levels.
    `ratio` is candidate/baseline per-request output tok/s; `low`, `high` its interval as the
    verdict reports it (non-finite or non-positive bounds are read as "includes 1.0").
    """

    level: str
    load: float
    ratio: float
    low: float
    high: float
    verdict: str

    def __post_init__(self) -> None:
        if isinstance(self.load, bool) or not (math.isfinite(self.load) and self.load > 0):
            raise ValueError(
                f"level {self.level!r}: load must be a positive number, got {self.load!r}"
            )

    @property
    def measured(self) -> bool:
        """Whether the speedup is a number (an insufficient level may have none)."""
        return _positive(self.ratio)

    @property
    def significantly_faster(self) -> bool:
        return _positive(self.low) and self.low > 1.0

    @property
    def significantly_slower(self) -> bool:
        return _positive(self.high) and self.high < 1.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "load": self.load,
            "ratio": _json(self.ratio),
            "low": _json(self.low),
            "high": _json(self.high),
            "verdict": self.verdict,
        }


class PayingLoadKind(enum.StrEnum):
    """What the series of speedups says about the paying load."""

    CROSSING = "crossing"
    FASTER = "always faster"
    SLOWER = "always slower"
    MIXED = "mixed"  # on both sides of 1.0, no crossing confirmed by an interval
    FLAT = "flat"  # exactly 1.0 at every level
    SINGLE = "single level"
    EMPTY = "no level"


@dataclass(frozen=True)
class PayingLoad:
    """The paying load of one prompt type and candidate, or why none can be told."""

    prompt_type: str
    candidate: str
    kind: PayingLoadKind
    axis: str  # "concurrency" or "rate"
    points: tuple[LevelPoint, ...]  # the measured levels, in load order
    load: float | None = None  # the estimate
    low: float | None = None  # the uncertainty's lower end; None: open (below the range)
    high: float | None = None  # its upper end; None: open (beyond the range)
    direction: str | None = None  # "falls" (faster, then slower) or "rises"
    crossings: int = 0  # sign changes of the point speedups
    first: bool = True  # the reported crossing is the first one
    monotone: bool = True  # the speedups are monotone in load
    skipped: tuple[str, ...] = ()  # levels without a speedup

    @property
    def significant(self) -> int:
        """Levels whose interval lies wholly on one side of 1.0."""
        return sum(p.significantly_faster or p.significantly_slower for p in self.points)

    def fmt(self, load: float) -> str:
        """A load as the level labels write it: c2.3, r0.75."""
        return _fmt_load(load, self.axis)

    @property
    def text(self) -> str:
        """One phrase for tables."""
        none = "the speedup does not cross 1.0 in the measured range"
        span = f"{self.points[0].level} to {self.points[-1].level}" if self.points else ""
        if self.kind is PayingLoadKind.EMPTY:
            return "no measured level: the paying load cannot be told"
        if self.kind is PayingLoadKind.SINGLE:
            return f"one level only ({self.points[0].level}): the paying load cannot be told"
        if self.kind is PayingLoadKind.FLAT:
            return f"{none}: the speedup is exactly 1.0 at every level ({span})"
        if self.kind is PayingLoadKind.MIXED:
            return (
                f"{none}: mixed, no clean crossing (the speedup is on both sides of 1.0, "
                f"its interval includes 1.0 at every level; {span})"
            )
        if self.kind in (PayingLoadKind.FASTER, PayingLoadKind.SLOWER):
            which = "faster" if self.kind is PayingLoadKind.FASTER else "slower"
            sig = "" if self.significant else "; not significant at any level"
            return f"{none}: always {which} ({span}{sig})"
        assert self.load is not None
        verb = "falls below" if self.direction == "falls" else "rises above"
        if self.low is not None and self.high is not None:
            where = f"between {self.fmt(self.low)} and {self.fmt(self.high)}"
        elif self.low is not None:
            where = f"from {self.fmt(self.low)} to beyond the measured range"
        else:
            assert self.high is not None
            where = f"from below the measured range to {self.fmt(self.high)}"
        notes = []
        if not self.first:
            notes.append("the first crossing an interval confirms")
        if self.crossings > 1:
            notes.append(f"not monotone: crosses 1.0 {self.crossings} times")
        elif not self.monotone:
            notes.append("not monotone")
        tail = "; " + "; ".join(notes) if notes else ""
        return f"speedup {verb} 1.0 at {self.fmt(self.load)} ({where}){tail}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_type": self.prompt_type,
            "candidate": self.candidate,
            "kind": self.kind.value,
            "text": self.text,
            "axis": self.axis,
            "load": self.load,
            "low": self.low,
            "high": self.high,
            "direction": self.direction,
            "crossings": self.crossings,
            "first": self.first,
            "monotone": self.monotone,
            "significant": self.significant,
            "skipped": list(self.skipped),
            "points": [p.to_dict() for p in self.points],
        }


def log_crossing(x0: float, y0: float, x1: float, y1: float, target: float = 1.0) -> float:
    """Where the line through (log x0, log y0), (log x1, log y1) reaches log(target)."""
    ly0, ly1 = math.log(y0), math.log(y1)
    if ly0 == ly1:
        return x0
    t = (math.log(target) - ly0) / (ly1 - ly0)
    return math.exp(math.log(x0) + t * (math.log(x1) - math.log(x0)))


def paying_load(
    points: Sequence[LevelPoint], *, prompt_type: str = "", candidate: str = ""
) -> PayingLoad:
    """The paying load of one prompt type and candidate from its levels (any order)."""
    axis = _axis(points)
    usable = tuple(sorted((p for p in points if p.measured), key=lambda p: p.load))
    skipped = tuple(p.level for p in points if not p.measured)
    loads = [p.load for p in usable]
    if len(set(loads)) != len(loads):
        raise ValueError(f"two levels share a load: {', '.join(p.level for p in usable)}")

    def make(kind: PayingLoadKind, **extra: Any) -> PayingLoad:
        return PayingLoad(prompt_type, candidate, kind, axis, usable, skipped=skipped, **extra)

    if len(usable) < 2:
        return make(PayingLoadKind.SINGLE if usable else PayingLoadKind.EMPTY)
    ratios = [p.ratio for p in usable]
    sides = [(i, 1 if r > 1.0 else -1) for i, r in enumerate(ratios) if r != 1.0]
    pairs = [(a, b) for (a, sa), (b, sb) in pairwise(sides) if sa != sb]
    shape = {"crossings": len(pairs), "monotone": _monotone(ratios)}
    if not sides:
        return make(PayingLoadKind.FLAT, **shape)
    if not pairs:
        return make(PayingLoadKind.FASTER if sides[0][1] > 0 else PayingLoadKind.SLOWER, **shape)
    for n, (a, b) in enumerate(pairs):
        falls = ratios[a] > 1.0
        if b > a + 1:  # levels at exactly 1.0 between: the first of them is the crossing
            estimate = usable[a + 1].load
        else:
            estimate = log_crossing(usable[a].load, ratios[a], usable[b].load, ratios[b])
        lower = _lower_end(usable, a, falls=falls)
        upper = _upper_end(usable, b, falls=falls)
        if lower is None and upper is None:
            continue  # no interval on either side confirms this crossing
        return make(
            PayingLoadKind.CROSSING,
            load=estimate,
            low=None if lower is None else min(lower, estimate),
            high=None if upper is None else max(upper, estimate),
            direction="falls" if falls else "rises",
            first=n == 0,
            **shape,
        )
    return make(PayingLoadKind.MIXED, **shape)


def _lower_end(points: Sequence[LevelPoint], a: int, *, falls: bool) -> float | None:
    """Where the interval last leaves the starting side, at or before level `a`."""
    for i in range(a, -1, -1):
        p = points[i]
        if p.significantly_faster if falls else p.significantly_slower:
            bound, nxt = (p.low, points[i + 1].low) if falls else (p.high, points[i + 1].high)
            if not _positive(nxt):
                return p.load  # the next bound is unknown: the wider range
            return log_crossing(p.load, bound, points[i + 1].load, nxt)
    return None


def _upper_end(points: Sequence[LevelPoint], b: int, *, falls: bool) -> float | None:
    """Where the interval first lies wholly on the far side, at or after level `b`."""
    for i in range(b, len(points)):
        p = points[i]
        if p.significantly_slower if falls else p.significantly_faster:
            bound, prev = (p.high, points[i - 1].high) if falls else (p.low, points[i - 1].low)
            if not _positive(prev):
                return p.load
            return log_crossing(points[i - 1].load, prev, p.load, bound)
    return None


def _axis(points: Sequence[LevelPoint]) -> str:
    kinds = {"rate" if p.level.startswith("r") else "concurrency" for p in points}
    if len(kinds) > 1:
        raise ValueError(
            "a series mixes open-loop (rate) and closed-loop (concurrency) levels: "
            + ", ".join(p.level for p in points)
        )
    return kinds.pop() if kinds else "concurrency"


def _fmt_load(load: float, axis: str) -> str:
    prefix = "r" if axis == "rate" else "c"
    if load < 1:
        return f"{prefix}{load:.2g}"
    return f"{prefix}{load:.1f}" if load < 100 else f"{prefix}{load:.0f}"


def _monotone(values: Sequence[float]) -> bool:
    steps = [b - a for a, b in pairwise(values)]
    return all(s >= 0 for s in steps) or all(s <= 0 for s in steps)


def _positive(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _json(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
