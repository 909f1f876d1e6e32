"""Glue between pytest's config and the experiment objects: options, run folder, progress."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

import pytest

from .config.settings import Settings, load_settings
from .errors import ConfigError, SpecDecodeError
from .measure.experiment import BASELINE, Experiment
from .record.history import check_stored_baseline, previous_timing, stored_baseline_warnings
from .record.store import redact_text, register_secret
from .report import summary as report
from .targets import open_target
from .targets.base import Progress

SETTINGS_KEY = pytest.StashKey[Settings]()
RUN_DIR_KEY = pytest.StashKey[Path]()
EXPERIMENT_KEY = pytest.StashKey[Experiment]()
FINISHED_KEY = pytest.StashKey["report.Written | None"]()


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
    """To the terminal, if there still is one: a closed or broken one (EPIPE, EIO) is ignored."""
    stream = sys.__stderr__ or sys.stderr
    with contextlib.suppress(OSError, ValueError):
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
    for candidate, phase in experiment.phases.items():
        if phase.spec is None:  # the baseline, and the baseline measured again (ABA)
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
    restore = experiment.board.restore_report
    if restore is not None:
        lines.append(restore.describe())
    lines += report.terminal_notes(experiment.results.data)
    written = config.stash.get(FINISHED_KEY, None)
    if written is not None:
        lines.append(f"summary: {written.summary}")
    lines.append(f"results: {experiment.results.path}")
    return lines


def check_run_options(config: pytest.Config, settings: Settings) -> None:
    """Refuse, before anything starts, a --spec-baseline-from that cannot be reused."""
    path = config.getoption("spec_baseline_from")
    if path:
        check_stored_baseline(path, settings)


def dry_run(config: pytest.Config) -> None:
    """--spec-dry-run: print the plan and exit 0. Nothing is started, written or changed."""
    if not config.getoption("spec_dry_run") or SETTINGS_KEY not in config.stash:
        return
    settings = config.stash[SETTINGS_KEY]
    target = open_target(settings.target, log_dir=settings.reports_dir)
    try:
        steps = target.plan(settings.candidates)  # systemd: reads the unit, read-only
    except SpecDecodeError as exc:
        pytest.exit(f"pytest-specdecode dry run: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    finally:
        host = getattr(target, "host", None)
        if host is not None:  # not target.close(): that cleans up on the host
            host.close()
    lines = report.dry_run_lines(
        settings,
        steps,
        host=target.host_name,
        timing=previous_timing(settings),
        aba=config.getoption("spec_aba"),
        baseline_from=config.getoption("spec_baseline_from"),
    )
    capman = config.pluginmanager.get_plugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        sys.stdout.write(redact_text("\n".join(lines)) + "\n")
        sys.stdout.flush()
    pytest.exit("dry run: nothing was started or changed", returncode=pytest.ExitCode.OK)


def measure_baseline_after(
    config: pytest.Config, session: pytest.Session, experiment: Experiment
) -> None:
    """--spec-aba: measure the original again, last, before the restore (the drift check)."""
    if not config.getoption("spec_aba"):
        return
    if session.shouldfail or session.shouldstop or session.exitstatus != pytest.ExitCode.OK:
        experiment.progress("drift check (ABA) skipped: the run was stopped")
    elif BASELINE in experiment.phases and any(
        p.spec is not None for p in experiment.phases.values()
    ):
        experiment.progress("drift check (ABA): measuring the original again")
        experiment.baseline_after()
    else:
        experiment.progress("drift check (ABA) skipped: no candidate was measured")


def finish_reports(config: pytest.Config) -> report.Written | None:
    """Once, at the end: verdicts, checks, plots and summary.md in the run folder.

    Never raises: results.json is already complete, and the test outcome must stand.
    """
    if FINISHED_KEY in config.stash:
        return config.stash[FINISHED_KEY]
    config.stash[FINISHED_KEY] = None
    experiment = config.stash.get(EXPERIMENT_KEY, None)
    if experiment is None:
        return None
    try:
        stored_baseline_warnings(experiment.results.data)
        written = report.finish(
            experiment,
            run_dir_for(config, experiment.settings),
            failed=_failed_tests(config),
            step_summary=os.environ.get("GITHUB_STEP_SUMMARY"),
        )
    except Exception:
        _write("[specdecode] the report could not be written:\n" + traceback.format_exc())
        return None
    config.stash[FINISHED_KEY] = written
    return written


def _failed_tests(config: pytest.Config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return []
    return [
        r.nodeid.split("::")[-1] + ("" if r.when == "call" else f" ({r.when})")
        for key in ("failed", "error")
        for r in reporter.stats.get(key, [])
        if getattr(r, "nodeid", None)
    ]
