"""What a start ran with, read from its real log; the diff of two starts; the record round-trip."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pytest_specdecode.analysis.verdict.side_changes import (
    RUNNER_ENV,
    SideChange,
    foreseen,
    foreseen_text,
    reproduce,
    said_but_same,
    side_changes,
)
from pytest_specdecode.config.specconfig import OFFLINE_FACTS, VllmFacts
from pytest_specdecode.record.engine_settings import (
    EngineSettings,
    from_server_info,
    parse_engine_log,
    scalar_fields,
)
from pytest_specdecode.record.schema import Phase, RunRecord

from ...support.synthetic import add_phase, record, settings

DATA = Path(__file__).parent.parent.parent / "data"


def cpu_log(arm: str) -> list[str]:
    return (DATA / f"vllm-0.32-cpu-{arm}.start.log").read_text().splitlines()


def gpu_lines(arm: str) -> list[str]:
    """The vLLM 0.26 (GPU) lines of one arm, as issue 28 quotes them."""
    out: dict[str, list[str]] = {}
    current = ""
    for line in (DATA / "vllm-0.26-gpu-start-lines.txt").read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        if line.startswith("["):
            current = line.strip("[]")
            continue
        out.setdefault(current, []).append(line)
    return out[arm]


def test_the_cpu_baseline_runs_without_async_scheduling_by_its_platforms_rule() -> None:
    s = parse_engine_log(cpu_log("baseline"))
    assert s.version == "0.32.0"
    assert s.async_scheduling is False and not s.async_said  # no line says so: the CPU rule
    assert "CPU platform" in (s.async_evidence or "")
    assert s.model_runner == "V1"
    assert (
        s.runner_evidence == "Model Runner V2 requires Triton; using the V1 model runner instead."
    )
    assert s.non_default_args["max_model_len"] == 2048
    assert s.non_default_args["served_model_name"] == ["smollm2-135m-instruct"]
    assert "speculative_config" not in s.non_default_args
    assert s.config["device_config"] == "cpu" and s.config["enable_prefix_caching"] == "True"
    assert s.source == f"log ({len(cpu_log('baseline'))} lines)"


def test_the_cpu_ngram_start_says_it_disabled_async_scheduling() -> None:
    s = parse_engine_log(cpu_log("ngram"))
    assert s.async_scheduling is False and s.async_said
    assert s.async_evidence == (
        "Async scheduling not supported with ngram-based speculative decoding and will be disabled."
    )
    assert s.non_default_args["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    assert s.async_evidence in s.feature_warnings


def test_the_gpu_lines_tell_async_scheduling_and_the_runner() -> None:
    base, ngram = parse_engine_log(gpu_lines("baseline")), parse_engine_log(gpu_lines("ngram"))
    assert (base.async_scheduling, base.model_runner) == (True, "V2")
    assert (ngram.async_scheduling, ngram.model_runner) == (False, "V1")
    assert ngram.async_said and base.async_said


def test_no_lines_no_settings() -> None:
    s = parse_engine_log([])
    assert not s.known and "no log lines" in s.describe()
    assert side_changes(s, parse_engine_log(gpu_lines("ngram"))) == []


def test_the_engine_config_line_keeps_its_plain_top_level_fields() -> None:
    fields = scalar_fields("a=1, b=Cfg(x=1, y=[2, 3]), c='m', d={'k': (1, 2)}, e=None")
    assert fields == {"a": "1", "c": "m", "e": "None"}


def test_server_info_corrects_the_log() -> None:
    """vLLM's dev mode: /server_info?config_format=json (captured shape, vLLM 0.32)."""
    s = parse_engine_log(gpu_lines("baseline"))
    info = {"vllm_config": {"scheduler_config": {"async_scheduling": False}}, "vllm_env": {}}
    s = from_server_info(s, info)
    assert s.async_scheduling is False and s.async_evidence.startswith("/server_info")
    assert s.source.endswith("+ /server_info")


def test_on_the_gpu_ngram_changes_async_scheduling_and_the_runner() -> None:
    found = side_changes(
        parse_engine_log(gpu_lines("baseline")), parse_engine_log(gpu_lines("ngram"))
    )
    assert [c.text() for c in found] == [
        "async scheduling disabled (baseline: enabled)",
        "model runner V1 (baseline: V2)",
    ]
    control = reproduce(found)
    assert control.args == ("--no-async-scheduling",)
    assert dict(control.env) == {RUNNER_ENV: "0"}
    assert control.unreproduced == ()


def test_on_the_cpu_both_run_without_async_scheduling_and_the_log_line_is_still_named() -> None:
    base, ngram = parse_engine_log(cpu_log("baseline")), parse_engine_log(cpu_log("ngram"))
    assert side_changes(base, ngram) == []
    same = said_but_same(base, ngram)
    assert len(same) == 1 and same[0].startswith("async scheduling disabled (vLLM: Async")
    # the control still turns it off: it then matches the candidate whatever the baseline ran
    assert reproduce([], ngram).args == ("--no-async-scheduling",)


