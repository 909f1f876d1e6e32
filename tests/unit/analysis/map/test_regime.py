"""The regime window (issue 41): beside two or more, the baseline is first measured with one
server beside it, before the others start; the run compares it with the same start beside them
all, says where that slowed it beyond the tolerance, and the next plan serves fewer beside."""

from __future__ import annotations

import json
import math
from pathlib import Path

from pytest_specdecode.analysis.map.regime import (
    FASTER,
    SLOWED,
    WITHIN,
    Regime,
    RegimeFigure,
    fallback_beside,
    regime_of,
)
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import RunStore

from ....support.scripted_target import Script, ScriptedTarget, Speed
from ....support.synthetic import record, settings
from ...measure.test_beside_many import ManyBoard, three_specs
from ...targets.test_arms_together import H200, alive, local_target, sleeping_vllm  # noqa: F401

K = [f'{{"method":"ngram","num_speculative_tokens":{k}}}' for k in (2, 3, 4)]
NAMES = ["ngram-k2", "ngram-k3", "ngram-k4"]
PROMPTS = ("the coding prompt", "the math prompt")


def _run(tmp_path: Path, *, crowded: float, slots: int = 2) -> tuple[RunRecord, ManyBoard]:
    """Three candidates beside one baseline start on the scripted target; the original slowed
    by `crowded` a gap per server beside beyond the first."""
    (tmp_path / "run").mkdir(parents=True)
    s = settings(
        tmp_path,
        candidates=K,
        samples=4,
        run_extra=f'arms = "together"\nbeside = 3\nregime_slots = {slots}',
    )
    original = Script({p: Speed(gap_s=0.004) for p in PROMPTS}, crowded=crowded)
    scripts = {n: Script({p: Speed(gap_s=0.005) for p in PROMPTS}) for n in NAMES}
    target = ScriptedTarget(original, scripts)
    store = RunStore(tmp_path / "run", record(s))
    board = ManyBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    for name in NAMES:
        exp.arm(name)
    board.restore()
    return RunRecord.from_json(json.loads(store.path.read_text())), board


def test_the_regime_window_is_sent_beside_one_before_the_others_start(tmp_path: Path) -> None:
    rec, board = _run(tmp_path, crowded=0.0, slots=2)
    window = rec.regime
    assert window is not None  # kept through results.json
    assert (window.phase, window.beside, window.neighbour) == (BASELINE, 3, NAMES[0])
    assert sorted(window.measurements) == ["coding", "math"]
    assert all(len(m.samples) == 2 for m in window.measurements.values())  # the slots asked
    second_started = dict(board.started)[NAMES[1]]
    streams = board.target.streams  # type: ignore[attr-defined]
    before = [name for name, t0, _ in streams if t0 < second_started]
    assert set(before) == {"original", NAMES[0]}  # beside one only
    sent = sum(len(m.samples) + len(m.warmup) for m in window.measurements.values())
    assert before.count("original") == sent  # all of the window, none of the main rounds
    main = rec.phases[BASELINE].measurements.values()
    assert len(streams) - len(before) > sum(len(m.samples) for m in main)  # then beside three


def test_the_regime_window_enters_no_phase_and_no_verdict(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, crowded=0.0, slots=2)
    assert not [p for p in rec.phases if "regime" in p]
    base = rec.phases[BASELINE]
    found = analyze(rec)
    for name in NAMES:
        for key, verdict in found.verdicts[name].items():
            assert verdict.throughput.n_baseline == len(base.measurements[key].samples)
    lines = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    labels = {json.loads(line)["phase"] for line in lines}
    assert f"{BASELINE}@regime" in labels  # journalled, marked as the regime's


def test_the_baseline_slowed_beside_three_is_named_beyond_the_tolerance(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, crowded=0.5, slots=2)  # beside three: each step two gaps
    regime = analyze(rec).regime
    assert regime is not None and regime.state == SLOWED
    assert regime.pooled.high < 1 - regime.tolerance
    assert 0.4 < regime.pooled.ratio < 0.8  # tokens per second: about halved, the TTFT aside
    assert set(regime.cells) == {"coding", "math"}
    text = regime.text()
    assert f"{1 - regime.pooled.ratio:.0%} slower beside 3 servers than beside one" in text
    assert "another regime than production's" in text
    assert analyze(rec).to_json()["regime"]["state"] == SLOWED


def test_the_baseline_beside_three_as_fast_as_beside_one_is_within(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, crowded=0.0, slots=1)
    regime = regime_of(rec)
    assert regime is not None and regime.state == WITHIN
    assert "within 5% of its speed beside one" in regime.text()


