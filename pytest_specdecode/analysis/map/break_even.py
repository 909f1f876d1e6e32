"""The break-even map: what acceptance pays on this engine, measured. Pure.

A map point is a server whose drafter proposes as usual while vLLM accepts its drafts at a
stated rate (`rejection_sample_method: "synthetic"`, `synthetic_acceptance_length` L). Against
the baseline it gives the throughput ratio at that L, for its k and load, with the verdict's
own interval. A speculative step costs the same whatever is accepted, so at one k and load the
ratio is a line in the tokens per step x it emits: r(x) = a + b*x (at a fixed step cost). A
point lies at the tokens per step its counters measured (output tokens over decode steps,
drafting or not), which runs below the asked L, an accepted per draft, where some steps drafted
nothing. The map fits that line per k, load and prompt type, and reads off:

- the break-even tokens per step, where r(x) = 1;
- the ceiling, r(k + 1): every draft accepted.

The band at any L comes from redrawing every point within its interval (a t on the log scale,
the verdict's own df) and fitting again: its central `confidence`. Seeded, so a record gives
the same map every time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

from ...config.arms import cell_key
from ...config.break_even import carrier_of, depth_of_arm, point_of
from ...record.measurement import Measurement
from ...record.schema import RunRecord
from ..verdict.compare import PromptTypeVerdict

__all__ = [
    "ALL_PROMPTS",
    "BreakEvenMap",
    "MapLine",
    "MapPoint",
    "Steps",
    "fit_line",
    "map_of_run",
    "measured_steps",
]

ALL_PROMPTS = "all"  # the line over every prompt type: each point the mean of their logs
DRAWS = 4000
SEED = 20261204


@dataclass(frozen=True)
class MapPoint:
    """One synthetic server against the baseline, at one load level and prompt type (or all)."""

    candidate: str
    k: int
    length: float  # the asked accepted per draft (synthetic_acceptance_length)
    level: str
    prompt_type: str
    log_ratio: float  # candidate over baseline, throughput, log scale
    se: float
    df: float
    measured_length: float | None = None  # accepted per draft, 1 + accepted / drafts, counted
    drafts_per_step: float | None = None  # draft tokens per decode step: k where it drafts always
    tokens_per_step: float | None = None  # counted; the map's x where known (else `length`)

    @property
    def x(self) -> float:
        """Where the point lies on the map: the tokens per step counted, else the asked length
        (a step that drafts nothing emits one token, so the counted value runs below it)."""
        return self.tokens_per_step if self.tokens_per_step is not None else self.length

    @property
    def ratio(self) -> float:
        return math.exp(self.log_ratio)

    def band(self, confidence: float) -> tuple[float, float]:
        """The point's own central interval of the ratio (a t with its df, log scale)."""
        half = float(stats.t.ppf(0.5 + confidence / 2, min(max(self.df, 1.0), 1e6))) * self.se
        return math.exp(self.log_ratio - half), math.exp(self.log_ratio + half)

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "k": self.k,
            "asked_accepted_per_draft": self.length,
            "level": self.level,
            "prompt_type": self.prompt_type,
            "ratio": self.ratio,
            "log_ratio": self.log_ratio,
            "se": self.se,
            "df": self.df,
            "accepted_per_draft": self.measured_length,
            "drafts_per_step": self.drafts_per_step,
            "tokens_per_step": self.tokens_per_step,
        }


