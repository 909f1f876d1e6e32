"""Other work on the serving host, watched through each window like other clients' traffic.

The host's samples are scripted from real output (nvidia-smi's query interface on an H200,
tests/data/nvidia-smi-h200/query-clocks*.txt; /proc/stat and a cgroup's cpu.stat as Linux
prints them); the experiment runs on the scripted target, so every window is deterministic.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.verdict.stats import Verdict
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.measure.host_load import Bounds, judge, summarise
from pytest_specdecode.record.host_env import WindowEnvironment
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.store import load_run
from pytest_specdecode.targets.host_env import HostProbe, HostSample, Scope, parse_host_sample
from pytest_specdecode.targets.hosts.base import LocalHost

from ...support.scripted_target import Script, ScriptedTarget, Speed, measure_arms
from ...support.synthetic import settings

DATA = Path(__file__).parent.parent.parent / "data" / "nvidia-smi-h200"
BUSY = (DATA / "query-clocks-busy.txt").read_text().splitlines()
# Real rows: the H200 under a matmul loop (software power cap active), the loop's own process
# on it, and the same GPU idle again a moment later.
LOADED_ROW, OTHER_APP, IDLE_ROW = BUSY[2], BUSY[5], BUSY[8]
UUID = "GPU-2071921a-c8fd-0971-a100-65943eca306a"
SERVER_PID = 4242
SERVER_APP = f"{SERVER_PID}, 120000 MiB, {UUID}, python3"
CPUS, TCK = 16, 100


@dataclass(frozen=True)
class Moment:
    """What the host does up to one sample: other work's share, GPU row, extra processes."""

    other: float = 0.0
    gpu_row: str = LOADED_ROW
    apps: tuple[str, ...] = ()


class ScriptedHost:
    """A systemd host's samples: /proc/stat's totals, the unit's cgroup usage, nvidia-smi.
    `moment(service, k)` says what the host did before that service's k-th sample."""

    def __init__(self, moment: Callable[[str, int], Moment]) -> None:
        self.moment = moment
        self.calls: dict[str, int] = {}
        self.user = self.idle = 0  # ticks over all CPUs
        self.server_usec = 0

    def __call__(self, service) -> HostSample:
        k = self.calls.get(service.name, 0)
        self.calls[service.name] = k + 1
        now = self.moment(service.name, k)
        server, other = 0.2 * CPUS * TCK, now.other * CPUS * TCK  # one second's ticks
        self.user += int(server + other)
        self.idle += int(CPUS * TCK - server - other)
        self.server_usec += int(server / TCK * 1e6)
        text = "\n".join(
            [
                f"cpus {CPUS}",
                f"tck {TCK}",
                f"stat cpu  {self.user} 0 0 {self.idle} 0 0 0 0 0 0",
                f"cg usec {self.server_usec}",
                f"pid {SERVER_PID}",
                "smi 0",
                f"gpu {now.gpu_row}",
                f"app {SERVER_APP}",
                *(f"app {a}" for a in now.apps),
            ]
        )
        return parse_host_sample(text)


def run(tmp_path: Path, host: ScriptedHost, run_extra: str = ""):
    s = settings(tmp_path, prompt_types=("coding",), samples=6, run_extra=run_extra)
    fast = Script({"the coding prompt": Speed(gap_s=0.004, tokens=9, tokens_per_chunk=3)})
    target = ScriptedTarget(Script(), {"ngram": fast})
    store = measure_arms(target, s, tmp_path, "ngram", probe=host)
    assert load_run(store.path) == store.record  # the environment round-trips through the file
    return store.record, analyze(store.record)


def test_real_h200_rows_give_clocks_throttle_reasons_and_the_other_process() -> None:
    sample = parse_host_sample(
        f"smi 0\ngpu {LOADED_ROW}\napp {SERVER_APP}\napp {OTHER_APP}\npid {SERVER_PID}"
    )
    (gpu,) = sample.server_gpus()
    assert (gpu.sm_mhz, gpu.memory_mhz, gpu.temperature_c, gpu.power_w) == (1650, 3201, 55, 547.1)
    assert gpu.throttle == ["sw_power_cap"]  # 0x4, under load
    (other,) = sample.others_on_server_gpus()
    assert (other.pid, other.used_mib, other.name) == (517, 964, "python3")
    idle = parse_host_sample(f"smi 0\ngpu {IDLE_ROW}\napp {SERVER_APP}\npid {SERVER_PID}")
    assert idle.server_gpus()[0].throttle == []  # 0x0
    # A GPU the server does not hold is not the server's: its processes are not judged.
    alone = parse_host_sample(f"smi 0\ngpu {LOADED_ROW}\napp {OTHER_APP}\npid {SERVER_PID}")
    assert alone.server_gpus() == () and alone.others_on_server_gpus() == []
    # Where nvidia-smi lists none of the server's processes, the host's GPUs' clocks stand in
    hidden = summarise([alone, alone])
    assert hidden.sm_mhz == 1650 and hidden.throttle == ["sw_power_cap"]
    assert hidden.other_gpu_processes == []
    assert "memory 3201 MHz (every GPU of the host: none listed the server)" in hidden.describe()
    told = summarise([sample, sample])
    assert told.gpus == "the server's" and "every GPU" not in told.describe()