def test_the_baseline_faster_beside_all_is_beyond_on_the_fast_side_not_within() -> None:
    # the H100 on 2026-12-07 (SmolLM2, beside 5): 1.24x [1.10, 1.39] was printed as "within 5%"
    regime = _regime(5, 1.24, half=0.12)
    assert regime.state == FASTER and not regime.slowed
    text = regime.text()
    assert "24% faster beside 5 servers than beside one" in text
    assert "within 5% of its speed" not in text
    assert fallback_beside(5, [("r", regime)]) == (5, None)


def test_no_regime_window_with_one_beside_nor_with_none_asked(tmp_path: Path) -> None:
    rec, _ = _run(tmp_path, crowded=0.5, slots=0)
    assert rec.regime is None and analyze(rec).regime is None


def _regime(beside: int, ratio: float, half: float = 0.02) -> Regime:
    figure = RegimeFigure(ratio, ratio - half, ratio + half, 8, 32)
    return Regime(BASELINE, beside, "ngram-k2", 0.05, 0.9, figure)


def test_the_plan_falls_back_to_the_largest_n_measured_within_the_tolerance() -> None:
    assert fallback_beside(5, []) == (5, None)
    assert fallback_beside(5, [("r1", _regime(5, 0.99))]) == (5, None)
    chosen, why = fallback_beside(5, [("r2", _regime(5, 0.72))])
    assert chosen == 1 and why is not None
    assert "the stored run r2 measured the baseline 28% slower beside 5 servers" in why
    chosen, why = fallback_beside(5, [("r2", _regime(5, 0.72)), ("r1", _regime(3, 0.99))])
    assert chosen == 3 and why is not None and "beside 3 the run r1" in why
    # the newest measurement of an N stands: a later run within the tolerance lifts it
    assert fallback_beside(5, [("r3", _regime(5, 1.0)), ("r2", _regime(5, 0.72))]) == (5, None)
    # an interval across the tolerance is no reason to fall back
    assert fallback_beside(5, [("r2", _regime(5, 0.95, half=0.05))]) == (5, None)
    # asked for fewer than the slowed N: as asked
    assert fallback_beside(2, [("r2", _regime(5, 0.72))]) == (2, None)


def test_the_reports_say_the_regime_and_mark_what_was_measured_in_it(tmp_path: Path) -> None:
    from pytest_specdecode.report import html, markdown, terminal

    rec, _ = _run(tmp_path, crowded=0.5, slots=2)
    found = analyze(rec)
    assert found.regime is not None
    said = found.regime.text()
    md = markdown.summary(rec, found)
    assert said in md and "· ⚠ measured in a slowed regime" in md
    assert md.index(said) < md.index(f"### {NAMES[0]}")  # at the top, before the tables
    page = html.summary(rec, found, None)
    assert "the baseline ran" in page and "measured in a slowed regime" in page
    lines = terminal.lines(rec, found, files={})
    assert f"warning: Regime: {said}." in lines
    assert f"  {NAMES[1]}: measured in a slowed regime" in lines
    calm, _ = _run(tmp_path / "calm", crowded=0.0, slots=1)
    quiet = analyze(calm)
    assert "slowed regime" not in markdown.summary(calm, quiet)
    assert any(line.startswith("Regime: the baseline beside 3") for line in
               terminal.lines(calm, quiet, files={}))  # fmt: skip


class Host:
    """A target as the plan's key reads it: its host's name."""

    host_name = "localhost"


def test_the_next_plan_on_the_machine_serves_fewer_beside_and_says_why(tmp_path: Path) -> None:
    import shutil

    from pytest_specdecode.run.arms import with_regime
    from pytest_specdecode.run.host_noise import HostNoise

    rec, _ = _run(tmp_path / "slowed", crowded=0.5, slots=2)
    s = settings(tmp_path, candidates=K, run_extra='arms = "together"\nbeside = 3')
    stored = s.reports_dir / "20261204-2100-map"
    stored.parent.mkdir(parents=True)
    shutil.copytree(tmp_path / "slowed" / "run", stored)  # a stored run of this host and model
    host = HostNoise(s, profiles=tmp_path / "profiles", run_dir=s.reports_dir / "next",
                     progress=lambda _: None, facts=lambda: None)  # fmt: skip
    host._machine = {"gpus": None}  # the serving host's, as the stored run recorded it
    found = host.regimes(Host())  # type: ignore[arg-type]
    assert [name for name, _ in found] == [stored.name] and found[0][1].slowed
    fewer, why = with_regime(s, lambda: found)
    assert fewer.run.beside == 1 and why is not None
    assert why.startswith(f"1 beside the baseline, not 3: the stored run {stored.name} measured")
    assert "slower beside 3 servers than beside one (tolerance 5%)" in why
    # judged against this run's tolerance: a looser one keeps all three beside
    loose = settings(tmp_path, candidates=K,
                     run_extra='arms = "together"\nbeside = 3\nregime_tolerance = 0.9')  # fmt: skip
    host.settings = loose
    assert with_regime(loose, lambda: host.regimes(Host())) == (loose, None)  # type: ignore[arg-type]
    host.settings = s
    # another accelerator's stored run is not this machine's
    host._machine = {"gpus": ["0: NVIDIA H200, 143771 MiB, driver 580.159.04"]}
    assert host.regimes(Host()) == []  # type: ignore[arg-type]
    # one at a time, or one beside: nothing to fall back from
    one = settings(tmp_path, candidates=K, run_extra='arms = "together"\nbeside = 1')
    assert with_regime(one, lambda: found) == (one, None)
    assert rec.regime is not None and rec.regime.beside == 3


