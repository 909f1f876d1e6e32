"""Session fixtures: one experiment per pytest session, restored at teardown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import __version__
from .config.settings import Settings, Workload
from .errors import ConfigError, SpecDecodeError
from .measure.experiment import Experiment, PhaseResult
from .record.history import run_facts, use_stored_baseline
from .record.store import ResultsFile, redact_argv, redact_env
from .session import (
    EXPERIMENT_KEY,
    api_headers,
    load_from_options,
    make_progress,
    measure_baseline_after,
    run_dir_for,
)
from .targets import open_target
from .targets.lifecycle import experiment_services


@pytest.fixture(scope="session")
def specdecode_settings(pytestconfig: pytest.Config) -> Settings:
    try:
        return load_from_options(pytestconfig)
    except ConfigError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def specdecode_experiment(
    pytestconfig: pytest.Config, specdecode_settings: Settings, request: pytest.FixtureRequest
) -> Iterator[Experiment]:
    """Brings services up on demand; whatever happens, its teardown restores the original."""
    settings = specdecode_settings
    run_dir = run_dir_for(pytestconfig, settings)
    progress = make_progress(pytestconfig, run_dir / "run.log")
    headers = api_headers(settings)
    t = settings.target
    target = open_target(t, log_dir=run_dir)
    results = ResultsFile(
        run_dir / "results.json",
        {
            "plugin_version": __version__,
            "config_file": str(settings.source),
            "target": {
                "backend": t.backend,
                "host": target.host_name,
                "unit": t.unit,
                "api_base": t.api_base,
                "model": t.model,
                "command": redact_argv(t.command),
                "env": redact_env(t.env),
            },
            "run": settings.run.__dict__,
            "candidates": {c.name: dict(c.values) for c in settings.candidates},
            "workloads": {w.name: w.__dict__ for w in settings.workloads.values()},
        },
    )
    progress(f"run folder {run_dir}")
    try:  # nothing is touched until preflight has passed; its last step takes the lock
        for step in target.plan(settings.candidates):
            progress(f"plan: {step}")  # progress redacts secrets
        target.preflight()
    except SpecDecodeError as exc:
        target.close()
        progress(f"refused, nothing was touched: {exc}")
        pytest.exit(f"pytest-specdecode: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    results.set("environment", run_facts(target, settings))  # GPUs, suite commit
    with experiment_services(
        target,
        ready_timeout_s=t.startup_timeout_s,
        restore_timeout_s=t.restore_timeout_s,
        progress=progress,
        headers=headers,
        record_ending=lambda ending: results.set("ending", ending.to_dict()),  # how it ended
    ) as board:
        experiment = Experiment(settings, board, results, progress=progress, headers=headers)
        use_stored_baseline(experiment, pytestconfig.getoption("spec_baseline_from"))
        pytestconfig.stash[EXPERIMENT_KEY] = experiment
        yield experiment
        measure_baseline_after(pytestconfig, request.session, experiment)  # --spec-aba
    if board.restore_report is not None:
        results.set("restore", board.restore_report.__dict__)


@pytest.fixture(scope="session")
def specdecode_phase(
    request: pytest.FixtureRequest, specdecode_experiment: Experiment
) -> PhaseResult:
    """The measurements of one phase: 'baseline' or a candidate's name."""
    return specdecode_experiment.phase(request.param)


@pytest.fixture(scope="session")
def specdecode_candidate(
    request: pytest.FixtureRequest, specdecode_experiment: Experiment
) -> PhaseResult:
    """A candidate's measurements, after the baseline's."""
    return specdecode_experiment.phase(request.param)


@pytest.fixture
def specdecode_workload(request: pytest.FixtureRequest, specdecode_settings: Settings) -> Workload:
    return specdecode_settings.workloads[request.param]
