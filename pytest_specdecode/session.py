"""Glue between pytest's config and the experiment objects: options, run folder, progress."""

from __future__ import annotations

import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from .config import Settings, load_settings
from .errors import ConfigError
from .experiment import BASELINE, Experiment
from .results import redact_text, register_secret
from .service import Progress

SETTINGS_KEY = pytest.StashKey[Settings]()
RUN_DIR_KEY = pytest.StashKey[Path]()
EXPERIMENT_KEY = pytest.StashKey[Experiment]()


def load_from_options(config: pytest.Config) -> Settings:
    """The validated Settings for this pytest run, loaded once."""
    if SETTINGS_KEY in config.stash:
        return config.stash[SETTINGS_KEY]
    opt = config.getoption
    reports = opt("spec_reports")
    settings = load_settings(
        _spec_file(config),
        spec_configs=opt("spec_config"),
        workloads=opt("spec_workload"),
        target_overrides={
            "host": opt("spec_host"),
            "unit": opt("spec_unit"),
            "identity_file": opt("spec_identity"),
            "known_hosts": opt("spec_known_hosts"),
            "accept_unknown_host_key": opt("spec_accept_unknown_host_key"),
            "api_base": opt("spec_api_base"),
            "model": opt("spec_model"),
            "watchdog_s": opt("spec_watchdog"),
            **({"backend": "systemd"} if opt("spec_host") else {}),
        },
        reports_dir=Path(reports).resolve() if reports else None,
        run_overrides={
            "samples": opt("spec_samples"),
            "warmup": opt("spec_warmup"),
            "max_tokens": opt("spec_max_tokens"),
            "concurrency": opt("spec_concurrency"),
            "alpha": opt("spec_alpha"),
            "min_effect": opt("spec_min_effect"),
        },
    )
    config.stash[SETTINGS_KEY] = settings
    return settings


def _spec_file(config: pytest.Config) -> Path:
    given = config.getoption("spec_file") or config.getini("specdecode_file")
    if given:
        path = Path(given)
        return path if path.is_absolute() else Path.cwd() / path
    return Path(config.rootpath) / "suites" / "specdecode.toml"


def run_dir_for(config: pytest.Config, settings: Settings) -> Path:
    """This run's own folder under the reports dir, created and proven writable."""
    if RUN_DIR_KEY in config.stash:
        return config.stash[RUN_DIR_KEY]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    label = "-".join(c.name for c in settings.candidates) or "baseline-only"
    label = re.sub(r"[^A-Za-z0-9_.-]", "_", label)[:60]
    run_dir = settings.reports_dir / f"{stamp}-{label}"
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = settings.reports_dir / f"{stamp}-{label}-{suffix}"
    try:
        run_dir.mkdir(parents=True)
        probe = run_dir / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(
            f"reports directory {settings.reports_dir} is not writable ({exc.strerror}); "
            "nothing was started. Pass --spec-reports DIR"
        ) from None
    config.stash[RUN_DIR_KEY] = run_dir
    return run_dir


def make_progress(config: pytest.Config, log_path: Path) -> Progress:
    """Progress lines shown live (past output capture) and kept in the run's log."""
    start = time.monotonic()
    capman = config.pluginmanager.get_plugin("capturemanager")

    def say(message: str) -> None:
        message = redact_text(message)
        elapsed = time.monotonic() - start
        line = f"[specdecode {elapsed:6.0f}s] {message}"
        with log_path.open("a") as log:
            log.write(f"{datetime.now(UTC).isoformat(timespec='seconds')} {message}\n")
        if capman is not None:
            with capman.global_and_fixture_disabled():
                _write(line)
        else:
            _write(line)

    return say


def _write(line: str) -> None:
    stream = sys.__stderr__ or sys.stderr
    stream.write(line + "\n")
    stream.flush()


def api_headers(settings: Settings) -> dict[str, str]:
    """Authorization from the variable the config names; the key itself is never stored."""
    name = settings.target.api_key_env
    if not name:
        return {}
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"[target] api_key_env names {name}, but it is not set")
    register_secret(key)
    return {"Authorization": f"Bearer {key}"}


def terminal_table(config: pytest.Config) -> list[str]:
    """The seed-style table, one row per prompt type and candidate."""
    experiment = config.stash.get(EXPERIMENT_KEY, None)
    if experiment is None or BASELINE not in experiment.phases:
        return []
    lines: list[str] = []
    header = (
        f"{'prompt':<12} {'candidate':<14} {'base tok/s':>10} {'cand tok/s':>10} "
        f"{'change':>8} {'TPOT base→cand ms':>19} {'p_adj':>7} {'accept len':>10}  verdict"
    )
    base = experiment.phases[BASELINE]
    if len(experiment.phases) == 1:
        lines.append(f"{'prompt':<12} {'median tok/s':>12} {'median TPOT ms':>15}")
        for name, m in base.measurements.items():
            lines.append(f"{name:<12} {m.median_tokens_per_s:>12.1f} {m.median_tpot_ms:>15.1f}")
        return lines
    lines.append(header)
    for candidate in experiment.phases:
        if candidate == BASELINE:
            continue
        for name, v in experiment.verdicts(candidate).items():
            acc = v.measured.acceptance.mean_acceptance_length
            lines.append(
                f"{name:<12} {candidate:<14} {v.throughput.baseline_median:>10.1f} "
                f"{v.throughput.candidate_median:>10.1f} {v.throughput.change:>+8.1%} "
                f"{v.tpot.baseline_median:>8.1f} → {v.tpot.candidate_median:<8.1f} "
                f"{v.throughput.p_adjusted:>7.3g} {(f'{acc:.2f}' if acc else 'n/a'):>10}  "
                f"{v.verdict}"
            )
        acc = experiment.phases[candidate].acceptance
        if acc.present and acc.per_position_rates:
            rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
            lines.append(
                f"  {candidate}: per-position acceptance [{rates}], draft acceptance "
                f"{acc.draft_acceptance_rate:.1%}"
            )
    report = experiment.board.restore_report
    if report is not None:
        lines.append(report.describe())
    lines.append(f"results: {experiment.results.path}")
    return lines