def test_the_figure_pairs_by_prompt_so_the_window_s_few_prompts_weigh_no_prompt_level() -> None:
    import dataclasses
    import random

    from pytest_specdecode.analysis.map.regime import regime_figure
    from pytest_specdecode.record.measurement import Measurement

    from ....support.synthetic import sample

    level = {("coding", i): 100.0 * (1 + 0.5 * i) for i in range(8)}  # prompts far apart
    level |= {("math", i): 60.0 * (1 + 0.3 * i) for i in range(8)}

    def cell(rng: random.Random, key: str, prompts: range, factor: float) -> Measurement:
        m = Measurement(key)
        for i in prompts:
            tps = level[(key, i)] * factor * math.exp(rng.gauss(0, 0.02))
            m.samples.append(dataclasses.replace(sample(key, "b", i, tps), prompt_index=i))
        return m

    def cells(seed: int) -> list:
        rng = random.Random(seed)
        return [(k, cell(rng, k, range(2), 1.0), cell(rng, k, range(8), 0.8))
                for k in ("coding", "math")]  # fmt: skip

    found = [regime_figure(cells(seed), 0.9) for seed in range(400)]
    assert all(f is not None and (f.n_one, f.n_beside) == (4, 16) for f in found)
    covered = sum(f.low < 0.8 < f.high for f in found if f) / len(found)
    assert 0.86 < covered < 0.94  # the 90% interval covers the true 0.8 nine times in ten
    # the prompts' own levels, not removed, would have called the baseline faster beside N
    plain = cells(0)
    for _, a, b in plain:
        for x in (*a.samples, *b.samples):
            x.prompt_index = None
    unpaired = regime_figure(plain, 0.9)
    assert unpaired is not None and unpaired.ratio > 1.0


def test_the_map_measured_beside_n_in_a_slowed_regime_says_so(tmp_path: Path) -> None:
    import dataclasses
    from types import SimpleNamespace

    from pytest_specdecode.report.sections import break_even

    rec, _ = _run(tmp_path, crowded=0.5, slots=1)
    found = analyze(rec)
    a_map = SimpleNamespace(overall=[], drafting="synthetic")  # the lines read only these
    slowed = dataclasses.replace(found, break_even=a_map)
    assert break_even.lines(slowed)[0].startswith("The map was measured in a slowed regime: ")
    calm = dataclasses.replace(slowed, regime=None)
    assert not any("slowed regime" in line for line in break_even.lines(calm))


def test_together_all_calls_the_regime_window_once_the_first_serves_before_the_others(
    tmp_path: Path,
    sleeping_vllm: None,  # noqa: F811
) -> None:
    from pytest_specdecode.targets.lifecycle import experiment_services

    target = local_target(tmp_path, gpus=(H200,))
    specs = three_specs()
    lines: list[str] = []
    seen: list[tuple[bool, bool, list[str]]] = []

    def window(original, first) -> None:  # type: ignore[no-untyped-def]
        started = [line.split("'")[1] for line in lines if "process 'beside-" in line]
        seen.append((alive(original.pid), alive(first.pid), started))

    with (
        experiment_services(
            target, ready_timeout_s=5, restore_timeout_s=30, progress=lines.append
        ) as board,  # fmt: skip
        board.together_all(specs, restart_original=False, first_beside=window) as (_, seconds),
    ):
        assert len(seconds) == 3 and all(alive(s.pid) for s in seconds)
    assert len(seen) == 1  # once, beside the first only
    original_alive, first_alive, started = seen[0]
    assert original_alive and first_alive
    assert set(started) == {f"beside-{NAMES[0]}"}  # the others not yet started


def test_the_regime_s_settings_are_checked(tmp_path: Path) -> None:
    import pytest

    from pytest_specdecode.errors import ConfigError

    # the default, defined once: sized by the plan (test_regime_size.py), 4 where none sized it
    assert settings(tmp_path).run.regime_slots is None
    assert settings(tmp_path).run.regime_window_slots == 4
    with pytest.raises(ConfigError, match="regime_tolerance must be in"):
        settings(tmp_path, run_extra="regime_tolerance = 1.5")
    with pytest.raises(ConfigError, match="regime_slots must be an integer >= 0"):
        settings(tmp_path, run_extra="regime_slots = -1")
