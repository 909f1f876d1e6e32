"""The candidate as a transient unit beside the running production unit, on the systemd test host
(`--spec-arms together`, issue 29): started, measured, removed, while the original's process
(the same MainPID) serves the whole time; and, when the controller is killed, the host's
watchdog removes it.

The candidate is driven here through `SystemdTarget.beside(spec)` directly. Once the
Switchboard's side of `--spec-arms together` and the interleaved sending are merged, the step
`drive_through_the_target` becomes a whole run of the suite (`pytester.runpytest_subprocess(
*suite_args(pytester, testbed, config, "--spec-arms", "together", "--spec-config", "ngram"))`,
with `write_remote_experiment`), and every assertion around it stays as it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.targets.base import wait_until_ready
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.systemd.beside import BESIDE_PREFIX
from pytest_specdecode.targets.systemd.target import SystemdTarget
from pytest_specdecode.targets.systemd.units import BesideUnit

from ..support.testbed import REPO, Testbed

NGRAM = SpecConfig(
    "ngram", {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
)
# Repeated text: an n-gram candidate finds its drafts in the prompt.
PROMPT = "Copy the list: apple, pear, plum, fig, apple, pear, plum, fig, apple, pear, plum,"


class OriginalWatch:
    """Polls the original's /v1/models every second on a thread: it must answer every time."""

    def __init__(self, testbed: Testbed) -> None:
        self.testbed = testbed
        self.answers = 0
        self.misses: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="original-watch")

    def __enter__(self) -> OriginalWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _poll(self) -> None:
        while not self._stop.wait(1.0):
            try:
                got = httpx.get(f"{self.testbed.api_base}/v1/models", timeout=10)
                ok = got.status_code == 200 and self.testbed.model in got.text
                self.answers += ok
                if not ok:
                    self.misses.append(f"HTTP {got.status_code} at {time.strftime('%T')}")
            except httpx.HTTPError as exc:
                self.misses.append(f"{type(exc).__name__} at {time.strftime('%T')}")


def main_pid(testbed: Testbed) -> str:
    state = testbed.state()
    assert state.get("ActiveState") == "active", state
    return state["MainPID"]


def specdecode_units(testbed: Testbed) -> list[str]:
    """Every unit systemd knows whose name holds `specdecode`, in any state."""
    listed = testbed.ssh(
        "systemctl", "list-units", "--all", "--plain", "--no-legend", "*specdecode*"
    ).stdout
    return [line.split()[0] for line in listed.splitlines() if line.strip()]


def complete(api_base: str, model: str) -> dict:
    """One plain request, as the measurement's client sends it (a real connection)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{api_base}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text[:300]
    return response.json()


def spec_decode_drafts(api_base: str) -> float | None:
    """vLLM's counter of speculative drafts in /metrics; None where it has none."""
    metrics = httpx.get(f"{api_base}/metrics", timeout=30).text
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("vllm:spec_decode_num_drafts_total")
    ]
    return sum(values) if values else None


@pytest.fixture
def target(testbed: Testbed) -> Iterator[SystemdTarget]:
    """The production unit as a target past its preflight (this run's lock, the watchdog)."""
    testbed.wait_serving()
    assert testbed.settled_traces() == [] and specdecode_units(testbed) == []
    spec = SSHSpec.parse(
        testbed.host, identity_file=testbed.identity, known_hosts=testbed.known_hosts
    )
    found = SystemdTarget(
        SSHHost(spec),
        testbed.unit,
        api_base=testbed.api_base,
        model=testbed.model,
        watchdog_s=300,
        heartbeat_host=SSHHost(spec),
        progress=print,
    )
    found.preflight()
    try:
        yield found
    finally:
        found.close()


