"""`--spec-arms together` on a local target: where the two servers run (port, cores, GPU share),
the refusals, and the restore of both. The servers here are stand-in processes (a `vllm`
package that only sleeps, run by the real local backend); the real vLLM pair, its requests and
a Ctrl-C are in tests/real_vllm/test_arms_together.py."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.report.plan import arms_plan, service_plan
from pytest_specdecode.targets import lifecycle
from pytest_specdecode.targets.beside.placement import (
    api_base_on_port,
    core_list,
    gpu_placements,
    split_cores,
    with_port,
)
from pytest_specdecode.targets.facts.gpu import parse_gpus
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.interrupts import Interrupts
from pytest_specdecode.targets.lifecycle import experiment_services
from pytest_specdecode.targets.local import LocalProcessTarget

from ...support.standin_target import StandInTarget

DATA = Path(__file__).resolve().parents[2] / "data"
SPEC = SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})
H200 = (DATA / "nvidia-smi-h200" / "query-gpu.csv").read_text().splitlines()[2]  # noheader
H200_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version", "uuid")
COMMAND = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
           "--host", "127.0.0.1", "--port", "18011", "--seed", "0"]  # fmt: skip


class NvidiaSmi:
    """A host whose nvidia-smi prints `rows` (captured H200 rows), or that has none."""

    name = "localhost"

    def __init__(self, *rows: str) -> None:
        self.rows = rows

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True) -> CommandResult:
        if not self.rows:
            return CommandResult(self.name, tuple(argv), 127, "", "nvidia-smi: not found")
        # the captured rows' column order, as the query asks for it
        gpus = parse_gpus("\n".join(self.rows), H200_FIELDS)
        text = "\n".join(
            f"{g.index}, {g.uuid}, {g.name}, {g.memory_total_mib} MiB, "
            f"{g.memory_used_mib} MiB, {g.driver}"
            for g in gpus
        )
        return CommandResult(self.name, tuple(argv), 0, text, "")


def local_target(tmp_path: Path, *, cores=(0, 1), gpus: tuple[str, ...] = (), command=COMMAND):
    target = LocalProcessTarget(
        command=command,
        api_base="http://127.0.0.1:18011",
        model="m",
        workdir=tmp_path,
        env={"VLLM_CPU_OMP_THREADS_BIND": "1"},
        log_dir=tmp_path / "logs",
        cores=cores,
    )
    target.host = NvidiaSmi(*gpus)  # type: ignore[assignment]
    return target


def used(row: str, mib: int) -> str:
    """The captured H200 row with `mib` in use."""
    fields = [f.strip() for f in row.split(",")]
    fields[3] = f"{mib} MiB"
    return ", ".join(fields)


# -- where each runs ---------------------------------------------------------------------------


def test_the_second_server_gets_the_next_free_port_and_its_api_base_follows(tmp_path):
    target = local_target(tmp_path)
    second = target.beside(SPEC)
    assert second.api_base == "http://127.0.0.1:18012"
    port_at = second.argv.index("--port")
    assert second.argv[port_at + 1] == "18012" and second.argv.count("--port") == 1
    assert "--speculative-config" in second.argv
    assert target.original().argv.count("--port") == 1 and "18011" in target.original().argv


def test_port_rewriting_replaces_every_form_of_the_flag():
    assert with_port(["vllm", "--port=9", "--x", "--port", "8"], 7) == [
        "vllm",
        "--x",
        "--port",
        "7",
    ]
    assert with_port(["vllm", "serve"], 8001) == ["vllm", "serve", "--port", "8001"]
    assert api_base_on_port("http://[::1]:8011/v1", 8012) == "http://[::1]:8012/v1"


def test_on_a_cpu_each_server_gets_half_the_cores_bound_by_taskset_and_vllm(tmp_path):
    target = local_target(tmp_path, cores=(0, 1, 2, 3, 5))
    second = target.beside(SPEC)
    original = target.original()
    assert second.argv[:3][1:] == ["-c", "2-3,5"] and second.argv[0].endswith("taskset")
    assert original.argv[:3][1:] == ["-c", "0-1"]
    # the server's own binding follows, over the config's ("1")
    assert second._env["VLLM_CPU_OMP_THREADS_BIND"] == "2-3,5"
    assert original._env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    assert "cores 0-1" in original.placement and "cores 2-3,5" in second.placement


def test_swapped_each_takes_the_others_cores_and_the_ports_stay(tmp_path):
    """Every second pair: the places alternate, so that a faster core weighs on both arms."""
    target = local_target(tmp_path, cores=(0, 1, 2, 3))
    assert target.swaps_places
    second = target.beside(SPEC, swap=True)
    original = target.original()
    assert original.argv[1:3] == ["-c", "2-3"] and second.argv[1:3] == ["-c", "0-1"]
    assert "cores 2-3" in original.placement and "cores 0-1" in second.placement
    assert original.api_base == target.api_base != second.api_base


def test_core_split_and_lists():
    a, b = split_cores([3, 1, 0, 2])
    assert (a.cores, b.cores) == ((0, 1), (2, 3))
    assert core_list([7, 0, 1, 2, 4]) == "0-2,4,7"
    with pytest.raises(ValueError, match="need 2 cores"):
        split_cores([4])


def test_one_usable_core_is_refused_naming_the_host_and_the_figure(tmp_path):
    target = local_target(tmp_path, cores=(1,))
    why = target.room_beside(SPEC)
    assert why is not None and "localhost" in why and "1 core (1)" in why
    with pytest.raises(ConfigError, match="no room for a second server"):
        target.beside(SPEC)


def test_on_one_gpu_each_server_gets_its_memory_share(tmp_path):
    target = local_target(tmp_path, gpus=(H200,))
    assert target.room_beside(SPEC) is None
    second = target.beside(SPEC)
    original = target.original()
    for service in (second, original):
        at = service.argv.index("--gpu-memory-utilization")
        assert service.argv[at + 1] == "0.421"  # 0.9 less 4 GiB each, over 2
        assert service.argv[0] == sys.executable  # no taskset on a GPU
    assert "42% of the GPU memory" in second.placement


def test_a_gpu_without_room_for_two_shares_is_refused_with_its_figures(tmp_path):
    target = local_target(tmp_path, gpus=(used(H200, 21099),))  # another process's 21 GiB
    why = target.room_beside(SPEC)
    assert why is not None
    assert "GPU 0 (NVIDIA H200) has 122672 MiB free of 143771 MiB" in why
    assert "need 129247 MiB" in why


class NvidiaSmiWithApps(NvidiaSmi):
    """The H200 rows, and a compute-apps list of (pid, MiB)."""

    def __init__(self, row: str, apps: list[tuple[int, int]]) -> None:
        super().__init__(row)
        self.apps = apps
        self.uuid = parse_gpus(row, H200_FIELDS)[0].uuid

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True) -> CommandResult:
        if any(a.startswith("--query-compute-apps") for a in argv):
            text = "\n".join(f"{pid}, {mib} MiB, {self.uuid}, python3" for pid, mib in self.apps)
            return CommandResult(self.name, tuple(argv), 0, text, "")
        return super().run(argv, timeout=timeout, stdin=stdin, privileged=privileged)


def test_a_repeated_pair_counts_the_memory_of_the_targets_own_servers_as_room(tmp_path):
    """On the H200, an A/A side by side with two pairs: at the second, the original (started by
    this run at 45%) held 65 GiB, and the pair was refused. Its own servers' memory is room: the
    original restarts at its share. Another process's memory is not."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    target = local_target(tmp_path, command=sleeper)
    row = used(H200, 65703 + 1000)
    original = target.original()
    original.start()
    try:
        assert original.pid is not None
        apps = [(original.pid, 65703), (os.getpid(), 1000)]  # ours, and someone else's
        target.host = NvidiaSmiWithApps(row, apps)  # type: ignore[assignment]
        assert target.room_beside(SPEC) is None
    finally:
        original.stop()
    # Stopped, the memory is another process's to the target: refused, with the figures.
    why = target.room_beside(SPEC)
    assert why is not None and "has 77068 MiB free of 143771 MiB" in why, why


