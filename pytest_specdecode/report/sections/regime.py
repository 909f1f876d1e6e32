"""The regime: the baseline beside N servers against beside one, measured in the run
(analysis/map/regime.py); where it was slowed beyond the tolerance, the map and the verdicts
measured beside N are marked as measured in a slowed regime."""

from __future__ import annotations

import html

from ...analysis.run import RunAnalysis

SLOWED_MARK = "measured in a slowed regime"


def lines(analysis: RunAnalysis) -> list[str]:
    """The regime's sentence, empty where the run served fewer than two beside."""
    regime = analysis.regime
    if regime is None:
        return []
    return [f"Regime: {regime.text()}."]


def mark(analysis: RunAnalysis, arm: str | None = None) -> str:
    """SLOWED_MARK where `arm` (None: the map) was measured beside N in a slowed regime."""
    regime = analysis.regime
    return SLOWED_MARK if regime is not None and regime.marks(arm) else ""


def markdown_lines(analysis: RunAnalysis) -> list[str]:
    found = lines(analysis)
    if not found:
        return []
    warn = "⚠ " if mark(analysis) else ""
    return [f"{warn}{line}" for line in found] + [""]


def html_block(analysis: RunAnalysis) -> str:
    klass = "warn" if mark(analysis) else "note"
    return "".join(f"<p class='{klass}'>{html.escape(line)}</p>" for line in lines(analysis))


def terminal_lines(analysis: RunAnalysis) -> list[str]:
    return [f"warning: {line}" if mark(analysis) else line for line in lines(analysis)]
