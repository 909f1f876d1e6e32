"""Production units as they are written, on the real systemd test host: a template instance with
a unit bound to it, a podman-run unit on a locally built image, and a host reboot in the middle
of a candidate.

The extra units are installed over SSH by the fixtures here and removed after. Each test checks
that the production unit still serves, that nothing of the tool's is left, and that nothing
under /etc/systemd/system changed.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from pytest_specdecode.targets.systemd.unitfile import dropin_path

from ..support.embedded import free_port
from ..support.pipes import finish
from ..support.testbed import (
    REPO,
    Testbed,
    results_of,
    results_path,
    run_until,
    suite_args,
    write_remote_experiment,
)

UNIT_DIR = "/etc/systemd/system"
MODELS = "/var/lib/specdecode-test-models"  # the template's %i resolves to a link in here


@pytest.fixture(autouse=True)
def production_unit_untouched(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.settled_traces() == []
    etc = testbed.persistent_units()
    yield
    testbed.wait_serving(timeout_s=120)
    testbed.assert_original_restored()
    assert testbed.persistent_units() == etc


@dataclass
class ExtraUnit:
    """A unit installed for one test, serving the test bed's model on a port of its own."""

    unit: str
    api_base: str
    bed: Testbed
    since: str = ""  # the host's clock when the unit was installed: its journal starts there

    def options(self) -> list[str]:
        return ["--spec-unit", self.unit, "--spec-api-base", self.api_base]

    def active(self, unit: str | None = None) -> bool:
        return self.bed.ssh("systemctl", "is-active", "--quiet", unit or self.unit).ok

    def journal(self, grep: str, *match: str) -> list[str]:
        since = ["--since", f"@{self.since}"] if self.since else []
        argv = ["journalctl", "-u", self.unit, *match, *since, "-o", "cat", "--no-pager"]
        out = self.bed.ssh(*argv).stdout
        return [line for line in out.splitlines() if grep in line]


def wait_until_serving(api_base: str, model: str, bed: Testbed, unit: str) -> None:
    deadline = time.monotonic() + 400
    while time.monotonic() < deadline:
        try:
            models = httpx.get(f"{api_base}/v1/models", timeout=5).json()
            if any(m.get("id") == model for m in models.get("data", [])):
                return
        except (httpx.HTTPError, json.JSONDecodeError):
            pass
        time.sleep(2)
    tail = bed.ssh("journalctl", "-u", unit, "-n", "30", "-o", "cat", "--no-pager").stdout
    pytest.fail(f"{unit} did not serve {model} at {api_base}:\n{tail}")


def install(bed: Testbed, units: dict[str, str], start: list[str]) -> None:
    for name, text in units.items():
        bed.write(f"{UNIT_DIR}/{name}", text)
    bed.ssh("systemctl", "daemon-reload")
    assert bed.ssh("systemctl", "start", *start, timeout=120).ok


def uninstall(bed: Testbed, units: dict[str, str], running: list[str]) -> None:
    bed.ssh("systemctl", "stop", *running, timeout=180)
    bed.ssh("rm", "-f", *(f"{UNIT_DIR}/{name}" for name in units))
    bed.ssh("systemctl", "daemon-reload")
    bed.ssh("systemctl", "reset-failed")