@dataclass(frozen=True)
class MapLine:
    """r(L) = intercept + slope * L at one k, level and prompt type, with its band."""

    k: int
    level: str
    prompt_type: str
    points: tuple[MapPoint, ...]
    intercept: float
    slope: float
    confidence: float
    draws: tuple[tuple[float, float], ...]  # (intercept, slope) redrawn, for the bands
    carrier: str = ""  # what drafted on its servers: ngram, eagle3, draft_model:NAME

    @property
    def name(self) -> str:
        """`k=3`, and the carrier where it is a drafter with a model: `k=3 (eagle3)`."""
        return f"k={self.k}" + (f" ({self.carrier})" if _with_model(self.carrier) else "")

    def at(self, length: float) -> tuple[float, float, float]:
        """The ratio at `length` tokens per step, and its band."""
        values = [a + b * length for a, b in self.draws]
        low, high = _central(values, self.confidence)
        return self.intercept + self.slope * length, low, high

    @property
    def break_even(self) -> tuple[float, float, float]:
        """The tokens per step where r(x) = 1 (inf: never, at this k and load), with its
        band: from the redrawn lines, a line that never reaches 1 counting as inf."""
        values = [_crossing(a, b) for a, b in self.draws]
        low, high = _central(values, self.confidence)
        return _crossing(self.intercept, self.slope), low, high

    @property
    def ceiling(self) -> tuple[float, float, float]:
        """The ratio with every draft accepted, L = k + 1."""
        return self.at(self.k + 1.0)

    def describe(self) -> str:
        be, low, high = self.break_even
        top, top_low, top_high = self.ceiling
        where = (
            f"breaks even at {_length(be)} tokens per step [{_length(low)}, {_length(high)}]"
            if be <= self.k + 1
            else f"never breaks even up to {self.k + 1} tokens per step (the line reaches 1 at "
            f"{_length(be)})"
        )
        return (
            f"{self.name} at {self.level}: {where}; every draft accepted: {top:.2f}x "
            f"[{top_low:.2f}, {top_high:.2f}]"
        )

    def to_dict(self) -> dict[str, Any]:
        be, be_low, be_high = self.break_even
        top, top_low, top_high = self.ceiling
        return {
            "k": self.k,
            "carrier": self.carrier,
            "level": self.level,
            "prompt_type": self.prompt_type,
            "intercept": self.intercept,
            "slope": self.slope,
            "confidence": self.confidence,
            "break_even": _finite(be),
            "break_even_band": [_finite(be_low), _finite(be_high)],
            "ceiling": top,
            "ceiling_band": [top_low, top_high],
            "points": [p.to_dict() for p in self.points],
        }


@dataclass(frozen=True)
class BreakEvenMap:
    """Every line of a run's map: per (k, level, prompt type), and per (k, level) over all."""

    lines: tuple[MapLine, ...]
    drafting: str  # how it was made sure that the drafter proposed k tokens a step

    @property
    def carriers(self) -> list[str]:
        """The carriers measured, the map's own first (its servers are named first)."""
        return list(dict.fromkeys(line.carrier for line in self.lines))

    def line(
        self, k: int, level: str, prompt_type: str = ALL_PROMPTS, carrier: str | None = None
    ) -> MapLine | None:
        """The line of `carrier` (default: the map's own) for k, load and prompt type."""
        carriers = self.carriers
        wanted = carrier if carrier is not None else (carriers[0] if carriers else "")
        for line in self.lines:
            if (line.k, line.level, line.prompt_type, line.carrier) == (
                k, level, prompt_type, wanted,
            ):  # fmt: skip
                return line
        return None

    @property
    def overall(self) -> list[MapLine]:
        return [line for line in self.lines if line.prompt_type == ALL_PROMPTS]

    @property
    def ks(self) -> list[int]:
        """The map's own carrier's k."""
        own = self.carriers[:1]
        return sorted({line.k for line in self.lines if line.carrier in own})

    def near(
        self, k: int, level: str, prompt_type: str, carrier: str | None = None
    ) -> MapLine | None:
        """The line for `k`, else the map's nearest k (the caller names it), at the level: of
        `carrier` where the map measured it (a candidate's own method), else the map's own."""
        carrier = carrier if carrier in self.carriers else None
        ks = sorted({ln.k for ln in self.lines if ln.carrier == carrier}) if carrier else self.ks
        found = self.line(k, level, prompt_type, carrier) or self.line(k, level, carrier=carrier)
        if found is not None or not ks:
            return found
        nearest = min(ks, key=lambda m: (abs(m - k), m))
        return self.line(nearest, level, prompt_type, carrier) or self.line(
            nearest, level, carrier=carrier
        )

    def to_json(self) -> dict[str, Any]:
        return {"drafting": self.drafting, "lines": [line.to_dict() for line in self.lines]}