def test_with_several_gpus_each_server_gets_its_own_the_freest_first():
    rows = [H200, used(H200.replace("0,", "1,", 1), 9000), H200.replace("0,", "2,", 1)]
    gpus = parse_gpus("\n".join(rows), H200_FIELDS)
    first, second = gpu_placements(gpus)
    assert (first.gpus, second.gpus) == ((0,), (2,))
    assert first.env() == {"CUDA_VISIBLE_DEVICES": "0"} and first.memory_share is None
    assert first.argv(["vllm", "serve"]) == ["vllm", "serve"]  # its own GPU, all its memory


def test_tensor_parallel_needs_its_gpus_for_each_server():
    gpus = parse_gpus("\n".join([H200, H200.replace("0,", "1,", 1)]), H200_FIELDS)
    first, second = gpu_placements(gpus, tensor_parallel=1)
    assert (first.gpus, second.gpus) == ((0,), (1,))
    shared = gpu_placements(gpus, tensor_parallel=2)  # 2 GPUs for 2 x 2: both share them
    assert not isinstance(shared, str) and shared[0].memory_share == 0.421
    assert "needs 3" in str(gpu_placements(gpus, tensor_parallel=3))


# -- the plan and the refusal --------------------------------------------------------------------


def settings_for(tmp_path: Path, arms: str):
    config = tmp_path / "x.toml"
    config.write_text(
        '[target]\nbackend = "local"\napi_base = "http://127.0.0.1:18011"\nmodel = "m"\n'
        'command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "18011"]\n'
        '[presets]\nngram = { method = "ngram", num_speculative_tokens = 3 }\n'
        '[prompt_types.coding]\nprompt = "Write a function"\n'
    )
    return load_settings(config, spec_configs=["ngram"], run_overrides={"arms": arms})


