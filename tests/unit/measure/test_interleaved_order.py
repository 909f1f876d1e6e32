"""A start's requests in interleaved order (measure/experiment/order.py,
measure/experiment/arms.py), and two arms served together, on the scripted target: each round holds
every cell once in a seeded order, each cell's counters are its own, a contaminated round is sent
again, and with `--spec-arms together` each slot goes to one server, then the other, never both at
once."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE, together_order
from pytest_specdecode.config.load import LoadLevel
from pytest_specdecode.config.prompts import request_plan
from pytest_specdecode.config.settings import Settings
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ServiceError
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.measure.experiment.order import CellPlan, RoundOrder, order_seed, slot_size
from pytest_specdecode.record.schema import Phase, RunRecord
from pytest_specdecode.record.store import RunStore, load_run
from pytest_specdecode.targets.lifecycle import Switchboard

from ...support.scripted_target import Script, ScriptedService, ScriptedTarget, Speed, measure_arms
from ...support.synthetic import record, settings

TYPES = ("coding", "math", "chat")


def slots_in_order(phase: Phase) -> list[str]:
    """The prompt type of each slot, in the order the slots were sent."""
    by_slot = {s.slot: s for m in phase.measurements.values() for s in m.samples}
    assert None not in by_slot
    return [by_slot[k].prompt_type for k in sorted(by_slot)]  # type: ignore[type-var]


# -- the order, pure --------------------------------------------------------------------------


def test_each_round_holds_every_key_once_in_a_seeded_order() -> None:
    keys = ["a", "b", "c", "d"]
    first, again = RoundOrder(7), RoundOrder(7)
    rounds = [first.round(keys) for _ in range(20)]
    assert rounds == [again.round(keys) for _ in range(20)]  # reproducible from the seed
    assert all(sorted(r) == keys for r in rounds)  # balanced: every key once a round
    assert len({tuple(r) for r in rounds}) > 1  # shuffled, not one fixed order
    other = RoundOrder(8)
    assert [other.round(keys) for _ in range(20)] != rounds
    # the arm that goes first alternates from slot to slot
    firsts = [first.a_first() for _ in range(6)]
    assert all(a != b for a, b in itertools.pairwise(firsts))
    assert order_seed(0, "baseline") == order_seed(0, "baseline") != order_seed(0, "ngram")
    assert order_seed(0, "baseline") != order_seed(1, "baseline")


def test_a_slot_is_a_request_at_c1_a_burst_at_cn_and_stops_at_most() -> None:
    assert slot_size(LoadLevel(concurrency=1), 6) == 1
    assert slot_size(LoadLevel(concurrency=4), 8) == 4
    assert slot_size(LoadLevel(rate=2.0), 6) == 6  # a Poisson window of its least
    cell = CellPlan("coding@c4", tuple(range(10)), least=8, most=10, step=4)
    assert cell.next_slot(0) == (0, 1, 2, 3) and cell.next_slot(8) == (8, 9)
    assert cell.wants(4, pinned=True)  # below the least, pinned or not
    assert cell.wants(8, pinned=False) and not cell.wants(8, pinned=True)
    assert not cell.wants(10, pinned=False)


def test_together_pairs_each_candidate_start_with_a_baseline_start() -> None:
    assert together_order(["ngram", "eagle"], 2) == [
        ("baseline", "baseline"),
        ("ngram", "ngram"),
        ("baseline#2", "baseline"),
        ("eagle", "eagle"),
        ("baseline#3", "baseline"),
        ("eagle#2", "eagle"),
        ("baseline#4", "baseline"),
        ("ngram#2", "ngram"),
    ]


# -- one arm at a time ------------------------------------------------------------------------


def three_types(tmp_path: Path, run_extra: str = "", **kw) -> Settings:
    return settings(tmp_path, prompt_types=TYPES, samples=6, run_extra=run_extra, **kw)


def test_the_interleaved_order_is_balanced_seeded_and_recorded(tmp_path: Path) -> None:
    s = three_types(tmp_path)
    rec = measure_arms(ScriptedTarget(Script()), s, tmp_path, BASELINE).record
    phase = rec.phases[BASELINE]
    assert (phase.order, phase.order_seed) == ("interleaved", order_seed(0, BASELINE))
    sent = slots_in_order(phase)
    # the seeded order, replayed from the phase's recorded seed: round after round
    order = RoundOrder(phase.order_seed or 0)
    assert sent == [t for _ in range(6) for t in order.round(list(TYPES))]
    rounds = [sent[i : i + 3] for i in range(0, len(sent), 3)]
    assert all(sorted(r) == sorted(TYPES) for r in rounds)  # every cell once a round
    assert len({tuple(r) for r in rounds}) > 1
    # in time too: each request starts after the one before it ended
    samples = sorted((s for m in phase.measurements.values() for s in m.samples), key=_slot)
    assert [s.started_at for s in samples] == sorted(s.started_at for s in samples)
    # the same prompts as the blocked order sends, so pairing by prompt keeps working
    planned = request_plan(1, samples=6, warmup=1).levels[0]
    for m in phase.measurements.values():
        assert [x.prompt_index for x in m.samples] == list(planned)
        assert [x.index for x in m.samples] == list(range(6))  # their places in the window
    assert load_run(tmp_path / "run") == rec  # the order round-trips through results.json

    (tmp_path / "again").mkdir()
    again = measure_arms(ScriptedTarget(Script()), s, tmp_path / "again", BASELINE).record
    assert slots_in_order(again.phases[BASELINE]) == sent  # reproducible
    (tmp_path / "seeded").mkdir()
    other = three_types(tmp_path / "seeded", run_extra="seed = 5")
    seeded = measure_arms(ScriptedTarget(Script()), other, tmp_path / "seeded", BASELINE).record
    assert seeded.phases[BASELINE].order_seed == order_seed(5, BASELINE)
    assert slots_in_order(seeded.phases[BASELINE]) != sent


def test_the_blocked_order_sends_one_prompt_type_after_another(tmp_path: Path) -> None:
    s = three_types(tmp_path, run_extra='order = "blocked"')
    rec = measure_arms(ScriptedTarget(Script()), s, tmp_path, BASELINE).record
    phase = rec.phases[BASELINE]
    assert (phase.order, phase.order_seed) == ("blocked", None)
    times = {name: [x.started_at for x in m.samples] for name, m in phase.measurements.items()}
    assert max(times["coding"]) < min(times["math"]) and max(times["math"]) < min(times["chat"])
    assert all(x.slot is None for m in phase.measurements.values() for x in m.samples)


def test_each_cells_counters_are_its_own(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=4)
    drafts = Script(
        {
            "the coding prompt": Speed(tokens=9, tokens_per_chunk=3),  # 3 steps: 2, 2, 1 taken
            "the math prompt": Speed(tokens=9, tokens_per_chunk=1),  # 8 steps, none taken
        }
    )
    target = ScriptedTarget(Script(), {"ngram": drafts})
    rec = measure_arms(target, s, tmp_path, BASELINE, "ngram").record
    ms = rec.phases["ngram"].measurements
    assert set(slots_in_order(rec.phases["ngram"])[:2]) == {"coding", "math"}  # interleaved
    coding, math_ = ms["coding"].acceptance, ms["math"].acceptance
    assert coding.mean_acceptance_length is not None
    assert math.isclose(coding.mean_acceptance_length, 1 + 5 / 3)
    assert math_.mean_acceptance_length == 1.0
    # the traffic of each cell is its requests only: no other client is seen
    for m in ms.values():
        assert m.traffic.requests == len(m.samples) and m.foreign is None
        assert m.traffic.generation_tokens == m.output_tokens
        assert m.wall_s is not None and m.wall_s > 0


def test_a_round_with_other_clients_is_sent_again_and_kept_aside(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=4, warmup=0, run_extra="traffic_attempts = 2")
    target = ScriptedTarget(Script(), neighbour=1)  # finishes a request with our first one
    rec = measure_arms(target, s, tmp_path, BASELINE).record
    ms = rec.phases[BASELINE].measurements
    discarded = [x for m in ms.values() for x in m.discarded]
    assert sorted(x.prompt_type for x in discarded) == ["coding", "math"]  # the whole round
    assert {x.slot for x in discarded} == {0, 1}
    for m in ms.values():
        assert len(m.samples) == 4 and m.foreign is None  # the round sent again, clean
        (aside,) = m.discarded
        assert aside.prompt_index == m.samples[0].prompt_index == 0  # the same prompt again
        assert m.traffic.requests == 4  # the kept slots' counts only


def test_the_adaptive_rule_stops_each_cell_on_its_own(tmp_path: Path) -> None:
    prompts = [f"prompt number {i}" for i in range(40)]
    tables = f"""
