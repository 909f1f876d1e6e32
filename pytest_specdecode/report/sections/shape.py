"""The shape target in the plan and the reports: which architecture was served with dummy
weights, at which depth, and what is real, random, cut and changed (config/shape/served.py →
`ServedShape.statement`). A run of the model itself shows nothing here."""

from __future__ import annotations

import html

from ...config.shape.served import ServedShape
from ...record.schema import RunRecord

HEADLINE = "Measured on the shape, not the model"


def plan_lines(served: ServedShape | None, *, unit: str | None = None) -> list[str]:
    """The plan's lines, before anything is touched; `unit`: the systemd unit that serves it."""
    if served is None:
        return []
    window = (
        f"the window of unit {unit}, which is stopped for it and put back as it was found at "
        "the end (a reload of the real model)"
        if unit
        else "the original's window (the real model is neither started nor stopped)"
    )
    return [
        f"shape: {served.label}, served by the target's own vLLM, with dummy weights, in {window}",
        *(f"  {line}" for line in served.statement()),
    ]


def lines(record: RunRecord) -> list[str]:
    served = record.shape
    if served is None:
        return []
    said = [f"{s[0].upper()}{s[1:]}." for s in served.statement()]
    return [f"{HEADLINE}: {served.label}.", *said]


def markdown_lines(record: RunRecord) -> list[str]:
    found = lines(record)
    if not found:
        return []
    head, *rest = found
    return [f"**{head}**", "", *(f"- {line}" for line in rest), ""]


def html_section(record: RunRecord) -> str:
    found = lines(record)
    if not found:
        return ""
    head, *rest = found
    items = "".join(f"<li>{html.escape(line)}</li>" for line in rest)
    return f"<p class='note'><b>{html.escape(head)}</b></p><ul>{items}</ul>"


def terminal_lines(record: RunRecord) -> list[str]:
    found = lines(record)
    return [found[0], *(f"  {line}" for line in found[1:])] if found else []
