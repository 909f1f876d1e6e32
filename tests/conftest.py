"""Fixtures for the remote-host tests: a real systemd host (nspawn) with sshd, serving vLLM."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

# httpx imports httpcore lazily, at its first client. If that happened inside a test that uses
# `pytester`, pytester's sys.modules restore would drop httpcore afterwards, and a re-import
# would bring exception classes that httpx no longer maps (raw httpcore errors would escape).
import httpcore  # noqa: F401
import pytest

from .testbed import REPO, Reach, Testbed


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    """Boots scripts/testbed/systemd-host if it is down, and stops it again if it booted it."""
    script = REPO / "scripts" / "testbed" / "systemd-host"
    was_up = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if not was_up:
        up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True)
        if up.returncode != 0:
            pytest.fail(
                f"the systemd test host did not come up:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
            )
    bed = Testbed.from_script(script)
    try:
        yield bed
    finally:
        bed.close()
        if not was_up:
            subprocess.run(["bash", str(script), "down"], capture_output=True)


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
