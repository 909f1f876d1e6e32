"""The plan describes the run (issue 41): the servers it starts, grouped as the run groups them,
their ports and memory shares, the starts, and the time, for side by side and for N beside; the
time from this machine's stored pace, else from its kind of accelerator's; the cheapest lever
timed by the same function. On a stand-in H200 (tests/data/nvidia-smi-h200)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_specdecode.analysis.variance.restarts import RestartNoise
from pytest_specdecode.analysis.variance.time_drift import TimeDrift
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.config.settings import Settings, load_settings
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.profile import Accelerator, ProfileKey, lookup
from pytest_specdecode.report import plan, plan_reach
from pytest_specdecode.report.schedule import (
    ACCELERATOR_PACE,
    Schedule,
    SlotCount,
    planned_servers,
    schedule_of,
    schedule_seconds,
    slots_seconds,
)
from pytest_specdecode.report.text import fmt_duration
from pytest_specdecode.targets.lifecycle import beside_kwargs, experiment_services

from ...support.synthetic import add_phase, store
from ..targets.test_arms_together import COMMAND, H200, alive, local_target, sleeping_vllm  # noqa: F401

H200_KIND = Accelerator("gpu", "NVIDIA H200", 1)
TYPES = ("coding", "math", "structured", "explanatory")
# suites/gpu.toml's server command: its own share of 0.5, replaced beside others
GPU_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--host",
               "127.0.0.1", "--port", "18011", "--gpu-memory-utilization", "0.5"]  # fmt: skip
MAP = ["ngram", "map-k3-L1", "map-k3-L4", "map-k5-L1", "map-k5-L6"]  # --spec-break-even auto


def gpu_settings(tmp_path: Path, *, beside: int, samples: int, break_even: bool) -> Settings:
    """suites/gpu.toml's design: side by side, n-gram k=5, four prompt types of 256 tokens."""
    path = tmp_path / "gpu.toml"
    path.write_text(
        f'reports_dir = "{tmp_path / "reports"}"\n'
        '[target]\nbackend = "local"\napi_base = "http://127.0.0.1:18011"\n'
        'model = "smollm2-135m-instruct"\n'
        'command = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--port", "18011"]\n'
        f'[run]\narms = "together"\nbeside = {beside}\nsamples = {samples}\n'
        f"max_samples = {samples}\nrepeats = 1\nwarmup = 1\nmax_tokens = 256\n"
        + ('break_even = "auto"\n' if break_even else "")
        + '[presets]\nngram = { method = "ngram", num_speculative_tokens = 5, '
        "prompt_lookup_max = 4 }\n"
        + "".join(f'[prompt_types.{t}]\nprompt = "the {t} prompt"\n' for t in TYPES)
    )
    return load_settings(path, spec_configs=["ngram"])


def run_groups(s: Settings) -> list[list[str]]:
    """The groups the run itself serves: `Experiment.arm`'s dispatch, its starts recorded."""
    served: list[list[str]] = []

    class Recorded(Experiment):
        def _start_group(self, base_name, group):
            served.append([base_name, *(name for name, _ in group)])

        def _start_and_measure(self, name, arm):
            served.append([name])

    exp = Recorded(s, board=None, store=store(s.reports_dir / "x", s), progress=lambda _: None)  # type: ignore[arg-type]
    exp.measure_all()
    return served


def share(argv: list[str]) -> float:
    return float(argv[argv.index("--gpu-memory-utilization") + 1])


@pytest.mark.parametrize(("beside", "groups"), [(5, [6]), (1, [2, 2, 2, 2, 2])])
def test_the_plans_groups_and_starts_are_the_runs(tmp_path: Path, beside, groups) -> None:
    s = gpu_settings(tmp_path, beside=beside, samples=12, break_even=True)
    assert [c.name for c in s.candidates] == MAP
    schedule = schedule_of(s, baseline=True, aba=False, adopts_original=False)
    planned = [[name for name, _ in g.phases] for g in schedule.groups]
    assert planned == run_groups(s)
    assert [g.servers for g in schedule.groups] == groups
    # the local backend starts every server of a group, the original too, one after another
    assert (
        schedule.starts
        == sum(groups)
        == plan.count_starts(s, baseline=True, aba=False, adopts_original=False)
    )
    # a unit that keeps serving (systemd) starts only the candidates beside it
    kept = schedule_of(s, baseline=True, aba=False, adopts_original=True)
    assert kept.starts == len(MAP)
    assert plan.phase_order(s, baseline=True, aba=False) == [n for g in planned for n in g]


