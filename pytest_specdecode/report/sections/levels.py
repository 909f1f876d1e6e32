"""Load levels in the reports: each level's aggregates, the paying load, the dynamic-k table, and
which prompts gained or lost. Every renderer (terminal, summary.md, HTML) reads these rows."""

from __future__ import annotations

import html
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ...analysis.run import RunAnalysis
from ...config.arms import BASELINE
from ...record.measurement import Measurement
from ...record.schema import RunRecord
from ..text import fmt_num, fmt_pct

HEADER = (
    "Phase",
    "Prompt @ level",
    "n",
    "tok/s per request",
    "tok/s in all",
    "TTFT p50 / p99 ms",
    "TPOT p50 / p99 ms",
    "Goodput",
)


@dataclass(frozen=True)
class LevelRow:
    """One phase's measurement of a prompt type at a level: its aggregates."""

    phase: str
    key: str
    m: Measurement

    def cells(self) -> tuple[str, ...]:
        s = self.m.stats
        good = "—"
        if s.good is not None:
            good = f"{fmt_num(s.goodput, '.2f')} req/s ({s.good}/{s.n})"
        checks = [c for c in s.slo_checks if not c.met]
        if checks:
            good += "; misses " + ", ".join(f"{c.key} {c.value:.0f} > {c.limit:g}" for c in checks)
        return (
            self.phase,
            self.key,
            str(s.n),
            fmt_num(s.median_tokens_per_s),
            fmt_num(s.output_tokens_per_s),
            f"{fmt_num(s.ttft_p50_ms, '.0f')} / {fmt_num(s.ttft_p99_ms, '.0f')}",
            f"{fmt_num(s.tpot_p50_ms)} / {fmt_num(s.tpot_p99_ms)}",
            good,
        )


def level_rows(record: RunRecord) -> list[LevelRow]:
    """Every measured start, prompt type and level, in the order they were measured."""
    return [
        LevelRow(phase.name, key, m)
        for phase in record.phases.values()
        for key, m in phase.measurements.items()
        if m.samples
    ]


def shown(record: RunRecord) -> bool:
    """The level table is shown when several levels were measured, or an SLO was set."""
    slo = any(
        m.slo.per_request or m.slo.percentiles
        for p in record.phases.values()
        for m in p.measurements.values()
    )
    return len(record.run.levels) > 1 or slo


def paying_load_lines(analysis: RunAnalysis) -> list[str]:
    """Per candidate and prompt type, the paying load (where the speedup crosses 1.0); then the
    dynamic-k table."""
    out = [
        f"{candidate} / {name}: {x.text}"
        for candidate, per in analysis.paying_loads.items()
        for name, x in per.items()
    ]
    for table in analysis.dynamic_k:
        out.append(f"dynamic k: {table.text}")
        if table.spec is not None:
            out.append(f"  --spec-config '{json.dumps(table.spec, separators=(',', ':'))}'")
    return out


def prompt_changes(record: RunRecord, candidate: str, key: str) -> list[tuple[int, float]]:
    """Per prompt of a measurement, the candidate's throughput over the baseline's (geometric
    means over the requests of that prompt), largest gain first."""
    base = _by_prompt(record, BASELINE, key)
    cand = _by_prompt(record, candidate, key)
    ratios = [(i, math.exp(cand[i] - base[i])) for i in sorted(set(base) & set(cand))]
    return sorted(ratios, key=lambda r: -r[1])


def prompt_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    """Which prompts gained and which lost, per candidate and measurement (prompt sets only)."""
    out = []
    for candidate, per in analysis.verdicts.items():
        for key in per:
            changes = prompt_changes(record, candidate, key)
            if len(changes) < 2:
                continue
            gained = [f"#{i} {fmt_pct(r - 1)}" for i, r in changes[:3] if r > 1]
            lost = [f"#{i} {fmt_pct(r - 1)}" for i, r in changes[::-1][:3] if r < 1]
            out.append(
                f"{candidate} / {key}, per prompt ({len(changes)}): gained most "
                f"{', '.join(gained) or 'none'}; lost most {', '.join(lost) or 'none'}"
            )
    return out


def _by_prompt(record: RunRecord, arm: str, key: str) -> dict[int, float]:
    logs: dict[int, list[float]] = {}
    for phase in record.arm_phases(arm):
        m = phase.measurements.get(key)
        for value, index in m.by_prompt("tokens_per_s") if m else ():
            if index is not None:
                logs.setdefault(index, []).append(math.log(value))
    return {i: statistics.fmean(v) for i, v in logs.items()}


# --------------------------------------------------------------------------- renderers


def markdown_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    lines: list[str] = []
    if shown(record):
        lines += [
            "### Load levels",
            "",
            "| " + " | ".join(HEADER) + " |",
            "|:--|:--|--:|--:|--:|--:|--:|:--|",
            *(
                "| " + " | ".join(c.replace("|", "\\|") for c in row.cells()) + " |"
                for row in level_rows(record)
            ),
            "",
        ]
    paying = paying_load_lines(analysis)
    if paying:
        lines += ["### Where speculation stops paying", "", *(f"- {c}" for c in paying), ""]
    per_prompt = prompt_lines(record, analysis)
    if per_prompt:
        lines += ["### Per prompt", "", *(f"- {c}" for c in per_prompt), ""]
    return lines


def html_section(record: RunRecord, analysis: RunAnalysis) -> str:
    parts = []
    if shown(record):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row.cells()) + "</tr>"
            for row in level_rows(record)
        )
        parts.append(
            f"<h3>Load levels</h3><table class='specdecode-table'><tr>{head}</tr>{body}</table>"
        )
    paying = paying_load_lines(analysis)
    if paying:
        items = "".join(f"<li>{html.escape(c)}</li>" for c in paying)
        parts.append(f"<h3>Where speculation stops paying</h3><ul>{items}</ul>")
    per_prompt = prompt_lines(record, analysis)
    if per_prompt:
        items = "".join(f"<li>{html.escape(c)}</li>" for c in per_prompt)
        parts.append(f"<h3>Per prompt</h3><ul>{items}</ul>")
    return "".join(parts)


def terminal_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    out: list[str] = []
    if len(record.run.levels) > 1:
        widths = (14, 22, 4, 10, 10, 14, 16)
        out.append(
            " ".join(f"{h:<{w}}" for h, w in zip(HEADER, widths, strict=False)) + f" {HEADER[-1]}"
        )
        for row in level_rows(record):
            cells: Sequence[str] = row.cells()
            out.append(
                " ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=False)) + f" {cells[-1]}"
            )
    out += paying_load_lines(analysis)
    return out