[prompt_types.spread]
prompts = {json.dumps(prompts)}
[prompt_types.steady]
prompts = ["the same prompt every time"]
"""
    s = settings(
        tmp_path, prompt_types=(), candidates=(), samples=4, max_samples=24, warmup=0,
        run_extra="min_effect = 0.03\nassumed_restart_noise = 0.05", extra=tables,
    )  # fmt: skip
    speeds = {
        p: Speed(ttft_s=0.0, gap_s=0.010 * math.exp(0.1 if i % 2 else -0.1), tokens=9)
        for i, p in enumerate(prompts)
    }
    rec = measure_arms(ScriptedTarget(Script(speeds)), s, tmp_path, BASELINE).record
    phase = rec.phases[BASELINE]
    ms = phase.measurements
    assert len(ms["steady"].samples) == 4 < len(ms["spread"].samples) < 24
    sent = slots_in_order(phase)
    # four full rounds, then only the cell the rule has not pinned down
    assert sorted(sent[:8]) == ["spread"] * 4 + ["steady"] * 4
    assert set(sent[8:]) == {"spread"}


# -- two arms together ------------------------------------------------------------------------


class TogetherBoard(Switchboard):
    """The agreed `Switchboard.together` (targets/lifecycle.py, built elsewhere), faked: the
    original serving, a candidate's scripted server beside it on its own port."""

    calls: list[tuple[str, bool]]
    swaps: list[bool]

    @contextmanager
    def together(
        self, spec: SpecConfig, *, restart_original: bool, swap: bool = False
    ) -> Iterator[tuple[ScriptedService, ScriptedService]]:
        self.calls.append((spec.name, restart_original))
        self.swaps.append(swap)
        original = self.activate(None, restart=restart_original)
        target: ScriptedTarget = self.target  # type: ignore[assignment]
        crash = target._scripts.get(spec.name, Script()).crash_at_start
        if crash:
            raise ServiceError(f"scripted service {spec.name!r} beside the original: {crash}")
        try:
            yield original, target.start_beside(spec)  # type: ignore[misc]
        finally:
            target.stop_beside()


