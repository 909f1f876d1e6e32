"""Helpers: a run of the suite on a shape with dummy weights (tests/real_vllm/test_shape_*.py),
and what every such run must show: both arms measured on the shape's server, the original left
as found, and the plan and the report naming what is random and what is cut."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .embedded import EmbeddedExperiment, require_embedded, run_suite, write_experiment

__all__ = ["RUN", "ShapeRun", "measured", "says", "shape_run"]

RUN = {"samples": 5, "max_samples": 5, "warmup": 1, "max_tokens": 16, "repeats": 1}


@dataclass
class ShapeRun:
    exp: EmbeddedExperiment
    done: subprocess.CompletedProcess[str]
    data: dict
    log: str  # run.log
    summary: str  # summary.md


def shape_run(where: Path, *shape: str) -> ShapeRun:
    require_embedded()
    exp = write_experiment(where, run=RUN)
    done = run_suite(
        exp,
        "--spec-config",
        "ngram",
        "--spec-prompt-type",
        "coding",
        "--spec-arms",
        "one-at-a-time",
        *shape,
    )
    assert exp.reports.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    folder = exp.run_dir()
    return ShapeRun(
        exp,
        done,
        exp.results(),
        (folder / "run.log").read_text(),
        (folder / "summary.md").read_text(),
    )


def measured(run: ShapeRun) -> None:
    """Baseline and n-gram each measured on the shape server, the original left as found."""
    phases = run.data["phases"]
    assert set(phases) == {"baseline", "ngram"}, run.done.stdout[-3000:]
    for phase in phases.values():
        (cell,) = phase["measurements"].values()
        assert len(cell["samples"]) == RUN["samples"]
    assert phases["ngram"]["acceptance"]["present"] is True
    restore = run.data["restore"]
    assert restore["was_active"] is False and restore["is_active"] is False
    assert restore["errors"] == []
    assert run.exp.leftover_servers() == []


def says(run: ShapeRun, cut: str) -> None:
    """The plan (run.log, before anything started) and the report name what is random and
    what is cut."""
    plan = [line for line in run.log.splitlines() if "plan:" in line]
    first_start = next(i for i, line in enumerate(run.log.splitlines()) if "starting " in line)
    assert any("random: the weights (--load-format dummy)" in line for line in plan)
    assert any(f"cut: {cut}" in line for line in plan)
    assert max(i for i, line in enumerate(run.log.splitlines()) if "plan: " in line) < first_start
    assert "Measured on the shape, not the model" in run.summary
    assert "- Random: the weights (--load-format dummy)" in run.summary
    assert f"- Cut: {cut}" in run.summary
    page = (run.exp.run_dir() / "report.html").read_text()
    assert "Measured on the shape, not the model" in page and "Random: the weights" in page
    assert "Measured on the shape, not the model" in run.done.stdout  # the terminal
    assert f"  Cut: {cut}" in run.done.stdout
