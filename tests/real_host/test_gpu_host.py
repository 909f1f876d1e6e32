"""The GPU check after a stop, end to end on the systemd test host: real processes, a real stop.

The test host has no GPU, so a stand-in nvidia-smi (tests/support/standin_nvidia_smi.sh, named
as one in its header) replays the values of a real H200 for the PIDs a test lists, while they run.
The units are small transient ones (`sleep`), not the vLLM unit: a stop and start of that one
would cost a minute or more, and the decision does not depend on what the processes run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.errors import ServiceError
from pytest_specdecode.targets.facts import gpu
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.systemd import units as systemd_units
from pytest_specdecode.targets.systemd.target import SystemdTarget

from ..support.testbed import Testbed

STANDIN = Path(__file__).parents[1] / "support" / "standin_nvidia_smi.sh"
STATE = "/run/specdecode-nvidia-smi-standin"
SMI = "/usr/local/bin/nvidia-smi"
UUID = "GPU-695d5997-a103-0d89-580b-71c5e61fbbe2"
UNITS = ("specdecode-gpu-probe.service", "specdecode-gpu-other.service")


@pytest.fixture
def host(testbed: Testbed) -> Iterator[SSHHost]:
    """The test host with the stand-in nvidia-smi installed; everything removed afterwards."""
    ssh = SSHHost(
        SSHSpec.parse(testbed.host, identity_file=testbed.identity, known_hosts=testbed.known_hosts)
    )
    assert not ssh.run(["test", "-e", SMI]).ok, f"{SMI} exists on the test host: not replacing it"
    install = 'mkdir -p "$2" && cat > "$1" && chmod 0755 "$1"'
    ssh.check(["sh", "-c", install, "sh", SMI, STATE], stdin=STANDIN.read_text())
    try:
        yield ssh
    finally:
        ssh.run(["systemctl", "kill", "--signal=KILL", *UNITS], timeout=60)  # leftovers too
        ssh.run(["systemctl", "stop", *UNITS], timeout=60)
        ssh.run(["systemctl", "reset-failed", *UNITS], timeout=60)
        ssh.run(["sh", "-c", 'rm -f "$1"; rm -rf "$2"', "sh", SMI, STATE])
        ssh.close()


def start(host: SSHHost, unit: str, command: str, *, kill_mode: str, count: int) -> list[int]:
    """A transient unit running `command`; returns its PIDs (MainPID and its cgroup's)."""
    host.check(
        ["systemd-run", f"--unit={unit}", f"--property=KillMode={kill_mode}", "sh", "-c", command]
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:  # the cgroup's PIDs, as the check itself reads them
        pids = sorted(gpu.snapshot_unit(host, unit).pids)
        if len(pids) == count:
            return pids
        time.sleep(0.2)
    pytest.fail(f"{unit} did not get {count} processes: {pids}")


def on_gpu(host: SSHHost, pids: list[int]) -> None:
    """The stand-in lists these PIDs in compute-apps while they run."""
    script = 'printf "%s\\n" "$@" > /run/specdecode-nvidia-smi-standin/pids'
    host.check(["sh", "-c", script, "sh", *map(str, pids)])


def test_the_units_own_processes_release_and_a_foreign_one_is_only_reported(host):
    command = "sleep 600 & exec sleep 601"  # a main process and a child, as vLLM's engine
    unit_pids = start(host, UNITS[0], command, kill_mode="control-group", count=2)
    (foreign,) = start(host, UNITS[1], "exec sleep 600", kill_mode="control-group", count=1)
    on_gpu(host, [*unit_pids, foreign])
    listed = host.check(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"])
    assert sorted(map(int, listed.stdout.split())) == sorted([*unit_pids, foreign])

    said: list[str] = []
    unit = SystemdTarget(
        host, UNITS[0], api_base="http://127.0.0.1:9", model="-", progress=said.append
    ).original()
    unit.stop()  # does not raise: the foreign process is not the unit's (its one note says so)
    (note,) = unit.gpu_notes
    assert note.startswith(
        f"after unit {UNITS[0]} on {host.name} stopped, other processes still hold memory on the "
        f"GPUs it used: pid {foreign} (sleep) 21090 MiB on GPU 0 ({UUID})"
    )
    assert said == [f"GPU: {note}"]
    assert host.run(["test", "-d", f"/proc/{foreign}"]).ok  # untouched


def test_a_child_left_behind_by_killmode_process_fails_the_check(host, monkeypatch):
    # KillMode=process: the stop ends the main process only, and its child keeps "its GPU".
    monkeypatch.setattr(systemd_units, "GPU_RELEASE_TIMEOUT_S", 3.0)
    main, child = None, None
    pids = start(host, UNITS[0], "sleep 600 & exec sleep 601", kill_mode="process", count=2)
    try:
        on_gpu(host, pids)
        main = int(host.check(["systemctl", "show", "-p", "MainPID", "--value", UNITS[0]]).stdout)
        (child,) = [p for p in pids if p != main]
        unit = SystemdTarget(host, UNITS[0], api_base="http://127.0.0.1:9", model="-").original()
        with pytest.raises(ServiceError) as err:
            unit.stop()
        # 3 s of waiting, said in whole seconds as measured (4 on a busy machine).
        assert re.match(
            rf"unit {re.escape(UNITS[0])} on {re.escape(host.name)} stopped, but \d+s later its "
            rf"own processes still hold GPU memory: pid {child} \(sleep, still running\) "
            rf"21090 MiB on GPU 0 \({UUID}\)\. ",
            str(err.value),
        ), str(err.value)
        assert not host.run(["test", "-d", f"/proc/{main}"]).ok  # the main process did end
    finally:
        if child is not None:
            host.run(["kill", str(child)])