def together_experiment(
    tmp_path: Path, target: ScriptedTarget, s: Settings
) -> tuple[TogetherBoard, Experiment, RunStore]:
    """An experiment of arms together on the faked board, its calls recorded."""
    store = RunStore(tmp_path / "run", record(s))
    board = TogetherBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    board.calls, board.swaps = [], []
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    return board, exp, store


def together(tmp_path: Path, target: ScriptedTarget, s: Settings, *arms: str) -> RunRecord:
    board, exp, store = together_experiment(tmp_path, target, s)
    for arm in arms:
        exp.arm(arm)
    board.restore()
    assert board.calls == [
        ("ngram", False),  # the first baseline start is the original as it serves
        *([("ngram", True)] if s.run.repeats > 1 else []),  # a local original restarted
    ]
    return store.record


def test_arms_together_alternate_per_slot_and_never_overlap(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, samples=4, run_extra='arms = "together"\nconcurrency = [1, 2]')
    fast = Script({p: Speed(gap_s=0.005) for p in ("the coding prompt", "the math prompt")})
    target = ScriptedTarget(Script(), {"ngram": fast})
    rec = together(tmp_path, target, s, "ngram")
    base, cand = rec.phases[BASELINE], rec.phases["ngram"]
    assert (base.together_with, cand.together_with) == ("ngram", BASELINE)
    assert cand.service.endswith("'ngram'") and base.order_seed == cand.order_seed
    # every slot went to both, the first of the two alternating, recorded on both phases
    assert base.sent_first == cand.sent_first and len(cand.sent_first) == len(set(_slots(cand)))
    assert set(cand.sent_first) == {BASELINE, "ngram"}
    assert all(a != b for a, b in zip(cand.sent_first, cand.sent_first[1:], strict=False))
    for k, first in enumerate(cand.sent_first):
        a = min(x.started_at for x in _slot_samples(base, k))
        b = min(x.started_at for x in _slot_samples(cand, k))
        assert (a < b) == (first == BASELINE)
    # never both at once: no stream on one server overlaps a stream on the other
    mine = [(n, t0, t1) for n, t0, t1 in target.streams]
    on_a = [(t0, t1) for n, t0, t1 in mine if n == "original"]
    on_b = [(t0, t1) for n, t0, t1 in mine if n == "ngram"]
    assert on_a and on_b
    assert not any(a0 < b1 and b0 < a1 for a0, a1 in on_a for b0, b1 in on_b)
    # at c2 a burst of two in flight on one server: the level's own load, not the other's
    assert any(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in itertools.pairwise(on_a))
    # two phases as one at a time records them: the analysis compares them as it does
    verdicts = analyze(rec).verdicts["ngram"]
    assert set(verdicts) == {"coding@c1", "coding@c2", "math@c1", "math@c2"}
    assert "start ngram beside" in target.events and "stop ngram beside" in target.events