def test_the_setting_is_checked(tmp_path):
    assert settings_for(tmp_path, "together").run.arms == "together"
    with pytest.raises(ConfigError, match="arms must be one of auto, one-at-a-time, together"):
        settings_for(tmp_path, "both")


def test_the_plan_says_where_each_runs_before_anything_starts(tmp_path):
    target = local_target(tmp_path)
    (line,) = arms_plan(settings_for(tmp_path, "together"), target)
    assert "the original on port 18011, cores 0" in line
    assert "the candidate on port 18012, cores 1" in line
    assert "VLLM_CPU_OMP_THREADS_BIND=1" in line and "-c 1" in line
    assert not target.original().is_active() and target.original().argv == COMMAND  # untouched
    assert arms_plan(settings_for(tmp_path, "one-at-a-time"), target) == []
    # the dry run's steps: side by side, never the one-at-a-time swaps on the original's port
    steps = service_plan(settings_for(tmp_path, "together"), target)
    assert steps[0] == line and "second server is stopped" in steps[-1]
    assert not any("stop the running server" in step for step in steps)
    assert service_plan(settings_for(tmp_path, "one-at-a-time"), target) == target.plan(
        settings_for(tmp_path, "one-at-a-time").candidates
    )


def test_the_plan_refuses_a_backend_without_room_naming_the_host(tmp_path):
    with pytest.raises(ConfigError, match=r"refused on localhost: no room .* 1 core"):
        arms_plan(settings_for(tmp_path, "together"), local_target(tmp_path, cores=(0,)))
    standin = StandInTarget()  # a backend that cannot run two: the protocol's refusal
    with pytest.raises(ConfigError, match="StandInTarget backend on stand-in-host cannot"):
        arms_plan(settings_for(tmp_path, "together"), standin)
    assert standin.log == []


def test_together_refuses_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(lifecycle, "wait_until_ready", lambda service, **kw: 0.0)
    standin = StandInTarget()
    with (
        pytest.raises(ConfigError, match="refused on stand-in-host"),
        experiment_services(
            standin, ready_timeout_s=1, restore_timeout_s=1, progress=lambda line: None
        ) as board,
        board.together(SPEC, restart_original=False),
    ):
        pass
    assert "start candidate ngram" not in standin.log and "stop original" not in standin.log


# -- the lifecycle and the restore of both, with stand-in server processes -----------------------


@pytest.fixture
def sleeping_vllm(tmp_path, monkeypatch):
    """A `vllm` package whose API server only sleeps (cwd is on `python -m`'s path); the
    readiness wait is the real vLLM's part, not tested here."""
    server = tmp_path / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for folder in (server, server.parent, server.parent.parent):
        (folder / "__init__.py").write_text("")
    (server / "api_server.py").write_text("import time\ntime.sleep(300)\n")
    monkeypatch.setattr(lifecycle, "wait_until_ready", lambda service, **kw: 0.0)
    monkeypatch.setattr(lifecycle, "INTERRUPTS", Interrupts())


def cores_of(pid: int | None) -> set[int]:
    """The server's cores, once `taskset` has set them and run the server in its place."""
    assert pid is not None
    for _ in range(500):
        if b"taskset" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]:
            break
        time.sleep(0.01)
    return os.sched_getaffinity(pid)


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie awaiting its parent's wait is gone for our purposes
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.split(")")[-1].split()[0] != "Z"


