"""The plan a user reads before anything is touched: --spec-dry-run's text and its estimate."""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config.settings import Settings
from ..errors import ConfigError
from ..record.schema import BASELINE, RunRecord
from ..record.store import RESULTS_FILE, load_run
from . import prediction
from .text import fmt_duration

RUN_LOG = "run.log"


@dataclass(frozen=True)
class Timing:
    """How long things took before: per server start and per output token."""

    start_s: float
    s_per_token: float
    source: str  # where these numbers come from


def stored_runs(settings: Settings, *, host: str) -> Iterator[tuple[Path, RunRecord]]:
    """The stored runs of this model on this host under the reports folder, newest first."""
    folders = (
        sorted((p for p in settings.reports_dir.iterdir() if p.is_dir()), reverse=True)
        if settings.reports_dir.is_dir()
        else []
    )
    for folder in folders:
        if not (folder / RESULTS_FILE).is_file():
            continue
        try:
            record = load_run(folder)
        except ConfigError:
            continue
        if record.target.model == settings.target.model and record.target.host == host:
            yield folder, record


def previous_timing(settings: Settings, *, host: str, default_start_s: float) -> Timing:
    """Timings of the newest stored run of the same model and host, or stated assumptions."""
    for folder, record in stored_runs(settings, host=host):
        per_token = [
            s.e2e_s / s.output_tokens
            for p in record.phases.values()
            for m in p.measurements.values()
            for s in m.samples
            if s.output_tokens and s.e2e_s > 0
        ]
        if not per_token:
            continue
        starts = _ready_times(folder / RUN_LOG)
        return Timing(
            start_s=statistics.median(starts) if starts else default_start_s,
            s_per_token=statistics.median(per_token),
            source=f"from the stored run {folder.name}",
        )
    return Timing(
        start_s=default_start_s,
        s_per_token=0.05,
        source=f"assumed: no stored run of this model on this host in {settings.reports_dir}",
    )


def stored_prediction(settings: Settings, *, host: str) -> list[str]:
    """The planned candidates predicted from the newest stored baseline with token ids."""
    if not settings.candidates:
        return []
    for folder, record in stored_runs(settings, host=host):
        if any(
            m.token_ids is not None and m.token_ids.missing is None
            for p in record.arm_phases(BASELINE)
            for m in p.measurements.values()
        ):
            return prediction.dry_run_lines(settings, record, folder.name)
    return [
        "prediction: no stored baseline with token ids of this model on this host in "
        f"{settings.reports_dir}"
    ]


def _ready_times(log: Path) -> list[float]:
    try:
        text = log.read_text()
    except OSError:
        return []
    return [float(m) for m in re.findall(r" ready after (\d+(?:\.\d+)?)s", text)]


def count_requests(settings: Settings, *, baseline: bool, aba: bool) -> tuple[int, int]:
    """(phases measured, requests sent) for this configuration."""
    phases = int(baseline) + len(settings.candidates) + int(aba and bool(settings.candidates))
    per_phase = len(settings.prompt_types) * (settings.run.samples + settings.run.warmup)
    return phases, phases * per_phase


def estimate_seconds(
    settings: Settings, timing: Timing, *, baseline: bool, aba: bool, adopts_original: bool
) -> tuple[float, int]:
    """(seconds, server starts): starts, plus every request at its full max_tokens."""
    candidates = len(settings.candidates)
    aba = aba and candidates > 0
    if adopts_original:  # measured as it runs; the restore starts it again unless ABA did
        starts = candidates + (1 if aba else int(candidates > 0))
    else:
        starts = int(baseline) + candidates + int(aba)
    phases, _ = count_requests(settings, baseline=baseline, aba=aba)
    per_phase = sum(
        (settings.run.samples + settings.run.warmup) * t.max_tokens * timing.s_per_token
        for t in settings.prompt_types.values()
    )
    return starts * timing.start_s + phases * per_phase / settings.run.concurrency, starts


def dry_run_lines(
    settings: Settings,
    steps: Sequence[str],
    *,
    host: str,
    timing: Timing,
    aba: bool,
    baseline_from: str | None,
    adopts_original: bool,
    predicted: Sequence[str] = (),
) -> list[str]:
    """The plan, as --spec-dry-run prints it; `predicted`: `stored_prediction`'s lines."""
    t = settings.target
    baseline = baseline_from is None
    phases, requests = count_requests(settings, baseline=baseline, aba=aba)
    seconds, starts = estimate_seconds(
        settings, timing, baseline=baseline, aba=aba, adopts_original=adopts_original
    )
    run = settings.run
    lines = [
        "pytest-specdecode dry run: nothing is started, written or changed.",
        f"host: {host} ({t.backend} backend)" + (f", unit {t.unit}" if t.unit else ""),
        f"model: {t.model} at {t.api_base}",
        "candidates: "
        + (", ".join(f"{c.name} {c.to_json()}" for c in settings.candidates) or "none"),
        f"prompt types: {', '.join(settings.prompt_types)}",
    ]
    if baseline_from:
        lines.append(
            f"baseline: reused from {baseline_from}, not measured"
            + ("" if adopts_original else "; the original is not started for it")
        )
    steps = list(steps)
    if aba and settings.candidates:  # just before the restore, the plan's last step
        steps.insert(
            len(steps) - 1,
            "drift check (ABA): stop the last candidate, start the original and measure it "
            "again as 'baseline-after'",
        )
    lines.append("steps, in order:")
    for i, step in enumerate(steps, start=1):
        first, *rest = step.splitlines()
        lines.append(f"  {i}. {first}")
        lines += [f"     {line}" for line in rest]
    lines += [
        f"requests: {requests} = {phases} phases x {len(settings.prompt_types)} prompt types x "
        f"({run.samples} measured + {run.warmup} warm-up)",
        f"estimated duration: about {fmt_duration(seconds)} ({starts} server "
        f"start{'' if starts == 1 else 's'} at ~{timing.start_s:.0f}s, requests at up to "
        f"~{timing.s_per_token * 1000:.0f} ms per output token; {timing.source})",
    ]
    return lines + list(predicted)
