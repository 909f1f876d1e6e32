"""Session fixtures: one experiment per pytest session, restored at teardown.

A project's own test asks for `specdecode`, one typed `SpecDecodeCase` per candidate, prompt
type and load level (docs/fixtures.md). The others are the parts it is built from; the plugin
parametrizes `specdecode_phase`, `specdecode_candidate`, `specdecode_prompt_type` and, when
several load levels are measured, `specdecode_level` from the configuration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .analysis.verdict.compare import PromptTypeVerdict
from .case import SpecDecodeCase
from .config.arms import BASELINE, cell_key
from .config.load import LoadLevel
from .config.settings import PromptType, Settings
from .measure.experiment.arms import Experiment
from .measure.search import SearchStopped
from .record.measurement import Measurement
from .record.schema import Phase
from .run.session import SpecDecodeSession, session_of


@pytest.fixture(scope="session")
def specdecode_session(pytestconfig: pytest.Config) -> SpecDecodeSession:
    return session_of(pytestconfig)


@pytest.fixture(scope="session")
def specdecode_settings(specdecode_session: SpecDecodeSession) -> Settings:
    return specdecode_session.settings


@pytest.fixture(scope="session")
def specdecode_experiment(
    specdecode_session: SpecDecodeSession, request: pytest.FixtureRequest
) -> Iterator[Experiment]:
    """Brings services up on demand; whatever happens, its teardown restores the original."""
    with specdecode_session.running(request.session) as experiment:
        yield experiment


@pytest.fixture(scope="session")
def specdecode_phase(
    request: pytest.FixtureRequest,
    specdecode_session: SpecDecodeSession,
    specdecode_experiment: Experiment,
) -> Phase:
    """The measurements of one arm, over all its starts: 'baseline' or a candidate's name (a
    search's slot, search-1 .., is its config once the search chose it)."""
    return _arm(specdecode_session, request.param)


@pytest.fixture(scope="session")
def specdecode_candidate(
    request: pytest.FixtureRequest,
    specdecode_session: SpecDecodeSession,
    specdecode_experiment: Experiment,
) -> Phase:
    """A candidate's measurements over all its starts, after the baseline's."""
    return _arm(specdecode_session, request.param)


def _arm(session: SpecDecodeSession, name: str) -> Phase:
    try:
        return session.arm(name)
    except SearchStopped as stopped:
        pytest.skip(f"the search stopped before {name}: {stopped}")


@pytest.fixture
def specdecode_prompt_type(
    request: pytest.FixtureRequest, specdecode_settings: Settings
) -> PromptType:
    return specdecode_settings.prompt_types[request.param]


@pytest.fixture
def specdecode_level(request: pytest.FixtureRequest, specdecode_settings: Settings) -> LoadLevel:
    """The load level (parametrized only when a run measures several)."""
    return getattr(request, "param", None) or specdecode_settings.run.levels[0]


@pytest.fixture
def specdecode_measurement(
    specdecode_phase: Phase,
    specdecode_prompt_type: PromptType,
    specdecode_level: LoadLevel,
    specdecode_settings: Settings,
) -> Measurement:
    """One arm's measurement of a prompt type at a level, over all its starts."""
    several = len(specdecode_settings.run.levels) > 1
    key = cell_key(specdecode_prompt_type.name, specdecode_level, several=several)
    return specdecode_phase.measurements[key]


@pytest.fixture
def specdecode_verdict(
    specdecode_session: SpecDecodeSession,
    specdecode_candidate: Phase,
    specdecode_prompt_type: PromptType,
    specdecode_level: LoadLevel,
    specdecode_settings: Settings,
) -> PromptTypeVerdict:
    """The candidate against the baseline on this prompt type and level (the one analysis
    path)."""
    several = len(specdecode_settings.run.levels) > 1
    key = cell_key(specdecode_prompt_type.name, specdecode_level, several=several)
    return specdecode_session.verdict(specdecode_candidate.arm, key)


@pytest.fixture
def specdecode(
    specdecode_session: SpecDecodeSession,
    specdecode_experiment: Experiment,
    specdecode_candidate: Phase,
    specdecode_prompt_type: PromptType,
    specdecode_level: LoadLevel,
    specdecode_settings: Settings,
) -> SpecDecodeCase:
    """One candidate against the baseline on one prompt type at one level: the same object
    at one level or several, one start per arm or several."""
    several = len(specdecode_settings.run.levels) > 1
    key = cell_key(specdecode_prompt_type.name, specdecode_level, several=several)
    arm = specdecode_candidate.arm
    return SpecDecodeCase(
        candidate=arm,
        prompt_type=specdecode_prompt_type,
        level=specdecode_level,
        baseline=specdecode_experiment.arm(BASELINE).measurements[key],
        speculative=specdecode_candidate.measurements[key],
        _verdict=lambda: specdecode_session.verdict(arm, key),
    )
