"""The search's answer, in one paragraph; the best measured config per level, and the schedule
when it changes with load. Pure: reads the run record and the verdicts (compare_arms).

- **Per level**, the winner is the measured candidate with the best speedup (the geometric mean
  over prompt types of the verdicts' throughput ratio) among those regressed on no prompt type
  there. Speculation is worth turning on at a level when the winner's speedup reaches the margin.
- **A schedule**: where the winner changes with load (closed-loop levels only: a rate has no
  batch size), vLLM's `num_speculative_tokens_per_batch_size` runs each level's k, 0 where
  speculation is off; the lookup range is the lowest level's winner's. Ranges meet at the
  geometric midpoint of adjacent levels (map/dynamic_k.py → batch_boundaries).
- **The band's check**: every reload's measured tok/s against the band predicted before it, per
  prompt type; with the stored runs' held-out checks, the band's coverage.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.arms import cell_key
from ...config.specconfig import BATCH_TABLE_KEY, check_spec_shape
from ...record.schema import RunRecord
from ..map.dynamic_k import DEFAULT_MAX_BATCH, batch_boundaries
from ..prediction.bands.coverage import NOMINAL, CoverageCase
from ..prediction.level_prediction import config_settings
from ..prediction.ngram_types import NgramSettings
from ..verdict.compare import PromptTypeVerdict, worst
from ..verdict.stats import Verdict

__all__ = ["BandCheck", "Schedule", "SearchAnswer", "Winner", "level_winners", "schedule"]

Verdicts = Mapping[str, Mapping[str, PromptTypeVerdict]]
_CLOSED_LOOP = re.compile(r"^c(\d+)$")


@dataclass(frozen=True)
class Winner:
    """The best measured candidate at one level."""

    level: str
    arm: str
    label: str
    ratio: float  # geometric mean over prompt types of the throughput ratio
    verdicts: tuple[PromptTypeVerdict, ...]
    on: bool  # its speedup reaches the margin

    @property
    def shown(self) -> bool:
        """Its verdict at this level is improved (worst over the prompt types): only then does
        the answer say to turn it on."""
        return worst(v.verdict for v in self.verdicts) is Verdict.IMPROVED

    settings: NgramSettings | None = None  # None for a schedule

    def changes(self) -> str:
        """e.g. "+12.0% [-2.1%, +28.4%] on coding, +8.1% [...] on math"."""
        return _changes({v.prompt_type: v for v in self.verdicts})


@dataclass(frozen=True)
class Schedule:
    """A num_speculative_tokens_per_batch_size table from the per-level winners."""

    table: list[list[int]]
    k_at: dict[str, int]  # level label -> k (0: off)
    lookup: tuple[int, int]
    values: dict[str, Any] | None  # the candidate's --speculative-config, shape-checked
    why: str

    @property
    def label(self) -> str:
        lo, hi = self.lookup
        return f"schedule n={lo}..{hi} {BATCH_TABLE_KEY}={self.table}"

    def settings_at(self, k: int) -> NgramSettings:
        return NgramSettings(k, *self.lookup)


@dataclass(frozen=True)
class BandCheck(CoverageCase):
    """A reload's measured tok/s against the band predicted before it, on one measurement (a
    held-out case of this run: `config` is the reload's label)."""

    @property
    def label(self) -> str:
        return self.config

    @property
    def text(self) -> str:
        where = "inside" if self.inside else "OUTSIDE"
        return (
            f"{self.arm} ({self.label}) {self.key}: measured {self.measured:.1f} tok/s, {where} "
            f"the band predicted before its reload, {self.predicted:.1f} "
            f"[{self.low:.1f}, {self.high:.1f}]"
        )


