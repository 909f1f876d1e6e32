"""The host-side handover of the systemd backend, on a stand-in host whose files are a dict: it
acts only while the lock is this run's, and it stops the heartbeat. The same handover runs on
the real systemd host in tests/real_host (a signal mid-run, the host's restore script)."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from pytest_specdecode.targets.hosts.base import BaseHost, CommandResult
from pytest_specdecode.targets.systemd.target import SystemdTarget
from pytest_specdecode.targets.systemd.watchdog import LOCK_DIR, RESTORING

UNIT = """# /etc/systemd/system/vllm.service
[Unit]
Description=vLLM

[Service]
ExecStart=/opt/vllm/bin/vllm serve /models/smol --served-model-name smol --port 8000
"""
OWNER = f"{LOCK_DIR}/owner.txt"


class HostFiles(BaseHost):
    """A stand-in host: its files and folders in memory, a unit that runs, every command kept."""

    name = "root@gpu:22"

    def __init__(self) -> None:
        self.files: dict[str, str] = {}
        self.dirs: set[str] = {"/", "/run/systemd/system"}
        self.ran: list[tuple[str, ...]] = []

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        argv = tuple(argv)
        self.ran.append(argv)
        ok, out = True, ""
        match argv:
            case ("systemctl", "cat", _):
                out = UNIT
            case ("systemctl", "show", "vllm.service", *_):
                out = "ActiveState=active\nSubState=running\nMainPID=42\n"
            case ("install", *_, tmp):
                self.files[tmp] = stdin or ""
            case ("mv", "-f", tmp, path):
                self.files[path] = self.files.pop(tmp)
            case ("cat", *paths):
                out = "".join(self.files.get(p, "") for p in paths)
                ok = all(p in self.files for p in paths)
            case ("test", "-d" | "-e" | "-w", path):
                ok = path in self.files or path in self.dirs
            case ("mkdir", "-p", "-m", _, path):
                self.dirs.add(path)
            case ("mkdir", path):
                ok = path not in self.dirs
                self.dirs.add(path)
            case ("rm", "-rf", "--", *paths):
                for gone in paths:
                    self.dirs = {d for d in self.dirs if not d.startswith(gone)}
                    self.files = {f: t for f, t in self.files.items() if not f.startswith(gone)}
        return CommandResult(self.name, argv, 0 if ok else 1, out, "")


def heartbeats() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "specdecode-watchdog"]


@pytest.fixture
def armed():
    """A target past its preflight: the lock is this run's, the watchdog armed and renewed."""
    host = HostFiles()
    target = SystemdTarget(host, "vllm.service", api_base="http://gpu:8000", model="smol")
    target.preflight()
    assert host.files[OWNER].startswith(f"run {target.run_id} ") and heartbeats()
    yield host, target
    target.close()


def test_a_handover_tells_the_host_to_restore_and_stops_the_heartbeat(armed) -> None:
    host, target = armed
    done = target.hand_over("interrupted by SIGTERM")
    assert done == (
        "pytest-specdecode-watchdog.service on root@gpu:22 runs /run/pytest-specdecode/restore.sh"
    )
    assert host.ran[-1] == (
        "systemctl", "start", "--no-block", "pytest-specdecode-watchdog.service"
    )  # fmt: skip
    assert (
        f"handed to the host by run {target.run_id} (interrupted by SIGTERM)"
        in (host.files[RESTORING])
    )
    for beat in heartbeats():
        beat.join(timeout=5)
    assert not heartbeats()  # no renewal may re-arm the timer behind the host's restore
    assert target.hand_over("interrupted by SIGTERM") is None  # once


def test_no_handover_over_a_lock_that_is_no_longer_this_runs(armed) -> None:
    host, target = armed
    # The watchdog restored the host meanwhile, and another run took the lock.
    host.files[OWNER] = "run other-host-7-1700000000 by ci on other-host since ...\n"
    before = len(host.ran)
    assert target.hand_over("interrupted by SIGINT") is None
    assert RESTORING not in host.files
    assert not [argv for argv in host.ran[before:] if argv[0] in ("systemctl", "systemd-run")]