def test_five_beside_on_an_h200_the_plan_names_the_six_servers_the_run_places(
    tmp_path: Path,
) -> None:
    """beside = 5 with the map: one group of six servers at (0.9 less 4 GiB a server)/6 =
    0.121 of the memory each, on the ports the run gives them; the old plan said 45% for every
    one."""
    s = gpu_settings(tmp_path, beside=5, samples=12, break_even=True)
    planning = local_target(tmp_path, gpus=(H200,), command=GPU_COMMAND)
    (group,) = schedule_of(s, baseline=True, aba=False, adopts_original=False).groups
    servers = planned_servers(s, planning, group)
    assert servers is not None
    assert [x.name for x in servers] == [BASELINE, *MAP]
    assert [x.memory_share for x in servers] == [pytest.approx(0.121)] * 6
    # the run's own places, on a target of its own: the same ports, shares and commands
    running = local_target(tmp_path, gpus=(H200,), command=GPU_COMMAND)
    specs = {c.name: c for c in s.candidates}
    started = [
        running.beside(specs[name], **beside_kwargs(swapped=False, place=i, of=5))
        for i, name in enumerate(MAP, start=1)
    ]
    original = running.original()
    assert [x.where for x in servers] == [original.placement, *(x.placement for x in started)]
    ports = [int(re.search(r"port (\d+)", x.where).group(1)) for x in servers]  # type: ignore[union-attr]
    assert len(set(ports)) == 6 and ports[0] == 18011
    assert [share(x.argv) for x in (original, *started)] == [pytest.approx(0.121)] * 6
    assert all("12% of the GPU memory" in x.where for x in servers)
    # the plan's text: one group, six servers, six starts, never 45%
    lines = plan.arms_plan(s, planning)
    text = "\n".join(lines)
    assert "6 servers side by side for baseline with ngram, map-k3-L1" in text
    assert "6 server starts, one after the other" in text
    assert text.count("12% of the GPU memory") == 6 and "45%" not in text