@pytest.fixture
def template_instance(testbed: Testbed) -> Iterator[ExtraUnit]:
    """vllm@<model>.service from a template with %i in the model path and the served name, and
    vllm-proxy.service bound to it (BindsTo=), both running."""
    python, *_ = testbed.exec_start()
    model_dir = model_path(testbed)
    port = free_port()
    instance = f"vllm@{testbed.model}.service"
    units = {
        "vllm@.service": f"""[Unit]
Description=test bed: vLLM serving %i (one instance per model)

[Service]
Environment=VLLM_CPU_KVCACHE_SPACE=1
ExecStart={python} -m vllm.entrypoints.openai.api_server --model {MODELS}/%i \\
    --served-model-name %i --host 127.0.0.1 --port {port} --enforce-eager --max-model-len 1024 \\
    --distributed-executor-backend uni
Restart=on-failure
RestartSec=5
TimeoutStopSec=30
""",
        "vllm-proxy.service": f"""[Unit]
Description=test bed: stands for a proxy in front of {instance}; stops when it stops
BindsTo={instance}
After={instance}

[Service]
ExecStart=/bin/sleep infinity
""",
    }
    testbed.ssh("mkdir", "-p", MODELS)
    testbed.ssh("ln", "-sfn", model_dir, f"{MODELS}/{testbed.model}")
    install(testbed, units, [instance, "vllm-proxy.service"])
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", testbed.model, testbed, instance)
        yield ExtraUnit(instance, f"http://127.0.0.1:{port}", testbed)
    finally:
        uninstall(testbed, units, ["vllm-proxy.service", instance])
        testbed.ssh("rm", "-rf", MODELS)


def run_ngram(
    pytester: pytest.Pytester, testbed: Testbed, unit: ExtraUnit, *, max_tokens: int
) -> tuple[dict, str]:
    """The suite with the ngram candidate against `unit`, run to its end: results.json and the
    progress."""
    config = write_remote_experiment(
        pytester, testbed, run={"samples": 5, "max_tokens": max_tokens}
    )
    args = suite_args(pytester, testbed, config, *unit.options(), "--spec-config", "ngram")
    result = pytester.runpytest_subprocess(*args)
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out + err
    return results_of(pytester), err


def model_path(testbed: Testbed) -> str:
    argv = testbed.exec_start()
    return argv[argv.index("--model") + 1]


def test_template_instance_with_a_bound_unit_baseline_candidate_restore(
    pytester: pytest.Pytester, testbed: Testbed, template_instance: ExtraUnit
) -> None:
    bed, inst = testbed, template_instance
    data, err = run_ngram(pytester, bed, inst, max_tokens=16)  # as the podman unit's: n, not speed

    # Baseline and candidate measured: the candidate is the instance itself, so %i resolved to
    # the production instance's values (the model under /…/<instance>, served as <instance>).
    for phase in ("baseline", "ngram"):
        measured = data["phases"][phase]["measurements"]["coding"]
        assert measured["summary"]["n"] == 5, data["phases"]
    assert data["phases"]["ngram"]["service"].startswith(f"candidate ngram: unit {inst.unit} on")
    assert data["phases"]["baseline"]["acceptance"]["present"] is False
    assert data["phases"]["ngram"]["acceptance"]["present"] is True
    assert f"--model {MODELS}/%i" in err  # the plan shows the drop-in, specifiers as written

    # The bound unit stopped with the instance; it was active at the start, so it is again.
    assert "restored to active and serving" in err, err
    assert "started again vllm-proxy.service" in err, err
    assert any("vllm-proxy.service" in note for note in data["restore"]["notes"])
    assert inst.active() and inst.active("vllm-proxy.service")
    assert bed.traces(inst.unit) == []


PODMAN_UNIT = "vllm-podman.service"
CONTAINER = "vllm-ctr"
CONTAINER_MODEL = "/models/smol"  # the model directory as the container sees it


