"""Load levels and prompt sets through the experiment, on the scripted target: every level of every
phase on the plan's prompts, keyed per prompt type and level, verdicts per level, the paying load,
the reports. The same path runs on the real CPU vLLM in tests/real_vllm/test_levels_real.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.config.prompts import request_plan
from pytest_specdecode.config.settings import Settings, load_settings
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.record.requests.samples import RequestSample
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.record.store import load_run
from pytest_specdecode.report import write_reports

from ...support.scripted_target import Script, ScriptedTarget, Speed, measure_arms

PROMPTS = [f"prompt number {i}" for i in range(5)]


def level_settings(tmp_path: Path, *, levels: str = "[1, 4]", extra: str = "") -> Settings:
    path = tmp_path / "experiment.toml"
    path.write_text(f"""
reports_dir = "{tmp_path / "reports"}"
[target]
api_base = "http://127.0.0.1:18011"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
[run]
samples = 6
max_samples = 6
warmup = 1
max_tokens = 64
concurrency = {levels}
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompts = {json.dumps(PROMPTS)}
{extra}
""")
    return load_settings(path, spec_configs=["ngram"])


def speeds(tokens_per_chunk: int) -> dict[str, Speed]:
    """Each prompt its own output, so that outputs differ within a phase as on a real server."""
    return {
        p: Speed(gap_s=0.008, tokens=8, tokens_per_chunk=tokens_per_chunk, text=f"answer {i} x y")
        for i, p in enumerate(PROMPTS)
    }


def run(tmp_path: Path, s: Settings) -> RunRecord:
    # The candidate delivers 2 tokens a step, but its steps slow down far more with the batch:
    # faster alone, slower at 4 in flight (the flip that the issue describes).
    target = ScriptedTarget(
        Script(speeds(1), batch_cost=0.05),
        {"ngram": Script(speeds(2), batch_cost=1.0)},
    )
    store = measure_arms(target, s, tmp_path, "ngram")
    assert load_run(store.path) == store.record  # written as it went, read back the same
    return store.record


def test_every_level_of_every_phase_on_the_plans_prompts(tmp_path: Path) -> None:
    s = level_settings(tmp_path)
    rec = run(tmp_path, s)
    plan = request_plan(5, samples=8, warmup=1, levels=2)  # 8: the most of any level (2 x 4)
    for phase in (BASELINE, "ngram"):
        ms = rec.phases[phase].measurements
        assert list(ms) == ["coding@c1", "coding@c4"]
        c1, c4 = ms["coding@c1"], ms["coding@c4"]
        assert [s.prompt_index for s in c1.samples] == list(plan.levels[0][:6])
        # at 4 in flight, requests end out of order: the set, not the order
        assert sorted(s.prompt_index for s in c4.samples) == sorted(plan.levels[1][:8])
        assert [s.prompt_index for s in c1.warmup] == list(plan.warmup)
        assert {s.level for s in c4.samples} == {"c4"} and c4.level.concurrency == 4
        assert c4.stats.peak_in_flight == 4 and c1.stats.peak_in_flight == 1
        assert len({s.text for s in c1.samples}) > 1  # distinct outputs within a phase
    analysis = analyze(rec)
    verdicts = analysis.verdicts["ngram"]
    assert set(verdicts) == {"coding@c1", "coding@c4"}
    assert verdicts["coding@c1"].throughput.ratio > 1.3
    assert verdicts["coding@c4"].throughput.ratio < 0.9
    paying = analysis.paying_loads["ngram"]["coding"]
    assert paying.kind.value == "crossing" and 1 < paying.load < 4, paying.text
    assert [p.level for p in paying.points] == ["c1", "c4"]


def order(sample: RequestSample) -> tuple[bool, int]:
    return not sample.warmup, sample.index


def test_every_phase_is_sent_the_same_prompts_in_the_same_order(tmp_path: Path) -> None:
    # Per-prompt pairing and the n-gram replay rest on it (config/prompts.py `request_plan`).
    rec = run(tmp_path, level_settings(tmp_path))
    sent = {  # in the order sent (at 4 in flight, requests end in another order)
        phase: [
            (key, [s.prompt_index for s in sorted([*m.warmup, *m.samples], key=order)])
            for key, m in rec.phases[phase].measurements.items()
        ]
        for phase in (BASELINE, "ngram")
    }
    assert sent[BASELINE] == sent["ngram"]
    assert sent[BASELINE][0] == ("coding@c1", [1, 0, 1, 2, 3, 4, 0])  # the warm-up first


def test_reports_show_the_levels_the_paying_load_and_the_plot(tmp_path: Path) -> None:
    rec = run(tmp_path, level_settings(tmp_path))
    analysis = analyze(rec)
    written = write_reports(rec, analysis, tmp_path / "run", failed=[], step_summary=None)
    md = written.markdown
    assert "### Load levels" in md and "| baseline | coding@c4 | 8 |" in md
    assert "### Where speculation stops paying" in md
    assert "ngram / coding: speedup falls below 1.0 at c" in md
    assert "### Per prompt" in md and "ngram / coding@c1, per prompt (5)" in md
    assert written.plots["speedup-ngram"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stored = json.loads((tmp_path / "run" / "results.json").read_text())
    level = stored["phases"]["baseline"]["measurements"]["coding@c4"]
    assert level["level"] == {"label": "c4", "concurrency": 4, "rate": None}
    assert level["summary"]["level"]["peak_in_flight"] == 4


def test_one_level_keeps_the_prompt_type_as_the_key(tmp_path: Path) -> None:
    rec = run(tmp_path, level_settings(tmp_path, levels="1"))
    assert list(rec.phases[BASELINE].measurements) == ["coding"]
    analysis = analyze(rec)
    assert analysis.paying_loads == {} and analysis.dynamic_k == []


def test_the_dynamic_k_table_ends_at_the_units_max_num_seqs(tmp_path: Path) -> None:
    k3 = '"ngram-k3" = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }'
    path = tmp_path / "experiment.toml"
    text = level_settings(tmp_path).source.read_text()
    path.write_text(text.replace("[presets]\n", f"[presets]\n{k3}\n"))
    s = load_settings(path, spec_configs=["ngram", "ngram-k3"])
    target = ScriptedTarget(
        Script(speeds(1)), {"ngram": Script(speeds(2)), "ngram-k3": Script(speeds(2))}
    )
    rec = measure_arms(target, s, tmp_path, "ngram", "ngram-k3").record
    rec.target.command = [*s.target.command, "--max-num-seqs", "64"]  # as the unit runs vLLM
    (table,) = analyze(rec).dynamic_k
    assert (table.max_batch, table.max_batch_source) == (64, "max_num_seqs")
    rec.target.command = list(s.target.command)  # vLLM's own default then
    (table,) = analyze(rec).dynamic_k
    assert table.max_batch_source == "default"


def test_slo_goodput_per_level(tmp_path: Path) -> None:
    extra = "[slo]\ntpot_ms = 1000\nttft_p99_ms = 0.001\n[slo.levels.c4]\ntpot_ms = 0.001\n"
    rec = run(tmp_path, level_settings(tmp_path, extra=extra))
    c1 = rec.phases[BASELINE].measurements["coding@c1"].stats
    c4 = rec.phases[BASELINE].measurements["coding@c4"].stats
    assert c1.good == c1.n and c4.good == 0  # every request meets 1 s; none meets 1 µs
    assert [c.key for c in c1.slo_checks] == ["ttft_p99_ms"] and not c1.slo_checks[0].met


def test_an_slo_for_a_level_not_measured_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"\[slo.levels\]: no measured level c16"):
        level_settings(tmp_path, extra="[slo.levels.c16]\ntpot_ms = 100\n")
