"""The search as the run drives it, over scripted services on virtual time: slots resolved in
order, a stopped search's slots, the budget, and that no candidate is ever left running."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.search.policy import SearchPolicy
from pytest_specdecode.config.specconfig import BATCH_TABLE_KEY, SpecConfig
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.measure.search import SearchRun, SearchStopped
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.targets.lifecycle import experiment_services

from ....support import synthetic
from ....support.scripted_target import Script, ScriptedTarget, Speed

TEXT = "x = x + 1 ;"  # six words: the ids repeat every six tokens, so n-grams draft
PROMPTS = {"coding": "the coding prompt", "math": "the math prompt"}


def speculative(spec: SpecConfig) -> Script:
    """A config's speed: more draft tokens, more tokens a step, each step dearer."""
    k = int(spec.values["num_speculative_tokens"])
    speed = Speed(gap_s=0.010 * (1 + 0.05 * k), tokens=24, tokens_per_chunk=min(k, 3) + 1,
                  text=TEXT)  # fmt: skip
    return Script({p: speed for p in PROMPTS.values()}, token_ids=True)


def target(*, running: bool = True, **extra) -> ScriptedTarget:
    base = Speed(gap_s=0.010, tokens=24, text=TEXT)
    return ScriptedTarget(
        Script({p: base for p in PROMPTS.values()}, token_ids=True),
        running=running,
        speculative=extra.pop("speculative", speculative),
        **extra,
    )


@contextmanager
def search(
    tmp_path: Path, t: ScriptedTarget, *, max_reloads: int = 2, run_extra: str = ""
) -> Iterator[SearchRun]:
    s = synthetic.settings(tmp_path, candidates=(), samples=4, prompts=PROMPTS, run_extra=run_extra)
    (tmp_path / "run").mkdir()
    store = RunStore(tmp_path / "run", synthetic.record(s))
    with experiment_services(
        t, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=t.transports().sync, clock=t.time.clock,
    ) as board:  # fmt: skip
        exp = Experiment(s, board, store, progress=lambda _: None, transports=t.transports())
        yield SearchRun(
            exp,
            method="ngram",
            max_reloads=max_reloads,
            margin=0.03,
            stored=list,
            prepare=lambda spec: spec,
            progress=lambda _: None,
        )


def no_candidate_running(t: ScriptedTarget) -> bool:
    return t.candidates != [] and not any(c.active for c in t.candidates)


def test_slots_resolve_in_order_and_the_original_is_restored(tmp_path: Path) -> None:
    t = target()
    with search(tmp_path, t, max_reloads=2) as run:
        assert run.arm(1) == "search-1"
        assert [r.arm for r in run.record.search.reloads] == ["search-1"]  # type: ignore[union-attr]
        run.complete()
        search_ = run.record.search
        assert search_ is not None and search_.reloads[0].kind == "teach"
        names = [r.arm for r in search_.reloads]
        assert names == ["search-1", "search-2"] or search_.stopped
        with pytest.raises(SearchStopped, match="there is no slot 3: the budget is 2"):
            run.arm(3)
    assert no_candidate_running(t)
    assert t.events[-2:] == ["start original", "close"] and t.serving is not None
    assert t.serving.name == "original"


def test_a_search_that_stops_skips_its_later_slots_with_the_reason(tmp_path: Path) -> None:
    t = target()
    with search(tmp_path, t, max_reloads=3) as run:
        run.arm(1)
        run._policy = SearchPolicy(margin=10.0, max_reloads=3)  # nothing reaches +1000%
        with pytest.raises(SearchStopped) as stopped:
            run.arm(2)
        assert "no untried config is predicted to beat the best measured" in str(stopped.value)
        assert run.record.search.stopped == str(stopped.value)  # type: ignore[union-attr]
        with pytest.raises(SearchStopped):
            run.arm(3)
    assert no_candidate_running(t)


def test_an_exception_mid_search_leaves_no_candidate_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = target()
    calls = []
    real = SearchPolicy.next

    def next_or_fail(self, record, verdicts, **kw):
        calls.append(record.measured_candidates)
        if len(calls) == 2:  # while search-1 is the service running
            assert t.serving is not None and t.serving.name == "search-1"
            raise RuntimeError("the policy failed while choosing search-2")
        return real(self, record, verdicts, **kw)

    monkeypatch.setattr(SearchPolicy, "next", next_or_fail)
    with (
        pytest.raises(RuntimeError, match="while choosing search-2"),
        search(tmp_path, t, max_reloads=3) as run,
    ):
        assert run.arm(1) == "search-1"
        try:
            run.arm(2)
        finally:
            why = "choosing reload 2 failed: RuntimeError: the policy failed while choosing"
            assert run.record.search.stopped.startswith(why)  # type: ignore[union-attr]
            with pytest.raises(SearchStopped, match="choosing reload 2 failed"):
                run.arm(3)
            assert t.serving is not None and t.serving.name == "search-1"  # until the restore
    assert calls == [[], ["search-1"]]
    assert no_candidate_running(t)
    assert t.events[-3:] == ["stop search-1", "start original", "close"]


