"""The candidate beside a running systemd unit (`--spec-arms together`): the systemd-run command
line and its quoting, the port, the room on a GPU or CPU host, and the restore's coverage.

A scripted host answers what a real systemd 252 host printed for such a unit (the test host's
port from a drop-in's EnvironmentFile=); nvidia-smi's rows are the captured H200 values of
tests/data/nvidia-smi-h200 (see test_gpu.py). tests/real_host/test_arms_together_host.py runs
the same path on the systemd test host.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.beside.room import (
    UnitPlacement,
    cpu_placement,
    first_free_port,
    gpu_placement,
    listening_ports,
    parse_cpu_list,
    with_unit_port,
)
from pytest_specdecode.targets.facts import gpu
from pytest_specdecode.targets.hosts.base import BaseHost, CommandResult
from pytest_specdecode.targets.systemd.beside import systemd_run_argv
from pytest_specdecode.targets.systemd.target import SystemdTarget
from pytest_specdecode.targets.systemd.watchdog import RESTORE_SCRIPT

DATA = Path(__file__).parents[3] / "data" / "nvidia-smi-h200"
UNIT = """# /etc/systemd/system/vllm.service
[Service]
Environment=VLLM_CPU_KVCACHE_SPACE=2 VLLM_PORT=8000
EnvironmentFile=-/etc/vllm/vllm.env
User=vllm
ExecStart=/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model /models/smol \\
    --served-model-name smol --host 127.0.0.1 --port ${VLLM_PORT} --enforce-eager

# /etc/systemd/system/vllm.service.d/10-port.conf
[Service]
EnvironmentFile=/etc/default/vllm
"""
SHOWN = {
    "Environment": "VLLM_CPU_KVCACHE_SPACE=2 VLLM_PORT=8000",
    "EnvironmentFiles": [
        "/etc/vllm/vllm.env (ignore_errors=yes)",
        "/etc/default/vllm (ignore_errors=no)",
    ],
    "User": "vllm",
    "Group": "",
    "WorkingDirectory": "",
    "CPUAffinity": "",
    "ActiveState": "active",
    "SubState": "running",
    "MainPID": "863",
}
# `ss -Htln` on the test host: sshd, the original's API, and something on the next port.
SS = """LISTEN 0      128          0.0.0.0:2222      0.0.0.0:*
LISTEN 0      2048       127.0.0.1:8100      0.0.0.0:*
LISTEN 0      4096       127.0.0.1:8101      0.0.0.0:*
LISTEN 0      128             [::]:2222         [::]:*
"""
NGRAM = SpecConfig("ngram-k3", {"method": "ngram", "num_speculative_tokens": 3})
QUERY_GPU = (DATA / "query-gpu.csv").read_text().splitlines()
H200 = gpu.parse_gpus("\n".join(QUERY_GPU[:2]))[0]  # captured idle: 143771 MiB, 0 MiB used
BUSY_LINES = (DATA / "compute-apps.txt").read_text().splitlines()
HELD_MIB = BUSY_LINES[4].split(", ")[2]  # "21090 MiB", held by pid 863 in the capture
USED_MIB = BUSY_LINES[5]  # "21099 MiB", the GPU's memory.used meanwhile
SECOND = "GPU-00000000-0000-0000-0000-000000000001"  # a second GPU: not in the captures


def snapshot_text(*, second_gpu: bool = False) -> str:
    """The snapshot script's output while the original (pid 863) holds its captured memory."""
    lines = ["main 863", "pid 863", "smi 0", f"app 863, {HELD_MIB}, {H200.uuid}, python3"]
    lines.append(f"gpu 0, {H200.uuid}, NVIDIA H200, 143771 MiB, {USED_MIB}, 580.159.04")
    if second_gpu:
        lines.append(f"gpu 1, {SECOND}, NVIDIA H200, 143771 MiB, 0 MiB, 580.159.04")
    return "\n".join(lines)


