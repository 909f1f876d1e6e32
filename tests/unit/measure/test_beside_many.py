"""Several servers beside the original at once (`[run] beside = N`, the break-even map's way):
every slot visits every server once, in an order that turns from slot to slot, never two at
once; each candidate is compared by pairs with the baseline start it was served beside; the
places, and a Ctrl-C that stops them all, on the real local backend with stand-in servers."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE, together_order
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.measure.experiment.order import RoundOrder
from pytest_specdecode.record.schema import Phase
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.targets.base import room_beside
from pytest_specdecode.targets.lifecycle import Switchboard, experiment_services

from ...support.scripted_target import Script, ScriptedService, ScriptedTarget, Speed
from ...support.synthetic import record, settings
from ..targets.test_arms_together import H200, alive, local_target, sleeping_vllm, used  # noqa: F401

K = [f'{{"method":"ngram","num_speculative_tokens":{k}}}' for k in (2, 3, 4)]
NAMES = ["ngram-k2", "ngram-k3", "ngram-k4"]


def test_the_turn_visits_every_server_once_a_slot_and_each_goes_first_alike() -> None:
    order = RoundOrder(7)
    turns = [order.turn(4) for _ in range(8)]
    assert all(sorted(t) == [0, 1, 2, 3] for t in turns)  # each once a slot
    assert len({tuple(t) for t in turns}) == 4  # it changes from slot to slot
    assert Counter(t[0] for t in turns) == {0: 2, 1: 2, 2: 2, 3: 2}  # each first alike
    two = RoundOrder(7)
    assert [two.turn(2) for _ in range(4)] == [
        [0, 1] if first else [1, 0]
        for first in (lambda o: [o.a_first() for _ in range(4)])(RoundOrder(7))
    ]  # two servers: the pair's alternation, unchanged


def test_groups_of_candidates_beside_one_baseline_start() -> None:
    assert together_order(["a", "b", "c"], 1, 3) == [
        (BASELINE, BASELINE), ("a", "a"), ("b", "b"), ("c", "c")
    ]  # fmt: skip
    assert together_order(["a", "b", "c"], 1, 2) == [
        (BASELINE, BASELINE), ("a", "a"), ("b", "b"), ("baseline#2", BASELINE), ("c", "c")
    ]  # fmt: skip
    assert together_order(["a", "b"], 1) == [
        (BASELINE, BASELINE), ("a", "a"), ("baseline#2", BASELINE), ("b", "b")
    ]  # fmt: skip


class ManyBoard(Switchboard):
    """`Switchboard.together_all` on the scripted target: its servers on ports of their own,
    started one after the other (`started`: each with the virtual time it started)."""

    started: list[tuple[str, float]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.started = []

    @contextmanager
    def together_all(
        self,
        specs: Sequence[SpecConfig],
        *,
        restart_original: bool,
        swap: bool = False,
        first_beside: Callable[[ScriptedService, ScriptedService], None] | None = None,
    ) -> Iterator[tuple[ScriptedService, list[ScriptedService]]]:
        original = self.activate(None, restart=restart_original)
        target: ScriptedTarget = self.target  # type: ignore[assignment]
        try:
            seconds = []
            for i, spec in enumerate(specs):  # one after the other, as the real one
                seconds.append(target.start_beside(spec, i + 1))
                self.started.append((spec.name, target.time.now))
                if i == 0 and first_beside is not None:  # the regime window
                    first_beside(original, seconds[0])
            yield original, seconds  # type: ignore[misc]
        finally:
            target.stop_beside()


def test_three_candidates_beside_the_baseline_visit_every_server_each_slot_never_two_at_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, candidates=K, samples=4, run_extra='arms = "together"\nbeside = 3')
    prompts = ("the coding prompt", "the math prompt")
    scripts = {n: Script({p: Speed(gap_s=0.004 + 0.001 * i) for p in prompts})
               for i, n in enumerate(NAMES)}  # fmt: skip
    target = ScriptedTarget(Script(), scripts)
    store = RunStore(tmp_path / "run", record(s))
    board = ManyBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    for name in NAMES:
        exp.arm(name)
    board.restore()
    rec = store.record
    base = rec.phases[BASELINE]
    cands = [rec.phases[n] for n in NAMES]
    assert [p.name for p in rec.arm_phases(BASELINE)] == [BASELINE]  # one start, beside all three
    assert all(c.together_with == BASELINE and c.order_seed == base.order_seed for c in cands)
    assert sorted(c.position for c in cands) == [1, 2, 3] and base.position == 0
    # every slot went to all four servers
    slots = {x.slot for m in base.measurements.values() for x in m.samples}
    for phase in cands:
        assert {x.slot for m in phase.measurements.values() for x in m.samples} == slots
    # in an order that turns: each server first in some slot
    firsts = base.sent_first
    assert len(firsts) == len(slots) and set(firsts) == {BASELINE, *NAMES}
    for k, first in enumerate(firsts):
        starts = {p.name: min(x.started_at for x in _slot(p, k)) for p in (base, *cands)}
        assert min(starts, key=starts.__getitem__) == first
    # never two at once: no stream on one server overlaps a stream on another
    streams = [(n, t0, t1) for n, t0, t1 in target.streams]
    assert {n for n, _, _ in streams} == {"original", *NAMES}
    assert not any(
        a0 < b1 and b0 < a1
        for i, (na, a0, a1) in enumerate(streams)
        for nb, b0, b1 in streams[i + 1 :]
        if na != nb
    )
    # each candidate by pairs against the start it was served beside
    found = analyze(rec).verdicts
    for name in NAMES:
        assert {v.throughput.interval.by for v in found[name].values()} == {"pairs"}
    assert target.events.count("stop ngram-k3 beside") == 1


def _slot(phase: Phase, k: int) -> list:
    return [x for m in phase.measurements.values() for x in m.samples if x.slot == k]


# -- the local backend: places for four, and a Ctrl-C that stops them all ----------------------


def three_specs() -> list[SpecConfig]:
    """n-gram at k = 2, 3 and 4, named as NAMES: three servers beside the original."""
    return [SpecConfig(n, {"method": "ngram", "num_speculative_tokens": k})
            for n, k in zip(NAMES, (2, 3, 4), strict=True)]  # fmt: skip


def _cmdline(pid: int | None) -> list[str]:
    assert pid is not None
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_three_beside_the_original_on_one_gpu_each_get_a_share_and_ctrl_c_stops_all(
    tmp_path: Path,
    sleeping_vllm: None,  # noqa: F811
) -> None:
    target = local_target(tmp_path, gpus=(H200,))
    specs = three_specs()
    assert room_beside(target, specs[0], of=3) is None
    busy = local_target(tmp_path, gpus=(used(H200, 21099),))  # another process's 21 GiB
    why = room_beside(busy, specs[0], of=3)
    assert why is not None and "4 servers at 0.196 each need 129100 MiB" in why
    lines: list[str] = []
    pids: list[int | None] = []
    with (
        pytest.raises(KeyboardInterrupt),
        experiment_services(
            target, ready_timeout_s=5, restore_timeout_s=30, progress=lines.append
        ) as board,
        board.together_all(specs, restart_original=False) as (original, seconds),
    ):
        pids += [original.pid, *(s.pid for s in seconds)]
        assert all(alive(p) for p in pids) and len(set(pids)) == 4
        assert len({original.api_base, *(s.api_base for s in seconds)}) == 4
        for pid in pids:
            argv = _cmdline(pid)
            assert (
                argv[argv.index("--gpu-memory-utilization") + 1] == "0.196"
            )  # 0.9 over 4, less 4 GiB each beyond its share
        board.interrupts.signalled(signal.SIGINT)  # as the plugin's handler does
        raise KeyboardInterrupt
    assert not any(alive(p) for p in pids)
    report = board.restore_report
    assert report is not None and not report.failed
    for name, pid in zip(NAMES, pids[1:], strict=True):
        assert (
            f"stopped the second server local vLLM process 'beside-{name}' (pid {pid})"
            in report.describe()
        )
    started = [line for line in lines if "starting local vLLM process 'beside-" in line]
    assert [line.split("'")[1] for line in started] == [f"beside-{n}" for n in NAMES]


def test_the_plan_refuses_more_beside_than_the_host_holds_before_anything_starts(
    tmp_path: Path,
) -> None:
    from pytest_specdecode.errors import ConfigError
    from pytest_specdecode.report.plan import arms_plan
    from pytest_specdecode.run.arms import choose_arms

    s = settings(tmp_path, candidates=K, run_extra='arms = "together"\nbeside = 3')
    two_cores = local_target(tmp_path, cores=(0, 1))
    with pytest.raises(ConfigError, match="no room for 3 servers beside the original"):
        arms_plan(s, two_cores)
    h200 = local_target(tmp_path, gpus=(H200,))
    lines = arms_plan(s, h200)
    assert lines[0].startswith("up to 3 candidates served beside each baseline start at once")
    auto = settings(tmp_path, candidates=K, run_extra="beside = 3")
    mode, why = choose_arms(auto, two_cores, machine={}, profile=None, version=None)
    assert mode == "one-at-a-time" and "no room for 3 servers" in why