@dataclass(frozen=True)
class SearchAnswer:
    """What a search found, and the paragraph that says it."""

    paragraph: str
    winners: dict[str, Winner | None]
    schedule: Schedule | None
    checks: list[BandCheck] = field(default_factory=list)
    coverage: dict[str, tuple[int, int]] = field(default_factory=dict)  # with this run's checks
    recommended: str | None = None  # the arm to turn on, if one

    def flagged(self, prompt_type: str) -> bool:
        """The band's coverage on this prompt type is below its nominal level."""
        inside, total = self.coverage.get(prompt_type, (0, 0))
        return total > 0 and inside / total < NOMINAL

    def coverage_lines(self) -> list[str]:
        out = []
        for name, (inside, total) in self.coverage.items():
            share = inside / total if total else math.nan
            flag = f": below the nominal {NOMINAL:.0%}" if self.flagged(name) else ""
            out.append(
                f"{name}: {inside} of {total} measured tok/s inside the predicted band "
                f"({share:.0%}; stored runs and this run's reloads){flag}"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "paragraph": self.paragraph,
            "recommended": self.recommended,
            "winners": {
                level: (
                    {"arm": w.arm, "label": w.label, "ratio": w.ratio, "on": w.on}
                    if w is not None
                    else None
                )
                for level, w in self.winners.items()
            },
            "schedule": (
                {
                    "table": self.schedule.table,
                    "values": self.schedule.values,
                    "why": self.schedule.why,
                }
                if self.schedule
                else None
            ),
            "checks": [c.to_json() for c in self.checks],
            "coverage": {k: list(v) for k, v in self.coverage.items()},
            "coverage_lines": self.coverage_lines(),
        }


def arm_label(record: RunRecord, arm: str) -> str:
    """A candidate as a reader knows it: the search's label, or its effective settings."""
    if record.search is not None:
        found = record.search.reload_of(arm)
        if found is not None:
            return found.label
    settings = config_settings(record.candidates.get(arm) or {})
    return settings.label if settings else arm


def level_winners(
    record: RunRecord, verdicts: Verdicts, *, margin: float
) -> dict[str, Winner | None]:
    """Per level label, the best measured candidate regressed on no prompt type there."""
    several = len(record.run.levels) > 1
    out: dict[str, Winner | None] = {}
    for level in record.run.levels:
        best: Winner | None = None
        for arm, per in verdicts.items():
            if not (record.candidates.get(arm) or {}):
                continue  # the original again (A/A)
            found = [
                per[key]
                for name in record.prompt_types
                if (key := cell_key(name, level, several=several)) in per
            ]
            if not found or any(v.verdict is Verdict.REGRESSED for v in found):
                continue
            ratios = [v.throughput.ratio for v in found]
            if any(not (math.isfinite(r) and r > 0) for r in ratios):
                continue
            ratio = math.exp(statistics.fmean(math.log(r) for r in ratios))
            if best is None or ratio > best.ratio:
                best = Winner(
                    level=level.label,
                    arm=arm,
                    label=arm_label(record, arm),
                    ratio=ratio,
                    verdicts=tuple(found),
                    on=ratio >= 1 + margin,
                    settings=config_settings(record.candidates[arm]),
                )
        out[level.label] = best
    return out


def schedule(
    record: RunRecord, verdicts: Verdicts, *, margin: float, max_num_seqs: int | None = None
) -> Schedule | None:
    """The schedule, where the best measured config changes with load; None where it does not,
    where speculation is off everywhere, or with fewer than two closed-loop levels."""
    winners = level_winners(record, verdicts, margin=margin)
    closed = {
        label: int(m.group(1)) for label in winners if (m := _CLOSED_LOOP.match(label)) is not None
    }
    if len(closed) < 2:
        return None
    chosen = {
        label: w if w is not None and w.on and w.settings is not None else None
        for label, w in winners.items()
        if label in closed
    }
    if len({w.settings if w else None for w in chosen.values()}) < 2:
        return None
    on = [w for w in chosen.values() if w is not None]
    if not on:
        return None
    first = on[0]
    assert first.settings is not None
    lookup = (first.settings.prompt_lookup_min, first.settings.prompt_lookup_max)
    k_at = {
        label: w.settings.num_speculative_tokens if w and w.settings else 0
        for label, w in chosen.items()
    }
    max_batch = max_num_seqs or DEFAULT_MAX_BATCH
    levels = sorted(closed, key=closed.get)  # type: ignore[arg-type]
    ranges = batch_boundaries([closed[label] for label in levels], max_batch)
    table: list[list[int]] = []
    for (start, end), label in zip(ranges, levels, strict=False):
        if table and table[-1][2] == k_at[label]:
            table[-1][1] = end
        else:
            table.append([start, end, k_at[label]])
    parts = []
    for label in levels:
        w = chosen[label]
        parts.append(f"{label}: {w.label} ({w.ratio - 1:+.1%})" if w else f"{label}: off")
    other = [
        w.label
        for w in on
        if w.settings and (w.settings.prompt_lookup_min, w.settings.prompt_lookup_max) != lookup
    ]
    note = (
        f"; a table varies k only, so {', '.join(other)} runs with n={lookup[0]}..{lookup[1]}"
        if other
        else ""
    )
    top = max(row[2] for row in table)
    values = None
    if top > 0:
        values = check_spec_shape(
            {
                "method": "ngram",
                "num_speculative_tokens": top,
                "prompt_lookup_min": lookup[0],
                "prompt_lookup_max": lookup[1],
                BATCH_TABLE_KEY: table,
            },
            source="the search's schedule",
        )
    why = f"the best measured config changes with load ({'; '.join(parts)}){note}"
    return Schedule(table, k_at, lookup, values, why)


