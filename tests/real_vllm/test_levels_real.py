"""Load levels and prompt sets on the real CPU vLLM, through the tool (minutes).

`pytest suites/ --spec-config ngram --spec-concurrency 1,4,8`, smaller: two of the shipped prompt
sets and short outputs. Each phase measures the three levels with no extra restart, the verdicts
come per prompt type and level, the paying load (or its absence) is told and drawn, and the
suite's own example test runs at every level through the `specdecode` fixture.
"""

from __future__ import annotations

import re

import pytest

from ..support.embedded import write_experiment

TWO_SETS = (
    '[prompt_types.coding]\nprompt_set = "coding"\n[prompt_types.math]\nprompt_set = "math"\n'
)


# The mechanics, not a verdict: c1 sends the least the design accepts for 12 comparisons (6;
# the run refuses 4), each higher level two requests per slot.
SAMPLES = 6


def test_a_1_4_8_sweep_measures_every_level_in_each_phase(pytester: pytest.Pytester) -> None:
    exp = write_experiment(
        pytester,
        run={
            "samples": SAMPLES,
            "max_samples": SAMPLES,
            "max_tokens": 32,
            "record_token_ids": True,
        },
        thresholds="min_tokens_per_s = 0.1",
        prompt_types=TWO_SETS,
    )
    result = pytester.runpytest_subprocess(
        *exp.args("--spec-config", "ngram", "--spec-concurrency", "1,4,8", "-rA")
    )
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out + err
    data = exp.results()

    # Two starts in all (baseline, candidate), each measuring c1, c4 and c8 of both types.
    assert err.count("starting local vLLM process") == 2, err
    keys = [f"{t}@c{n}" for t in ("coding", "math") for n in (1, 4, 8)]
    for phase in ("baseline", "ngram"):
        ms = data["phases"][phase]["measurements"]
        assert list(ms) == keys
        for key, m in ms.items():
            n = int(key.rsplit("@c", 1)[1])
            assert m["level"]["concurrency"] == n
            assert len(m["samples"]) == max(SAMPLES, 2 * n)
            assert m["summary"]["level"]["peak_in_flight"] == n, key
            texts = {s["text"] for s in m["samples"]}
            assert len(texts) > 1, key  # distinct prompts give distinct outputs within a phase
            assert len({s["prompt_index"] for s in m["samples"]}) > 1
    # Verdicts per prompt type and level, as tests with the level in their id.
    verdicts = data["analysis"]["verdicts"]["ngram"]
    assert list(verdicts) == keys
    for key in keys:
        t, level = key.split("@")
        assert re.search(rf"test_speculation_does_not_regress\[ngram-{t}-{level}\]", out), out
    # The project's own example test (suites/test_time_to_first_token.py) at every level: its
    # fixture has one shape; it passes, or fails on its own rule, never on a key.
    assert "KeyError" not in out, out
    for key in keys:
        t, level = key.split("@")
        case = rf"test_speculation_keeps_the_first_token_prompt\[ngram-{t}-{level}\]"
        # a FAILED line is cut to the terminal's width: its reason is read from its failure
        passed = re.search(rf"^PASSED \S+::{case}", out, re.M)
        failed = re.search(rf"^FAILED \S+::{case}", out, re.M)
        reason = re.search(rf"_ {case} _.*?AssertionError: .*?median TTFT", out, re.S)
        assert passed or (failed and reason), (key, out)
    # The paying load per prompt type, in the tables and drawn.
    paying_loads = data["analysis"]["paying_loads"]["ngram"]
    assert set(paying_loads) == {"coding", "math"}
    assert all(x["kind"] != "single level" for x in paying_loads.values())
    summary = (exp.run_dir() / "summary.md").read_text()
    assert "### Where speculation stops paying" in summary
    for t, x in paying_loads.items():
        assert f"ngram / {t}: {x['text']}" in summary
    assert (exp.run_dir() / "speedup-ngram.png").read_bytes()[:4] == b"\x89PNG"
    assert "### Load levels" in summary and "| ngram | math@c8 | 16 |" in summary
    assert_acceptance_per_request_and_step(data, summary, keys)
    assert exp.leftover_servers() == []


def assert_acceptance_per_request_and_step(data: dict, summary: str, keys: list[str]) -> None:
    """The candidate asked for vLLM's per-request metrics; at every level each timed request
    carries its own figures, their sum is the counters' delta over the (quiet) window, and the
    replay is checked step by step against each request's arrays."""
    args = data["phases"]["ngram"]["extra_args"]
    assert args == ["--per-request-spec-decode-metrics", "detailed"]
    assert data["phases"]["ngram"]["request_metrics"] == "detailed"
    assert data["phases"]["baseline"]["request_metrics"] is None
    for key in keys:
        m = data["phases"]["ngram"]["measurements"][key]
        for s in m["samples"]:
            payload = s["spec_decode"]
            assert payload is not None, (key, s["index"])
            assert len(payload.get("per_step_drafted", [])) == payload["num_spec_steps"]
            assert s["output_ids"] and len(s["output_ids"]) == s["output_tokens"]
        own, counters = m["summary"]["request_acceptance"], m["acceptance"]
        assert m["foreign"] is None and m["summary"]["request_check"] is None
        for name in ("drafts", "draft_tokens", "accepted"):
            assert own[name] == counters[name], (key, name, own, counters)
        assert own["drafts"] == sum(s["spec_decode"]["num_spec_steps"] for s in m["samples"])
    by_level = data["analysis"]["acceptance_by_level"]
    entries = {e["key"]: e for e in by_level["levels"]}
    assert list(entries) == keys
    for key, e in entries.items():
        assert e["source"] == "requests" and e["counters_check"] is None
        n = len(data["phases"]["ngram"]["measurements"][key]["samples"])
        assert e["steps"]["requests"] == e["own_steps"]["requests"] == n, key
        # On its own tokens, every request drafted as the replay says, at every level.
        assert e["own_steps"]["agreeing"] == n, (key, e["own_steps"]["text"])
        classes = set(e["steps"]["by_first"]) | set(e["steps"]["by_class"])
        assert classes <= {"outputs differ"}, (key, e["steps"]["text"])
        assert e["predicted"] is not None and e["error"] is not None
        assert f"| ngram (k=5 n=4..4) | {key.replace('@', ' @ ')} | {n} |" in summary
    assert by_level["batch_predictable"] is True, by_level["batch_rule"]
    assert "Above the first level: in a batch (c4, c8) the n-gram proposer drafted" in summary
