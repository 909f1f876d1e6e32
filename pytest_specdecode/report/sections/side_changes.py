"""Beside a candidate's verdict: what else its flag changed, and (--spec-control) its change in
three. Lines for the terminal and summary.md, a block for the HTML; the analysis is
analysis/verdict/side_changes.py and analysis/verdict/control.py."""

from __future__ import annotations

import html

from ...analysis.run import RunAnalysis
from ...analysis.verdict.control import PARTS, ControlSplit
from ...analysis.verdict.stats import Comparison
from ..text import fmt_pct


def changed_line(analysis: RunAnalysis, candidate: str) -> str | None:
    """`ngram also changed: async scheduling disabled (baseline: enabled); …`."""
    found = analysis.side_changes.get(candidate)
    if found is None:
        return None
    return f"{candidate} also changed: {found.text}"


def split_lines(analysis: RunAnalysis, candidate: str) -> list[str]:
    """The control's split, a line per prompt type, the operator's figure first."""
    split = analysis.splits.get(candidate)
    if split is None:
        return []
    checked = f"; {split.checked}" if split.checked else ""
    out = [
        f"{candidate} split by its control arm {split.control} (the original + {split.added}"
        f"{checked}), throughput change [{_confidence(split)} interval]:"
    ]
    for key in split.keys:
        parts = [f"{label} {_change(split.part(name, key))}" for name, label in PARTS]
        out.append(f"{key}: " + " · ".join(parts))
    return out


def _confidence(split: ControlSplit) -> str:
    keys = split.keys
    return f"{split.part('flag', keys[0]).interval.confidence:.0%}" if keys else "its"


def _change(c: Comparison) -> str:
    low, high = c.ratio_ci
    return f"{fmt_pct(c.change)} [{fmt_pct(low - 1)}, {fmt_pct(high - 1)}] ({c.verdict.value})"


def terminal_lines(analysis: RunAnalysis, candidate: str) -> list[str]:
    changed = changed_line(analysis, candidate)
    out = [f"  {changed}"] if changed else []
    split = split_lines(analysis, candidate)
    if split:
        out += [f"  {split[0]}", *(f"    {line}" for line in split[1:])]
    return out


def markdown_lines(analysis: RunAnalysis, candidate: str) -> list[str]:
    changed = changed_line(analysis, candidate)
    out = [f"**{changed}**", ""] if changed else []
    split = split_lines(analysis, candidate)
    if split:
        out += [split[0], "", *(f"- {line}" for line in split[1:]), ""]
    return out


def html_block(analysis: RunAnalysis, candidate: str) -> str:
    found = analysis.side_changes.get(candidate)
    changed = changed_line(analysis, candidate)
    klass = "warn" if found is not None and found.changes else "note"
    parts = [f"<p class='{klass}'>{html.escape(changed)}</p>"] if changed else []
    split = split_lines(analysis, candidate)
    if split:
        items = "".join(f"<li>{html.escape(line)}</li>" for line in split[1:])
        parts.append(f"<p>{html.escape(split[0])}</p><ul class='specdecode-split'>{items}</ul>")
    return "".join(parts)
