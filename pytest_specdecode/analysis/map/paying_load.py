"""Where speculation stops paying: the paying load, and a dynamic-k table for vLLM. Pure.

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

`recommend_dynamic_k` turns several k of one method into vLLM's
`num_speculative_tokens_per_batch_size` table (vLLM 0.32: inclusive [start, end, k] ranges, the
first starting at 1, k >= 0; see config/specconfig.py for the checks).
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ...config.specconfig import BATCH_TABLE_KEY, check_spec_shape

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DynamicK",
    "LevelChoice",
    "LevelPoint",
    "PayingLoad",
    "PayingLoadKind",
    "batch_boundaries",
    "k_families",
    "log_crossing",
    "paying_load",
    "recommend_dynamic_k",
]

REGRESSED = "regressed"
NO_VERDICT = frozenset({"insufficient samples", "contaminated"})  # cannot win a level
TABLE_KEY = BATCH_TABLE_KEY
# The table's last range ends here when the server's max_num_seqs is not known: the largest
# default max_num_seqs of vLLM 0.32's API server (B200/H100-class GPUs). vLLM clips ranges at
# its max_num_seqs and carries the last k forward beyond the table's end, so this only matters
# to a reader.
DEFAULT_MAX_BATCH = 1024

_CLOSED_LOOP = re.compile(r"^c(\d+)$")


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


# --------------------------------------------------------------------------- dynamic k


@dataclass(frozen=True)
class LevelChoice:
    """The k chosen for one closed-loop level, and why."""

    level: str
    concurrency: int
    k: int  # 0: no k may run here (vLLM 0.32 accepts 0: no drafts at these batch sizes)
    ratio: float | None  # the winner's speedup (geometric mean over prompt types)
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "concurrency": self.concurrency,
            "k": self.k,
            "ratio": self.ratio,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DynamicK:
    """A `num_speculative_tokens_per_batch_size` table for one method measured at several k.

    `table` holds [start, end, k] ranges of batch sizes (inclusive, contiguous from 1 to
    `max_batch`); `spec` is the candidate to pass back: the method's values with
    num_speculative_tokens the table's largest k, and the table. Both are None when no k may
    run at any level; `notes` then say why.
    """

    method: str
    candidates: Mapping[int, str]  # k -> candidate name
    choices: tuple[LevelChoice, ...]
    table: list[list[int]] | None
    spec: dict[str, Any] | None
    max_batch: int
    max_batch_source: str  # "max_num_seqs" or "default"
    notes: tuple[str, ...]

    @property
    def name(self) -> str:
        """A name for the recommended candidate, e.g. ngram-k3-5-dynamic."""
        ks = "-".join(str(k) for k in sorted(self.candidates))
        return f"{self.method}-k{ks}-dynamic"

    @property
    def text(self) -> str:
        if self.table is None:
            return f"{self.method}: no dynamic-k table ({'; '.join(self.notes)})"
        return f"{self.method}: {TABLE_KEY} = {json.dumps(self.table)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "name": self.name,
            "candidates": {str(k): v for k, v in sorted(self.candidates.items())},
            "choices": [c.to_dict() for c in self.choices],
            "table": self.table,
            "spec": self.spec,
            "max_batch": self.max_batch,
            "max_batch_source": self.max_batch_source,
            "notes": list(self.notes),
            "text": self.text,
        }


def k_families(specs: Mapping[str, Mapping[str, Any]]) -> list[dict[int, str]]:
    """Candidates whose values are identical except num_speculative_tokens, two k or more.

    Each family maps k -> candidate name (the first name in sorted order where two candidates
    share a k). Candidates that already carry a dynamic-k table are left out.
    """
    groups: dict[str, dict[int, str]] = {}
    for name in sorted(specs):
        values = specs[name]
        k = values.get("num_speculative_tokens")
        if TABLE_KEY in values or isinstance(k, bool) or not isinstance(k, int) or k < 1:
            continue
        rest = {key: v for key, v in values.items() if key != "num_speculative_tokens"}
        groups.setdefault(json.dumps(rest, sort_keys=True), {}).setdefault(k, name)
    return [dict(sorted(g.items())) for _, g in sorted(groups.items()) if len(g) >= 2]


def batch_boundaries(concurrencies: Sequence[int], max_batch: int) -> list[tuple[int, int]]:
    """Inclusive batch-size ranges, one per concurrency level, from 1 to `max_batch`.

    Adjacent levels c_i < c_j meet at floor(sqrt(c_i * c_j)), their geometric midpoint: a
    batch of that size or smaller takes level i's k. The first range starts at 1, the last
    ends at `max_batch`; ranges starting above `max_batch` are dropped.
    """
    cs = sorted(concurrencies)
    if not cs or any(c < 1 for c in cs) or len(set(cs)) != len(cs):
        raise ValueError(f"concurrencies must be distinct integers >= 1, got {concurrencies!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    ends = [math.isqrt(a * b) for a, b in pairwise(cs)] + [max_batch]
    out, start = [], 1
    for end in ends:
        if start > max_batch:
            break
        out.append((start, min(end, max_batch)))
        start = end + 1
    return out


def recommend_dynamic_k(
    specs: Mapping[str, Mapping[str, Any]],
    points: Mapping[str, Mapping[str, Sequence[LevelPoint]]],
    *,
    max_num_seqs: int | None = None,
) -> list[DynamicK]:
    """One dynamic-k table per method measured at two k or more; [] when there is none.

    `specs`: candidate name -> its speculative config values; `points`: candidate name ->
    prompt type -> its LevelPoints. Only closed-loop levels (c4) count: a rate has no batch
    size. At each level the winner is the k with the best speedup (geometric mean over the
    prompt types measured there) among those not regressed, and with a verdict, on every one
    of them; ties go to the smaller k. Where no k may run, k = 0 (no drafts), which vLLM 0.32
    accepts. `max_num_seqs` (the server's) ends the last range; without it DEFAULT_MAX_BATCH.
    """
    if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or max_num_seqs < 1):
        raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    return [_recommend(family, specs, points, max_num_seqs) for family in k_families(specs)]


def _recommend(
    family: Mapping[int, str],
    specs: Mapping[str, Mapping[str, Any]],
    points: Mapping[str, Mapping[str, Sequence[LevelPoint]]],
    max_num_seqs: int | None,
) -> DynamicK:
    method = str(specs[family[max(family)]].get("method"))
    max_batch = max_num_seqs or DEFAULT_MAX_BATCH
    source = "max_num_seqs" if max_num_seqs else "default"
    notes: list[str] = []
    # level -> k -> prompt type -> point, closed-loop levels only
    by_level: dict[int, dict[int, dict[str, LevelPoint]]] = {}
    labels: dict[int, str] = {}
    open_loop: set[str] = set()
    for k, name in family.items():
        for prompt_type, series in points.get(name, {}).items():
            for p in series:
                match = _CLOSED_LOOP.match(p.level)
                if not match:
                    open_loop.add(p.level)
                    continue
                c = int(match.group(1))
                labels[c] = p.level
                by_level.setdefault(c, {}).setdefault(k, {})[prompt_type] = p
    if open_loop:
        notes.append(
            f"open-loop levels have no batch size, not used: {', '.join(sorted(open_loop))}"
        )

    def make(choices: Sequence[LevelChoice], table: list[list[int]] | None = None) -> DynamicK:
        spec = None
        if table is not None:
            top = max(row[2] for row in table)
            values = {**specs[family[max(family)]], "num_speculative_tokens": top, TABLE_KEY: table}
            spec = check_spec_shape(values, source=f"{method}-k{top}-dynamic")
        return DynamicK(
            method, dict(family), tuple(choices), table, spec, max_batch, source, tuple(notes)
        )

    if not by_level:
        notes.append("no closed-loop level was measured for these candidates")
        return make(())
    choices = [_choose(labels[c], c, by_level[c], list(family)) for c in sorted(by_level)]
    ranges = batch_boundaries([c.concurrency for c in choices], max_batch)
    cap = "the server's max_num_seqs" if max_num_seqs else "vLLM 0.32's largest default"
    notes.append(
        "ranges meet at floor(sqrt(c_i * c_j)) of adjacent levels; the first starts at 1, "
        f"the last ends at {max_batch} ({cap} max_num_seqs)"
    )
    lowest = choices[0]
    if lowest.concurrency > 1:
        notes.append(
            f"batch sizes below {lowest.concurrency} were not measured: they take "
            f"{lowest.level}'s k"
        )
    if len(ranges) < len(choices):
        dropped = ", ".join(c.level for c in choices[len(ranges) :])
        notes.append(f"{dropped}: above max_num_seqs={max_batch}, no batch is that large")
    table: list[list[int]] = []
    for (start, end), choice in zip(ranges, choices, strict=False):
        if table and table[-1][2] == choice.k:
            table[-1][1] = end  # the same k as the range before: one range
        else:
            table.append([start, end, choice.k])
    if max(row[2] for row in table) == 0:
        notes.append("no k may run at any measured level: keep speculation off")
        return make(choices)
    return make(choices, table)


def _choose(
    label: str, concurrency: int, measured: Mapping[int, Mapping[str, LevelPoint]], ks: list[int]
) -> LevelChoice:
    """The winning k of one level, or 0 when none may run."""
    types = sorted({t for per_type in measured.values() for t in per_type})
    scores: dict[int, float] = {}
    refused: list[str] = []
    for k in ks:
        per_type = measured.get(k, {})
        missing = [t for t in types if t not in per_type]
        regressed = [t for t in types if t in per_type and per_type[t].verdict == REGRESSED]
        no_verdict = [
            t
            for t in types
            if t in per_type and (per_type[t].verdict in NO_VERDICT or not per_type[t].measured)
        ]
        if missing:
            refused.append(f"k{k} not measured on {', '.join(missing)}")
        elif regressed:
            refused.append(f"k{k} regressed on {', '.join(regressed)}")
        elif no_verdict:
            refused.append(f"k{k} has no verdict on {', '.join(no_verdict)}")
        else:
            logs = [math.log(per_type[t].ratio) for t in types]
            scores[k] = math.exp(sum(logs) / len(logs))
    over = f" over {len(types)} prompt types" if len(types) > 1 else ""
    why_not = f"; {'; '.join(refused)}" if refused else ""
    if not scores:
        return LevelChoice(
            label,
            concurrency,
            0,
            None,
            f"{label}: k=0, no drafts (vLLM 0.32 accepts 0 in the table){why_not}",
        )
    best = max(scores.values())
    k = min(k for k, s in scores.items() if s == best)
    others = ", ".join(f"k{j} {s:.3f}" for j, s in sorted(scores.items()) if j != k)
    beat = f" (beats {others})" if others else ""
    slow = "; below 1.0 but not regressed" if best < 1.0 else ""
    return LevelChoice(
        label,
        concurrency,
        k,
        best,
        f"{label}: k{k}, speedup {best:.3f}{over}{beat}{slow}{why_not}",
    )
