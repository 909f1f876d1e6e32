"""The n-gram replay and the cost model against the real CPU vLLM (minutes; run under the lock).

One server start per config: the baseline, the shipped `ngram` preset, a config with another
prompt_lookup_min, and a third config that checks the cost model. Per prompt type and config,
the server's spec-decode counters over one greedy request must equal the replay of the
baseline's token ids exactly, wherever the candidate's output equals the baseline's (with
look-ahead; without it, within the stated bound). Figures go to `replay-real.json` in the
test's temporary folder and are printed (run with -s to see them). Its "recorded" part (token
ids and counters) is what tests/data/vllm-0.32-cpu-ngram-replay.json holds for the fast tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import statistics
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pytest_specdecode.analysis.cost_model import (
    BaselineTiming,
    CandidateTiming,
    fit_cost,
    predict,
    recommend,
    relative_noise,
)
from pytest_specdecode.analysis.ngram_replay import (
    NgramSettings,
    ReplayStats,
    RequestTokens,
    effective_settings,
    grid,
    propose,
    replay,
)
from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.measure.loadgen import RequestSample, RequestSpec, run_requests
from pytest_specdecode.measure.server_metrics import parse_counters as parse_spec_counters
from pytest_specdecode.measure.token_ids import CapturedTokens, capture_token_ids, detect_support
from pytest_specdecode.targets.base import wait_until_ready
from pytest_specdecode.targets.local import LocalProcessService

from ..support.embedded import MODEL, MODEL_DIR, REPO, SERVER_PYTHON, free_port

MAX_TOKENS = 96
MAX_MODEL_LEN = 1024
LOOKAHEAD = 8
TIMED = 5  # timed streams per prompt type and config, after one warm-up
PROMPTS = {  # the first prompt of each of the suite's prompt types: the seed's own
    name: t.prompt
    for name, t in load_settings(REPO / "suites" / "specdecode.toml").prompt_types.items()
}
PRESET = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
OTHER_MIN = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
             "prompt_lookup_max": 3}  # fmt: skip
THIRD = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1,
         "prompt_lookup_max": 2}  # fmt: skip
REPORT: dict[str, Any] = {}


@dataclass
class Counters:
    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]
    prefix_hits: int


@dataclass
class Phase:
    """One server's measurements: per prompt type, one counted request and timed streams."""

    name: str
    ids: dict[str, CapturedTokens] = field(default_factory=dict)
    counted: dict[str, Counters] = field(default_factory=dict)
    samples: dict[str, list[RequestSample]] = field(default_factory=dict)
    log: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _counters(client: httpx.Client, api: str, k: int) -> Counters:
    """The spec-decode and prefix-cache counters, read until two reads agree (they lag a step)."""
    previous = None
    for _ in range(20):
        text = client.get(f"{api}/metrics").text
        if text == previous:
            break
        previous = text
        time.sleep(0.3)
    spec = parse_spec_counters(previous or "")
    hits = sum(
        s.value
        for fam in text_string_to_metric_families(previous or "")
        for s in fam.samples
        if s.name == "vllm:prefix_cache_hits_total"
    )
    return Counters(
        drafts=int(spec.drafts or 0),
        draft_tokens=int(spec.draft_tokens or 0),
        accepted=int(spec.accepted or 0),
        per_position=tuple(int(spec.accepted_per_position.get(i, 0)) for i in range(k)),
        prefix_hits=int(hits),
    )


def _delta(before: Counters, after: Counters) -> Counters:
    return Counters(
        after.drafts - before.drafts,
        after.draft_tokens - before.draft_tokens,
        after.accepted - before.accepted,
        tuple(a - b for a, b in zip(after.per_position, before.per_position, strict=True)),
        after.prefix_hits - before.prefix_hits,
    )