def band_checks(record: RunRecord, verdicts: Verdicts) -> list[BandCheck]:
    """Each reload's measured tok/s against the band predicted before it: the reload's figure
    in the results table (its verdict's candidate_center), one figure per arm."""
    if record.search is None:
        return []
    out = []
    for reload in record.search.reloads:
        for key, band in reload.predicted.items():
            verdict = verdicts.get(reload.arm, {}).get(key)
            m = next(
                (
                    p.measurements[key]
                    for p in record.arm_phases(reload.arm)
                    if key in p.measurements
                ),
                None,
            )
            if verdict is None or m is None:
                continue
            out.append(
                BandCheck(
                    run="this run",
                    arm=reload.arm,
                    config=reload.label,
                    prompt_type=m.prompt_type,
                    key=key,
                    predicted=band.tokens_per_s,
                    low=band.low,
                    high=band.high,
                    measured=verdict.throughput.candidate_center,
                )
            )
    return out


def search_answer(
    record: RunRecord, verdicts: Verdicts, *, max_num_seqs: int | None = None
) -> SearchAnswer | None:
    """The answer of a search run; None for a run without a search."""
    search = record.search
    if search is None:
        return None
    margin = search.margin
    winners = level_winners(record, verdicts, margin=margin)
    plan = schedule(record, verdicts, margin=margin, max_num_seqs=max_num_seqs)
    checks = band_checks(record, verdicts)
    coverage: dict[str, tuple[int, int]] = {
        k: (v[0], v[1]) for k, v in search.coverage_counts.items()
    }
    for c in checks:
        inside, total = coverage.get(c.prompt_type, (0, 0))
        coverage[c.prompt_type] = (inside + c.inside, total + 1)
    levels = [level.label for level in record.run.levels]
    on = {label: w for label, w in winners.items() if w is not None and w.on and w.shown}
    off = [label for label in levels if label not in on]
    parts: list[str] = []
    recommended = None
    measured_plan = _arm_of(record, plan)
    if not on:
        best = max(
            (w for w in winners.values() if w is not None), key=lambda w: w.ratio, default=None
        )
        parts += _not_shown(record, best, margin=margin)
    elif len({w.arm for w in on.values()}) == 1:
        first = next(iter(on.values()))
        recommended = first.arm
        where = _where(levels, list(on), several=len(levels) > 1)
        parts.append(
            f"Turn on ngram {first.label} ({first.arm}, --speculative-config "
            f"'{_json(record.candidates[first.arm])}'): measured {first.changes()}{where}."
        )
        if off:
            parts.append(f"At {', '.join(off)}, keep it off{_schedule_text(plan, measured_plan)}.")
    else:
        per = "; ".join(
            f"at {label}, {w.label} ({w.arm}): {w.changes()}" for label, w in on.items()
        )
        if plan is not None and plan.values is not None and measured_plan is not None:
            recommended = measured_plan
            changes = _changes(verdicts.get(measured_plan, {}))
            parts.append(
                f"Turn on n-gram speculation with a schedule by batch size ({measured_plan}, "
                f"--speculative-config '{_json(plan.values)}'): measured {changes}. The best "
                f"config per level: {per}."
            )
        else:
            parts.append(f"Turn on n-gram speculation, by load: {per}.")
            if off:
                parts.append(f"At {', '.join(off)}, keep it off.")
            if plan is not None and plan.values is not None:
                parts.append(
                    f"As one config, this schedule would run each: {BATCH_TABLE_KEY} = "
                    f"{plan.table} (n={plan.lookup[0]}..{plan.lookup[1]}); not measured: no "
                    "reload was left."
                )
    parts.append(f"Reloads: {search.used} of {search.max_reloads}.")
    if search.stopped and search.used < search.max_reloads:
        parts.append(f"The search stopped: {search.stopped}.")
    shown = recommended or (search.reloads[-1].arm if search.reloads else None)
    before = _before(record, shown, checks)
    if before:
        parts.append(before)
    flagged = [name for name, (i, t) in coverage.items() if t and i / t < NOMINAL]
    if flagged:
        parts.append(
            f"The band held less often than its nominal {NOMINAL:.0%} on "
            f"{', '.join(flagged)} (coverage below)."
        )
    return SearchAnswer(
        paragraph=" ".join(parts),
        winners=winners,
        schedule=plan,
        checks=checks,
        coverage=coverage,
        recommended=recommended,
    )


