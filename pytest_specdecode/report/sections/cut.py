"""A run cut short: the banner at the very top of summary.md, report.html and the terminal's
section, and the word "partial" beside a result that read only part of the design."""

from __future__ import annotations

import html

from ...record.ending import RunCut
from ...record.schema import RunRecord


def result_label(record: RunRecord) -> str:
    """ "Result", or "Result (partial: cut by SIGINT)" where the design was not complete."""
    cut = record.cut
    if cut is None or not cut.partial:
        return "Result"
    return f"Result (partial: cut by {cut.short_cause()} before the design was complete)"


def markdown_lines(cut: RunCut | None) -> list[str]:
    """A quoted block: the headline in bold, then what was measured and which tests ran."""
    if cut is None:
        return []
    first, *rest = cut.lines()
    return [f"> **⚠ {first}**", *(f"> - {line}" for line in rest), ""]


def html_section(cut: RunCut | None) -> str:
    if cut is None:
        return ""
    first, *rest = cut.lines()
    items = "".join(f"<li>{html.escape(line)}</li>" for line in rest)
    return (
        "<div class='specdecode-cut' id='specdecode-cut'>"
        f"<p class='cut-headline'>⚠ {html.escape(first)}</p><ul>{items}</ul></div>"
    )


def terminal_lines(cut: RunCut | None) -> list[str]:
    if cut is None:
        return []
    first, *rest = cut.lines()
    return [f"CUT SHORT: {first}", *(f"  {line}" for line in rest)]