def test_other_arguments_and_warnings_are_side_changes_too() -> None:
    base = parse_engine_log(gpu_lines("baseline"))
    mine = parse_engine_log(gpu_lines("baseline"))
    base.non_default_args = {"max_num_seqs": 256, "speculative_config": None}
    mine.non_default_args = {"max_num_seqs": 128, "speculative_config": {"method": "ngram"}}
    mine.feature_warnings = ["Chunked prefill is disabled for this method"]
    found = side_changes(base, mine)
    assert [c.text() for c in found] == [
        "--max-num-seqs 128 (baseline: 256)",
        "vLLM warned: Chunked prefill is disabled for this method",
    ]
    assert reproduce(found).unreproduced == tuple(c.text() for c in found)


def test_the_port_of_a_candidate_beside_the_original_is_no_side_change() -> None:
    """Side by side the candidate serves on a port of its own (seen on the H200: `--port 8012
    (baseline: 8011)` was listed beside the verdict, and the control could not reproduce it)."""
    base = parse_engine_log(gpu_lines("baseline"))
    beside = parse_engine_log(gpu_lines("ngram"))
    base.non_default_args = {"port": 8011, "max_model_len": 2048}
    beside.non_default_args = {"port": 8012, "max_model_len": 2048, "speculative_config": {}}
    found = side_changes(base, beside)
    assert [c.setting for c in found] == ["async scheduling", "model runner"]
    assert reproduce(found).unreproduced == ()


def test_the_known_rules_foresee_by_method_and_version() -> None:
    assert [r.setting for r in foreseen("ngram", "0.26.0")] == ["async scheduling", "model runner"]
    assert [r.setting for r in foreseen("ngram", "0.32.0")] == ["async scheduling"]
    assert foreseen("eagle", "0.32.0") == []
    assert foreseen_text("eagle", None) is None
    text = foreseen_text("ngram", None) or ""
    assert text.startswith("expected, not measured: async scheduling disabled")


def asked(version: str, *, kept=None, v2=None, triton=None) -> VllmFacts:
    """A serving vLLM's facts with its side rules as read from its source (targets/facts/)."""
    return replace(
        OFFLINE_FACTS,
        version=version,
        host="root@gpu:22",
        async_kept=frozenset(kept) if kept is not None else None,
        v2_unsupported=frozenset(v2) if v2 is not None else None,
        triton=triton,
    )


# vLLM 0.32's, as its vllm/config/vllm.py says (tests/real_vllm/test_vllm_facts_real.py reads them)
V032 = asked(
    "0.32.0",
    kept={"eagle", "eagle3", "mtp", "deepseek_mtp", "ngram_gpu", "draft_model", "dspark"},
    v2={"suffix", "medusa", "mlp_speculator", "custom_class"},
    triton=True,
)


def settings_of(rules) -> list[tuple[str, str]]:
    return [(r.setting, r.candidate) for r in rules]


def test_the_serving_vllms_own_rules_foresee_on_0_32() -> None:
    """0.32 keeps async scheduling on for draft_model, eagle3 and ngram_gpu; its V2 runner
    takes ngram and draft_model."""
    for method in ("draft_model", "eagle3", "ngram_gpu", "deepseek_mtp"):
        assert foreseen(method, None, V032) == [], method
    assert settings_of(foreseen("ngram", None, V032)) == [("async scheduling", "disabled")]
    assert settings_of(foreseen("suffix", None, V032)) == [
        ("async scheduling", "disabled"),
        ("model runner", "V1"),
    ]
    text = foreseen_text("ngram", "0.26.0", V032) or ""  # the facts' version, not the record's
    assert "read from vLLM 0.32.0's vllm/config/vllm.py on root@gpu:22" in text, text
    assert (
        "draft_model, dspark, eagle, eagle3, mtp, ngram_gpu and 1 MTP method (a model's own)"
        in text
    )


def test_another_version_is_foreseen_by_its_own_source_not_by_0_32s() -> None:
    """A vLLM whose source keeps async scheduling on with EAGLE alone and whose V2 runner
    lacks n-gram and the draft model: the draft model gets both side changes there."""
    older = asked("0.27.0", kept={"eagle", "eagle3", "mtp"}, v2={"ngram", "draft_model"})
    assert settings_of(foreseen("draft_model", None, older)) == [
        ("async scheduling", "disabled"),
        ("model runner", "V1"),
    ]
    assert settings_of(foreseen("ngram", None, older)) == [
        ("async scheduling", "disabled"),
        ("model runner", "V1"),
    ]
    assert foreseen("eagle3", None, older) == []
    assert foreseen("draft_model", None, V032) == []  # the same method, on 0.32


