"""A server over several GPUs (issue 51): the GPUs a local server sees (its CUDA_VISIBLE_DEVICES),
the tensor parallel size its command asks for, the refusal of more than it sees before anything
is touched, the plan over several GPUs, and each GPU's memory after the restore. The GPUs are the
real H200 capture (tests/data/nvidia-smi-h200), renumbered as the GPUs of one host."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ConfigError, ServiceError
from pytest_specdecode.targets import lifecycle
from pytest_specdecode.targets.facts.devices import memory_after_restore, server_gpus
from pytest_specdecode.targets.facts.gpu import GPUS_QUERY, parse_gpus
from pytest_specdecode.targets.hosts.base import CommandResult
from pytest_specdecode.targets.interrupts import Interrupts
from pytest_specdecode.targets.lifecycle import experiment_services
from pytest_specdecode.targets.local import LocalProcessTarget

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi-h200"
HEADER, ROW = (DATA / "query-gpu.csv").read_text().splitlines()[:2]
UUID = "GPU-695d5997-a103-0d89-580b-71c5e61fbbe2"  # as captured
SPEC = SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})


def h200s(count: int, used_mib: int = 0) -> str:
    """nvidia-smi's `--query-gpu` answer (the plugin's fields, noheader) on a host of `count`
    H200s: the captured row, each its own index and UUID (its last digits)."""
    gpus = parse_gpus("\n".join([HEADER, ROW]))
    (gpu,) = gpus
    assert gpu.uuid == UUID and gpu.memory_total_mib == 143771  # read from the capture
    return "\n".join(
        f"{i}, {UUID[:-2]}{i:02d}, {gpu.name}, {gpu.memory_total_mib} MiB, {used_mib} MiB, "
        f"{gpu.driver}"
        for i in range(count)
    )


class Host:
    """A host of `count` H200s whose compute-apps list is `apps()`: (pid, GPU index, MiB)."""

    name = "localhost"

    def __init__(self, count: int, apps=lambda: []) -> None:
        self.count, self.apps, self.asked = count, apps, 0

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True) -> CommandResult:
        if any(a.startswith("--query-compute-apps") for a in argv):
            self.asked += 1
            rows = [f"{p}, {m} MiB, {UUID[:-2]}{i:02d}, python3" for p, i, m in self.apps()]
            return CommandResult(self.name, tuple(argv), 0, "\n".join(rows), "")
        assert list(argv[1:]) == GPUS_QUERY
        return CommandResult(self.name, tuple(argv), 0, h200s(self.count), "")


def command(*extra: str) -> list[str]:
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", "m",
            "--port", "18011", *extra]  # fmt: skip


def target(tmp_path: Path, host: Host, argv: list[str], env: dict[str, str] | None = None):
    local = LocalProcessTarget(
        command=argv,
        api_base="http://127.0.0.1:18011",
        model="m",
        workdir=tmp_path,
        env=env or {},
        log_dir=tmp_path / "logs",
    )
    local.host = host  # type: ignore[assignment]
    return local


# -- what a server sees, and what it asks for ---------------------------------------------------


def test_a_server_sees_the_gpus_its_cuda_visible_devices_names_in_that_order() -> None:
    listed = parse_gpus(h200s(4))
    seen = server_gpus("gpu-1", listed, ["vllm", "serve", "m", "-tp", "2"],
                       {"CUDA_VISIBLE_DEVICES": "3,1"})  # fmt: skip
    assert [g.index for g in seen.seen] == [3, 1] and seen.unknown == ()
    assert seen.tensor_parallel == 2 and seen.per_server == 2 and seen.refusal() is None
    assert seen.describe() == "GPUs 3,1 (2 x NVIDIA H200, 143771 MiB each), tensor parallel 2"
    every = server_gpus("gpu-1", listed, ["vllm", "serve", "m"], {})
    assert len(every.seen) == 4 and every.describe() == "GPU 0 (1 x NVIDIA H200, 143771 MiB)"
    by_uuid = server_gpus("gpu-1", listed, ["vllm"], {"CUDA_VISIBLE_DEVICES": f"{UUID[:-2]}02"})
    assert [g.index for g in by_uuid.seen] == [2]
    both = server_gpus("gpu-1", listed, ["vllm", "--tensor-parallel-size=2", "-pp", "2"], {})
    assert both.per_server == 4 and "pipeline parallel 2" in both.describe()


def test_a_tensor_parallel_size_larger_than_the_gpus_seen_is_refused_with_the_figures() -> None:
    listed = parse_gpus(h200s(4))
    why = server_gpus("gpu-1", listed, ["vllm", "serve", "m", "--tensor-parallel-size", "4"],
                      {"CUDA_VISIBLE_DEVICES": "0,1"}).refusal()  # fmt: skip
    assert why is not None
    assert "asks for --tensor-parallel-size 4, 4 GPUs, and sees 2 GPUs" in why
    assert "(CUDA_VISIBLE_DEVICES=0,1 of the 4 listed) on gpu-1" in why
    missing = server_gpus("gpu-1", listed, ["vllm"], {"CUDA_VISIBLE_DEVICES": "0,7"}).refusal()
    assert missing is not None and "names '7', which nvidia-smi on gpu-1 does not list" in missing
    # a CPU host: nothing to count, nothing refused
    assert server_gpus("cpu-1", [], ["vllm", "-tp", "2"], {}).refusal() is None


def test_the_local_target_refuses_it_before_anything_is_touched(tmp_path) -> None:
    host = Host(2)
    local = target(tmp_path, host, command("-tp", "4"))
    with pytest.raises(ConfigError) as refused:
        local.preflight()
    text = str(refused.value)
    assert text.startswith("refused on localhost, nothing was touched: ")
    assert "--tensor-parallel-size 4, 4 GPUs, and sees 2 GPUs (no CUDA_VISIBLE_DEVICES" in text
    with pytest.raises(ConfigError, match="asks for --tensor-parallel-size 4"):
        local.plan([SPEC])
    assert not local.original().is_active()  # nothing started
    hidden = target(tmp_path, host, command("-tp", "2"), {"CUDA_VISIBLE_DEVICES": "1"})
    with pytest.raises(ConfigError, match=r"sees 1 GPU \(CUDA_VISIBLE_DEVICES=1 of the 2"):
        hidden.preflight()


def test_a_tensor_parallel_plan_names_every_gpu_of_the_group(tmp_path) -> None:
    local = target(tmp_path, Host(4), command("-tp", "2"), {"CUDA_VISIBLE_DEVICES": "2,3"})
    first, *rest = local.plan([SPEC])
    assert first.startswith(
        "start the original on GPUs 2,3 (2 x NVIDIA H200, 143771 MiB each), tensor parallel 2: "
    )
    assert any("start candidate ngram" in step for step in rest)
    # side by side, each server gets a tensor parallel group of its own (4 GPUs seen, 2 each)
    host = Host(4)
    pair = target(tmp_path, host, command("-tp", "2"))
    mine, theirs = pair.beside_servers(SPEC)
    assert "CUDA_VISIBLE_DEVICES=0,1" in mine.command and "CUDA_VISIBLE_DEVICES=2,3" in (
        theirs.command
    )
    # 3 GPUs: no two groups of 2, so both share the first two, each at its part of the memory
    three = target(tmp_path, Host(3), command("-tp", "2"))
    assert three.room_beside(SPEC) is None
    for server in three.beside_servers(SPEC):
        assert "CUDA_VISIBLE_DEVICES" not in server.command and server.memory_share == 0.421
    assert "sees 2 GPUs" in str(target(tmp_path, Host(2), command("-tp", "3")).gpu_refusal())


# -- each GPU's memory after the restore -----------------------------------------------------------


def test_the_memory_after_the_restore_waits_for_the_release_and_names_each_gpu() -> None:
    listings = [[(863, 0, 21090), (864, 1, 21090)], [(864, 1, 21090)], [(999, 1, 512)]]
    host = Host(2, apps=lambda: listings[min(host.asked, len(listings)) - 1])
    gpus = parse_gpus(h200s(2))
    now = [0.0]
    notes = memory_after_restore(
        host, gpus, lambda pid: pid in (863, 864), clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )  # fmt: skip
    assert host.asked == 3 and now[0] == 1.0  # two polls held, the third released
    assert notes[0] == "GPU memory after the restore on localhost: GPU 0 0 MiB, GPU 1 0 MiB used"
    assert "pid 999 (python3) 512 MiB on GPU 1" in notes[1] and "not this run's" in notes[1]


def test_memory_still_held_after_the_bound_fails_naming_the_host_gpus_and_processes() -> None:
    host = Host(2, apps=lambda: [(863, 1, 21090)])
    now = [0.0]
    with pytest.raises(ServiceError) as held:
        memory_after_restore(
            host, parse_gpus(h200s(2)), lambda pid: True, timeout_s=5, clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )  # fmt: skip
    text = str(held.value)
    assert text.startswith("on localhost, 5s after the restore stopped every server")
    assert "GPUs 0,1: pid 863 (python3) 21090 MiB on GPU 1" in text


@pytest.fixture
def sleeping_vllm(tmp_path, monkeypatch):
    """A `vllm` package whose API server only sleeps; the readiness wait is not tested here."""
    server = tmp_path / "vllm" / "entrypoints" / "openai"
    server.mkdir(parents=True)
    for folder in (server, server.parent, server.parent.parent):
        (folder / "__init__.py").write_text("")
    (server / "api_server.py").write_text("import time\ntime.sleep(300)\n")
    monkeypatch.setattr(lifecycle, "wait_until_ready", lambda service, **kw: 0.0)
    monkeypatch.setattr(lifecycle, "INTERRUPTS", Interrupts())


def test_the_restore_of_a_tensor_parallel_server_reports_each_gpus_memory(
    tmp_path, sleeping_vllm
) -> None:
    """The real local backend starts a (sleeping) server over GPUs 0 and 1; while it runs, the
    host lists it on both, as a TP 2 server's ranks would be; the restore stops it and says each
    GPU's memory once none of it is the server's."""
    servers: list[int] = []

    def apps() -> list[tuple[int, int, int]]:
        return [(p, i, 21090) for p in servers if _alive(p) for i in (0, 1)]

    local = target(tmp_path, Host(2, apps), command("-tp", "2"))
    with experiment_services(
        local, ready_timeout_s=5, restore_timeout_s=30, progress=lambda line: None
    ) as board:
        original = board.activate(None)
        assert original.pid is not None and os.getpgid(original.pid) == original.pid
        servers.append(original.pid)
        assert len(apps()) == 2
    report = board.restore_report
    assert report is not None and not report.failed and report.is_active is False
    assert "GPU memory after the restore on localhost: GPU 0 0 MiB, GPU 1 0 MiB used" in (
        report.notes
    )
    assert apps() == []


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.split(")")[-1].split()[0] != "Z"