def test_the_plans_six_servers_are_the_six_the_board_starts(
    tmp_path: Path,
    sleeping_vllm: None,  # noqa: F811
) -> None:
    """The real local backend starts stand-in servers for the group the plan names: as many
    starts, and each process on the plan's port with the plan's share; the restore stops all."""
    s = gpu_settings(tmp_path, beside=5, samples=12, break_even=True)
    (group,) = schedule_of(s, baseline=True, aba=False, adopts_original=False).groups
    servers = planned_servers(s, local_target(tmp_path, gpus=(H200,)), group)
    assert servers is not None
    target = local_target(tmp_path, gpus=(H200,))
    lines: list[str] = []
    with (
        experiment_services(
            target, ready_timeout_s=5, restore_timeout_s=30, progress=lines.append
        ) as board,
        board.together_all(list(s.candidates), restart_original=False) as (original, seconds),
    ):
        pids = [original.pid, *(x.pid for x in seconds)]
        argvs = [Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0") for pid in pids]
    assert len([line for line in lines if line.startswith("starting ")]) == group.starts == 6
    for argv, planned in zip(argvs, servers, strict=True):
        assert share(argv) == planned.memory_share == pytest.approx(0.121)
        assert f"port {argv[argv.index('--port') + 1]}," in planned.where
    assert not any(alive(pid) for pid in pids)


def test_one_beside_the_pair_gets_the_pairs_share_and_each_group_is_listed(tmp_path: Path) -> None:
    s = gpu_settings(tmp_path, beside=1, samples=48, break_even=False)
    target = local_target(tmp_path, gpus=(H200,), command=GPU_COMMAND)
    (line,) = plan.arms_plan(s, target)
    assert line.startswith("arms side by side for ngram: the original on port 18011, 42% of")
    assert line.count("42% of the GPU memory") == 2 and "2 server starts" in line
    # with the map: five pairs, one line each, the places turned every second pair
    mapped = gpu_settings(tmp_path, beside=1, samples=12, break_even=True)
    lines = plan.arms_plan(mapped, local_target(tmp_path, gpus=(H200,), command=GPU_COMMAND))
    assert [line.split(":")[0] for line in lines] == [
        f"arms side by side for {name}{' (the places turned)' if i % 2 else ''}"
        for i, name in enumerate(MAP)
    ]


def test_on_cores_the_second_pair_sits_in_the_places_the_run_turns_to(tmp_path: Path) -> None:
    s = gpu_settings(tmp_path, beside=1, samples=12, break_even=True)
    cores = local_target(tmp_path, cores=(0, 1, 2, 3))
    groups = schedule_of(s, baseline=True, aba=False, adopts_original=False).groups
    second = planned_servers(s, cores, groups[1])
    assert second is not None
    run = local_target(tmp_path, cores=(0, 1, 2, 3))
    spec = next(c for c in s.candidates if c.name == groups[1].phases[1][1])
    placed = run.beside(spec, **beside_kwargs(swapped=True, place=1, of=1))
    assert second[1].where == placed.placement and second[1].cores == (0, 1)
    assert second[0].where == run.original().placement and second[0].cores == (2, 3)


# -- the time --------------------------------------------------------------------------------


def test_the_time_is_starts_and_slots_per_server_at_the_h200s_pace_where_nothing_is_stored(
    tmp_path: Path,
) -> None:
    """With nothing of this machine's stored, the H200's pace; the runs of issue 41 took
    13 min 29 s (the main job: two starts, 192 slots of two servers) and 482 s of starts and
    445 s of slots (the map, beside = 5, cut just before its end): the plan within 25%."""
    pace = ACCELERATOR_PACE["H200"]
    kwargs = {"host": "localhost", "default_start_s": 60.0, "accelerator": H200_KIND}
    for beside, samples, mapped, took in ((1, 48, False, 809.0), (5, 12, True, 482.0 + 445.0)):
        s = gpu_settings(tmp_path, beside=beside, samples=samples, break_even=mapped)
        timing = plan.previous_timing(s, **kwargs)
        assert (timing.start_s, timing.s_per_token) == (pace.start_s, pace.s_per_token)
        seconds, starts = plan.estimate_seconds(
            s, timing, baseline=True, aba=False, adopts_original=False
        )
        servers = 1 + len(s.candidates)
        slots = len(TYPES) * (samples + 1)  # each prompt type's requests and its warm-up
        window = s.run.regime_window_slots  # beside one, first
        regime = len(TYPES) * window * 2 if beside > 1 else 0
        assert starts == servers
        assert seconds == pytest.approx(
            starts * pace.start_s + (slots * servers + regime) * 256 * pace.s_per_token
        )
        assert abs(seconds / took - 1) < 0.25, (beside, seconds, took)
        time, stop = plan_reach.plan_time(
            s, {}, timing, baseline=True, aba=False, adopts_original=False
        )
        line = "\n".join(plan_reach.time_lines(time, timing, stop))
        assert f"{starts} server starts at ~100 s" in line and "assumed for 1 x NVIDIA H200" in line


def test_the_committed_h200_profile_of_another_machine_no_longer_halves_the_time(
    tmp_path: Path,
) -> None:
    """Issue 41's main job: the plan read the committed profile's speed (another machine's A/A
    runs, 2.2 ms per token, no overhead) and said about 6 min; the run took 13 min 29 s. That
    profile is not this machine's: the H200's pace is used, within 25% of what the run took."""
    s = gpu_settings(tmp_path, beside=1, samples=48, break_even=False)
    profiles = Path(__file__).resolve().parents[3] / "suites" / "host-profiles-h200"
    key = ProfileKey("localhost", H200_KIND, "smollm2-135m-instruct", "0.26.0")
    found = lookup(profiles, key)
    assert found.profile is not None and all(e.machine != "m-1" for e in found.profile.entries)
    timing = plan.previous_timing(
        s, host="localhost", default_start_s=60.0, accelerator=H200_KIND, profile=found,
        machine="m-1",
    )  # fmt: skip
    assert timing.source.startswith("assumed for 1 x NVIDIA H200")
    seconds, _ = plan.estimate_seconds(s, timing, baseline=True, aba=False, adopts_original=False)
    assert abs(seconds / 809.0 - 1) < 0.25


def test_this_machines_stored_pace_comes_before_the_accelerators(tmp_path: Path) -> None:
    s = gpu_settings(tmp_path, beside=5, samples=12, break_even=True)
    run = s.reports_dir / "20261204T000000Z-ngram"
    run.mkdir(parents=True)
    st = store(run.parent / "x", s)
    st.record.environment.update(
        {"accelerator": H200_KIND.to_json(), "machine": "m-1", "planned_s": 400.0, "run_s": 600.0}
    )
    add_phase(st.record, BASELINE, {"coding": 250.0}).startup_s = 80.0
    st.path = run / "results.json"
    st.flush()
    timing = plan.previous_timing(
        s, host="localhost", default_start_s=60.0, accelerator=H200_KIND, machine="m-1"
    )
    assert timing.start_s == 80.0 and timing.pace == pytest.approx(1.5)
    assert timing.s_per_token == pytest.approx(1 / 250, rel=0.05)
    assert timing.source.startswith("from the stored run 20261204T000000Z-ngram")
    seconds, starts = plan.estimate_seconds(
        s, timing, baseline=True, aba=False, adopts_original=False
    )
    assert starts == 6
    window = s.run.regime_window_slots  # the regime window's slots too
    slots = len(TYPES) * 13 * 6 + len(TYPES) * window * 2
    assert seconds == pytest.approx(1.5 * (6 * 80.0 + slots * 256 * timing.s_per_token))


def test_a_sequential_stops_expected_slots_are_what_the_slots_time_counts() -> None:
    """The hook for a sequential stop: the expected slots, where given, else the largest."""
    from pytest_specdecode.report.schedule import StartGroup

    schedule = Schedule((StartGroup(((BASELINE, BASELINE), ("a", "a")), 2),), starts=2)
    assert slots_seconds(schedule, SlotCount(52), 1.5) == pytest.approx(52 * 1.5 * 2)
    assert slots_seconds(schedule, SlotCount(52, expected=20), 1.5) == pytest.approx(20 * 3)
    assert schedule_seconds(schedule, start_s=100, slot_s=None, slots=SlotCount(52)) == 200


def test_the_cheapest_levers_time_is_the_plans_own_estimate(tmp_path: Path) -> None:
    """Every lever is timed by `design_seconds`, the configured design's own estimate: with
    five beside, a lever of more starts pays six starts per group (the map run's plan once
    said 2.7 h, pricing starts by pairs)."""
    s = gpu_settings(tmp_path, beside=5, samples=12, break_even=True)
    timing = plan.Timing(100.0, 0.0054, "the H200's")
    measured = RestartNoise(0.036, 3.0, "a prior", residual=0.05**2)
    drift = TimeDrift(0.05, 0.75, 0.4, (0.05**2 + 0.05**2) ** 0.5, 384, 8, 0.4, False)
    args = {"baseline": True, "aba": False, "adopts_original": False}
    lines = plan_reach.design_lines(
        s, {"throughput": measured, "tpot": measured}, detect=0.15, timing=timing, drift=drift,
        **args,
    )  # fmt: skip
    found = [line for line in lines if "--spec-repeats" in line and "about " in line]
    assert found, lines
    for line in found:
        n, k = (
            int(x) for x in re.search(r"--spec-repeats (\d+) --spec-samples (\d+)", line).groups()
        )  # type: ignore[union-attr]
        together = "--spec-arms together" in line or s.run.arms == "together"
        expected = plan.design_seconds(s, timing, n, k, together=together, **args)
        assert f"about {fmt_duration(expected)}" in line, line
        trial_starts = n * (1 + len(s.candidates))  # every group's six servers, each repeat
        assert expected >= trial_starts * timing.start_s
