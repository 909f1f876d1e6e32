"""The search policy over synthetic runs with a known step cost (support/search_sim.py)."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from pytest_specdecode.analysis.prediction.level_prediction import cost_prior
from pytest_specdecode.analysis.prediction.ngram_replay import replay_many
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings, RequestTokens
from pytest_specdecode.analysis.search.answer import schedule, search_answer
from pytest_specdecode.analysis.search.policy import Gain, Reload, SearchPolicy, Stop, _shapes
from pytest_specdecode.config.specconfig import BATCH_TABLE_KEY, check_spec_shape
from pytest_specdecode.record.schema import RunRecord

from ....support.search_sim import DATA, Truth, measure, run_search, search_record, verdicts

PAYS = Truth(cost={"c1": (0.1, 0.03)})  # n-gram pays on these prompts
COSTS = Truth(cost={"c1": (0.5, 0.1)})  # every speculative step costs half a step more
BY_LOAD = Truth(cost={"c1": (0.05, 0.02), "c4": (0.1, 0.25)}, t0={"c1": 0.016, "c4": 0.02})


def true_speedup(truth: Truth, s: NgramSettings, level: str = "c1") -> float:
    """The geometric mean over coding and math of the truth's speedup of a config."""
    b, c = truth.cost[level]
    logs = []
    for w in ("coding", "math"):
        ids = DATA["baseline"][w]
        r = replay_many(
            [RequestTokens.of(ids["prompt_ids"], ids["output_ids"], ids["lookahead_ids"])], s
        )
        n, t0 = len(ids["output_ids"]), truth.t0[level]
        tpot = t0 * (1 + b + c * r.draft_tokens_per_step) / r.decode_tokens_per_step
        logs.append(math.log((0.05 + (n - 1) * t0) / (0.05 + (n - 1) * tpot)))
    return math.exp(sum(logs) / len(logs))


def test_the_first_reload_teaches_the_cost_model_the_most(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    policy = SearchPolicy(margin=0.03)
    step = policy.next(rec, {})
    assert isinstance(step, Reload) and step.kind == "teach" and step.settings is not None
    assert step.predicted == {}  # the cost is unknown: no band yet
    shapes = _shapes(policy.predictions(rec), policy.configs)
    tau, m, _ = shapes[step.settings]
    # On the Pareto front: no config has as many tokens per step for fewer draft tokens.
    assert not any(t2 >= tau and m2 < m for t2, m2, _ in shapes.values())
    assert "lies mid-way" in step.why and "cost of a speculative step is unknown" in step.why


def test_a_stored_runs_prior_makes_the_first_reload_the_predicted_best(tmp_path: Path) -> None:
    stored = search_record(tmp_path / "a", PAYS)
    k2 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
    k6 = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
          "prompt_lookup_max": 4}  # fmt: skip
    measure(stored, "k2", k2, PAYS)
    measure(stored, "k6", k6, PAYS, seed=2)
    other_version = search_record(tmp_path / "b", PAYS)
    for phase in other_version.phases.values():
        phase.server_version = "0.31.0"
    measure(other_version, "k3", {"method": "ngram", "num_speculative_tokens": 3}, PAYS)
    rec = search_record(tmp_path / "c", PAYS, seed=5)
    prior = cost_prior([("20261201T100000Z-k2-k6", stored), ("old-vllm", other_version)], rec)
    assert prior["c1"].runs == ("20261201T100000Z-k2-k6",)  # same model, vLLM and GPUs only
    step = SearchPolicy(margin=0.03, prior=prior).next(rec, {})
    assert isinstance(step, Reload) and step.kind == "predicted best"
    assert "20261201T100000Z-k2-k6" in step.why and "over speculation off at c1" in step.why
    assert set(step.predicted) == {"coding", "math"}
    best = max(SearchPolicy(margin=0.03).configs, key=lambda s: true_speedup(PAYS, s))
    assert step.settings is not None
    assert true_speedup(PAYS, step.settings) >= 0.98 * true_speedup(PAYS, best)


def gain(value: float, high: float, *, separated: bool, k: int = 4) -> Gain:
    return Gain("c1", NgramSettings(k, 2, 3), value, value - 0.1, high, "search-1", separated)


