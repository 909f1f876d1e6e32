"""The map on the shape in the reports and the plan (analysis/map/shape.py): the break-even per
k and load carried to the full depth, said to be an extrapolation, and what each drafter must
accept to pay. Every renderer reads these lines; report/sections/break_even.py adds them after
the map's own."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from typing import Any

from ...analysis.map.depth import DepthLine, DepthMap
from ...analysis.map.shape import MapOnShape
from ...analysis.run import RunAnalysis
from ...config.arms import BASELINE
from ...config.break_even import depth_of_arm
from ...config.settings import Settings

HEADER = (
    "drafter",
    "k",
    "load",
    "breaks even at tokens per step",
    "every draft accepted",
    "its points (tokens per step: ratio [band])",
)


def rows(found: MapOnShape | None) -> list[tuple[str, ...]]:
    """A row per carrier, k and load of the carried map."""
    if found is None or found.carried is None:
        return []
    return [_cells(line) for line in found.carried.lines]


def _cells(line: DepthLine) -> tuple[str, ...]:
    points = "; ".join(f"{x:.2f}: {r.text(unit='x')}" for x, r in line.points)
    be = line.break_even
    beyond = " (beyond k+1)" if math.isfinite(be.estimate) and be.estimate > line.k + 1 else ""
    return (
        line.carrier,
        str(line.k),
        line.level,
        be.text() + beyond,
        line.ceiling.text(unit="x"),
        points,
    )


def lines(analysis: RunAnalysis) -> list[str]:
    """The statement (measured, or carried: an extrapolation from which depths to which), the
    baseline's step per layer, each line's break-even, each drafter's pay-off, the notes."""
    found = analysis.map_on_shape
    if found is None:
        return []
    out = [f"{found.statement()}."]
    if found.carried is not None:
        out += step_lines(found.carried)
        out += [_line_text(line, found.carried.full_depth) for line in found.carried.lines]
    out += [f"Pay-off: {p.text()}." for p in found.payoffs]
    out += [f"Note: {n}." for n in found.notes]
    return out


def step_lines(carried: DepthMap) -> list[str]:
    """The baseline's step, per layer and carried, at each load."""
    out = []
    for fit in carried.fits:
        if fit.server != BASELINE:
            continue
        measured = ", ".join(
            f"{m:.2f} ms at {d}" for d, m in zip(fit.depths, fit.measured_ms, strict=True)
        )
        out.append(
            f"The baseline's step at {fit.level}: {measured} layers; "
            f"{fit.intercept_ms.text()} ms + {fit.per_layer_ms.text('.3f')} ms per layer, "
            f"so {fit.full_ms.text()} ms at {carried.full_depth} layers"
        )
    return out


def _line_text(line: DepthLine, full: int) -> str:
    be = line.break_even
    where = (
        f"breaks even at {be.text()} tokens per step"
        if line.pays
        else f"never breaks even up to {line.k + 1} tokens per step"
    )
    return (
        f"At {full} layers, {line.carrier} k={line.k} at {line.level}: {where}; every draft "
        f"accepted: {line.ceiling.text(unit='x')}"
    )


def markdown_lines(analysis: RunAnalysis) -> list[str]:
    found = analysis.map_on_shape
    said = lines(analysis)
    if not said or found is None:
        return []
    title = (
        f"### The map carried to {found.full} layers (an extrapolation)"
        if found.extrapolated
        else "### What a drafter must accept to pay"
    )
    table = rows(found)
    out = [title, ""]
    if table:
        out += [
            "| " + " | ".join(HEADER) + " |",
            "|:--|--:|:--|:--|:--|:--|",
            *("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in table),
            "",
        ]
    return out + [f"- {line}" for line in said] + [""]


def html_section(analysis: RunAnalysis) -> str:
    found = analysis.map_on_shape
    said = lines(analysis)
    if not said or found is None:
        return ""
    title = (
        f"The map carried to {found.full} layers (an extrapolation)"
        if found.extrapolated
        else "What a drafter must accept to pay"
    )
    table = ""
    if rows(found):
        head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
            for row in rows(found)
        )
        table = f"<table class='specdecode-table'><tr>{head}</tr>{body}</table>"
    items = "".join(f"<li>{html.escape(line)}</li>" for line in said)
    return f"<h3>{html.escape(title)}</h3>{table}<ul>{items}</ul>"


def terminal_lines(analysis: RunAnalysis) -> list[str]:
    return [f"map on the shape: {line}" for line in lines(analysis)]


# --- the plan ------------------------------------------------------------------------------------


def plan_lines(
    settings: Settings,
    found: Mapping[str, Any],
    full: int,
    *,
    seconds: float | None = None,
    pace: str = "",
) -> list[str]:
    """The plan of the map on the shape: its carriers and why, the depths and what is carried,
    the servers and starts per depth, and (`seconds`, at `pace`) the map's share of the plan's
    time (the plan's own total counts its servers as the run serves them)."""
    if not found:
        return []
    depths = [int(d) for d in found.get("depths") or ()]
    served = int(found.get("served") or (depths[-1] if depths else full))
    names = [str(n) for n in found.get("servers") or ()]
    at_served = [n for n in names if depth_of_arm(n) is None]
    out = [
        f"map on the shape: {c['label']}" + (f" ({c['model']})" if c.get("model") else "")
        + f": {c['why']}"
        for c in found.get("carriers") or ()
    ]  # fmt: skip
    per_depth = {d: 1 + len(at_served) for d in depths}  # the original (or its depth) + servers
    starts = sum(per_depth.values())
    if len(depths) >= 2 and served < full:
        out.append(
            f"map on the shape: measured at {_and(depths)} of {full} layers (served: {served}), "
            f"each server's step fitted per layer and carried to {full}: an extrapolation, said "
            "so in the report, its interval over requests and restarts"
        )
    elif served < full:
        out.append(
            f"map on the shape: measured at {served} of {full} layers only: not carried to "
            f"{full} (two depths carry it: [shape] layers = [n/2, n])"
        )
    else:
        out.append(f"map on the shape: all {full} layers served: nothing to carry")
    out.append(
        f"map on the shape: {len(at_served)} map servers and the original per depth: "
        + ", ".join(f"{per_depth[d]} starts at {d}" for d in depths)
        + f"; {starts} starts in all (each compiles the shape at its depth), "
        f"{settings.run.beside} beside the original at once where the host has room"
        + (f"; about {seconds / 60:.0f} min (the pace: {pace})" if seconds is not None else "")
    )
    return out


def _and(values: list[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]
