"""Hooks that pytest-specdecode offers to conftest.py files and other plugins."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .config.settings import Settings
    from .targets.base import Target


@pytest.hookspec(firstresult=True)
def pytest_specdecode_open_target(
    config: pytest.Config, settings: Settings, log_dir: Path, progress: Callable[[str], None]
) -> Target | None:
    """Return the target to experiment on, or None for the configured backend.

    :param config: the pytest config.
    :param settings: the validated experiment settings.
    :param log_dir: where the target may keep server logs (the run folder).
    :param progress: where the target says what it waits for, as the run's other progress.
    """