def test_together_serves_both_then_stops_the_second_and_the_restore_the_original(
    tmp_path, sleeping_vllm
):
    target = local_target(tmp_path)
    lines: list[str] = []
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=30, progress=lines.append
    ) as board:
        with board.together(SPEC, restart_original=False) as (original, second):
            pids = original.pid, second.pid
            assert all(alive(p) for p in pids)
            assert original.api_base != second.api_base
            assert cores_of(second.pid) == {1}
            assert cores_of(original.pid) == {0}
        assert not alive(pids[1]) and alive(pids[0])  # the original serves on
        assert board.beside is None
    assert not any(alive(p) for p in pids)
    assert board.restore_report is not None and not board.restore_report.failed
    assert any("starting local vLLM process 'beside-ngram'" in line for line in lines)


def test_a_running_original_is_restarted_on_its_half(tmp_path, sleeping_vllm):
    target = local_target(tmp_path)
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=30, progress=lambda line: None
    ) as board:
        whole = board.activate(None)  # one at a time first: all the cores
        first_pid = whole.pid
        assert os.sched_getaffinity(first_pid) == os.sched_getaffinity(0)
        with board.together(SPEC, restart_original=False) as (original, _):
            assert original.pid != first_pid and not alive(first_pid)
            assert cores_of(original.pid) == {0}


def test_an_exception_stops_both_and_the_restore_report_says_what_it_stopped(
    tmp_path, sleeping_vllm
):
    target = local_target(tmp_path)
    pids: list[int | None] = []
    with (
        pytest.raises(RuntimeError, match="mid-run"),
        experiment_services(
            target, ready_timeout_s=5, restore_timeout_s=30, progress=lambda line: None
        ) as board,
        board.together(SPEC, restart_original=True) as (original, second),
    ):
        pids += [original.pid, second.pid]
        raise RuntimeError("mid-run")
    assert len(pids) == 2 and not any(alive(p) for p in pids)
    report = board.restore_report
    assert report is not None and not report.failed and report.is_active is False
    assert f"stopped the second server local vLLM process 'beside-ngram' (pid {pids[1]})" in (
        report.describe()
    )
    assert "http://127.0.0.1:18012" in report.describe()


def test_the_first_signal_hands_both_over_and_the_restore_says_so(tmp_path, sleeping_vllm):
    target = local_target(tmp_path)
    pids: list[int | None] = []
    with (
        pytest.raises(KeyboardInterrupt),
        experiment_services(
            target, ready_timeout_s=5, restore_timeout_s=30, progress=lambda line: None
        ) as board,
        board.together(SPEC, restart_original=False) as (original, second),
    ):
        pids += [original.pid, second.pid]
        board.interrupts.signalled(signal.SIGINT)  # as the plugin's handler does
        raise KeyboardInterrupt
    assert not any(alive(p) for p in pids)
    assert board.ending.handed_over is not None and "beside-ngram" in board.ending.handed_over
    # named as it was while it ran, pid and all, though the host's restore ended it first
    assert f"stopped the second server local vLLM process 'beside-ngram' (pid {pids[1]})" in (
        board.restore_report.describe()
    )


def test_three_servers_on_an_h100_leave_each_its_overhead_beyond_its_share():
    """The H100 lease of 2026-12-07: three 8B servers at 0.3 each took 25.5 and 27.6 GiB for
    their 23.75, and the third found 23.2 GiB free, less than its share, and refused to start.
    Each share now leaves SERVER_OVERHEAD_MIB beyond it, and the three fit with it."""
    from pytest_specdecode.targets.beside.placement import SERVER_OVERHEAD_MIB

    h100 = H200.replace("NVIDIA H200", "NVIDIA H100 80GB HBM3").replace("143771", "81559")
    gpus = parse_gpus(used(h100, 0), H200_FIELDS)
    layout = gpu_placements(gpus, share=0.9, servers=3)
    assert not isinstance(layout, str)
    each = layout[0].memory_share
    assert each is not None and each < 0.3
    assert 3 * (each * 81559 + SERVER_OVERHEAD_MIB) <= 0.9 * 81559
    # the servers of that lease: 3.8 GiB at most beyond the share; the third's share is free
    taken = 2 * (each * 81559 + 3.82 * 1024)
    assert 81559 - taken >= each * 81559
