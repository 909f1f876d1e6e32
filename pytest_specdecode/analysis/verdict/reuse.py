"""A stored run's baseline, reused instead of measured (--spec-baseline-from)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ...config.arms import BASELINE, design_keys
from ...config.settings import Settings
from ...errors import ConfigError
from ...record.schema import BaselineSource, Phase
from ...record.store import load_run
from .checks import facts


def stored_baseline(path: str, settings: Settings) -> tuple[Phase, BaselineSource]:
    """The baseline phase of a stored run, for this run's prompt types, and where it came from.

    Checked before anything starts: the run must hold a baseline for every prompt type.
    """
    if not settings.candidates and not settings.run.search:
        raise ConfigError(
            "--spec-baseline-from reuses a baseline to compare candidates with: pass --spec-config "
            "or --spec-search"
        )
    record = load_run(path)
    phases = record.arm_phases(BASELINE)
    if not phases:
        raise ConfigError(f"the stored run {path} has no {BASELINE!r} phase")
    phase = phases[0]
    keys = design_keys(settings.prompt_types, settings.run.levels)
    missing = [
        key for key in keys if key not in phase.measurements or not phase.measurements[key].samples
    ]
    if missing:
        raise ConfigError(
            f"the stored run {path} has no measured {BASELINE!r} requests for "
            f"{', '.join(missing)} (prompt type, and @level when several); it has: "
            f"{', '.join(phase.measurements) or 'none'}"
        )
    source = str(Path(path).resolve())
    reused = dataclasses.replace(
        phase,
        reused_from=source,
        measurements={key: phase.measurements[key] for key in keys},
    )
    return reused, BaselineSource(path=source, facts=facts(record, arm=BASELINE))
