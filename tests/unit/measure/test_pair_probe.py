"""Arms side by side: the two servers of a pair are the run's own, not other work on the host.

Seen on the H200: with the baseline and the candidate on one GPU, each server's window saw the
other's EngineCore as "another process on the server's GPUs", and every round waited for a quiet
host that could not come.
"""

from __future__ import annotations

from pytest_specdecode.measure.host_load import one_server, pair_probe, summarise
from pytest_specdecode.targets.facts.gpu import GpuProcess
from pytest_specdecode.targets.host_env import GpuReading, HostSample

UUID = "GPU-eda606d4-8706-fd4b-3aa6-56d219e8df3d"
GPU = GpuReading(0, UUID, 1980.0, 3201.0, 0, 38.0, 125.0)
APPS = (
    GpuProcess(6100, 65764, UUID, "VLLM::EngineCore"),
    GpuProcess(6257, 65764, UUID, "VLLM::EngineCore"),
)


def _sample(pid: int, server_s: float, total: int) -> HostSample:
    return HostSample(
        cpus=16, total_ticks=total, idle_ticks=total // 2, steal_ticks=0, server_s=server_s,
        server_pids=frozenset({pid}), gpus=(GPU,), apps=APPS,
    )  # fmt: skip


def test_each_server_alone_sees_the_other_as_another_process_on_its_gpu() -> None:
    a = _sample(6100, 1.0, 1000)
    assert [p.pid for p in a.others_on_server_gpus()] == [6257]


def test_the_pair_read_as_one_server_has_no_other_process_and_both_cpu_times() -> None:
    one = one_server([_sample(6100, 1.0, 1000), _sample(6257, 2.0, 1000)])
    assert one is not None
    assert one.others_on_server_gpus() == []
    assert one.server_s == 3.0 and one.server_pids == {6100, 6257}
    assert one_server([_sample(6100, 1.0, 1000), None]) is not None
    assert one_server([None, None]) is None


def test_a_window_watched_through_the_pair_probe_is_not_contaminated_by_its_partner() -> None:
    ticks = iter(range(1000, 100000, 1000))

    def probe(service: str) -> HostSample:
        pid = 6100 if service == "a" else 6257
        return _sample(pid, 0.0, next(ticks))

    alone = summarise([probe("a"), probe("a")])
    both = pair_probe(probe, ["a", "b"])  # type: ignore[list-item]
    paired = summarise([both("a"), both("a")])  # type: ignore[arg-type]
    assert alone.other_gpu_processes and not paired.other_gpu_processes