@contextlib.contextmanager
def _serve(name: str, spec_values: dict[str, Any] | None, tmp: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(SERVER_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(MODEL_DIR), "--served-model-name", MODEL, "--host", "127.0.0.1",
            "--port", str(port), "--enforce-eager", "--max-model-len", str(MAX_MODEL_LEN),
            "--seed", "0"]  # fmt: skip
    if spec_values is not None:
        argv += ["--speculative-config", json.dumps(spec_values)]
    service = LocalProcessService(
        name=name,
        argv=argv,
        api_base=f"http://127.0.0.1:{port}",
        model=MODEL,
        workdir=REPO,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        log_path=tmp / f"server-{name}.log",
    )
    service.start()
    try:
        wait_until_ready(service, timeout_s=400, progress=lambda line: None)
        yield service.api_base
    finally:
        service.stop()


def _measure(name: str, spec_values: dict[str, Any] | None, tmp: Path) -> Phase:
    k = spec_values["num_speculative_tokens"] if spec_values else 1
    phase = Phase(name)
    with _serve(name, spec_values, tmp) as api, httpx.Client(timeout=300) as client:
        for prompt_type, prompt in PROMPTS.items():
            spec = RequestSpec(api_base=api, model=MODEL, prompt=prompt, max_tokens=MAX_TOKENS)
            samples, _ = asyncio.run(
                run_requests(spec, workload=prompt_type, phase=name, count=1 + TIMED)
            )
            phase.samples[prompt_type] = samples[1:]
            if spec_values is None:  # the baseline: ids and look-ahead, in one untimed request
                phase.ids[prompt_type] = capture_token_ids(
                    spec, lookahead=LOOKAHEAD, reference_text=samples[-1].text
                )
                continue
            # A candidate: one request of exactly max_tokens, counted on its own.
            before = _counters(client, api, k)
            phase.ids[prompt_type] = capture_token_ids(
                spec, lookahead=0, reference_text=samples[-1].text
            )
            phase.counted[prompt_type] = _delta(before, _counters(client, api, k))
        if spec_values is PRESET:
            phase.extra["padded_prefill"] = _padded_prefill_probe(client, api, k)
        if spec_values is None:
            phase.extra["support"] = detect_support(
                RequestSpec(api_base=api, model=MODEL, prompt="Hi", max_tokens=1)
            )
    phase.log = (tmp / f"server-{name}.log").read_text(errors="replace")
    return phase


def _padded_prefill_probe(client: httpx.Client, api: str, k: int) -> dict[str, Any]:
    """A prompt of 129 tokens, sent twice: the second finds 128 (one CPU block) cached."""
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    target = 129
    for length in range(60, 200):
        text = "Continue this list: " + " ".join(words[i % 10] for i in range(length))
        count = client.post(
            f"{api}/tokenize",
            json={"model": MODEL, "messages": [{"role": "user", "content": text}]},
        ).json()["count"]
        if count == target:
            break
    else:
        pytest.fail("no probe prompt of exactly 129 tokens found")
    spec = RequestSpec(api_base=api, model=MODEL, prompt=text, max_tokens=24)
    runs = []
    for _ in range(2):  # a miss, then a hit: each counted on its own
        before = _counters(client, api, k)
        ids = capture_token_ids(spec, lookahead=0)
        runs.append((ids, _delta(before, _counters(client, api, k))))
    truth = capture_token_ids(spec, lookahead=LOOKAHEAD)  # output and look-ahead, not counted
    return {"prompt_tokens": count, "runs": runs, "truth": truth}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SERVER_PYTHON.exists():
        pytest.fail(
            f"the embedded vLLM is not set up ({SERVER_PYTHON}): run scripts/setup-embedded"
        )
    return tmp_path_factory.mktemp("replay-real")


@pytest.fixture(scope="module")
def baseline(tmp: Path) -> Phase:
    return _measure("baseline", None, tmp)


@pytest.fixture(scope="module")
def preset(tmp: Path, baseline: Phase) -> Phase:
    return _measure("ngram", PRESET, tmp)


@pytest.fixture(scope="module")
def other_min(tmp: Path, preset: Phase) -> Phase:
    return _measure("ngram-min2", OTHER_MIN, tmp)


@pytest.fixture(scope="module")
def third(tmp: Path, other_min: Phase) -> Phase:
    return _measure("ngram-third", THIRD, tmp)


@pytest.fixture(scope="module", autouse=True)
def report(tmp: Path) -> Iterator[None]:
    yield
    (tmp / "replay-real.json").write_text(json.dumps(REPORT, indent=1, default=str))
    print(f"\nreplay-real figures: {tmp / 'replay-real.json'}")


def _replayed(baseline: Phase, prompt_type: str, s: NgramSettings, hits: int, *, look: bool):
    ids = baseline.ids[prompt_type]
    return replay(
        ids.prompt_ids,
        ids.output_ids,
        s,
        lookahead_ids=ids.lookahead_ids if look else (),
        max_model_len=MAX_MODEL_LEN,
        cached_prompt_tokens=hits,
    )


def _row(r: ReplayStats) -> tuple[int, int, int, tuple[int, ...]]:
    return (r.drafts, r.draft_tokens, r.accepted, r.accepted_per_position)


def _check_config(baseline: Phase, candidate: Phase, values: dict[str, Any]) -> None:
    settings = effective_settings(values)
    rows, mismatches, compared = [], [], 0
    for prompt_type, measured in candidate.counted.items():
        same = candidate.ids[prompt_type].output_ids == baseline.ids[prompt_type].output_ids
        exact = _replayed(baseline, prompt_type, settings, measured.prefix_hits, look=True)
        bound = _replayed(baseline, prompt_type, settings, measured.prefix_hits, look=False)
        got = (measured.drafts, measured.draft_tokens, measured.accepted, measured.per_position)
        in_bound = (
            got[:2] == (bound.drafts, bound.draft_tokens)
            and bound.accepted <= measured.accepted <= bound.accepted_max
            and all(
                lo <= m <= hi
                for lo, m, hi in zip(
                    bound.accepted_per_position,
                    measured.per_position,
                    bound.accepted_per_position_max,
                    strict=True,
                )
            )
        )
        rows.append(
            {
                "prompt": prompt_type,
                "outputs_equal": same,
                "lookahead": len(baseline.ids[prompt_type].lookahead_ids),
                "finish": baseline.ids[prompt_type].finish_reason,
                "predicted": _row(exact),
                "predicted_exact": exact.exact,
                "measured": got,
                "without_lookahead": _row(bound),
                "unverified_without_lookahead": bound.unverified_tokens,
                "within_bound_without_lookahead": in_bound,
                "predicted_len": exact.mean_acceptance_length,
                "measured_len": 1 + measured.accepted / measured.drafts
                if measured.drafts
                else None,
                "tokens_per_step": exact.tokens_per_step,
                "drafts_per_step": exact.drafts_per_step,
            }
        )
        if same:
            compared += 1
            if _row(exact) != got or not exact.exact or not in_bound:
                mismatches.append(rows[-1])
    REPORT[settings.label] = rows
    recorded = REPORT.setdefault("recorded", {"max_model_len": MAX_MODEL_LEN, "configs": {}})
    recorded["baseline"] = {p: ids.to_dict() for p, ids in baseline.ids.items()}
    recorded["configs"][json.dumps(values, sort_keys=True)] = {
        p: {
            "outputs_equal": candidate.ids[p].output_ids == baseline.ids[p].output_ids,
            "drafts": c.drafts,
            "draft_tokens": c.draft_tokens,
            "accepted": c.accepted,
            "accepted_per_position": list(c.per_position),
            "prefix_cache_hits": c.prefix_hits,
        }
        for p, c in candidate.counted.items()
    }
    print(f"\n{settings.label}: predicted vs measured (drafts, draft tokens, accepted, per pos)")
    for row in rows:
        bound = f"{row['without_lookahead']}+{row['unverified_without_lookahead']}"
        print(f"  {row['prompt']:<12} same={row['outputs_equal']!s:<5} "
              f"pred={row['predicted']} meas={row['measured']} no-look={bound}")  # fmt: skip
    assert compared >= 2, f"too few prompts with the baseline's output to compare: {rows}"
    assert not mismatches, mismatches


def test_server_runs_the_v1_proposer_and_offers_token_ids(baseline: Phase) -> None:
    assert "using the V1 model runner" in baseline.log
    support = baseline.extra["support"]
    assert (support.output, support.prompt) == ("return_token_ids", "return_token_ids")
    for prompt_type, ids in baseline.ids.items():
        assert ids.consistent, (prompt_type, ids.check)
        assert len(ids.output_ids) == MAX_TOKENS or ids.finish_reason == "stop"
        if ids.finish_reason == "length":
            assert len(ids.lookahead_ids) == LOOKAHEAD


def test_shipped_preset_predicted_equals_measured(baseline: Phase, preset: Phase) -> None:
    _check_config(baseline, preset, PRESET)


def test_other_prompt_lookup_min_predicted_equals_measured(
    baseline: Phase, other_min: Phase
) -> None:
    _check_config(baseline, other_min, OTHER_MIN)


def test_padded_prefill_after_a_prefix_cache_hit(preset: Phase) -> None:
    probe = preset.extra["padded_prefill"]
    (first_ids, first), (second_ids, second) = probe["runs"]
    truth = probe["truth"]
    assert probe["prompt_tokens"] == 129 and first.prefix_hits == 0 and second.prefix_hits == 128
    assert first_ids.output_ids == second_ids.output_ids == truth.output_ids
    assert len(truth.lookahead_ids) == LOOKAHEAD
    s = effective_settings(PRESET)
    for measured in (first, second):
        predicted = replay(
            truth.prompt_ids,
            truth.output_ids,
            s,
            lookahead_ids=truth.lookahead_ids,
            max_model_len=MAX_MODEL_LEN,
            cached_prompt_tokens=measured.prefix_hits,
        )
        assert predicted.exact
        assert _row(predicted) == (
            measured.drafts,
            measured.draft_tokens,
            measured.accepted,
            measured.per_position,
        )
    # The padded prefill: one more draft of k placeholder tokens, none accepted.
    assert (second.drafts - first.drafts, second.draft_tokens - first.draft_tokens) == (1, 5)
    assert second.accepted == first.accepted
    REPORT["padded_prefill"] = {"first": first, "second": second}


def _timing(samples: list[RequestSample]) -> tuple[float, float, float, list[float]]:
    tpots = [s.tpot_s for s in samples if s.tpot_s is not None]
    return (
        statistics.median(tpots),
        statistics.median(s.ttft_s for s in samples),
        statistics.mean(s.output_tokens for s in samples),
        tpots,
    )


def test_cost_model_predicts_the_third_config(
    baseline: Phase, preset: Phase, other_min: Phase, third: Phase
) -> None:
    """Fit from the baseline and the preset only; predict the two other configs, then compare."""
    bases = {}
    for prompt_type, samples in baseline.samples.items():
        tpot, ttft, n, tpots = _timing(samples)
        bases[prompt_type] = BaselineTiming(tpot, ttft, n, tpot_noise=relative_noise(tpots))
    s_preset = effective_settings(PRESET)
    observed = []  # one observation per timed request, its steps replayed on its own ids
    for prompt_type, samples in preset.samples.items():
        own = preset.ids[prompt_type]
        r = replay(own.prompt_ids, own.output_ids, s_preset, max_model_len=MAX_MODEL_LEN)
        observed += [CandidateTiming.from_replay(prompt_type, r, x.tpot_s) for x in samples]
    fit = fit_cost(bases, observed)
    assert fit is not None
    REPORT["cost_model_observations"] = [
        (o.prompt_type, o.draft_tokens_per_step, o.decode_tokens_per_step,
         o.tpot_s * o.decode_tokens_per_step / bases[o.prompt_type].tpot_s - 1)
        for o in observed
    ]  # fmt: skip
    rows = []
    for phase, values in ((other_min, OTHER_MIN), (third, THIRD)):
        s = effective_settings(values)
        replays = {p: {s: _replayed(baseline, p, s, 0, look=True)} for p in PROMPTS}
        predictions = predict(bases, replays, fit)
        for prompt_type, samples in phase.samples.items():
            pred = predictions[prompt_type][s]
            measured = statistics.median(x.tokens_per_s for x in samples)
            assert pred.tokens_per_s_band is not None
            low, high = pred.tokens_per_s_band
            rows.append(
                {
                    "config": s.label,
                    "prompt": prompt_type,
                    "baseline_tok_s": statistics.median(
                        x.tokens_per_s for x in baseline.samples[prompt_type]
                    ),
                    "predicted_tok_s": pred.tokens_per_s,
                    "band": (low, high),
                    "measured_tok_s": measured,
                    "inside": low <= measured <= high,
                    "outputs_equal": phase.ids[prompt_type].output_ids
                    == baseline.ids[prompt_type].output_ids,
                }
            )
    REPORT["cost_model"] = {"fit": fit.describe(), "rows": rows}
    print(f"\ncost model: {fit.describe()}")
    for row in rows:
        print(f"  {row['config']:<11} {row['prompt']:<12} base {row['baseline_tok_s']:5.1f} "
              f"pred {row['predicted_tok_s']:5.1f} [{row['band'][0]:5.1f}, {row['band'][1]:5.1f}] "
              f"meas {row['measured_tok_s']:5.1f} inside={row['inside']}")  # fmt: skip
    # The whole grid from the same fit: what it would recommend measuring next.
    replays = grid({p: [_request(baseline, p)] for p in PROMPTS}, max_model_len=MAX_MODEL_LEN)
    advice = recommend(predict(bases, replays, fit), measured=[s_preset])
    REPORT["recommendation"] = advice.reason
    print(f"  next: {advice.reason}")
    third_rows = [r for r in rows if r["config"] == effective_settings(THIRD).label]
    inside = sum(r["inside"] for r in third_rows)
    assert inside >= len(third_rows) - 1, third_rows


def _request(phase: Phase, prompt_type: str) -> RequestTokens:
    ids = phase.ids[prompt_type]
    return RequestTokens.of(ids.prompt_ids, ids.output_ids, ids.lookahead_ids)


def test_propose_equals_vllms_own_function() -> None:
    """The plain rule against vLLM 0.32's numba function itself, run in the server's venv."""
    rng = random.Random(5)
    cases = []
    for _ in range(2000):
        n = rng.randint(0, 60)
        tokens = [rng.randint(0, rng.choice([1, 2, 4, 9])) for _ in range(n)]
        lo = rng.randint(1, 5)
        cases.append((tokens, lo, rng.randint(lo, 6), rng.choice([1024, n + rng.randint(0, 3)]),
                      rng.randint(1, 8)))  # fmt: skip
    script = (
        "import json, sys\nimport numpy as np\n"
        "from vllm.v1.spec_decode.ngram_proposer import "
        "_find_longest_matched_ngram_and_propose_tokens as f\n"
        "out = [f(np.array(t, dtype=np.int32), lo, hi, mml, k).tolist()"
        " for t, lo, hi, mml, k in json.load(sys.stdin)]\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(SERVER_PYTHON), "-c", script],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for (tokens, lo, hi, mml, k), expected in zip(cases, theirs, strict=True):
        ours = propose(tokens, NgramSettings(k, lo, hi), max_model_len=mml)
        assert ours == expected, (tokens, lo, hi, mml, k)
