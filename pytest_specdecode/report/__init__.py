"""Where a run is reported: the terminal table, summary.md, the HTML report, the plots and the plan.

Every renderer reads the run record and its analysis through one row model (`rows.Row`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.run import RunAnalysis
from ..record.schema import RunRecord
from . import markdown
from .plots import write_plots
from .sections import acceptance
from .sections.prediction import write_heatmap

SUMMARY_FILE = "summary.md"


@dataclass
class Written:
    """The report files of a run."""

    run_dir: Path
    summary: Path
    plots: dict[str, Path] = field(default_factory=dict)
    markdown: str = ""


def write_reports(
    record: RunRecord,
    analysis: RunAnalysis,
    run_dir: Path,
    *,
    failed: list[str],
    step_summary: str | None,
) -> Written:
    """summary.md and the plots in the run folder; summary.md also into $GITHUB_STEP_SUMMARY."""
    plots = write_plots(record, analysis, run_dir)
    plots.update(write_heatmap(record, analysis, run_dir))  # the prediction's grid, if any
    plots.update(acceptance.write_plot(record, analysis, run_dir))  # per prompt, per level
    text = markdown.summary(record, analysis, failed=failed, run_name=run_dir.name)
    summary = run_dir / SUMMARY_FILE
    summary.write_text(text)
    if step_summary:
        with Path(step_summary).open("a") as f:
            f.write(text + "\n")
    return Written(run_dir, summary, plots, text)