class BesideHostStub(BaseHost):
    """A host with the unit running: answers systemctl, journalctl, ss, cat and the GPU
    snapshot as systemd 252 does; keeps its files in memory and every command it ran."""

    name = "root@gpu:22"

    def __init__(self, *, snapshot: str = "main 863\npid 863\nsmi absent", cpus="0-1") -> None:
        self.shown = dict(SHOWN)
        self.unit_text = UNIT
        self.snapshot, self.cpus, self.ss = snapshot, cpus, SS
        self.files: dict[str, str] = {"/etc/default/vllm": "VLLM_PORT=8100\n"}
        self.dirs: set[str] = {"/", "/run/systemd/system"}
        self.loaded: set[str] = {"vllm.service"}
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
                out = self.unit_text
            case ("systemctl", "show-environment"):
                out = "LANG=C.UTF-8\nPATH=/usr/bin:/bin\n"
            case ("systemctl", "show", unit, *props):
                out = self._show(unit, props)
            case ("systemctl", "stop", *units):
                self.loaded -= {u for u in self.loaded if any(fnmatch.fnmatch(u, p) for p in units)}
            case ("systemd-run", unit, *_) if unit.startswith("--unit=specdecode-beside"):
                self.loaded.add(unit.removeprefix("--unit="))
            case ("busctl", *_):
                ok = False
            case ("sh", "-c", _, "sh", *_):
                out = self.snapshot
            case ("ss", "-Htln"):
                out = self.ss
            case ("cat", "/sys/devices/system/cpu/online"):
                out = self.cpus + "\n"
            case ("install", *_, tmp):
                self.files[tmp] = stdin or ""
            case ("mv", "-f", tmp, path):
                self.files[path] = self.files.pop(tmp)
            case ("cat", "--", path) | ("cat", path):
                ok, out = path in self.files, self.files.get(path, "")
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
        return CommandResult(self.name, argv, 0 if ok else 1, out, "" if ok else "No such file")

    def _show(self, unit: str, props: Sequence[str]) -> str:
        if unit != "vllm.service":
            up = unit in self.loaded  # as systemd shows a unit it does not know: inactive, pid 0
            values = {
                "LoadState": "loaded" if up else "not-found",
                "ActiveState": "active" if up else "inactive",
                "SubState": "running" if up else "dead",
                "MainPID": "4242" if up else "0",
            }
        else:
            values = {**self.shown, "LoadState": "loaded"}
        names = [p.removeprefix("--property=") for p in props if p.startswith("--property=")]
        lines = []
        for name in names:
            value = values.get(name, "")
            for one in value if isinstance(value, list) else [value]:
                lines.append(one if "--value" in props else f"{name}={one}")
        return "\n".join(lines) + "\n"


def target(host: BesideHostStub) -> SystemdTarget:
    return SystemdTarget(host, "vllm.service", api_base="http://127.0.0.1:8100", model="smol")


def heartbeats() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "specdecode-watchdog"]


# ------------------------------------------------------------------------- the command line


def test_the_transient_unit_runs_the_originals_command_on_a_free_port_with_the_candidate():
    host = BesideHostStub()
    launch = target(host).beside_launch(NGRAM)
    argv = launch.run_argv
    assert argv[:3] == ["systemd-run", f"--unit={launch.name}", "--collect"]
    assert launch.name.startswith("specdecode-beside-") and launch.name.endswith(
        "-ngram-k3.service"
    )
    assert launch.address == ("127.0.0.1", 8102)  # 8100 is the original's, 8101 is taken
    command = argv[argv.index("--") + 1 :]
    assert command == [
        "/usr/bin/env",
        "VLLM_CPU_OMP_THREADS_BIND=1",
        "/opt/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/models/smol",
        "--served-model-name",
        "smol",
        "--host",
        "127.0.0.1",
        "--port",
        "8102",  # was ${VLLM_PORT}: 8100, from the drop-in's EnvironmentFile
        "--enforce-eager",
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":3}',
    ]
    options = argv[: argv.index("--")]
    assert '--property=Environment="VLLM_CPU_KVCACHE_SPACE=2"' in options
    assert "--property=EnvironmentFile=-/etc/vllm/vllm.env" in options
    assert "--property=EnvironmentFile=/etc/default/vllm" in options
    assert "--property=User=vllm" in options and "--property=CPUAffinity=1" in options
    assert not [o for o in options if o.startswith(("--property=Group", "--property=Working"))]


