"""The prediction as an analysis of the run record: on what the real CPU vLLM 0.32 recorded
(tests/data: token ids and counters), and on synthetic runs with known effects."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pytest_specdecode.analysis.prediction.level_acceptance import acceptance_by_level
from pytest_specdecode.analysis.prediction.ngram_replay import replay, replay_many
from pytest_specdecode.analysis.prediction.ngram_types import (
    NgramSettings,
    RequestTokens,
    grid_settings,
)
from pytest_specdecode.analysis.prediction.predict import predict_run
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.requests.token_capture import TokenIds
from pytest_specdecode.record.schema import RunRecord, _finite
from pytest_specdecode.record.store import RunStore, load_run

from ....support.scripted_target import Script, ScriptedTarget, Speed, measure_arms
from ....support.synthetic import (
    acceptance_of,
    add_phase,
    captured,
    record,
    recorded_run,
    settings,
    token_ids,
)


def statuses(rec: RunRecord) -> dict[tuple[str, str], str]:
    prediction = predict_run(rec)
    return {(c, w): x.status for c, per in prediction.comparisons.items() for w, x in per.items()}


def test_recorded_real_counters_are_predicted_exactly_from_the_record(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    analysis = analyze(rec)
    prediction = analysis.prediction
    assert prediction is not None and prediction.available
    assert statuses(rec) == {
        **{(c, w): "exact" for c in ("ngram", "ngram-min2") for w in ("coding", "math",
                                                                       "structured")},
        ("ngram", "explanatory"): "outputs differ",
        ("ngram-min2", "explanatory"): "outputs differ",
    }  # fmt: skip
    assert not any("prediction" in w for w in analysis.warnings)
    math = prediction.comparisons["ngram"]["math"]
    assert math.settings == NgramSettings(5, 4, 4)  # only max given: min = max
    assert math.predicted is not None and math.predicted.exact
    assert (math.predicted.accepted, math.predicted.accepted_per_position) == (37, (9, 9, 9, 5, 5))
    differs = prediction.comparisons["ngram-min2"]["explanatory"]
    assert "outputs differ from the baseline's (a timed output differs from character 73)" in (
        differs.detail
    )
    assert "accepted per draft 1.56 vs measured 1.62 (+0.07)" in differs.detail
    assert "own token ids were not recorded" in differs.detail
    # Every config of the grid, plus the candidates, per prompt type; effective labels.
    assert set(prediction.replays["coding"]) == set(grid_settings())  # both candidates on it
    assert len(prediction.replays["coding"]) == 8 * 21
    assert prediction.candidates["ngram"].text == "ngram (effective k=5 n=4..4)"
    # Strict JSON, and the analysis of the stored run is the live one.
    json.dumps(_finite(analysis.to_json()), allow_nan=False)
    store = RunStore(tmp_path / "run", rec) if (tmp_path / "run").mkdir() is None else None
    assert store is not None
    stored = load_run(store.path)
    assert stored == rec
    assert analyze(stored).to_json()["prediction"] == analysis.to_json()["prediction"]


def test_without_look_ahead_the_last_step_is_within_the_stated_bound(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path, lookahead=False)
    found = statuses(rec)
    assert found[("ngram", "structured")] == "within bound"  # 3 accepted past max_tokens
    assert found[("ngram-min2", "math")] == "within bound"  # none, but 2 could have been
    assert found[("ngram", "math")] == "exact"  # its last step verified no unknown token
    assert "mismatch" not in found.values()
    structured = predict_run(rec).comparisons["ngram"]["structured"]
    assert structured.predicted is not None
    assert (structured.predicted.accepted, structured.predicted.accepted_max) == (21, 24)
    assert structured.predicted.unverified_tokens <= 4  # at most k - 1 per request
    assert "21 (+0..3 verified past the recorded tokens) accepted" in structured.detail


def test_a_counter_that_disagrees_is_a_mismatch_warning(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    before = analyze(rec)
    m = rec.phases["ngram"].measurements["coding"]
    m.acceptance = acceptance_of(4, 20, 7, [2, 2, 1, 1, 1])  # one more accepted than replayed
    analysis = analyze(rec)
    assert analysis.prediction.comparisons["ngram"]["coding"].status == "mismatch"
    (warning,) = [w for w in analysis.warnings if "prediction" in w]
    assert warning.startswith("ngram/coding prediction (k=5 n=4..4): outputs equal")
    assert "MISMATCH" in warning and "measured 4, 20, 7 [2, 2, 1, 1, 1]" in warning

    # The prediction is beside the verdicts, never in them.
    def verdicts(a):
        return {
            c: {w: (v.verdict, v.reason) for w, v in per.items()} for c, per in a.verdicts.items()
        }

    assert verdicts(analysis) == verdicts(before)
    assert analysis.outcome == before.outcome


def test_other_methods_are_measured_only_or_not_predicted(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    rec.candidates["suffix"] = {"method": "suffix", "num_speculative_tokens": 3}
    rec.candidates["eagle"] = {"method": "eagle", "model": "org/d", "num_speculative_tokens": 3}
    notes = predict_run(rec).candidates
    assert notes["suffix"].settings is None and "suffix decoding is not on the n-gram grid" in (
        notes["suffix"].reason or ""
    )
    assert "only the measured figures count" in (notes["eagle"].reason or "")
    assert notes["ngram-min2"].text == "ngram-min2 (effective k=3 n=2..3)"


def repeated_prompt_run(tmp_path: Path, *, block_size: int | None) -> tuple[RunRecord, list[int]]:
    """One prompt of 9 tokens, sent as 1 warm-up + 2 timed requests per phase."""
    prompt = [1, 7, 8, 9, 7, 8, 9, 7, 2]
    output = [7, 8, 9, 7, 8, 9, 5, 7, 8, 9, 7, 8]
    rec = record(settings(tmp_path, prompt_types=("coding",), samples=2))
    ids = token_ids({"the coding prompt": captured(prompt, output, [9, 7, 8, 9, 7, 8, 9, 7])},
                    block_size=block_size)  # fmt: skip
    for name in (BASELINE, "ngram"):
        phase = add_phase(rec, name, {"coding": 20.0})
        phase.measurements["coding"].token_ids = ids
    return rec, [*prompt, *output]


def test_a_prefix_cache_hit_on_a_repeated_prompt_pads_the_prefill(tmp_path: Path) -> None:
    rec, _ = repeated_prompt_run(tmp_path, block_size=8)  # 8 of 9 prompt tokens cached
    s = NgramSettings(5, 4, 4)
    one = rec.phases[BASELINE].measurements["coding"].token_ids.prompts["the coding prompt"]
    hit = RequestTokens.of(one.prompt_ids, one.output_ids, one.lookahead_ids, 8)
    expected = replay_many([hit, hit], s, max_model_len=1024)  # both timed requests hit
    cold = replay(one.prompt_ids, one.output_ids, s, lookahead_ids=one.lookahead_ids)
    assert (expected.drafts, expected.draft_tokens) == (
        2 * cold.drafts + 2,
        2 * cold.draft_tokens + 10,
    )
    rec.phases["ngram"].measurements["coding"].acceptance = acceptance_of(
        expected.drafts, expected.draft_tokens, expected.accepted, expected.accepted_per_position
    )
    prediction = predict_run(rec)
    assert prediction.comparisons["ngram"]["coding"].status == "exact"
    assert "prefix cache on, block size 8" in prediction.token_ids["coding"]
    # A server whose block size is unknown: no padding modelled, and said so.
    (tmp_path / "unknown").mkdir()
    unknown, _ = repeated_prompt_run(tmp_path / "unknown", block_size=None)
    unknown.phases["ngram"].measurements["coding"].acceptance = dataclasses.replace(
        rec.phases["ngram"].measurements["coding"].acceptance
    )
    again = predict_run(unknown)
    assert again.comparisons["ngram"]["coding"].status == "mismatch"
    assert "a padded prefill after a prefix-cache hit is not modelled" in again.token_ids["coding"]


def test_no_token_ids_says_why_and_predicts_nothing(tmp_path: Path) -> None:
    rec = record(settings(tmp_path))
    add_phase(rec, BASELINE, {"coding": 20.0, "math": 16.0})
    add_phase(rec, "ngram", {"coding": 22.0, "math": 16.0})
    old = analyze(rec).prediction
    assert old is not None and not old.available
    assert "no token ids recorded" in (old.reason or "")
    for m in rec.phases[BASELINE].measurements.values():
        m.token_ids = TokenIds(missing="http://h:8000/v1/chat/completions answered HTTP 404")
    prediction = predict_run(rec)
    assert prediction.reason == (
        "coding: no token ids: http://h:8000/v1/chat/completions answered HTTP 404; "
        "math: no token ids: http://h:8000/v1/chat/completions answered HTTP 404"
    )
    assert prediction.comparisons["ngram"]["coding"].status == "not compared"
    assert prediction.to_json()["available"] is False


def test_cost_model_from_the_record_predicts_the_grid_with_bands(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    prediction = predict_run(rec)
    assert prediction.fit is not None and prediction.fit.method == "least-squares"
    for name in ("coding", "math", "structured", "explanatory"):
        preds = prediction.predictions[name]
        assert len(preds) == 168
        assert all(p.speedup_band is not None and p.tokens_per_s for p in preds.values())
    advice = prediction.recommendation
    assert advice is not None
    assert advice.settings not in (NgramSettings(5, 4, 4), NgramSettings(3, 2, 3))
    # No measured candidate: the ceiling alone, and the cost said to be unknown.
    del rec.phases["ngram"], rec.phases["ngram-min2"]
    bare = predict_run(rec)
    assert bare.fit is None and bare.comparisons == {}
    assert all(p.speedup is None for p in bare.predictions["math"].values())
    assert "the cost of a speculative step is unknown" in bare.recommendation.reason


def test_token_ids_keyed_by_prompt_text_survive_the_record(tmp_path: Path) -> None:
    rec = recorded_run(tmp_path)
    m = rec.phases[BASELINE].measurements["coding"]
    m.token_ids.prompts["a second prompt of the set"] = captured([1, 2], [3, 4, 5])
    rec.phases["ngram"].measurements["math"].token_ids = TokenIds(missing="no ids: HTTP 404")
    assert RunRecord.from_json(json.loads(json.dumps(rec.to_json()))) == rec
    written = rec.to_json()["phases"][BASELINE]["measurements"]["coding"]["token_ids"]
    assert [p["prompt"] for p in written["prompts"]] == [
        "the coding prompt",
        "a second prompt of the set",
    ]
    assert written["block_size"] == 128 and written["max_model_len"] == 1024
    # Timed on a prompt whose ids are missing: that prompt type is not predicted.
    del m.token_ids.prompts["the coding prompt"]
    assert "no token ids for the timed requests' prompts" in predict_run(rec).token_ids["coding"]


def run_scripted(tmp_path: Path, *, ids: bool) -> RunRecord:
    s = settings(tmp_path, samples=3, prompt_types=("coding", "math"))
    fast = Speed(gap_s=0.002, tokens=7, tokens_per_chunk=3)
    target = ScriptedTarget(
        Script(token_ids=ids), {"ngram": Script({"the coding prompt": fast}, token_ids=ids)}
    )
    store = measure_arms(target, s, tmp_path, "ngram")
    assert load_run(store.path) == store.record
    return store.record


def test_the_experiment_records_token_ids_outside_the_timed_window(tmp_path: Path) -> None:
    rec = run_scripted(tmp_path, ids=True)
    for phase in (BASELINE, "ngram"):
        for name, m in rec.phases[phase].measurements.items():
            assert m.token_ids is not None and m.token_ids.missing is None
            (prompt,) = m.token_ids.prompts
            assert prompt == f"the {name} prompt"
            one = m.token_ids.prompts[prompt]
            assert one.consistent, one.check
            tokens = 7 if (phase, name) == ("ngram", "coding") else 8  # as scripted
            assert len(one.output_ids) == tokens and one.lookahead_ids == ()  # stopped before 64
            assert m.traffic.requests == 3  # the window holds the timed requests only
    coding = rec.phases["ngram"].measurements["coding"].token_ids.prompts["the coding prompt"]
    assert coding.output_ids == (100, 101, 102, 103, 100, 101, 102)  # 4 words, one id each
    assert coding.prompt_ids == (1, 10, 11, 12, 2)


def test_a_server_without_token_ids_is_recorded_with_the_reason(tmp_path: Path) -> None:
    rec = run_scripted(tmp_path, ids=False)
    m = rec.phases[BASELINE].measurements["coding"]
    assert m.token_ids is not None and m.token_ids.prompts == {}
    assert m.token_ids.missing == (
        "http://scripted.invalid:8000/v1/chat/completions answered HTTP 404 to the token-id "
        "request: "
    )
    assert not analyze(rec).prediction.available


def test_record_token_ids_false_sends_no_untimed_request_and_says_so(tmp_path: Path) -> None:
    s = settings(
        tmp_path, samples=3, prompt_types=("coding",), run_extra="record_token_ids = false"
    )
    target = ScriptedTarget(Script(token_ids=True), {"ngram": Script(token_ids=True)})
    rec = measure_arms(target, s, tmp_path, "ngram").record
    for phase in (BASELINE, "ngram"):
        m = rec.phases[phase].measurements["coding"]
        assert m.token_ids == TokenIds(missing="not recorded: [run] record_token_ids = false")
    assert target.token_id_requests == 0  # no untimed request after the windows
    assert "not recorded: [run] record_token_ids = false" in predict_run(rec).token_ids["coding"]


def test_the_runs_restart_noise_widens_the_bands_of_its_predictions(tmp_path: Path) -> None:
    # Each predicted config would run in a start of its own: the run's restart noise (here the
    # assumption, with no repeated starts to measure it) enters every band.
    rec = recorded_run(tmp_path)
    bands = {}
    for sd in (0.0, 0.05):
        rec.run = dataclasses.replace(rec.run, assumed_restart_noise=sd)
        preds = predict_run(rec).predictions["coding"]
        bands[sd] = {s: p.speedup_band for s, p in preds.items()}
    for s, (low, high) in bands[0.05].items():
        quiet_low, quiet_high = bands[0.0][s]
        assert low < quiet_low and high > quiet_high, s


def reasons_not_compared(rec: RunRecord) -> list[str]:
    """Every "not compared" and "not predicted" of a run's prediction, with its reason."""
    prediction = predict_run(rec)
    found = [
        f"{c.candidate}/{c.prompt_type}: {c.detail}"
        for per in prediction.comparisons.values()
        for c in per.values()
        if c.status == "not compared"
    ]
    return found + [
        f"{e.candidate}/{e.key}: {e.basis}"
        for e in acceptance_by_level(rec).levels
        if e.basis.startswith("not predicted")
    ]