def drive_through_the_target(target: SystemdTarget, testbed: Testbed, pid: str) -> BesideUnit:
    """Start the candidate beside the original, send requests to each, stop it."""
    assert target.room_beside(NGRAM) is None  # "auto" binds the original's threads to core 0
    for line in target.plan_beside([NGRAM]):
        print("plan:", line)
    service = target.beside(NGRAM)
    service.start()
    assert main_pid(testbed) == pid
    wait_until_ready(service, timeout_s=600, progress=print)
    assert main_pid(testbed) == pid
    name = service.unit
    shown = testbed.ssh("systemctl", "show", name, "--property=CPUAffinity", "--value").stdout
    assert shown.strip() == "1", shown  # the core the original's threads leave free
    for _ in range(3):
        assert complete(testbed.api_base, testbed.model)["choices"][0]["text"]
        assert complete(service.api_base, testbed.model)["choices"][0]["text"]
    drafts = spec_decode_drafts(service.api_base)
    assert drafts is not None, "the candidate has no speculative decoding counters"
    assert spec_decode_drafts(testbed.api_base) is None  # the original does not speculate
    print(f"candidate {name} at {service.api_base}: {drafts:.0f} drafts; original pid {pid}")
    settings = service.settings_log()
    assert any("speculative_config" in line for line in settings), settings[-5:]
    assert main_pid(testbed) == pid
    service.stop()
    assert not testbed.ssh("systemctl", "is-active", "--quiet", name).ok
    return service


def test_the_candidate_runs_beside_the_original_which_serves_throughout(
    target: SystemdTarget, testbed: Testbed
):
    before = testbed.state()
    with OriginalWatch(testbed) as watch:
        service = drive_through_the_target(target, testbed, before["MainPID"])
        target.close()
    after = testbed.state()
    assert (after["MainPID"], after["NRestarts"]) == (before["MainPID"], before["NRestarts"])
    assert watch.misses == [] and watch.answers > 10, (watch.misses, watch.answers)
    assert specdecode_units(testbed) == []  # the transient unit, the watchdog: all gone
    assert testbed.settled_traces() == []
    assert not testbed.ssh("systemctl", "is-active", "--quiet", service.unit).ok


KILLED_CONTROLLER = """
import sys, time
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.config.ssh_config import SSHSpec
from pytest_specdecode.targets.hosts.ssh import SSHHost
from pytest_specdecode.targets.systemd.target import SystemdTarget

host, identity, known_hosts, unit, api_base, model = sys.argv[1:7]
spec = SSHSpec.parse(host, identity_file=identity, known_hosts=known_hosts)
target = SystemdTarget(SSHHost(spec), unit, api_base=api_base, model=model, watchdog_s=15,
                       heartbeat_host=SSHHost(spec))
target.preflight()
service = target.beside(SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3}))
service.start()
print(service.unit, flush=True)
time.sleep(3600)
"""


def test_a_killed_controllers_transient_unit_is_removed_by_the_hosts_watchdog(testbed: Testbed):
    """SIGKILL: no handover, no close; the watchdog's timer fires and restore.sh stops it."""
    testbed.wait_serving()
    assert testbed.settled_traces() == [] and specdecode_units(testbed) == []
    pid = main_pid(testbed)
    argv = [sys.executable, "-c", KILLED_CONTROLLER, testbed.host, str(testbed.identity)]
    argv += [str(testbed.known_hosts), testbed.unit, testbed.api_base, testbed.model]
    controller = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        name = (controller.stdout.readline() if controller.stdout else "").strip()
        assert name.startswith(BESIDE_PREFIX), name
        assert testbed.ssh("systemctl", "is-active", "--quiet", name).ok
    finally:
        killed_at = int(time.time())
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait(timeout=30)
    deadline = time.monotonic() + 180  # the 15 s watchdog, then restore.sh's stop
    with OriginalWatch(testbed) as watch:
        while specdecode_units(testbed) and time.monotonic() < deadline:
            time.sleep(2)
    assert specdecode_units(testbed) == [], "the watchdog left units behind"
    assert testbed.settled_traces() == []
    assert main_pid(testbed) == pid and watch.misses == []
    restored = testbed.ssh(
        "journalctl", "-u", "pytest-specdecode-watchdog.service", f"--since=@{killed_at - 1}",
        "-o", "cat", "--no-pager",
    ).stdout  # fmt: skip
    assert "restored " in restored, restored[-2000:]
