"""summary.md: the verdict and the results table in Markdown, fit for a PR comment."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.run import RunAnalysis
from ..analysis.verdict.stats import Verdict
from ..record.schema import RunRecord
from ..redaction import redact_text
from .rows import TABLE_HEADER, checks, headline, rows, stops, undecided
from .sections import (
    acceptance,
    break_even,
    cut,
    levels,
    prediction,
    regime,
    search,
    shape,
    side_changes,
)
from .text import STATISTICS_NOTE, acceptance_text, design_text, suite_text, title


def summary(
    record: RunRecord,
    analysis: RunAnalysis,
    *,
    failed: Sequence[str] = (),
    run_name: str | None = None,
) -> str:
    target = record.target
    versions = sorted({p.server_version for p in record.phases.values() if p.server_version})
    gpus = record.environment.get("gpus")
    not_decided = undecided(analysis, record)
    lines = [
        *cut.markdown_lines(record.cut),
        f"## {title(list(record.candidates))}",
        "",
        *search.answer_markdown(analysis.search),
        f"`{target.model}` on `{target.host}` ({target.backend}"
        + (f", unit `{target.unit}`" if target.unit else "")
        + f") · vLLM {', '.join(versions) or 'unknown'} · GPUs: "
        + ("; ".join(gpus) if gpus else "none listed")
        + f" · suite {suite_text(record.environment, markdown=True)}",
        "",
        design_text(record.run) + ".",
        "",
        *shape.markdown_lines(record),
        f"**{cut.result_label(record)}: {headline(analysis)}**",
        "",
        *(f"- {line}" for line in not_decided),
        *([""] if not_decided else []),
        *regime.markdown_lines(analysis),
    ]
    if failed:  # an undecided test fails the gate too; the head says how many were undecided
        open_ = sum(f.endswith(" (undecided)") for f in failed)
        count = f"{len(failed)}" + (f", {open_} of them undecided" if open_ else "")
        lines += [f"**Failed tests ({count}):** " + ", ".join(f"`{f}`" for f in failed), ""]
    for name in analysis.verdicts:
        spec = record.candidates.get(name)
        lines += [
            f"### {name}"
            + (f" · `{json.dumps(spec, sort_keys=True)}`" if spec else "")
            + (f" · ⚠ {found}" if (found := regime.mark(analysis, name)) else ""),
            "",
            *drafter_lines(record.environment, name),
            "| " + " | ".join(TABLE_HEADER) + " |",
            "|:--|--:|--:|--:|:--|--:|:--|",
        ]
        for row in rows(analysis, name):
            cells = list(row.cells())
            if row.verdict in (Verdict.REGRESSED.value, Verdict.IMPROVED.value):
                cells[-1] = f"**{cells[-1]}**"
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        if stopped := stops(record, name):  # side by side: where each cell stopped, and why
            lines += ["", "Where each prompt type stopped: " + "; ".join(stopped) + "."]
        lines += ["", acceptance_text(record.arm_phases(name)[0].acceptance), ""]
        lines += side_changes.markdown_lines(analysis, name)
    lines += levels.markdown_lines(record, analysis)
    lines += break_even.markdown_lines(analysis)
    lines += search.markdown_lines(record, analysis.search)
    lines += [f"- {line.strip()}" for line in search.coverage_lines(analysis.search)]
    lines += prediction.markdown_lines(record, analysis)
    lines += acceptance.markdown_lines(record, analysis)
    found = checks(record, analysis)
    if found:
        lines += ["### Checks", "", *(f"- {'⚠ ' if c.warn else ''}{c.text}" for c in found), ""]
    where = f"run folder `{run_name}`: " if run_name else ""
    lines += [
        f"<sub>{STATISTICS_NOTE} Full data in the {where}results.json, report.html and the "
        "plots.</sub>",
        "",
    ]
    return redact_text("\n".join(lines))


def drafter_lines(environment: Mapping[str, Any], name: str) -> list[str]:
    """The candidate's drafter as the run checked it: path, architecture, layers, vocabulary,
    size; then each warning of the check."""
    found = (environment.get("drafters") or {}).get(name)
    if not found:
        return []
    description, *warnings = found
    return [f"Drafter: {description}", *(f"- ⚠ {w}" for w in warnings), ""]