def test_the_prediction_is_compared_where_adaptive_arms_stop_at_different_counts(
    tmp_path: Path,
) -> None:
    """issue 28: the baseline pinned at the least requests, the candidate sent the most; the
    baseline's ids cover every prompt a window may send, so nothing is left uncompared."""
    texts = [f"prompt number {i} of the set" for i in range(6)]
    table = "[prompt_types.coding]\nprompts = [" + ", ".join(f'"{t}"' for t in texts) + "]"
    s = settings(
        tmp_path, samples=3, max_samples=6, prompt_types=(), extra=table,
        run_extra="concurrency = [1, 2]",
    )  # fmt: skip
    # The baseline alike on every prompt (pinned at once); the candidate's prompts far apart.
    spread = {t: Speed(gap_s=0.002 * (1 + 3 * (i % 3)), tokens_per_chunk=3) for i, t in
              enumerate(texts)}  # fmt: skip
    target = ScriptedTarget(Script(token_ids=True), {"ngram": Script(spread, token_ids=True)})
    rec = measure_arms(target, s, tmp_path, "ngram").record
    counts = {
        (p.arm, key): len(m.samples)
        for p in rec.phases.values()
        for key, m in p.measurements.items()
    }
    assert counts == {
        (BASELINE, "coding@c1"): 3, (BASELINE, "coding@c2"): 4,
        ("ngram", "coding@c1"): 6, ("ngram", "coding@c2"): 6,
    }  # fmt: skip
    ids = rec.phases[BASELINE].measurements["coding@c1"].token_ids
    assert ids is not None and set(ids.prompts) == set(texts)  # the timed 3 and 3 untimed
    assert reasons_not_compared(rec) == []
    assert set(statuses(rec).values()) <= {"exact", "within bound", "mismatch", "outputs differ"}

    # Without the untimed ids of the prompts the baseline stopped short of, both checks say so.
    timed = {texts[i] for i in range(3)}
    for prompt in set(texts) - timed:
        del ids.prompts[prompt]
    lost = reasons_not_compared(rec)
    timed_on = "ngram/coding: the baseline has no token ids for a prompt the candidate was timed on"
    assert timed_on in lost
    prefix = "ngram/coding@c1: not predicted: the baseline has no token ids"
    assert any(reason.startswith(prefix) for reason in lost), lost


def test_an_aa_run_predicts_nothing_of_its_own_arm_and_says_what_to_do_next(tmp_path) -> None:
    """The H200's A/A run said 'baseline-again: method None drafts with a model', and that no
    candidate had been measured."""
    from pytest_specdecode.analysis.prediction.predict import AA_NEXT, predict_run
    from pytest_specdecode.config.arms import AA_ARM, BASELINE

    from ....support.synthetic import recorded_run

    rec = recorded_run(tmp_path)
    rec.candidates = {AA_ARM: {}}
    rec.phases = {n: p for n, p in rec.phases.items() if p.arm == BASELINE}
    found = predict_run(rec)
    assert found.candidates[AA_ARM].reason == (
        "the original's configuration, without speculation: nothing to replay"
    )
    assert found.recommendation is not None and found.recommendation.reason == AA_NEXT