def fit_line(
    points: Sequence[MapPoint], *, confidence: float, draws: int = DRAWS, seed: int = SEED
) -> tuple[float, float, tuple[tuple[float, float], ...]]:
    """The line through the points' ratios (least squares, weighted by their spread), and
    `draws` lines through the points redrawn within their intervals. One point: through the
    origin (r = L / step cost), the only line one point allows."""
    lengths = np.array([p.x for p in points], dtype=float)
    logs = np.array([p.log_ratio for p in points], dtype=float)
    ses = np.array([max(p.se, 1e-9) for p in points], dtype=float)
    dfs = np.array([min(max(p.df, 1.0), 1e6) for p in points], dtype=float)
    a, b = _least_squares(lengths, np.exp(logs), ses)
    rng = np.random.default_rng(seed)
    redrawn = logs + ses * rng.standard_t(dfs, size=(draws, len(points)))
    lines = tuple(_least_squares(lengths, np.exp(row), ses) for row in redrawn)
    return a, b, lines


def _least_squares(lengths: np.ndarray, ratios: np.ndarray, ses: np.ndarray) -> tuple[float, float]:
    weights = 1.0 / (ratios * ses) ** 2
    if len(set(lengths.tolist())) < 2:
        slope = float(np.sum(weights * lengths * ratios) / np.sum(weights * lengths**2))
        return 0.0, slope
    x = np.vstack([np.ones_like(lengths), lengths]).T
    w = np.sqrt(weights)
    coef, *_ = np.linalg.lstsq(x * w[:, None], ratios * w, rcond=None)
    return float(coef[0]), float(coef[1])


def map_of_run(
    record: RunRecord, verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]]
) -> BreakEvenMap | None:
    """The run's map, from its synthetic candidates' verdicts; None where it measured none."""
    found = {
        c: p
        for c in verdicts
        if (p := point_of(record.candidates.get(c) or {})) and depth_of_arm(c) is None
    }
    if not found:
        return None
    levels = record.run.levels
    several = len(levels) > 1
    confidence = 1.0 - record.run.alpha
    # the carriers in the order their servers were configured: the map's own first
    order = list(dict.fromkeys(carrier_of(record.candidates[c]) for c in record.candidates
                               if c in found))  # fmt: skip
    points: dict[tuple[int, str, int, str, str], list[MapPoint]] = {}
    for candidate, (k, length) in found.items():
        carrier = carrier_of(record.candidates[candidate])
        rank = order.index(carrier)
        for level in levels:
            per_type: list[MapPoint] = []
            for name in record.prompt_types:
                key = cell_key(name, level, several=several)
                v = verdicts[candidate].get(key)
                if v is None or not math.isfinite(v.throughput.interval.se):
                    continue
                iv = v.throughput.interval
                counts = _counts(record, candidate, key)
                point = MapPoint(
                    candidate, k, length, level.label, name, iv.estimate, iv.se, iv.df,
                    counts.length, counts.drafts_per_step, counts.tokens_per_step,
                )  # fmt: skip
                per_type.append(point)
                points.setdefault((rank, carrier, k, level.label, name), []).append(point)
            if per_type:
                key = (rank, carrier, k, level.label, ALL_PROMPTS)
                points.setdefault(key, []).append(_pooled(per_type))
    lines = []
    for (_, carrier, k, level, name), series in sorted(points.items()):
        a, b, draws = fit_line(series, confidence=confidence)
        lines.append(MapLine(k, level, name, tuple(series), a, b, confidence, draws, carrier))
    return BreakEvenMap(tuple(lines), drafting=_drafting(lines))


def _pooled(points: Sequence[MapPoint]) -> MapPoint:
    """The prompt types' points as one: the mean of their logs, with the mean of their standard
    errors (their start effect is shared, so they are not independent), the fewest df."""
    first = points[0]
    lengths = [p.measured_length for p in points if p.measured_length is not None]
    drafts = [p.drafts_per_step for p in points if p.drafts_per_step is not None]
    steps = [p.tokens_per_step for p in points if p.tokens_per_step is not None]
    return MapPoint(
        first.candidate,
        first.k,
        first.length,
        first.level,
        ALL_PROMPTS,
        sum(p.log_ratio for p in points) / len(points),
        sum(p.se for p in points) / len(points),
        min(p.df for p in points),
        sum(lengths) / len(lengths) if lengths else None,
        sum(drafts) / len(drafts) if drafts else None,
        sum(steps) / len(steps) if steps else None,
    )