def test_repeats_together_restart_a_local_original_for_the_second_pair(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, samples=2, run_extra='arms = "together"\nrepeats = 2')
    rec = together(tmp_path, ScriptedTarget(Script()), s, "ngram")
    assert [(p.name, p.together_with) for p in rec.phases.values()] == [
        ("baseline", "ngram"),
        ("ngram", "baseline"),
        ("baseline#2", "ngram#2"),
        ("ngram#2", "baseline#2"),
    ]
    # each pair's places recorded (this board cannot swap them: the first's, each time)
    assert [p.position for p in rec.phases.values()] == [0, 1, 0, 1]


def test_the_places_alternate_between_pairs(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, samples=2, run_extra='arms = "together"\nrepeats = 3')
    board, exp, _ = together_experiment(tmp_path, ScriptedTarget(Script()), s)
    exp.arm("ngram")
    board.restore()
    assert board.swaps == [False, True, False]


def test_a_candidate_that_cannot_start_beside_leaves_the_baseline_measured_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "run").mkdir()
    s = settings(tmp_path, samples=2, run_extra='arms = "together"')
    target = ScriptedTarget(Script(), {"ngram": Script(crash_at_start="CUDA out of memory")})
    board, exp, store = together_experiment(tmp_path, target, s)
    base = exp.arm(BASELINE)
    assert board.calls == [("ngram", False)]
    assert "CUDA out of memory" in store.record.failures["ngram"]
    assert base.measurements["coding"].samples
    assert store.record.phases[BASELINE].together_with is None
    board.restore()


def _slots(phase: Phase) -> list[int]:
    return [x.slot for m in phase.measurements.values() for x in m.samples if x.slot is not None]


def _slot_samples(phase: Phase, k: int) -> list:
    return [x for m in phase.measurements.values() for x in m.samples if x.slot == k]


def _slot(sample) -> int:
    return sample.slot


def test_throughput_against_time_draws_a_panel_per_start(tmp_path: Path) -> None:
    import matplotlib.image

    from pytest_specdecode.report.plots import throughput_over_time

    s = three_types(tmp_path)
    target = ScriptedTarget(Script(), {"ngram": Script()})
    rec = measure_arms(target, s, tmp_path, BASELINE, "ngram").record
    one = throughput_over_time(_only(rec, BASELINE), tmp_path / "one.png")
    two = throughput_over_time(rec, tmp_path / "two.png")
    assert one is not None and two is not None
    small, tall = matplotlib.image.imread(one), matplotlib.image.imread(two)
    assert tall.shape[0] > small.shape[0] and tall.shape[1] == small.shape[1]  # a panel a start
    assert tall[..., :3].std() > 0.05  # something was drawn
    assert throughput_over_time(_only(rec), tmp_path / "none.png") is None


def _only(rec: RunRecord, *names: str) -> RunRecord:
    out = RunRecord.from_json(rec.to_json())
    out.phases = {n: p for n, p in out.phases.items() if n in names}
    return out


def test_the_order_and_the_arms_are_validated_and_planned(tmp_path: Path) -> None:
    import pytest

    from pytest_specdecode.config.settings import RunConfig
    from pytest_specdecode.errors import ConfigError
    from pytest_specdecode.report.plan import order_lines, phase_order

    assert RunConfig().order == "interleaved" and RunConfig().arms == "auto"
    for bad in ('order = "random"', 'arms = "both"', 'seed = "x"'):
        with pytest.raises(ConfigError, match=bad.split(" ")[0]):
            settings(tmp_path, run_extra=bad)
    (line,) = order_lines(RunConfig())
    assert line.startswith("within a start: interleaved") and "seed 0" in line
    s = settings(tmp_path, run_extra='order = "blocked"\narms = "together"\nrepeats = 2')
    blocked, beside = order_lines(s.run)
    assert "blocked" in blocked and beside.startswith("arms side by side")
    assert phase_order(s, baseline=True, aba=False) == [
        "baseline", "ngram", "baseline#2", "ngram#2"
    ]  # fmt: skip