def test_without_triton_no_start_changes_its_model_runner() -> None:
    """vLLM's CPU build has no Triton: every start runs V1, so no method changes it."""
    cpu = replace(V032, triton=False)
    assert settings_of(foreseen("suffix", None, cpu)) == [("async scheduling", "disabled")]


def test_a_platform_that_turns_async_scheduling_off_everywhere_foresees_no_async_change() -> None:
    """vLLM 0.32's CPU platform: the original runs without it too, so n-gram changes nothing."""
    never = "vLLM 0.32.0's CPU platform turns async scheduling off at every start"
    cpu = replace(V032, triton=False, async_never=never)
    assert foreseen("ngram", None, cpu) == [] and foreseen("suffix", None, cpu) == []
    assert settings_of(foreseen("ngram", None, V032)) == [("async scheduling", "disabled")]


def test_rules_not_read_fall_back_to_the_known_ones_for_the_version() -> None:
    """An answer without the side rules (or the offline list): the known rules by version."""
    unread = asked("0.26.0")
    assert settings_of(foreseen("ngram", None, unread)) == settings_of(foreseen("ngram", "0.26.0"))
    assert foreseen("ngram", "0.26.0", OFFLINE_FACTS) == foreseen("ngram", "0.26.0")
    only_async = replace(unread, async_kept=frozenset({"eagle"}))
    assert settings_of(foreseen("draft_model", None, only_async)) == [
        ("async scheduling", "disabled")
    ]


def test_a_phase_keeps_its_settings_through_results_json(tmp_path: Path) -> None:
    rec = record(settings(tmp_path))
    add_phase(rec, "baseline", {"coding": 20.0, "math": 16.0})
    rec.phases["baseline"].engine = parse_engine_log(cpu_log("ngram"))
    rec.phases["baseline"].env = {RUNNER_ENV: "0"}
    rec.phases["baseline"].control_of = "ngram"
    back = RunRecord.from_json(json.loads(json.dumps(rec.to_json(), allow_nan=False)))
    assert back == rec
    assert isinstance(back.phases["baseline"].engine, EngineSettings)


def test_a_phase_stored_before_the_settings_were_read_still_loads() -> None:
    old = {"name": "baseline", "arm": "baseline", "spec": None, "measurements": {}}
    phase = Phase.from_json(old)
    assert phase.engine is None and phase.control_of is None and phase.env == {}


def test_a_side_change_reads_as_the_issue_asks() -> None:
    change = SideChange("model runner", "V2", "V1")
    assert change.text() == "model runner V1 (baseline: V2)"


def tensor_parallel(lines: list[str], ranks: int = 2) -> list[str]:
    """A start's real log as a tensor parallel start would write it: `tensor_parallel_size` among
    its non-default args, each worker's line once per rank (`Worker_TP1`, vLLM 0.32's name)."""
    out = []
    for line in lines:
        line = line.replace("'max_model_len': 2048", f"'max_model_len': 2048, "
                            f"'tensor_parallel_size': {ranks}")  # fmt: skip
        if line.startswith("(Worker pid="):
            out += [line.replace("(Worker pid=", f"(Worker_TP{r} pid=") for r in range(ranks)]
        else:
            out.append(line)
    return out


def test_a_tensor_parallel_start_reads_as_one_engine_and_its_size_is_no_side_change() -> None:
    base, ngram = cpu_log("baseline"), cpu_log("ngram")
    one = parse_engine_log(ngram)
    two = parse_engine_log(tensor_parallel(ngram))
    assert two.non_default_args["tensor_parallel_size"] == 2
    assert two.feature_warnings == one.feature_warnings  # each rank's warning, once
    assert side_changes(parse_engine_log(tensor_parallel(base)), two) == side_changes(
        parse_engine_log(base), one
    )


def test_a_warning_of_one_rank_only_is_a_side_change_whatever_vllm_named_the_rank() -> None:
    """vLLM 0.32 names a rank `Worker_TP1` (and a worker `VllmWorker-0`); older ones
    `VllmWorker TP1` and `VllmWorker rank=1` (vllm-project/vllm#21256)."""
    base = parse_engine_log(tensor_parallel(cpu_log("baseline")))
    said = "WARNING 12-02 10:44:20 [x.py:1] Chunked prefill is disabled"
    for rank in ("Worker_TP1", "VllmWorker-1", "VllmWorker TP1", "VllmWorker rank=1"):
        line = f"({rank} pid=7) {said}"
        found = side_changes(base, parse_engine_log([*tensor_parallel(cpu_log("ngram")), line]))
        assert [c.text() for c in found] == ["vLLM warned: Chunked prefill is disabled"], rank