def test_a_reload_that_fails_is_raised_for_its_slot_and_stops_the_search(tmp_path: Path) -> None:
    def crashes(spec: SpecConfig) -> Script:
        return Script(crash_at_start="ValueError: num_speculative_tokens too large")

    t = target(speculative=crashes)
    with search(tmp_path, t, max_reloads=2) as run:
        with pytest.raises(Exception, match="num_speculative_tokens too large"):
            run.arm(1)
        with pytest.raises(SearchStopped, match=r"search-1 \(k=\d n=\d\.\.\d\) failed: "):
            run.arm(2)
        assert "search-1" in run.record.failures
    assert no_candidate_running(t)
    assert t.events[-2:] == ["start original", "close"]


def pays(batch_cost: float = 0.0):
    """Configs that pay at c1: each k drafts more tokens a step for a little more per step;
    `batch_cost` x k: each step dearer per request in flight (speculation loses in a batch)."""

    def script(spec: SpecConfig) -> Script:
        k = int(spec.values.get("num_speculative_tokens", 1))
        speed = Speed(gap_s=0.010 * (1 + 0.02 * k), tokens=24, tokens_per_chunk=min(k, 3) + 1,
                      text=TEXT)  # fmt: skip
        return Script({p: speed for p in PROMPTS.values()}, token_ids=True,
                      batch_cost=batch_cost * k)  # fmt: skip

    return script


def test_the_reload_budget_is_spent_and_never_exceeded(tmp_path: Path) -> None:
    t = target(speculative=pays())
    with search(tmp_path, t, max_reloads=2) as run:
        run.complete()
        found = run.record.search
        assert found is not None and found.used == 2 and found.stopped is None
        assert [r.kind for r in found.reloads] == ["teach", "predicted best"]
        with pytest.raises(SearchStopped, match="there is no slot 3: the budget is 2"):
            run.arm(3)
        run.complete()  # asked again: nothing more is started
    assert [c.name for c in t.candidates] == ["search-1", "search-2"]
    assert no_candidate_running(t)
    answer = analyze(run.record).search
    assert answer is not None and "Reloads: 2 of 2." in answer.paragraph
    assert "The search stopped" not in answer.paragraph
    # One start per arm, the restart noise assumed (5%): faster, but no verdict is improved.
    best = max((w for w in answer.winners.values() if w), key=lambda w: w.ratio)
    assert best.on and not best.shown and answer.recommended is None
    assert answer.paragraph.startswith("Not shown faster: no config's verdict is improved")
    assert f"The best found, {best.label} ({best.arm}): measured +" in answer.paragraph
    open_ = next(v for v in best.verdicts if v.undecided)
    design = open_.reason.split("; ", 1)[1]  # e.g. "take more requests", or starts per arm
    assert "To settle it, measure it alone (--spec-config '{" in answer.paragraph
    assert f"): on {open_.prompt_type}, {design}." in answer.paragraph


def test_the_search_stops_when_no_untried_config_beats_the_best_by_the_margin(
    tmp_path: Path,
) -> None:
    t = target(speculative=pays())
    with search(tmp_path, t, max_reloads=3) as run:
        run.complete()
        found = run.record.search
        assert found is not None and found.used < 3
        assert found.stopped is not None
        assert found.stopped.startswith(
            "no untried config is predicted to beat the best measured by the margin (+3%)"
        )
        with pytest.raises(SearchStopped, match="no untried config is predicted"):
            run.arm(3)
    assert len(t.candidates) == found.used
    assert no_candidate_running(t)
    answer = analyze(run.record).search
    assert answer is not None
    assert f"Reloads: {found.used} of 3. The search stopped: no untried config" in (
        answer.paragraph
    )


def test_the_choice_is_made_per_level_and_a_changing_best_is_measured_as_a_schedule(
    tmp_path: Path,
) -> None:
    # Speculation pays alone (c1) and costs in a batch (c4): the best changes with load.
    t = target(speculative=pays(batch_cost=0.3))
    with search(tmp_path, t, max_reloads=3, run_extra="concurrency = [1, 4]") as run:
        run.complete()
        found = run.record.search
        assert found is not None and found.used == 3
        assert {k.split("@")[1] for r in found.reloads for k in r.predicted} == {"c1", "c4"}
        last = found.reloads[-1]
        assert last.kind == "schedule" and BATCH_TABLE_KEY in last.values
        table = last.values[BATCH_TABLE_KEY]
        assert table[0][0] == 1 and table[0][2] > 0  # speculation on alone
        assert table[-1][2] == 0  # and off in the largest batches
    assert no_candidate_running(t)
    answer = analyze(run.record).search
    assert answer is not None
    winners = answer.winners
    assert winners["c1"] is not None and winners["c1"].on
    assert winners["c4"] is None or not winners["c4"].on
    # "Turn on" only where the verdict is improved: with the restart noise assumed, none is.
    assert not winners["c1"].shown and answer.recommended is None
    assert answer.paragraph.startswith("Not shown faster: ")