def test_values_are_quoted_for_systemd_run_and_a_dollar_stays_a_dollar():
    argv = systemd_run_argv(
        "specdecode-beside-x-ngram.service",
        ["/opt/venv/bin/python", "--chat-template", "/t/$HOME.jinja", "--x", "a%b"],
        description="candidate",
        environment=["HF_HOME=/srv/hf cache", 'GREETING=say "hi" \\o/'],
        environment_files=[],
        copied={"WorkingDirectory": "-/srv/vllm"},
        placement=UnitPlacement("GPU 1", env={"CUDA_VISIBLE_DEVICES": "1"}),
        extra_env={"VLLM_USE_V2_MODEL_RUNNER": "0"},
    )
    assert '--property=Environment="HF_HOME=/srv/hf cache"' in argv
    assert '--property=Environment="GREETING=say \\"hi\\" \\\\o/"' in argv
    assert "--property=WorkingDirectory=-/srv/vllm" in argv
    tail = argv[argv.index("--") + 1 :]
    assert tail[:3] == ["/usr/bin/env", "VLLM_USE_V2_MODEL_RUNNER=0", "CUDA_VISIBLE_DEVICES=1"]
    assert "/t/$$HOME.jinja" in tail  # systemd expands $NAME at start: $$ is a literal $
    assert "a%b" in tail  # no specifiers in a transient command


@pytest.mark.parametrize(
    ("field", "value"),
    [("environment", ["A=1\nExecStartPre=/bin/false"]), ("argv", ["/bin/vllm", "a\nb"])],
)
def test_a_control_character_is_refused(field, value):
    kwargs = {
        "description": "candidate",
        "environment": [],
        "environment_files": [],
        "copied": {},
        "placement": UnitPlacement("core 1"),
    }
    argv = ["/bin/vllm"]
    if field == "argv":
        argv = value
    else:
        kwargs[field] = value
    with pytest.raises(ConfigError, match="control character"):
        systemd_run_argv("specdecode-beside-x-y.service", argv, **kwargs)


def test_a_property_that_is_not_a_plain_value_is_refused():
    with pytest.raises(ConfigError, match="User='vllm; rm' is not a plain value"):
        systemd_run_argv(
            "specdecode-beside-x-y.service",
            ["/bin/vllm"],
            description="c",
            environment=[],
            environment_files=[],
            copied={"User": "vllm; rm"},
            placement=UnitPlacement("core 1"),
        )


# ----------------------------------------------------------------------------------- the port


def test_listening_ports_and_the_first_free_one():
    taken = listening_ports(SS)
    assert taken == {2222, 8100, 8101}
    assert first_free_port(taken, 8100) == 8102
    assert first_free_port(set(range(8101, 8201)), 8100) is None


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["vllm", "serve", "m", "--port", "8100"], ["vllm", "serve", "m", "--port", "8102"]),
        (["vllm", "serve", "m", "--port=8100"], ["vllm", "serve", "m", "--port=8102"]),
        (["vllm", "serve", "m"], ["vllm", "serve", "m", "--port", "8102"]),
    ],
)
def test_the_port_is_replaced_or_added(argv, expected):
    assert with_unit_port(argv, 2, 8102) == expected


def test_no_free_port_is_refused_before_anything_is_touched():
    host = BesideHostStub()
    host.ss = "\n".join(f"LISTEN 0 128 127.0.0.1:{p} 0.0.0.0:*" for p in range(8100, 8201))
    with pytest.raises(ConfigError, match="no free port on root@gpu:22 within 100 above 8100"):
        target(host).beside_launch(NGRAM)
    assert not [a for a in host.ran if a[0] == "systemd-run"]


# ------------------------------------------------------------------------------ room: GPUs


def test_the_originals_default_share_leaves_no_room_on_its_gpu():
    host = BesideHostStub(snapshot=snapshot_text())
    why = target(host).room_beside(NGRAM)
    assert why == (
        "no room beside unit vllm.service on root@gpu:22: it runs with --gpu-memory-utilization "
        "0.9 (vLLM's default) on GPU 0, so a second copy needs that share free: GPU 0 (NVIDIA "
        "H200): 21099 of 143771 MiB used, 122672 MiB free, 129394 MiB needed; and 0 of 1 GPUs "
        "have no compute process (1 needed)"
    )
    with pytest.raises(ConfigError, match=r"no room beside unit vllm\.service on root@gpu:22"):
        target(host).beside(NGRAM)
    assert not [a for a in host.ran if a[0] in ("systemd-run", "install", "mkdir")]


