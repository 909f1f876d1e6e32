"""One run, one shape: a live record and its results.json give the same analysis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import JOURNAL_FILE, RunStore, load_run

from ...support.scripted_target import Script, ScriptedTarget, Speed, measure_arms
from ...support.synthetic import NGRAM_ACCEPTANCE, add_phase, record, sample, settings


def awkward_run(tmp_path: Path) -> RunRecord:
    """A zero tok/s sample, and a prompt type whose requests give one token (no TPOT)."""
    rec = record(settings(tmp_path, prompt_types=("coding", "math", "short")))
    add_phase(rec, BASELINE, {"coding": 20.0, "math": 16.0}, seed=1)
    add_phase(rec, "ngram", {"coding": 26.0, "math": 12.0}, acceptance=NGRAM_ACCEPTANCE, seed=2)
    for name in (BASELINE, "ngram"):
        add_phase(rec, f"tmp-{name}", {"short": 40.0}, arm=name, tokens=1, seed=3)
        rec.phases[name].measurements["short"] = rec.phases.pop(f"tmp-{name}").measurements["short"]
    zero = sample("coding", "ngram", 9, 20.0, tokens=0)  # 0 tokens: 0 tok/s, no TPOT
    rec.phases["ngram"].measurements["coding"].samples.append(zero)
    return rec


def test_a_record_survives_its_serialisation(tmp_path: Path) -> None:
    rec = awkward_run(tmp_path)
    text = json.dumps(rec.to_json(), allow_nan=False)
    assert RunRecord.from_json(json.loads(text)) == rec


def test_verdicts_live_and_from_results_json_are_identical(tmp_path: Path) -> None:
    rec = awkward_run(tmp_path)
    live = analyze(rec)
    store = RunStore(tmp_path / "run", rec) if (tmp_path / "run").mkdir() is None else None
    assert store is not None
    store.analysis = live.to_json()
    store.flush()
    stored = analyze(load_run(store.path))
    assert stored.to_json() == live.to_json()
    coding = live.verdicts["ngram"]["coding"]
    # The zero tok/s sample is not a measurement: it enters neither metric.
    assert (coding.throughput.n_baseline, coding.throughput.n_candidate) == (6, 6)
    # No TPOT on either side: TPOT is left out of the Holm family, not compared as empty.
    assert live.verdicts["ngram"]["short"].tpot is None
    assert coding.tpot is not None and coding.tpot.n_candidate == 6
    # What readers of the file see is what the analysis said.
    written = json.loads(store.path.read_text())["analysis"]
    assert written["verdicts"]["ngram"]["math"]["verdict"] == live.verdicts["ngram"]["math"].verdict


def test_a_live_run_and_its_stored_record_agree(tmp_path: Path) -> None:
    """The experiment through a scripted target: what it measured is what it stored."""
    s = settings(tmp_path, samples=5, prompt_types=("coding", "math"))
    target = ScriptedTarget(
        Script(),
        {"ngram": Script({"the coding prompt": Speed(gap_s=0.002, tokens=7, tokens_per_chunk=3)},
                         ready_after_s=3.5)},
    )  # fmt: skip
    store = measure_arms(target, s, tmp_path, "ngram")
    # each start's time to serving, in its phase (the dry run's estimate reads it back)
    assert store.record.phases["ngram"].startup_s == pytest.approx(3.5, abs=1.0)
    assert target.events == ["before swap", "start original", "before swap", "stop original",
                             "start ngram", "stop ngram", "close"]  # fmt: skip
    stored = load_run(store.path)
    assert stored == store.record
    assert analyze(stored).to_json() == analyze(store.record).to_json()
    journal = (tmp_path / "run" / JOURNAL_FILE).read_text().splitlines()
    assert len(journal) == 2 * 2 * (5 + 1)  # every request, warm-ups too, as it finished
    coding = analyze(stored).verdicts["ngram"]["coding"]
    assert coding.acceptance.present and coding.acceptance_note is None
    assert coding.acceptance.mean_acceptance_length == pytest.approx(3.0)  # 2 accepted a step


def test_one_median_a_request_without_output_enters_no_rate() -> None:
    """The verdict's median and the level's written median are one figure (issue 19)."""
    from pytest_specdecode.record.measurement import Measurement

    rates = (10.0, 12.0, 30.0)
    m = Measurement(prompt_type="coding", samples=[sample("coding", BASELINE, i, r)
                                                   for i, r in enumerate(rates)])  # fmt: skip
    m.samples.append(sample("coding", BASELINE, 3, 20.0, tokens=0))  # no output: no rate
    m.wall_s = 9.0
    assert m.median_tokens_per_s == m.stats.median_tokens_per_s == 12.0
    written = m.to_json()["summary"]
    assert written["median_tokens_per_s"] == written["level"]["median_tokens_per_s"] == 12.0


def test_the_record_is_typed_through_json(tmp_path: Path) -> None:
    """How the run ended, the restore, the traffic watch and a reused baseline's source are
    typed parts of the record, and come back from results.json as written (issue 19)."""
    from pytest_specdecode.record.counters import Traffic, TrafficWatch
    from pytest_specdecode.record.ending import RestoreReport, RunEnding
    from pytest_specdecode.record.schema import BaselineSource

    rec = record(settings(tmp_path))
    add_phase(rec, BASELINE, {"coding": 20.0, "math": 16.0}).startup_s = 41.5
    rec.restore = RestoreReport("unit u", True, True, 12.0, ["one"], serving=True, notes=["n"])
    rec.ending = RunEnding(how="interrupted", signals=["SIGINT"], restore_s=30.0)
    rec.traffic_watch = TrafficWatch(2.0, Traffic(requests=3.0), "3 requests in 2s", False)
    rec.baseline_from = BaselineSource("/runs/a/results.json", {"vllm": "0.32.0"})
    back = RunRecord.from_json(json.loads(json.dumps(rec.to_json())))
    assert back == rec
    assert isinstance(back.restore, RestoreReport) and back.restore.describe().startswith(
        "unit u restored to active and serving in 12s"
    )
    assert isinstance(back.ending, RunEnding) and back.ending.describe().startswith(
        "interrupted by SIGINT"
    )
    assert back.phases[BASELINE].startup_s == 41.5
    warnings = analyze(back).warnings
    assert "other clients used the service before the run: 3 requests in 2s" in warnings
