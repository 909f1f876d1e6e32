"""The drafter check at run time: a candidate whose drafter has a model sends its first requests
before its timed windows; acceptance near zero stops it, as a failed start does, and the
original is restored. Seen on the embedded CPU vLLM 0.32: a draft model cut to SmolLM2-135M's
first 6 layers started, served, and counted 5 of 555 draft tokens accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.drafters.health import (
    MIN_DRAFT_TOKENS,
    MOST_ROUNDS,
    drafter_health,
    first_prompts,
    judged,
)
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.settings import Settings
from pytest_specdecode.errors import BrokenDrafter, ConfigError
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.record.counters import Acceptance, from_counts
from pytest_specdecode.record.drafter_check import BROKEN, HEALTHY, NO_COUNTERS, TOO_FEW
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.report.rows import checks
from pytest_specdecode.targets.lifecycle import experiment_services

from ....support.scripted_target import Script, ScriptedTarget, Speed
from ....support.synthetic import record, settings
from ...measure.test_beside_many import ManyBoard
from ...measure.test_interleaved_order import together_experiment

DRAFT = '{"method": "draft_model", "model": "/m/cut-6-layers", "num_speculative_tokens": 3}'
DRAFT_NAME = "draft_model-k3"
PROMPTS = {"coding": "the coding prompt", "math": "the math prompt"}


# -- the rule, pure -------------------------------------------------------------------------------


def test_the_cut_drafter_seen_on_the_cpu_is_broken_and_the_message_says_what_to_check() -> None:
    acc = from_counts(185, 555, 5, [5, 0, 0])  # vLLM 0.32's counters for the cut drafter
    health = drafter_health("draft_model", 3, acc, floor=0.05)
    assert health.verdict == BROKEN
    assert health.per_position == (5, 0, 0)
    assert "5 of 555 draft tokens accepted (0.9%)" in health.text
    assert "[5, 0, 0]" in health.text
    assert "tokenizer" in health.text and "family" in health.text


def test_an_eagle3_head_near_zero_names_the_aux_ids_and_the_vocabulary() -> None:
    acc = from_counts(400, 1200, 14, [12, 2, 0])  # 1.2%, as vllm#50170
    health = drafter_health("eagle3", 3, acc, floor=0.05)
    assert health.verdict == BROKEN
    for named in ("eagle_aux_hidden_state_layer_ids", "d2t", "vllm#50170", "45%"):
        assert named in health.text


@pytest.mark.parametrize(
    ("tokens", "accepted", "floor", "verdict"),
    [
        (300, 60, 0.05, HEALTHY),  # 20%
        (300, 15, 0.05, HEALTHY),  # at the floor
        (300, 14, 0.05, BROKEN),  # below it
        (300, 14, 0.01, HEALTHY),  # a lower floor set
        (MIN_DRAFT_TOKENS - 1, 0, 0.05, TOO_FEW),  # nothing accepted, but too few to say
    ],
)
def test_the_floor_and_the_least_draft_tokens(
    tokens: int, accepted: int, floor: float, verdict: str
) -> None:
    acc = from_counts(tokens / 3, tokens, accepted, [accepted])
    assert drafter_health("draft_model", 3, acc, floor=floor).verdict == verdict


def test_a_server_without_counters_is_not_judged() -> None:
    health = drafter_health("eagle3", 3, Acceptance(present=False), floor=0.05)
    assert health.verdict == NO_COUNTERS and not health.more


@pytest.mark.parametrize(
    ("values", "checked"),
    [
        ({"method": "draft_model", "model": "/m"}, True),
        ({"method": "eagle3", "model": "/h"}, True),
        ({"method": "deepseek_mtp"}, True),
        ({"method": "ngram", "prompt_lookup_max": 4}, False),
        ({"method": "suffix"}, False),
        ({"method": "eagle3", "model": "/h", "synthetic_acceptance_rates": [0.0]}, False),
        (None, False),
    ],
)
def test_which_candidates_are_checked(values: dict | None, checked: bool) -> None:
    assert judged(values) is checked


def test_the_check_sends_each_prompt_types_first_prompts_in_turn() -> None:
    assert first_prompts([("coding", 3), ("math", 1)], 4) == [
        ("coding", 0), ("math", 0), ("coding", 1), ("math", 0),
    ]  # fmt: skip


def test_the_settings_are_checked(tmp_path: Path) -> None:
    s = settings(tmp_path, run_extra="drafter_floor = 0.1\ndrafter_check_requests = 2")
    assert (s.run.drafter_floor, s.run.drafter_check_requests) == (0.1, 2)
    with pytest.raises(ConfigError, match="drafter_floor"):
        settings(tmp_path, run_extra="drafter_floor = 1.5")
    with pytest.raises(ConfigError, match="drafter_check_requests"):
        settings(tmp_path, run_extra="drafter_check_requests = -1")


# -- wired: the scripted target's counters --------------------------------------------------------


def _settings(tmp_path: Path, candidate: str = DRAFT) -> Settings:
    return settings(tmp_path, candidates=[candidate], prompts=PROMPTS)


def _run(
    target: ScriptedTarget, s: Settings, where: Path, *arms: str
) -> tuple[RunStore, dict[str, Exception]]:
    """Each arm measured in order under the restore; the arms' errors, by arm."""
    (where / "run").mkdir()
    store = RunStore(where / "run", record(s))
    errors: dict[str, Exception] = {}
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    ) as board:  # fmt: skip
        exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
        for arm in arms:
            try:
                exp.arm(arm)
            except Exception as exc:
                errors[arm] = exc
    return store, errors


