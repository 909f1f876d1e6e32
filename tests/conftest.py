"""Shared test set-up: markers by folder, a clean environment, and the systemd test host.

unit/       fast tests, no server (seconds)
real_vllm/  against the embedded CPU vLLM (marker `vllm`, minutes)
real_host/  against the systemd test host over a real sshd (marker `remote`, minutes)
support/    helpers, no tests
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

# httpx imports httpcore lazily, at its first client. If that happened inside a test that uses
# `pytester`, pytester's sys.modules restore would drop httpcore afterwards, and a re-import
# would bring exception classes that httpx no longer maps (raw httpcore errors would escape).
import httpcore  # noqa: F401
import pytest

# The same for the plugin's pytest-html hooks, imported at a run's configure: an in-process
# pytester run would drop the module, and the next run's register finds no sys.modules entry.
# And matplotlib's, which the reports import at their first plot: dropped after a run, a later
# plot would mix two copies of its classes ("Legend needs either Axes or FigureBase").
with contextlib.suppress(ImportError):  # no pytest-html: the plugin never imports them
    import pytest_specdecode.html_hooks  # noqa: F401
import matplotlib.axes
import matplotlib.colors
import matplotlib.figure
import matplotlib.patches
import matplotlib.ticker  # noqa: F401

from .support.testbed import REPO, Reach, Testbed

HERE = Path(__file__).parent
MARKERS = {"real_vllm": "vllm", "real_host": "remote"}


# The real tests' files, longest first (a CI run's durations): the two workers take them in
# this order, so that the last ones to start are short and neither worker idles long at the end.
# The test host's files come first, as one scope (pytest_xdist_make_scheduler).
LONGEST_FIRST = (
    "real_host/test_shape_host.py",  # about 2 min (three starts of the unit): first in its scope
    "real_host/",
    "real_vllm/test_prediction_real.py",
    "real_vllm/test_embedded_experiment.py",
    "real_vllm/test_aa.py",
    "real_vllm/test_shape_real.py",  # about 2.5 min each (two CPU vLLM starts), on a shared core
    "real_vllm/test_shape_llama_real.py",
    "real_vllm/test_levels_real.py",
    "real_vllm/test_adoption_wheel.py",
    "real_vllm/test_traffic.py",
    "real_vllm/test_drafter_real.py",
)


def _start_rank(item: pytest.Item) -> int:
    path = Path(item.path).as_posix()
    found = [i for i, part in enumerate(LONGEST_FIRST) if f"/tests/{part}" in path]
    return found[0] if found else len(LONGEST_FIRST)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(item.path).relative_to(HERE).parts[0] if HERE in item.path.parents else ""
        if folder in MARKERS:
            item.add_marker(MARKERS[folder])
    items.sort(key=_start_rank)  # stable: each file keeps its own order


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`-n 2 --dist loadscope` (make test): each file whole in either worker (a module's own
    server), except the one test host's tests, which share it: one scope, in order."""
    if config.getoption("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # scopes in collection order: LONGEST_FIRST
    from xdist.scheduler import LoadScopeScheduling

    class OneTestHost(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "tests/real_host" if path.startswith("tests/real_host/") else path

    return OneTestHost(config, log)


@pytest.fixture(autouse=True)
def _no_step_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin's own test runs never write into a CI job's step summary."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.fixture(scope="session", autouse=True)
def _own_facts_cache(tmp_path_factory) -> Iterator[None]:
    """vLLM's remembered facts (targets/facts/cache.py) in a folder of this session, shared by
    its tests (each worker its own), never the user's ~/.cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECDECODE_CACHE_DIR", str(tmp_path_factory.mktemp("facts-cache")))
        yield


@pytest.fixture(autouse=True)
def _own_host_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path_factory) -> None:
    """The plugin's own test runs never read or write the user's host profiles (an A/A run
    writes one; a later test would read it)."""
    folder = tmp_path_factory.mktemp("host-profiles")
    monkeypatch.setenv("SPECDECODE_HOST_PROFILES", str(folder))


# Set (make test): a test host this session booted stays up, for make test's next pytest run,
# and make test takes it down at the end. Unset: it is stopped again at the session's end.
KEEP_UP = "SPECDECODE_TESTBED_KEEP"


def _booted(instance: int) -> Iterator[Testbed]:
    """scripts/testbed/systemd-host --instance N: booted if it is down, and stopped again if
    this booted it (unless KEEP_UP is set)."""
    script = REPO / "scripts" / "testbed" / "systemd-host"
    cmd = ["bash", str(script), "--instance", str(instance)]
    was_up = subprocess.run([*cmd, "status"], capture_output=True).returncode == 0
    if not was_up:
        up = subprocess.run([*cmd, "up"], capture_output=True, text=True)
        if up.returncode != 0:
            pytest.fail(
                f"the systemd test host {instance} did not come up:\n"
                f"{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
            )
    bed = Testbed.from_script(script, instance)
    try:
        yield bed
    finally:
        bed.close()
        if not was_up and not os.environ.get(KEEP_UP):
            subprocess.run([*cmd, "down"], capture_output=True)


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Boots scripts/testbed/systemd-host if it is down, and stops it again if it booted it."""
    yield from _booted(1)


@pytest.fixture(scope="session")
def second_testbed(testbed: Testbed) -> Iterator[Testbed]:
    """A second host, a replica of the first (`systemd-host --instance 2`: its rootfs copied,
    its own keys and ports), booted after it if it is down, and stopped again if this booted it."""
    yield from _booted(2)


@pytest.fixture(scope="session")
def reach(testbed: Testbed) -> Iterator[Reach]:
    """scripts/testbed/reach-host on the test host: set up if needed, taken down if it set it up."""
    script = REPO / "scripts" / "testbed" / "reach-host"
    was_up = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if not was_up:
        up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True)
        if up.returncode != 0:
            pytest.fail(f"reach-host did not come up:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}")
    try:
        yield Reach.from_script(script)
    finally:
        if not was_up:
            subprocess.run(["bash", str(script), "down"], capture_output=True)