def _not_shown(record: RunRecord, best: Winner | None, *, margin: float) -> list[str]:
    """No config's verdict is improved: the best found, its interval, and what would settle
    it where its verdict is open."""
    open_ = [v for v in best.verdicts if v.undecided] if best is not None else []
    if best is None or not open_ or best.ratio <= 1.0:
        out = [
            f"Leave speculation off: no config was predicted or measured faster beyond the "
            f"margin ({margin:+.0%})."
        ]
        if best is not None:
            out.append(f"The best measured, {best.label} ({best.arm}): {best.changes()}.")
        return out
    first = open_[0]
    why = first.reason.split("; ", 1)[1] if "; " in first.reason else first.reason
    return [
        f"Not shown faster: no config's verdict is improved beyond the margin ({margin:+.0%}), "
        "so keep speculation off until one is.",
        f"The best found, {best.label} ({best.arm}): measured {best.changes()}.",
        f"To settle it, measure it alone (--spec-config '{_json(record.candidates[best.arm])}'): "
        f"on {first.prompt_type}, {why}.",
    ]


def _where(levels: Sequence[str], on: Sequence[str], *, several: bool) -> str:
    if not several:
        return f" (at {levels[0]})"
    if list(on) == list(levels):
        return f" at every level measured ({', '.join(levels)})"
    top = [label for label in levels if label in on][-1]
    closed = _CLOSED_LOOP.match(top)
    if closed and list(on) == list(levels[: levels.index(top) + 1]):
        return f" at concurrency <= {closed.group(1)}"
    return f" at {', '.join(on)}"


def _arm_of(record: RunRecord, plan: Schedule | None) -> str | None:
    """The candidate that measured this schedule, if one did."""
    if plan is None or plan.values is None:
        return None
    found = [a for a, v in record.candidates.items() if dict(v) == dict(plan.values)]
    return next((a for a in found if record.arm_phases(a)), None)


def _schedule_text(plan: Schedule | None, arm: str | None) -> str:
    if plan is None or plan.values is None:
        return ""
    table = f"{BATCH_TABLE_KEY} = {plan.table} (n={plan.lookup[0]}..{plan.lookup[1]})"
    if arm is None:
        return f" (or use this schedule: {table}; not measured: no reload was left)"
    return f" (or use this schedule: {table}, measured as {arm})"


def _changes(per: Mapping[str, PromptTypeVerdict]) -> str:
    """Throughput's change and interval per prompt type, with the verdict where not improved."""
    return ", ".join(
        f"{v.throughput.change:+.1%} [{v.throughput.ratio_ci[0] - 1:+.1%}, "
        f"{v.throughput.ratio_ci[1] - 1:+.1%}] on {key}"
        + ("" if v.verdict is Verdict.IMPROVED else f" ({v.verdict.value})")
        for key, v in per.items()
    )


def _json(values: Mapping[str, Any]) -> str:
    return json.dumps(dict(values), separators=(",", ":"), sort_keys=True)


def _before(record: RunRecord, arm: str | None, checks: Sequence[BandCheck]) -> str:
    """ "Predicted before reload: ..." for the reload the answer rests on."""
    if arm is None or record.search is None:
        return ""
    reload = record.search.reload_of(arm)
    if reload is None or not reload.predicted:
        return ""
    found = {c.key: c for c in checks if c.arm == arm}
    parts = []
    for key, band in reload.predicted.items():
        check = found.get(key)
        where = (
            ""
            if check is None
            else (
                ", measured inside"
                if check.inside
                else f", measured {check.measured:.1f} tok/s: OUTSIDE"
            )
        )
        parts.append(
            f"{band.speedup - 1:+.1%} [{band.speedup_low - 1:+.1%}, {band.speedup_high - 1:+.1%}]"
            f" on {key}{where}"
        )
    return f"Predicted before reload ({reload.kind}): {'; '.join(parts)}."