def _streams(target: ScriptedTarget, name: str) -> int:
    return sum(1 for service, _, _ in target.streams if service == name)


def _drafter(speed: Speed, drafted: int = 0) -> Script:
    return Script(speeds={p: speed for p in PROMPTS.values()}, drafted=drafted)


def test_a_drafter_accepting_nothing_is_stopped_before_its_windows_and_the_original_restored(
    tmp_path: Path,
) -> None:
    # 39 decode steps a request, 3 draft tokens each, none accepted
    broken = _drafter(Speed(tokens=40, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: broken}, running=True)
    s = _settings(tmp_path)
    store, errors = _run(target, s, tmp_path, "baseline", DRAFT_NAME)
    exc = errors[DRAFT_NAME]
    assert isinstance(exc, BrokenDrafter)
    text = str(exc)
    assert "stopped by the drafter check before its timed windows" in text
    assert "0 of 468 draft tokens accepted (0.0%)" in text
    assert "tokenizer" in text and DRAFT_NAME in text and "scripted service" in text
    # only the check's requests reached it: no warm-up, no window, no phase
    assert _streams(target, DRAFT_NAME) == s.run.drafter_check_requests
    assert DRAFT_NAME not in store.record.phases
    assert "drafter check" in store.record.failures[DRAFT_NAME]
    # the restore: the original serves again, the candidate stopped
    assert [e for e in target.events if e.startswith(("start", "stop"))] == [
        "stop original",  # the baseline measured as it ran
        f"start {DRAFT_NAME}",
        f"stop {DRAFT_NAME}",
        "start original",  # the restore
    ]
    assert target.original().is_active()
    # the figures, through results.json, and the report's warning
    saved = RunRecord.from_json(json.loads((tmp_path / "run" / "results.json").read_text()))
    check = saved.drafter_checks[DRAFT_NAME]
    assert (check.verdict, check.requests, check.acceptance.draft_tokens) == (BROKEN, 4, 468)
    assert check.per_position == [0.0, 0.0, 0.0]
    warnings = analyze(saved).warnings
    assert any("stopped by the drafter check before its timed windows" in w for w in warnings)


def test_a_healthy_drafter_goes_on_and_its_check_enters_no_window(tmp_path: Path) -> None:
    healthy = _drafter(Speed(tokens=40, tokens_per_chunk=3))
    target = ScriptedTarget(Script(), {DRAFT_NAME: healthy})
    s = _settings(tmp_path)
    store, errors = _run(target, s, tmp_path, "baseline", DRAFT_NAME)
    assert not errors
    check = store.record.drafter_checks[DRAFT_NAME]
    assert check.verdict == HEALTHY and check.acceptance.draft_acceptance_rate == 1.0
    phase = store.record.phases[DRAFT_NAME]
    sent = sum(len(m.samples) + len(m.warmup) for m in phase.measurements.values())
    assert _streams(target, DRAFT_NAME) == sent + s.run.drafter_check_requests
    # the windows' counters begin after the check: their drafts are their own (13 steps a
    # request: 1 token, then 13 of 3)
    measured = sum(len(m.samples) for m in phase.measurements.values())
    assert phase.acceptance.drafts == measured * 13
    assert check.acceptance.drafts == s.run.drafter_check_requests * 13
    assert all(m.samples for m in phase.measurements.values())
    shown = [c.text for c in checks(store.record, analyze(store.record))]
    assert any(t.startswith(f"Drafter check, {DRAFT_NAME} (4 requests") for t in shown)


def test_an_ngram_candidate_is_never_checked(tmp_path: Path) -> None:
    target = ScriptedTarget(Script(), {"ngram": _drafter(Speed(tokens_per_chunk=1), 3)})
    s = settings(tmp_path, candidates=["ngram"], prompts=PROMPTS)
    store, errors = _run(target, s, tmp_path, "baseline", "ngram")
    assert not errors and not store.record.drafter_checks
    assert "ngram" in store.record.phases