def test_a_small_share_fits_beside_the_original_on_its_gpu():
    host = BesideHostStub(snapshot=snapshot_text())
    host.unit_text = UNIT.replace(
        "--enforce-eager", "--enforce-eager --gpu-memory-utilization 0.25"
    )
    t = target(host)
    assert t.room_beside(NGRAM) is None
    launch = t.beside_launch(NGRAM)
    assert launch.placement.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert "free memory holds its --gpu-memory-utilization 0.25" in launch.placement.where


def test_a_gpu_without_compute_processes_is_taken_first():
    host = BesideHostStub(snapshot=snapshot_text(second_gpu=True))
    launch = target(host).beside_launch(NGRAM)
    assert launch.placement.where == "GPU 1 (no compute process on it)"
    tail = launch.run_argv[launch.run_argv.index("--") + 1 :]
    assert tail[:2] == ["/usr/bin/env", "CUDA_VISIBLE_DEVICES=1"]
    assert not [p for p in launch.run_argv if p.startswith("--property=CPUAffinity")]


def test_as_many_free_gpus_as_the_original_uses():
    held = gpu.parse_snapshot(snapshot_text(second_gpu=True))
    argv = ["vllm", "serve", "m", "--tensor-parallel-size", "2"]
    why = gpu_placement(held, argv, where="unit vllm.service on root@gpu:22")
    assert isinstance(why, str) and "1 of 2 GPUs have no compute process (2 needed)" in why
    idle = dataclasses.replace(held, apps=())
    placed = gpu_placement(idle, argv, where="unit vllm.service on root@gpu:22")
    assert isinstance(placed, UnitPlacement) and placed.env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_a_failing_nvidia_smi_refuses():
    failed = gpu.parse_snapshot("main 863\nsmi 9\napp NVIDIA-SMI has failed")
    why = gpu_placement(failed, [], where="unit vllm.service on root@gpu:22")
    assert isinstance(why, str) and why.startswith(
        "no room beside unit vllm.service on root@gpu:22: nvidia-smi could not tell"
    )


# ------------------------------------------------------------------------------ room: CPUs

WHERE = "unit vllm.service on root@cpu:22"


def test_auto_binding_leaves_the_last_core_to_a_second_copy():
    placed = cpu_placement([0, 1], [], {}, [], where=WHERE)
    assert isinstance(placed, UnitPlacement)
    assert placed.env == {"VLLM_CPU_OMP_THREADS_BIND": "1"}
    assert placed.properties == ("CPUAffinity=1",)