@pytest.fixture
def podman_unit(testbed: Testbed) -> Iterator[ExtraUnit]:
    """vllm-podman.service: a real podman runs the image built on the test host (no registry),
    with the venv and the model bind-mounted, and publishes the server's port 8000 on a host port
    that a drop-in's Environment= sets (-p ${CTR_PORT}:8000)."""
    if not testbed.ssh("podman", "image", "exists", testbed.image).ok:
        pytest.fail(
            f"the test host has no image {testbed.image}: it was booted from an older rootfs; "
            "run scripts/testbed/systemd-host down, then up"
        )
    port = free_port()
    model_dir = model_path(testbed)
    volumes = [f"-v {p}:{p}:ro" for p in testbed.binds if p != model_dir]
    units = {
        PODMAN_UNIT: f"""[Unit]
Description=test bed: vLLM in a podman container, from an image built on the host

[Service]
ExecStartPre=-/usr/bin/podman rm -f {CONTAINER}
ExecStart=/usr/bin/podman run --rm --name {CONTAINER} --shm-size=1g \\
    -e VLLM_CPU_KVCACHE_SPACE=1 -p ${{CTR_PORT}}:8000 {" ".join(volumes)} \\
    -v {model_dir}:{CONTAINER_MODEL}:ro {testbed.image} \\
    --model {CONTAINER_MODEL} --served-model-name {testbed.model} --enforce-eager \\
    --max-model-len 1024 --distributed-executor-backend uni
Restart=on-failure
TimeoutStopSec=30
""",
        f"{PODMAN_UNIT}.d/10-port.conf": f"[Service]\nEnvironment=CTR_PORT={port}\n",
    }
    since = testbed.ssh("date", "+%s").stdout.strip()  # earlier runs' lines are not this one's
    install(testbed, units, [PODMAN_UNIT])
    try:
        wait_until_serving(f"http://127.0.0.1:{port}", testbed.model, testbed, PODMAN_UNIT)
        yield ExtraUnit(PODMAN_UNIT, f"http://127.0.0.1:{port}", testbed, since)
    finally:
        uninstall(testbed, units, [PODMAN_UNIT])
        testbed.ssh("rm", "-rf", f"{UNIT_DIR}/{PODMAN_UNIT}.d")


def test_podman_unit_measured_through_its_port_mapping_and_ctrl_c_mid_candidate_restores(
    pytester: pytest.Pytester, testbed: Testbed, podman_unit: ExtraUnit
) -> None:
    """Baseline and candidate ngram measured in full, the API found through the unit's -p and
    reached only through SSH, vLLM's facts asked inside the container; then SIGINT (Ctrl-C)
    while candidate ngram-k3's container starts: the host restores the original at once."""
    bed, ctr = testbed, podman_unit
    repo = bed.image.rsplit(":", 1)[0]
    config = write_remote_experiment(
        pytester,
        bed,
        run={"samples": 5, "max_tokens": 16},
        target={"watchdog_s": 900, "vllm_images": [repo]},
    )
    extra = ["--spec-config", "ngram-k3", "--spec-unit", ctr.unit, "--spec-api-via", "ssh"]
    seen: list[str] = []
    proc = run_until(pytester, bed, config, "starting candidate ngram-k3:", *extra, seen=seen)
    assert proc.stderr is not None
    reader = threading.Thread(target=lambda: [seen.append(line) for line in proc.stderr])
    reader.start()  # the controller's progress, as it comes
    # Mid-candidate: its container runs and its server has read its arguments, but it does not
    # serve yet (its start takes a minute here). On a busy machine the journal can lag behind
    # the server: the controller's own "30s elapsed" line also says the start is well under way.
    half_way = re.compile(r"\b([3-9]\d|\d{3,})s elapsed, waiting for candidate ngram-k3")
    deadline = time.monotonic() + 180
    while not any(
        "'num_speculative_tokens': 3" in line
        for line in ctr.journal("non-default args:", f"CONTAINER_NAME={CONTAINER}")
    ) and not any(half_way.search(line) for line in seen):
        assert not any("ngram-k3" in ln and "ready after" in ln for ln in seen), "".join(seen)
        assert time.monotonic() < deadline, "candidate ngram-k3's server never started"
        time.sleep(1)
    assert bed.ssh("test", "-e", dropin_path(ctr.unit)).ok  # the candidate is what runs now
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=600)
    reader.join(timeout=60)
    err = "".join(seen)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err

    # The API was found on the host's side of -p ${CTR_PORT}:8000, and reached through SSH.
    port = httpx.URL(ctr.api_base).port
    assert f"forwarded over SSH to 127.0.0.1:{port} on root@127.0.0.1:2222" in err, err
    assert "CTR_PORT from Environment=" in err, err
    # vLLM's facts were asked of the Python inside the running container.
    inside = f"container {CONTAINER} on root@127.0.0.1:2222"
    assert f"vLLM 0.32.0 on {inside} (" in err, err
    data = results_of(pytester)
    facts = data["environment"]["vllm"]
    assert (facts["source"], facts["host"], facts["version"]) == ("host", inside, "0.32.0")

    # Baseline and candidate ngram measured in full; ngram-k3 was interrupted as it started.
    for phase in ("baseline", "ngram"):
        assert data["phases"][phase]["measurements"]["coding"]["summary"]["n"] == 5, data
    assert data["phases"]["baseline"]["acceptance"]["present"] is False
    assert data["phases"]["ngram"]["acceptance"]["present"] is True
    assert data["phases"]["ngram"]["service"].startswith(f"candidate ngram: unit {ctr.unit} on")
    ending = data["ending"]
    assert ending["how"] == "interrupted" and ending["signals"] == ["SIGINT"], ending
    assert "pytest-specdecode-watchdog.service" in ending["handed_over"], ending
    # The handover came first, then the restore, which the controller lived to see (the
    # controller waited for it: the watchdog did not do it).
    assert ending["restore_observed"] is True, ending
    assert 0 <= ending["handover_s"] <= ending["restore_s"], ending
    assert "restored to active and serving" in err, err
    run_log = (results_path(pytester).parent / "run.log").read_text()
    assert "run ending: interrupted by SIGINT; the restore was handed over" in run_log

    # What the server in the container received, as vLLM logs it (podman's journald log driver:
    # the same lines also come through `podman run`'s stdout): the fixture's start and the
    # restore without a speculative config, each candidate with its own, so the config went
    # after the image, among the server's arguments.
    starts = ctr.journal("non-default args:", f"CONTAINER_NAME={CONTAINER}")
    assert len(starts) == 4, starts
    assert ["speculative_config" in line for line in starts] == [False, True, True, False]
    assert "'num_speculative_tokens': 5" in starts[1] and "'num_speculative_tokens': 3" in starts[2]
    assert all(f"'model': '{CONTAINER_MODEL}'" in line for line in starts), starts
    assert ctr.active() and bed.traces(ctr.unit) == []
    wait_until_serving(ctr.api_base, bed.model, bed, ctr.unit)