@dataclass(frozen=True)
class Steps:
    """What vLLM's counters say of some cells' decode steps."""

    length: float | None  # accepted per draft: 1 + accepted / drafts, over steps that drafted
    drafts_per_step: float | None  # draft tokens over decode steps: k where every step drafts
    tokens_per_step: float | None  # output tokens (after the first) over decode steps


def measured_steps(cells: Sequence[Measurement]) -> Steps:
    """The counters of some cells as steps; each None where they were not counted."""
    drafts = sum(m.acceptance.drafts for m in cells if m.acceptance.present)
    tokens = sum(m.acceptance.draft_tokens for m in cells if m.acceptance.present)
    accepted = sum(m.acceptance.accepted for m in cells if m.acceptance.present)
    steps = sum(_steps(m) for m in cells)
    decoded = sum(m.output_tokens - len(m.samples) for m in cells if m.acceptance.present)
    return Steps(
        1.0 + accepted / drafts if drafts else None,
        tokens / steps if steps > 0 else None,
        decoded / steps if steps > 0 else None,
    )


def _counts(record: RunRecord, candidate: str, key: str) -> Steps:
    return measured_steps(
        [m for p in record.arm_phases(candidate) if (m := p.measurements.get(key))]
    )


def _steps(m: Measurement) -> float:
    """Decode steps of a cell's requests: each step emits its accepted drafts and one token of
    its own, so steps = output tokens - accepted drafts (the first token is the prefill's).
    Where a request ends at its max_tokens inside a step, vLLM's counter still counts that
    step's accepted drafts that the output drops; every drafting step is a step, so the steps
    are at least the drafts counted (an H100 map at k = 5, everything accepted, 128 tokens:
    127 - 110 = 17 steps where 22 drafted, 7.47 tokens a step where the client got 5.77)."""
    if not m.acceptance.present:
        return 0.0
    requests = len(m.samples)
    return max(0.0, m.output_tokens - requests - m.acceptance.accepted, m.acceptance.drafts)


def _drafting(lines: Sequence[MapLine]) -> str:
    per_step = [
        (p.k, p.drafts_per_step)
        for line in lines
        if line.prompt_type == ALL_PROMPTS
        for p in line.points
        if p.drafts_per_step is not None
    ]
    carriers = {line.carrier for line in lines}
    head = (
        "each map server drafts with prompt_lookup_min 1, so a draft is proposed wherever any "
        "earlier token recurs; vLLM's counters say how many draft tokens it proposed a step"
        if not any(_with_model(c) for c in carriers)
        else f"the map's servers draft with {', '.join(sorted(carriers))}; a drafter with a "
        "model proposes k at every step, n-gram only where its lookup matches; vLLM's counters "
        "say how many draft tokens each proposed a step"
    )
    if not per_step:
        return f"{head}: not counted in this run (no counters)"
    shares = [d / k for k, d in per_step]
    return (
        f"{head}: {min(shares):.0%} to {max(shares):.0%} of k over the map's servers "
        "(below 100%, some steps drafted fewer than k, and the map's step costs read low)"
    )


def _with_model(carrier: str) -> bool:
    return carrier not in ("", "ngram", "ngram_gpu", "suffix")


def _crossing(a: float, b: float) -> float:
    if b <= 0:
        return math.inf if a < 1 else 1.0
    return (1.0 - a) / b


def _central(values: Sequence[float], confidence: float) -> tuple[float, float]:
    ordered = sorted(values)
    tail = (1.0 - confidence) / 2.0
    n = len(ordered)
    low = ordered[min(n - 1, max(0, math.floor(tail * n)))]
    high = ordered[min(n - 1, max(0, math.ceil((1.0 - tail) * n) - 1))]
    return low, high


def _length(value: float) -> str:
    return "never" if not math.isfinite(value) else f"{value:.2f}"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