@pytest.mark.parametrize(
    ("affinity", "env", "figures"),
    [
        ([0, 1], {}, "CPUAffinity=0,1; 2 online: 0,1"),
        ([], {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}, "nobind (every core); 2 online"),
        ([], {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, "VLLM_CPU_OMP_THREADS_BIND=0-1; 2 online"),
        ([], {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}, "cores 0,1 of 0,1, leaving the last 0"),
    ],
)
def test_no_core_of_its_own_is_refused_with_the_figures(affinity, env, figures):
    why = cpu_placement([0, 1], affinity, env, [], where=WHERE)
    assert isinstance(why, str)
    assert why.startswith(f"no room beside {WHERE}: its threads use every core of the host (")
    assert figures in why


def test_an_explicit_binding_leaves_the_other_cores():
    placed = cpu_placement(
        parse_cpu_list("0-7"), [], {"VLLM_CPU_OMP_THREADS_BIND": "0-3|4-5"}, [], where=WHERE
    )
    assert isinstance(placed, UnitPlacement) and placed.properties == ("CPUAffinity=6 7",)


def test_cpu_lists():
    assert parse_cpu_list("0-3,5\n") == [0, 1, 2, 3, 5]
    assert parse_cpu_list("0 1") == [0, 1] and parse_cpu_list("") == []
    with pytest.raises(ValueError):
        parse_cpu_list("all")


def test_a_container_unit_is_refused():
    host = BesideHostStub()
    host.unit_text = """# /etc/systemd/system/vllm.service
[Service]
ExecStart=/usr/bin/podman run --rm --name vllm -p 8100:8000 localhost/my-vllm --model /m
"""
    t = SystemdTarget(
        host, "vllm.service", api_base="http://127.0.0.1:8100", model="smol",
        vllm_images=("localhost/my-vllm",),
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"runs vLLM in a container .* one at a time"):
        t.beside_launch(NGRAM)


# ----------------------------------------------------------------------- start, stop, restore


@pytest.fixture
def locked():
    """A target past its preflight: this run's lock, its watchdog armed."""
    host = BesideHostStub()
    t = target(host)
    t.preflight()
    yield host, t
    t.close()


def test_start_and_stop_touch_only_the_transient_unit(locked):
    host, t = locked
    service = t.beside(NGRAM)
    assert service.api_base == "http://127.0.0.1:8102"
    assert service.label == (
        f"candidate ngram-k3: transient unit {service.unit} beside vllm.service on root@gpu:22"
    )
    before = len(host.ran)
    service.start()
    assert service.is_active() and service.failure() is None
    service.stop()
    assert service.unit not in host.loaded
    ran = host.ran[before:]
    assert ("systemctl", "stop", service.unit) in ran
    touched = [a for a in ran if a[0] in ("systemctl", "systemd-run") and "vllm.service" in a]
    assert touched == []  # the original is only ever read (show), never stopped or started
    service.stop()  # gone already: nothing to stop, no error
    assert host.ran[-1] == ("systemctl", "show", service.unit, "--property=LoadState", "--value")


def test_a_transient_unit_that_vanished_after_its_start_is_a_failure(locked):
    host, t = locked
    service = t.beside(NGRAM)
    service.start()
    host.loaded.discard(service.unit)  # its process exited; --collect removed the unit
    assert service.failure() == (
        "the transient unit is gone: its process exited (--collect removed it)"
    )


def test_a_second_candidate_does_not_take_the_first_ones_core_or_port(locked):
    host, t = locked
    t.beside(NGRAM).start()  # core 1, port 8102 (it does not listen yet)
    why = t.room_beside(NGRAM)
    assert why is not None and "this run's other candidates hold 1" in why
    host.cpus = "0-3"
    second = t.beside(SpecConfig("suffix", {"method": "suffix"}))
    assert second.launch.port == 8103 and second.launch.placement.cores == (3,)


def test_the_watchdogs_restore_stops_this_runs_transient_units(locked):
    host, t = locked
    service = t.beside(NGRAM)
    script = host.files[RESTORE_SCRIPT]
    patterns = [
        line.split(" ", 2)[2].strip("'")
        for line in script.splitlines()
        if line.startswith("systemctl stop 'specdecode-beside-")
    ]
    assert len(patterns) == 1 and fnmatch.fnmatch(service.unit, patterns[0])
    other_run = service.unit.replace(t.run_id, "other-host-1-1700000000")
    assert not fnmatch.fnmatch(other_run, patterns[0])
    lines = script.splitlines()
    stop_at = lines.index(f"systemctl stop '{patterns[0]}'")
    assert stop_at < lines.index("systemctl start vllm.service")
    assert "systemctl stop vllm.service" not in lines[:stop_at]


def test_the_handover_starts_the_restore_that_stops_it(locked):
    host, t = locked
    t.beside(NGRAM).start()
    done = t.hand_over("interrupted by SIGINT")
    assert done is not None and "restore.sh" in done
    assert host.ran[-1] == (
        "systemctl",
        "start",
        "--no-block",
        "pytest-specdecode-watchdog.service",
    )


def test_close_stops_a_transient_unit_the_run_left(locked):
    host, t = locked
    service = t.beside(NGRAM)
    service.start()
    t.close()
    assert service.unit not in host.loaded and "vllm.service" in host.loaded
    assert not heartbeats()


def test_the_plan_says_which_unit_runs_beside_which_and_where():
    host = BesideHostStub()
    steps = target(host).plan_beside([NGRAM])
    assert steps[0].startswith("vllm.service on root@gpu:22 keeps serving as the baseline arm")
    assert "transient unit specdecode-beside-" in steps[1]
    assert "on port 8102, core 1 (the original: VLLM_CPU_OMP_THREADS_BIND=auto" in steps[1]
    assert "--speculative-config" in steps[1] and "restore.sh stops" in steps[2]
    assert not [a for a in host.ran if a[0] in ("systemd-run", "install", "mkdir")]