def test_other_work_is_the_hosts_total_less_the_units_cgroup() -> None:
    host = ScriptedHost(lambda _, k: Moment(other=0.5 if k == 1 else 0.0))
    first, second = host(_Named("x")), host(_Named("x"))
    env = summarise([first, second])
    # 20% of 16 CPUs was the unit's (its cgroup), 50% something else's
    assert env.other_cpu_share is not None and abs(env.other_cpu_share - 0.5) < 0.01
    bounds = Bounds(other_share=0.25)
    off = judge(env, usual_share=0.0, other_arm=None, other_label="-", bounds=bounds)
    assert off is not None and "other work took 50% of the host's CPU time" in off
    # measured against the host's usual other work: a constant load is not a change
    assert judge(env, usual_share=0.4, other_arm=None, other_label="-", bounds=bounds) is None


def test_another_process_on_the_servers_gpu_sends_the_window_again(tmp_path: Path) -> None:
    def moment(service: str, k: int) -> Moment:
        # the candidate's first round (its first two samples) shares the GPU with pid 517
        return Moment(apps=(OTHER_APP,) if service == "ngram" and k < 2 else ())

    rec, analysis = run(tmp_path, ScriptedHost(moment))
    m = rec.phases["ngram"].measurements["coding"]
    assert m.environment is not None and m.environment.contaminated is None
    (why,) = m.environment.remeasured
    # named by its round, as the progress line names it
    assert why.startswith("round 1: another process used the server's GPUs: pid 517 (python3)")
    # the first round (one request at c1) set aside, sent again once the GPU was the server's
    assert len(m.discarded) == 1 and len(m.samples) == 6
    assert m.discarded[0].prompt_index == m.samples[0].prompt_index  # the same slot again
    verdict = analysis.verdicts["ngram"]["coding"]
    assert verdict.verdict is Verdict.IMPROVED  # from the clean window
    (note,) = [w for w in analysis.warnings if "measured again after the host was busy" in w]
    assert note.startswith("ngram/coding:") and "pid 517" in note
    assert "busy (round 1: another process" in note and "1 round(s) of it sent again" in note
    assert rec.phases[BASELINE].measurements["coding"].environment.remeasured == []


def test_a_throttle_in_one_arm_only_contaminates_its_windows(tmp_path: Path) -> None:
    thermal = LOADED_ROW.replace("0x0000000000000004", "0x0000000000000044")  # + hw thermal

    def moment(service: str, k: int) -> Moment:
        return Moment(gpu_row=thermal if service == "ngram" else LOADED_ROW)

    rec, analysis = run(tmp_path, ScriptedHost(moment), run_extra="traffic_attempts = 2")
    env = rec.phases["ngram"].measurements["coding"].environment
    assert env is not None and env.throttle == ["hw_thermal_slowdown", "sw_power_cap"]
    assert env.contaminated == (
        "clocks throttled (hw_thermal_slowdown) where baseline's window's did not"
    )
    rounds = {x.slot for x in rec.phases["ngram"].measurements["coding"].samples}
    assert len(env.remeasured) == len(rounds) == 6  # each round tried twice, never clean
    assert [why.split(":")[0] for why in env.remeasured] == [f"round {n}" for n in range(1, 7)]
    verdict = analysis.verdicts["ngram"]["coding"]
    assert verdict.verdict is Verdict.CONTAMINATED  # nothing is called from that window
    assert verdict.reason.startswith("the host was not quiet while it was measured")
    assert "hw_thermal_slowdown" in verdict.reason
    base = rec.phases[BASELINE].measurements["coding"].environment
    assert base is not None and base.off is None  # the power cap is in both arms: not a change


def test_allow_busy_host_keeps_the_window_with_its_environment(tmp_path: Path) -> None:
    host = ScriptedHost(lambda service, k: Moment(other=0.6 if service == "ngram" else 0.0))
    rec, analysis = run(tmp_path, host, run_extra="allow_busy_host = true")
    env = rec.phases["ngram"].measurements["coding"].environment
    assert env is not None and env.contaminated is None and env.remeasured == []
    assert env.off is not None and "other work took 60%" in env.off
    assert analysis.verdicts["ngram"]["coding"].verdict is Verdict.IMPROVED
    assert any("the host was not quiet, kept: other work took 60%" in w for w in analysis.warnings)
    assert "other work 60% of 16 CPUs, SM 1650 MHz" in env.describe()