def test_too_few_drafted_asks_for_more_up_to_the_cap_then_says_so_and_goes_on(
    tmp_path: Path,
) -> None:
    # 2 decode steps a request, 3 draft tokens each: 6 a request, never 100 within the cap
    short = _drafter(Speed(tokens=3, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: short})
    s = _settings(tmp_path)
    store, errors = _run(target, s, tmp_path, "baseline", DRAFT_NAME)
    assert not errors
    check = store.record.drafter_checks[DRAFT_NAME]
    cap = MOST_ROUNDS * s.run.drafter_check_requests
    assert (check.verdict, check.requests) == (TOO_FEW, cap)
    assert check.acceptance.draft_tokens == cap * 6
    assert "not enough drafted to judge" in check.text
    assert DRAFT_NAME in store.record.phases
    warnings = analyze(store.record).warnings
    assert any("drafter check" in w and "not enough drafted" in w for w in warnings)


def test_more_requests_decide_where_the_first_ones_drafted_too_few(tmp_path: Path) -> None:
    # 7 decode steps a request, 3 draft tokens each: 84 after 4 requests, 168 after 8
    broken = _drafter(Speed(tokens=8, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: broken})
    s = _settings(tmp_path)
    store, errors = _run(target, s, tmp_path, "baseline", DRAFT_NAME)
    assert isinstance(errors[DRAFT_NAME], BrokenDrafter)
    check = store.record.drafter_checks[DRAFT_NAME]
    assert (check.requests, check.acceptance.draft_tokens) == (8, 168)


def test_a_check_of_no_requests_is_off(tmp_path: Path) -> None:
    broken = _drafter(Speed(tokens=40, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: broken})
    s = settings(
        tmp_path, candidates=[DRAFT], prompts=PROMPTS, run_extra="drafter_check_requests = 0"
    )
    store, errors = _run(target, s, tmp_path, "baseline", DRAFT_NAME)
    assert not errors and not store.record.drafter_checks


def test_beside_the_original_a_broken_drafter_fails_its_group_and_the_baseline_is_measured_alone(
    tmp_path: Path,
) -> None:
    (tmp_path / "run").mkdir()
    broken = _drafter(Speed(tokens=40, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: broken})
    s = settings(tmp_path, candidates=[DRAFT], prompts=PROMPTS, run_extra='arms = "together"')
    board, exp, store = together_experiment(tmp_path, target, s)
    with pytest.raises(BrokenDrafter, match="before its timed windows"):
        exp.arm(DRAFT_NAME)
    board.restore()
    assert _streams(target, DRAFT_NAME) == s.run.drafter_check_requests
    assert list(store.record.phases) == ["baseline"]  # measured alone, after the group failed
    assert all(m.samples for m in store.record.phases["baseline"].measurements.values())
    assert store.record.drafter_checks[DRAFT_NAME].verdict == BROKEN


def test_beside_others_a_broken_drafter_fails_its_own_arm_and_the_rest_are_measured(
    tmp_path: Path,
) -> None:
    """`beside = 2`: a broken draft model and an n-gram candidate served beside one baseline
    start. The broken one's arm fails; the n-gram one and the baseline are measured beside it,
    by pairs, in one group: no start is lost to another candidate's drafter."""
    (tmp_path / "run").mkdir()
    ngram = '{"method": "ngram", "num_speculative_tokens": 3}'
    broken = _drafter(Speed(tokens=40, tokens_per_chunk=1), drafted=3)
    target = ScriptedTarget(Script(), {DRAFT_NAME: broken, "ngram-k3": Script()})
    s = settings(
        tmp_path,
        candidates=[DRAFT, ngram],
        prompts=PROMPTS,
        run_extra='arms = "together"\nbeside = 2',
    )
    store = RunStore(tmp_path / "run", record(s))
    board = ManyBoard(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    )  # fmt: skip
    exp = Experiment(s, board, store, progress=lambda _: None, transports=target.transports())
    with pytest.raises(BrokenDrafter, match="before its timed windows"):
        exp.arm(DRAFT_NAME)
    exp.arm("ngram-k3")  # measured in the same group, not failed with it
    board.restore()
    rec = store.record
    assert [name for name, _ in board.started] == [DRAFT_NAME, "ngram-k3"]  # one group
    assert list(rec.phases) == ["baseline", "ngram-k3"]
    assert rec.phases["ngram-k3"].together_with == "baseline"
    assert rec.phases["ngram-k3"].position == 2  # its own place, the second beside
    assert all(m.samples for m in rec.phases["ngram-k3"].measurements.values())
    # no window of its own: the regime window's requests (the first beside serves in it, as
    # any neighbour does, before the others start) and the check's, nothing more
    assert rec.regime is not None and rec.regime.neighbour == DRAFT_NAME
    regime = sum(len(m.samples) + len(m.warmup) for m in rec.regime.measurements.values())
    assert _streams(target, DRAFT_NAME) == regime + s.run.drafter_check_requests
    assert set(rec.failures) == {DRAFT_NAME} and "drafter check" in rec.failures[DRAFT_NAME]
    assert "ngram-k3" in analyze(rec).verdicts