def test_the_stopping_rule_against_the_margin_with_its_band(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    measure(rec, "search-1", {"method": "ngram", "num_speculative_tokens": 5}, PAYS)
    policy = SearchPolicy(margin=0.03)
    # The estimate reaches the margin: worth it, however the band lies.
    assert "at least the margin" in (policy._worth(gain(0.05, 0.2, separated=True), rec) or "")
    # Below it, but the band reaches it while one k (k=5) is measured: another k teaches.
    why = policy._worth(gain(0.01, 0.2, separated=False), rec)
    assert why is not None and "k=4 separates fixed from per-token cost" in why
    # ... not once fixed and per-token cost are told apart,
    assert policy._worth(gain(0.01, 0.2, separated=True), rec) is None
    # ... nor with the k already measured,
    assert policy._worth(gain(0.01, 0.2, separated=False, k=5), rec) is None
    # ... nor with a band that stays below the margin.
    assert policy._worth(gain(0.01, 0.025, separated=False), rec) is None


def test_a_search_where_nothing_pays_stops_before_its_budget(tmp_path: Path) -> None:
    rec = search_record(tmp_path, COSTS)
    steps = run_search(rec, SearchPolicy(margin=0.03, max_reloads=5), COSTS)
    assert isinstance(steps[-1], Stop) and len(steps) - 1 < 5
    assert steps[-1].why.startswith("no untried config is predicted to beat the best measured")
    assert "over speculation off" in steps[-1].why
    answer = search_answer(rec, verdicts(rec))
    assert answer is not None and answer.recommended is None
    assert answer.paragraph.startswith("Leave speculation off: no config was predicted or measured")
    assert f"Reloads: {len(steps) - 1} of 5." in answer.paragraph
    assert "The search stopped: no untried config" in answer.paragraph


def test_a_search_that_pays_confirms_the_predicted_best(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    steps = run_search(rec, SearchPolicy(margin=0.03, max_reloads=3), PAYS)
    reloads = [s for s in steps if isinstance(s, Reload)]
    assert reloads[0].kind == "teach" and all(r.kind == "predicted best" for r in reloads[1:])
    assert len(reloads) >= 2
    answer = search_answer(rec, verdicts(rec))
    assert answer is not None and answer.recommended is not None
    assert answer.paragraph.startswith("Turn on ngram k=")
    assert '--speculative-config \'{"method":"ngram"' in answer.paragraph
    assert "Predicted before reload (predicted best): " in answer.paragraph
    confirmed = [c for c in answer.checks if c.arm == answer.recommended]
    assert {c.key for c in confirmed} == {"coding", "math"} and all(c.inside for c in confirmed)
    # Within 3% of the truth's best config of the whole grid.
    best = max(SearchPolicy(margin=0.03).configs, key=lambda s: true_speedup(PAYS, s))
    chosen = rec.search.reload_of(answer.recommended)  # type: ignore[union-attr]
    settings = NgramSettings(
        chosen.values["num_speculative_tokens"],
        chosen.values["prompt_lookup_min"],
        chosen.values["prompt_lookup_max"],
    )
    assert true_speedup(PAYS, settings) >= 0.97 * true_speedup(PAYS, best)


def test_the_reload_budget_is_never_exceeded(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    steps = run_search(rec, SearchPolicy(margin=0.03, max_reloads=1), PAYS)
    assert [type(s) for s in steps] == [Reload, Stop]
    assert steps[-1].why == "the reload budget is spent: 1 of 1"
    assert rec.measured_candidates == ["search-1"]
    answer = search_answer(rec, verdicts(rec))
    assert answer is not None and "Reloads: 1 of 1." in answer.paragraph
    assert "The search stopped" not in answer.paragraph  # the budget, not the rule, ended it
    # Spent before anything is predicted: no reload, whatever the predictions.
    assert SearchPolicy(margin=0.03, max_reloads=3).next(rec, {}, used=3) == Stop(
        "the reload budget is spent: 3 of 3"
    )


def test_the_choice_is_made_per_level_and_a_changing_best_becomes_a_schedule(
    tmp_path: Path,
) -> None:
    rec = search_record(tmp_path, BY_LOAD, concurrency=(1, 4))
    steps = run_search(rec, SearchPolicy(margin=0.03, max_reloads=4), BY_LOAD)
    reloads = [s for s in steps if isinstance(s, Reload)]
    assert any(r.kind == "predicted best" and "at c4" in r.why for r in reloads)
    assert reloads[-1].kind == "schedule"
    plan = schedule(rec, verdicts(rec), margin=0.03)
    assert plan is not None and plan.values is not None
    assert check_spec_shape(plan.values, source="test") == plan.values
    assert plan.k_at["c1"] > plan.k_at["c4"]  # the cost per draft token is higher at c4
    assert plan.table[0][:2] == [1, 2] and plan.table[-1][1] == 1024
    assert reloads[-1].values[BATCH_TABLE_KEY] == plan.table
    assert set(reloads[-1].predicted) == {"coding@c1", "coding@c4", "math@c1", "math@c4"}
    answer = search_answer(rec, verdicts(rec))
    assert answer is not None
    # c4's best is faster on the geometric mean, but inconclusive on coding: not turned on
    # there; the schedule is offered beside, measured.
    c1, c4 = answer.winners["c1"], answer.winners["c4"]
    assert c1 is not None and c1.on and c1.shown and answer.recommended == c1.arm
    assert c4 is not None and c4.on and not c4.shown
    assert answer.paragraph.startswith(f"Turn on ngram {c1.label} ({c1.arm}, ")
    assert "At c4, keep it off (or use this schedule: " in answer.paragraph
    assert f"measured as {reloads[-1].values and 'search-' + str(len(reloads))})" in (
        answer.paragraph
    )
    assert f"Reloads: {len(reloads)} of 4." in answer.paragraph


def test_the_schedule_keeps_speculation_off_where_it_does_not_pay(tmp_path: Path) -> None:
    truth = Truth(cost={"c1": (0.05, 0.02), "c4": (0.6, 0.3)}, t0={"c1": 0.016, "c4": 0.02})
    rec = search_record(tmp_path, truth, concurrency=(1, 4))
    measure(rec, "search-1", {"method": "ngram", "num_speculative_tokens": 8,
                              "prompt_lookup_min": 2, "prompt_lookup_max": 3}, truth)  # fmt: skip
    plan = schedule(rec, verdicts(rec), margin=0.03)
    assert plan is not None and plan.table == [[1, 2, 8], [3, 1024, 0]]
    assert plan.k_at == {"c1": 8, "c4": 0}


def test_the_search_record_survives_results_json(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    run_search(rec, SearchPolicy(margin=0.03, max_reloads=2), PAYS)
    again = RunRecord.from_json(rec.to_json())
    assert again.search == rec.search
    before, after = search_answer(rec, verdicts(rec)), search_answer(again, verdicts(again))
    assert before is not None and after is not None and before.paragraph == after.paragraph
    assert dataclasses.asdict(again.search)["reloads"][0]["kind"] == "teach"  # type: ignore[arg-type]


def test_a_larger_margin_stops_after_the_first_reload(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)
    steps = run_search(rec, SearchPolicy(margin=0.5, max_reloads=3), PAYS)
    assert [type(s) for s in steps] == [Reload, Stop]
    assert "by the margin (+50%)" in steps[-1].why


def test_a_cost_model_of_the_stored_prior_alone_names_no_empty_k(tmp_path: Path) -> None:
    rec = search_record(tmp_path, PAYS)  # no n-gram config measured in this run
    why = SearchPolicy(margin=0.03)._worth(gain(0.01, 0.2, separated=False), rec)
    assert why is not None and "()" not in why
    assert "rests on the stored runs' prior alone (no k measured in this run)" in why


def test_the_stop_names_the_most_promising_untried_not_another_best(tmp_path: Path) -> None:
    rec = search_record(tmp_path, COSTS)
    steps = run_search(rec, SearchPolicy(margin=0.03, max_reloads=5), COSTS)
    assert isinstance(steps[-1], Stop)
    assert re.search(r": the most promising untried, k=\d n=\d\.\.\d is predicted ", steps[-1].why)
    assert "the best, " not in steps[-1].why