def test_a_window_recorded_before_environments_still_loads() -> None:
    m = Measurement(prompt_type="coding", environment=WindowEnvironment(samples=3, cpus=2))
    data = json.loads(json.dumps(m.to_json()))
    assert Measurement.from_json(data).environment == m.environment
    del data["environment"]
    assert Measurement.from_json(data).environment is None


@dataclass
class _Named:
    name: str


def test_a_local_servers_process_group_and_this_controller_are_not_other_work() -> None:
    # As the sampling script prints them on a 2-CPU machine without nvidia-smi: 2 s apart, the
    # server's group used 1.2 s of CPU and this controller 0.3 s, of 3.0 s busy in all.
    first = parse_host_sample("cpus 2\ntck 100\nstat cpu 1000 0 0 3000 0 0 0 0 0 0\n"
                              "pid 700\npid 701\nticks 500\nown 100")  # fmt: skip
    second = parse_host_sample("cpus 2\ntck 100\nstat cpu 1300 0 0 3100 0 0 0 0 0 0\n"
                               "pid 700\nticks 620\nown 130")  # fmt: skip
    assert first.server_pids == {700, 701} and first.gpus == ()
    env = summarise([first, second])
    assert env.other_cpu_share is not None and abs(env.other_cpu_share - 1.5 / 4.0) < 1e-9
    assert env.sm_mhz is None and env.throttle == [] and env.steal_share == 0.0
    # nvidia-smi present but failing: said, never raised
    broken = parse_host_sample("smi 9\ngpu NVIDIA-SMI has failed")
    assert broken.gpus == () and broken.note is not None and "exited 9" in broken.note


def test_the_sampling_script_run_here_reads_this_process_group_and_the_gpu_queries(
    tmp_path: Path,
) -> None:
    """The real script on this machine, an nvidia-smi of the test's own on PATH: the loop
    over /proc must not lose the queries it was given (it once did, and no GPU was read)."""
    calls = tmp_path / "calls"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"  # answers as an idle H200 did; this test process holds the GPU
        f'echo "$@" >> {calls}\n'
        'case "$1" in\n'
        f'  --query-gpu=*) echo "{IDLE_ROW}" ;;\n'
        f'  --query-compute-apps=*) echo "{os.getpid()}, 674 MiB, {UUID}, python3" ;;\n'
        "esac\n"
    )
    smi.chmod(0o755)
    host = LocalHost(env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    sample = HostProbe(host).sample(Scope(group=os.getpgid(0), own=os.getpid()))
    asked = calls.read_text().splitlines()
    assert asked[0].startswith("--query-gpu=index,uuid,clocks.sm")
    assert asked[1].startswith("--query-compute-apps=pid,")
    assert os.getpid() in sample.server_pids and sample.note is None
    (gpu,) = sample.server_gpus()
    assert gpu.sm_mhz is not None and sample.others_on_server_gpus() == []


def test_the_sampling_script_reads_a_units_cpu_in_each_cgroup_layout(tmp_path: Path) -> None:
    """The real script against a cgroup tree of the test's own and a systemctl on PATH: v2,
    the hybrid layout's `unified` tree beside v1 controllers (the systemd test host's: the
    unit's CPU was once read as nothing there, so the whole host counted as other work), v1's
    cpuacct, and a cgroup with no CPU accounting, which leaves the unit's share unknown."""
    bin_dir, unit_cg = tmp_path / "bin", "/system.slice/vllm.service"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f"#!/bin/sh\necho {unit_cg}\n")
    (bin_dir / "systemctl").chmod(0o755)
    host = LocalHost(env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})

    def sample(layout: str, file: str, text: str) -> HostSample:
        root = tmp_path / layout
        folder = root / file.format(cg=unit_cg.lstrip("/"))
        folder.parent.mkdir(parents=True)
        folder.write_text(text)
        (folder.parent / "cgroup.procs").write_text("4242\n")
        return HostProbe(host, cgroup_root=str(root)).sample(Scope(unit="vllm.service"))

    usage = "usage_usec 2500000\nuser_usec 2000000\n"
    for layout, file in (("v2", "{cg}/cpu.stat"), ("hybrid", "unified/{cg}/cpu.stat")):
        got = sample(layout, file, usage)
        assert (got.server_s, got.server_pids, got.note) == (2.5, frozenset({4242}), None), layout
    v1 = sample("v1", "cpuacct/{cg}/cpuacct.usage", "3000000000\n")
    assert (v1.server_s, v1.server_pids) == (3.0, frozenset({4242}))
    unread = sample("none", "memory/{cg}/memory.usage_in_bytes", "1\n")
    assert unread.server_s is None and unread.total_ticks is not None
    assert unread.note and f"its cgroup {unit_cg} has no CPU accounting" in unread.note
    # A window of such samples is not judged on its CPU: unknown, never "all of it is others'".
    env = summarise([unread, unread])
    assert env.other_cpu_share is None and env.missing == unread.note
