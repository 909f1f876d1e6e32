"""The break-even map in the reports (analysis/map/break_even.py): a row per k and load, the
measured n-gram candidates' own cost per step beyond the map's, and each measured candidate's
one prediction read from the map (analysis/prediction/candidates.py), beside what it measured.
Every renderer reads these lines."""

from __future__ import annotations

import html
import math

from ...analysis.map.break_even import MapLine
from ...analysis.run import RunAnalysis
from ...record.counters import TOKENS_PER_STEP_MEANS
from . import shape_map

HEADER = (
    "k",
    "load",
    "measured points (tokens per step: ratio [band])",
    "breaks even at tokens per step",
    "every draft accepted",
    "draft tokens per step",
)
MAP_X_LABEL = "tokens per step (output tokens / decode steps)"
PLOT_CAPTION = (
    "The break-even map: throughput over the baseline's against tokens per step (output tokens "
    "over decode steps, drafting or not), a line per k with its band, a panel per load; the "
    "dashed line is break-even. Circles are the map's servers (vLLM's synthetic acceptance), "
    "diamonds the measured candidates at their replayed tokens per step."
)


def rows(analysis: RunAnalysis) -> list[tuple[str, ...]]:
    found = analysis.break_even
    return [_cells(line) for line in found.overall] if found else []


def _cells(line: MapLine) -> tuple[str, ...]:
    be, low, high = line.break_even
    top, top_low, top_high = line.ceiling
    points = "; ".join(
        f"{_x(p.x, p.length)}: {p.ratio:.2f}x [{low:.2f}, {high:.2f}]"
        for p in line.points
        for low, high in [p.band(line.confidence)]
    )
    drafted = [p.drafts_per_step for p in line.points if p.drafts_per_step is not None]
    return (
        line.name.removeprefix("k="),  # "5", or "5 (eagle3)" for a drafter with a model
        line.level,
        points,
        f"{_length(be, line.k)} [{_length(low, line.k)}, {_length(high, line.k)}]",
        f"{top:.2f}x [{top_low:.2f}, {top_high:.2f}]",
        ", ".join(f"{d:.2f}" for d in drafted) or "not counted",
    )


def _x(counted: float, asked: float) -> str:
    """A point's tokens per step, and the accepted per draft asked where drafting left it
    short (a step that drafts nothing emits one token)."""
    short = abs(counted - asked) > 0.05
    return f"{counted:.2f}" + (f" (asked {asked:g} accepted per draft)" if short else "")


def _length(value: float, k: int) -> str:
    if not math.isfinite(value):
        return "never"
    return f"{value:.2f}" + (" (beyond k+1)" if value > k + 1 else "")


def lines(analysis: RunAnalysis) -> list[str]:
    """The map's findings as sentences: each line's, how drafting was made sure, the checks."""
    found = analysis.break_even
    if found is None:
        return []
    out = [line.describe() for line in found.overall]
    regime = analysis.regime
    if regime is not None and regime.marks():  # analysis/map/regime.py: beside N slowed it
        out.insert(0, f"The map was measured in a slowed regime: {regime.text()}.")
    out.append(f"Drafting: {found.drafting}.")
    out.append(f"{TOKENS_PER_STEP_MEANS[0].upper()}{TOKENS_PER_STEP_MEANS[1:]}.")
    if analysis.prediction is not None:  # measured against the map, before the checks use it
        out += [cost.text() for cost in analysis.prediction.proposer.values()]
    out += [c.text() for c in analysis.candidate_predictions if c.on_map]
    return out


def markdown_lines(analysis: RunAnalysis) -> list[str]:
    table = rows(analysis)
    if not table:
        return []
    return [
        "### The break-even map",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|--:|:--|:--|:--|:--|:--|",
        *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table),
        "",
        *(f"- {line}" for line in lines(analysis)),
        "",
        *shape_map.markdown_lines(analysis),
    ]


def html_section(analysis: RunAnalysis) -> str:
    table = rows(analysis)
    if not table:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in table
    )
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines(analysis))
    return (
        "<h3>The break-even map</h3>"
        f"<table class='specdecode-table'><tr>{head}</tr>{body}</table><ul>{items}</ul>"
        + shape_map.html_section(analysis)
    )


def terminal_lines(analysis: RunAnalysis) -> list[str]:
    return [f"break-even map: {line}" for line in lines(analysis)] + shape_map.terminal_lines(
        analysis
    )
