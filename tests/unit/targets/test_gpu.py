"""GPU memory after a stop: parsing and the decision, on real nvidia-smi outputs of an H200 host.

The outputs are in tests/data/nvidia-smi-h200 (byte-identical copies; see its README). That
host has one GPU and its compute-apps captures carry no gpu_uuid column, so the rows that the
decision needs (pid, memory, GPU) are built from the captured values: the PIDs 863 and 1047,
21090 MiB, and the GPU's UUID from query-gpu.csv. A second GPU exists only where a test says so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_specdecode.errors import ServiceError
from pytest_specdecode.measure import environment
from pytest_specdecode.targets.facts import gpu
from pytest_specdecode.targets.hosts.base import CommandResult

DATA = Path(__file__).parents[2] / "data" / "nvidia-smi-h200"
LABEL = "unit vllm.service on root@gpu:22"


def sections(name: str) -> list[list[str]]:
    """The captures of a file, split at its `# …` comment lines."""
    out: list[list[str]] = []
    for line in (DATA / name).read_text().splitlines():
        if line.startswith("#"):
            out.append([])
        else:
            out[-1].append(line)
    return out


IDLE, BUSY_863, BUSY_1047 = sections("compute-apps.txt")
QUERY_GPU = (DATA / "query-gpu.csv").read_text().splitlines()
H200 = gpu.parse_gpus("\n".join(QUERY_GPU[:2]))[0]
UUID = H200.uuid
OTHER_GPU = "GPU-00000000-0000-0000-0000-000000000001"  # a second GPU: not in the captures


def row(pid: int, uuid: str | None = UUID, mib: str = "21090 MiB") -> str:
    """A noheader row of APP_FIELDS (pid, used_memory, gpu_uuid, process_name)."""
    return f"{pid}, {mib}, {uuid}, python3"


def snapshot(pids: set[int], *rows: str) -> gpu.UnitGpuSnapshot:
    apps = tuple(gpu.parse_compute_apps("\n".join(rows)))
    return gpu.UnitGpuSnapshot(min(pids), frozenset(pids), apps, (H200,))


def poll(*rows: str, alive: set[int] = frozenset()) -> gpu.GpuPoll:
    return gpu.GpuPoll(tuple(gpu.parse_compute_apps("\n".join(rows))), frozenset(alive))


# ------------------------------------------------------------------------------------ parsing


def test_idle_compute_apps_is_empty_output_exit_0():
    assert IDLE == ["exit=0"]  # the capture: nothing printed, then the exit status
    assert gpu.parse_compute_apps("") == []


def test_busy_compute_apps_with_its_header_and_units():
    # `--format=csv` with `pid,process_name,used_memory`: header names differ from the query's.
    apps = gpu.parse_compute_apps("\n".join(BUSY_863[:2]))
    assert apps == [gpu.GpuProcess(pid=863, used_mib=21090, gpu_uuid=None, name="python3")]
    assert gpu.parse_compute_apps("\n".join(BUSY_1047[:2]))[0].pid == 1047
    assert gpu.mib(BUSY_863[2]) == 21099  # the --query-gpu=memory.used that followed


def test_query_gpu_with_and_without_header_agree():
    header, _, noheader = QUERY_GPU  # csv (header + row), then the same with noheader
    assert header.startswith("index, name, memory.total [MiB]")
    fields = ("index", "name", "memory.total", "memory.used", "driver_version", "uuid")
    (plain,) = gpu.parse_gpus(noheader, fields)
    assert plain == H200
    uuid = "GPU-695d5997-a103-0d89-580b-71c5e61fbbe2"
    assert (H200.index, H200.uuid, H200.name) == (0, uuid, "NVIDIA H200")
    assert (H200.memory_total_mib, H200.memory_used_mib, H200.driver) == (143771, 0, "580.159.04")
    assert H200.describe() == "0: NVIDIA H200, 143771 MiB, driver 580.159.04"


@pytest.mark.parametrize(
    ("text", "value"),
    [("21090 MiB", 21090), ("0 MiB", 0), ("[N/A]", None), ("[Not Supported]", None), ("", None)],
)
def test_memory_amounts(text, value):
    assert gpu.mib(text) == value


def test_not_available_values_and_commas_in_process_names():
    (app,) = gpu.parse_compute_apps(f"4242, [N/A], {UUID}, python3 -m vllm, serve")
    assert app.used_mib is None and app.name == "python3 -m vllm, serve"
    assert (
        app.describe([H200])
        == f"pid 4242 (python3 -m vllm, serve) memory unknown on GPU 0 ({UUID})"
    )


def test_unreadable_output_is_an_error_not_silence():
    with pytest.raises(gpu.GpuOutputError, match="expected 4 columns"):
        gpu.parse_compute_apps("No devices were found")
    with pytest.raises(gpu.GpuOutputError, match="not an amount of memory"):
        gpu.parse_compute_apps(f"863, lots, {UUID}, python3")


def test_the_gpu_list_of_a_run_reads_the_real_query_output():
    class Host:
        def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
            return CommandResult("gpu", tuple(argv), 0, "\n".join(QUERY_GPU[:2]) + "\n", "")

    assert environment.gpu_list(Host()) == ["0: NVIDIA H200, 143771 MiB, driver 580.159.04"]


def test_snapshot_and_poll_script_output():
    text = "\n".join(
        ["main 863", "pid 863", "pid 901", "smi 0", f"app {row(863)}", f"gpu {QUERY_GPU[2]}"]
    )
    snap = gpu.parse_snapshot(text)
    assert snap.main_pid == 863 and snap.pids == {863, 901}
    assert snap.apps == (gpu.GpuProcess(863, 21090, UUID, "python3"),)
    assert snap.unit_gpus == {UUID} and snap.note is None
    assert gpu.parse_snapshot("main 0\nsmi absent").apps is None
    failed = gpu.parse_snapshot("main 5\nsmi 9\napp NVIDIA-SMI has failed because it couldn't")
    assert failed.apps is None and "nvidia-smi exited 9 (NVIDIA-SMI has failed" in failed.note
    polled = gpu.parse_poll(f"alive 901\nsmi 0\napp {row(901)}")
    assert polled.alive == {901} and polled.apps[0].pid == 901
    assert gpu.parse_poll("smi 0\napp ").apps == ()  # idle: the empty output, prefixed


# ------------------------------------------------------------------------------------ decision


def test_idle_after_the_stop_is_released():
    before = snapshot({863}, row(863))
    release = gpu.judge_release(before, poll())
    assert release.released and release.notes(LABEL, [H200]) == []


def test_the_units_own_pid_that_then_disappears_is_waited_for():
    # release-timing.txt: compute-apps was empty 0.154-0.186 s after the signal. Poll every
    # 0.05 s on a clock that replays that: the PID is listed until 0.186 s, then gone.
    timing = (DATA / "release-timing.txt").read_text()
    empty_after = max(float(s) for s in re.findall(r"compute-apps empty after ([\d.]+) s", timing))
    assert empty_after == 0.186
    now = [0.0]
    before = snapshot({863}, row(863))

    def look() -> gpu.GpuPoll:
        return poll(row(863), alive={863}) if now[0] < empty_after else poll()

    def sleep(seconds: float) -> None:
        now[0] += seconds

    release = gpu.wait_until_released(
        look, before, label=LABEL, interval_s=0.05, clock=lambda: now[0], sleep=sleep
    )
    assert release.released and 0.186 <= now[0] < 0.25


def test_the_units_own_pid_that_stays_fails_after_the_bound_with_progress():
    now, said = [0.0], []
    before = snapshot({863, 901}, row(863), row(901))

    def sleep(seconds: float) -> None:
        now[0] += seconds

    with pytest.raises(ServiceError) as err:
        gpu.wait_until_released(
            lambda: poll(row(901), alive={901}),
            before,
            label=LABEL,
            timeout_s=60,
            progress=said.append,
            clock=lambda: now[0],
            sleep=sleep,
        )
    message = str(err.value)
    assert message.startswith(f"{LABEL} stopped, but 60s later its own processes still hold")
    assert f"pid 901 (python3, still running) 21090 MiB on GPU 0 ({UUID})" in message
    assert len(said) == 5 and "waiting for unit vllm.service on root@gpu:22" in said[0]


def test_a_foreign_process_on_the_same_gpu_is_reported_not_fatal():
    # The unit was pid 863; pid 1047 (the second capture) is someone else's, on the same GPU.
    before = snapshot({863}, row(863), row(1047))
    release = gpu.judge_release(before, poll(row(1047)))
    assert release.released and release.shared and not release.elsewhere
    (note,) = release.notes(LABEL, [H200])
    assert note.startswith(f"after {LABEL} stopped, other processes still hold memory on the GPUs")
    assert f"pid 1047 (python3) 21090 MiB on GPU 0 ({UUID})" in note


def test_a_foreign_process_on_another_gpu_is_reported_as_such():
    before = snapshot({863}, row(863), row(1047, OTHER_GPU))
    release = gpu.judge_release(before, poll(row(1047, OTHER_GPU)))
    assert release.released and release.elsewhere and not release.shared
    (note,) = release.notes(LABEL, [H200])
    expected = "other GPUs of the host are in use by other processes: pid 1047 (python3) 21090 MiB"
    assert note == f"{expected} on {OTHER_GPU}"


def test_busy_with_another_process_only_when_the_unit_held_none():
    # The unit's PIDs never showed in compute-apps: which GPUs it used is unknown.
    before = snapshot({2000}, row(863))
    release = gpu.judge_release(before, poll(row(863)))
    assert release.released
    assert (
        "other processes still hold memory on this host's GPUs: pid 863"
        in release.notes(LABEL, [H200])[0]
    )


def test_no_nvidia_smi_or_a_failing_one_decides_nothing():
    before = snapshot({863}, row(863))
    release = gpu.judge_release(before, gpu.GpuPoll(None, note="nvidia-smi exited 9"))
    assert release.released and not release.checked
    assert release.notes(LABEL) == ["nvidia-smi exited 9"]