def test_reboot_mid_candidate_brings_back_the_original_and_leaves_no_trace(
    pytester: pytest.Pytester, testbed: Testbed
) -> None:
    """/run is cleared at boot: the drop-in, the lock and the watchdog go with it."""
    config = write_remote_experiment(
        pytester,
        testbed,
        # The reboot kills the candidate a second after its first line: a window of 10 requests
        # (20 s here) outlasts that; more would only lengthen the baseline's.
        run={"samples": 10, "max_tokens": 32},
        target={"watchdog_s": 900, "restore_timeout_s": 600},
    )
    proc = run_until(pytester, testbed, config, "[ngram] coding:")
    try:
        assert testbed.ssh("test", "-e", testbed.dropin).ok  # the candidate is what runs now
        script = REPO / "scripts" / "testbed" / "systemd-host"
        reboot = subprocess.run(["bash", str(script), "reboot"], capture_output=True, text=True)
        assert reboot.returncode == 0, reboot.stderr[-3000:]
        # Booted and serving again, before the controller did anything there: nothing is left.
        assert "rebooted: vllm-kimi-k25-int4.service serves" in reboot.stderr
        assert testbed.settled_traces() == []
        booted_pid = testbed.state()["MainPID"]
    except BaseException:
        proc.terminate()  # the controller restores and ends, its pipe read to the end
        finish(proc, 900)
        raise

    _, err = finish(proc, 900)
    assert "rebooted during the run" in err, err
    assert "restored to active and serving" in err, err
    # The controller found the original that the boot brought back and left it running.
    assert testbed.state()["MainPID"] == booted_pid
    assert results_of(pytester)["restore"]["is_active"] is True
