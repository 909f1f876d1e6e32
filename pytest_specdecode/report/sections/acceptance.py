"""Acceptance per request, prompt and load level in the reports: the table (terminal,
summary.md, HTML), what the levels above the first teach, and the per-prompt plot. Everything
here reads `analysis.level_acceptance.AcceptanceByLevel`; nothing is computed."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from ...analysis.prediction.level_acceptance import AcceptanceByLevel, LevelAcceptance
from ...analysis.run import RunAnalysis
from ...record.counters import ACCEPTED_PER_DRAFT
from ...record.schema import RunRecord
from ..text import fmt_num

TITLE = "Acceptance per level: each request's own figures, and the replay step by step"
PLOT_NAME = "prompt-acceptance"
PLOT_CAPTION = (
    "Accepted per draft, per prompt at each load level, per candidate and prompt type: vLLM's "
    "mean acceptance length, 1 + the accepted draft tokens over the verify steps that drafted "
    "(steps that drafted nothing are not counted), from the requests' own "
    "speculative metrics (vLLM's --per-request-spec-decode-metrics). A missing bar: the prompt "
    "drafted nothing there."
)
HEADER = (
    "Candidate",
    "Prompt @ level",
    "n",
    "Accepted per draft (source)",
    "Predicted (basis)",
    "Error",
    "Step check vs the prediction",
    "On its own tokens",
)
FOOTNOTE = (
    "Step check: each request's per-step drafted/accepted arrays (from the server) against the "
    "n-gram replay, walked in order; a step that parts is classed: no draft (the server drafted "
    "nothing where the replay drafted), fewer draft tokens, outputs differ (the request's output "
    'differs from the replayed one from there on), other. "vs the prediction" replays the '
    "baseline's outputs at the same level; \"on its own tokens\" replays the request's own "
    "output, which tells whether the proposer drafted as the replay says."
)


def cells(entry: LevelAcceptance) -> tuple[str, ...]:
    measured = entry.measured.mean_acceptance_length if entry.measured else None
    found = entry.predicted_range
    predicted = (
        "—"
        if found is None
        else f"{found[0]:.2f}"
        if found[1] - found[0] < 0.005
        else f"{found[0]:.2f}..{found[1]:.2f}"
    )
    label = entry.candidate + (f" ({entry.settings.label})" if entry.settings else "")
    return (
        label,
        f"{entry.prompt_type} @ {entry.level}",
        str(entry.requests),
        f"{fmt_num(measured, '.2f')} ({entry.source})",
        f"{predicted} ({entry.basis})" if entry.settings else "not replayable",
        fmt_num(entry.error, "+.2f") if entry.error is not None else "—",
        entry.steps.text() if entry.steps else "—",
        entry.own_steps.text() if entry.own_steps else "—",
    )


def notes(record: RunRecord, found: AcceptanceByLevel) -> list[str]:
    why: dict[str, list[str]] = {}  # one line per reason: its starts (ngram, ngram#2) named
    for p in record.phases.values():
        if p.request_metrics and p.request_metrics.startswith("none"):
            why.setdefault(p.request_metrics.removeprefix("none: "), []).append(p.name)
    out = [f"{', '.join(names)}: no per-request metrics ({text})" for text, names in why.items()]
    if found.batch_rule:
        out.append(f"Above the first level: {found.batch_rule}")
    out += [f"⚠ {w}" for w in found.warnings]
    return out


def _shown(analysis: RunAnalysis) -> list[LevelAcceptance]:
    return [e for e in analysis.acceptance.levels if e.source != "none"]


def terminal_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    found = _shown(analysis)
    if not any(e.source == "requests" for e in found):
        return notes(record, analysis.acceptance)  # why there are none, if a phase says
    out = [f"{TITLE}:"]
    for e in found:
        c = cells(e)
        out.append(
            f"  {c[1]:<22} {c[0]:<24} n={c[2]:<3} accepted per draft {c[3]}; predicted {c[4]}, "
            f"error {c[5]}"
        )
        if e.steps or e.own_steps:
            out.append(f"    step check: {c[6]}; on its own tokens: {c[7]}")
    out += [f"  {line}" for line in notes(record, analysis.acceptance)]
    return out


def markdown_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    found = _shown(analysis)
    if not found:
        return []
    lines = [
        f"### {TITLE}",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|:--|:--|--:|--:|:--|--:|:--|:--|",
        *("| " + " | ".join(c.replace("|", "\\|") for c in cells(e)) + " |" for e in found),
        "",
    ]
    lines += [f"- {line}" for line in notes(record, analysis.acceptance)]
    lines += ["", f"<sub>{FOOTNOTE}</sub>", ""]
    return lines


def html_section(record: RunRecord, analysis: RunAnalysis) -> str:
    found = _shown(analysis)
    if not found:
        return ""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in HEADER)
    body = "".join(
        "<tr>" + "".join(f"<td>{e(c)}</td>" for c in cells(entry)) + "</tr>" for entry in found
    )
    items = "".join(f"<li>{e(line)}</li>" for line in notes(record, analysis.acceptance))
    return (
        f"<h3 id='specdecode-acceptance-levels'>{e(TITLE)}</h3>"
        f"<table class='specdecode-table'><tr>{head}</tr>{body}</table>"
        + (f"<ul>{items}</ul>" if items else "")
        + f"<p class='note'>{e(FOOTNOTE)}</p>"
    )


def write_plot(record: RunRecord, analysis: RunAnalysis, run_dir: Path) -> dict[str, Path]:
    """prompt-acceptance.png: {PLOT_NAME: path}, or {} where no request had its own figures."""
    groups: dict[tuple[str, str], list[LevelAcceptance]] = {}
    for entry in analysis.acceptance.levels:
        if entry.per_prompt:
            groups.setdefault((entry.candidate, entry.prompt_type), []).append(entry)
    if not groups:
        return {}
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 2.3 * len(groups) + 0.6), dpi=100, layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    colors = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860")
    for ax, ((candidate, prompt_type), entries) in zip(axes, groups.items(), strict=True):
        _bars(ax, entries, colors)
        ax.set_title(f"{candidate} / {prompt_type}", fontsize=10)
    axes[-1].set_xlabel("prompt (index in its prompt type)")
    path = run_dir / f"{PLOT_NAME}.png"
    fig.savefig(path, format="png")
    return {PLOT_NAME: path}


def _bars(ax, entries: Sequence[LevelAcceptance], colors: Sequence[str]) -> None:
    indices = sorted({p.prompt_index or 0 for e in entries for p in e.per_prompt})
    width = 0.8 / len(entries)
    for j, entry in enumerate(entries):
        values = {p.prompt_index or 0: p.mean_acceptance_length for p in entry.per_prompt}
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(indices))]
        ys = [values.get(i) or 0.0 for i in indices]
        mean = entry.measured.mean_acceptance_length if entry.measured else None
        ax.bar(xs, ys, width, color=colors[j % len(colors)],
               label=f"{entry.level} (all: {fmt_num(mean, '.2f')})")  # fmt: skip
    ax.set_xticks(range(len(indices)), [f"#{i}" for i in indices], fontsize=8)
    ax.set_ylabel(ACCEPTED_PER_DRAFT, fontsize=8)
    ax.axhline(1.0, color="#888", lw=0.8)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
