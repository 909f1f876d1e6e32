"""Synthetic runs with known effects, built as a live run builds its record (no tests here)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from pytest_specdecode.analysis.variance.restarts import RestartNoise
from pytest_specdecode.config.settings import Settings, load_settings
from pytest_specdecode.record.counters import Acceptance
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.profile import ProfileEntry
from pytest_specdecode.record.requests.samples import RequestSample
from pytest_specdecode.record.requests.token_capture import CapturedTokens, TokenIds, TokenIdSupport
from pytest_specdecode.record.schema import Phase, RunRecord, TargetInfo
from pytest_specdecode.record.store import RunStore

TEXT = "def insert(self, key):\n    node = Node(key)\n    if self.root is None: ..."
NGRAM_ACCEPTANCE = Acceptance(
    present=True,
    drafts=100.0,
    draft_tokens=500.0,
    accepted=150.0,
    mean_acceptance_length=2.5,
    draft_acceptance_rate=0.3,
    per_position_rates=[0.55, 0.35, 0.3, 0.2, 0.1],
)


def settings(
    tmp_path: Path,
    *,
    prompt_types: Sequence[str] = ("coding", "math"),
    candidates: Sequence[str] = ("ngram",),
    samples: int = 6,
    max_samples: int | None = None,  # None: a fixed design, so counts are known
    prompts: dict[str, str] | None = None,
    extra: str = "",
    run_extra: str = "",  # more lines of [run]
    warmup: int = 1,
) -> Settings:
    prompts = prompts or {}
    tables = "\n".join(
        f'[prompt_types.{w}]\nprompt = "{prompts.get(w, f"the {w} prompt")}"' for w in prompt_types
    )
    path = tmp_path / "experiment.toml"
    path.write_text(f"""
reports_dir = "{tmp_path / "reports"}"
[target]
api_base = "http://127.0.0.1:18011"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m", "--port", "18011"]
[run]
samples = {samples}
max_samples = {max_samples or samples}
warmup = {warmup}
max_tokens = 64
{run_extra}
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
eagle = {{ method = "eagle", model = "org/eagle-draft", num_speculative_tokens = 3 }}
{tables}
{extra}
""")
    return load_settings(path, spec_configs=list(candidates))


def record(s: Settings) -> RunRecord:
    return RunRecord(
        plugin_version="0.1.0",
        config_file=str(s.source),
        target=TargetInfo(
            backend="local", host="localhost", api_base=s.target.api_base, model=s.target.model
        ),
        run=s.run,
        candidates={c.name: dict(c.values) for c in s.candidates},
        prompt_types=dict(s.prompt_types),
        environment={"gpus": None, "git_commit": "0123456789abcdef0123"},
    )


def store(tmp_path: Path, s: Settings) -> RunStore:
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunStore(run_dir, record(s))


def sample(
    prompt_type: str, phase: str, index: int, tokens_per_s: float, *, text: str = TEXT, tokens=64
) -> RequestSample:
    return RequestSample(
        prompt_type=prompt_type,
        phase=phase,
        index=index,
        warmup=index < 0,
        started_at=1.8e9 + index,
        ttft_s=0.08,
        e2e_s=tokens / tokens_per_s if tokens_per_s > 0 else float("inf"),
        output_tokens=tokens,
        prompt_tokens=40,
        chunks=tokens + 1,
        tokens_per_chunk=[0] + [1] * tokens,
        text=text,
    )


def add_phase(
    rec: RunRecord,
    name: str,
    tokens_per_s: dict[str, float],
    *,
    arm: str | None = None,
    acceptance: Acceptance | None = None,
    texts: dict[str, list[str]] | None = None,
    version: str = "0.32.0",
    seed: int = 0,
    spread: float = 0.02,
    tokens: int = 64,
) -> Phase:
    """A measured phase with about `tokens_per_s[w]` tok/s per request on each prompt type."""
    rng = np.random.default_rng(seed)
    arm = arm or name
    spec = rec.candidates.get(arm)
    phase = Phase(
        name=name, arm=arm, spec=spec, service=f"local vLLM '{name}'", server_version=version
    )
    for w, rate in tokens_per_s.items():
        choices = (texts or {}).get(w, [TEXT])
        m = Measurement(prompt_type=w)
        m.warmup.append(sample(w, name, -1, rate, text=choices[0], tokens=tokens))
        for i in range(rec.run.samples):
            value = rate * (1 + rng.normal(0, spread))
            m.samples.append(
                sample(w, name, i, value, text=choices[i % len(choices)], tokens=tokens)
            )
        m.wall_s = sum(s.e2e_s for s in m.samples)
        m.acceptance = acceptance if spec is not None and acceptance else Acceptance(present=False)
        phase.measurements[w] = m
    rec.phases[name] = phase
    return phase


# --- runs with token ids (the n-gram prediction) ---------------------------------------------

RECORDED_REPLAY = Path(__file__).parents[1] / "data" / "vllm-0.32-cpu-ngram-replay.json"
PRESET = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}
OTHER_MIN = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
             "prompt_lookup_max": 3}  # fmt: skip
RECORDED_TYPES = ("coding", "math", "structured", "explanatory")


def captured(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    lookahead_ids: Sequence[int] = (),
    *,
    consistent: bool = True,
) -> CapturedTokens:
    return CapturedTokens(
        prompt_ids=tuple(prompt_ids),
        output_ids=tuple(output_ids),
        lookahead_ids=tuple(lookahead_ids),
        finish_reason="length",
        support=TokenIdSupport(output="return_token_ids", prompt="return_token_ids"),
        consistent=consistent,
        check="the timed output's text is a prefix of this request's text",
    )


def token_ids(
    by_prompt: dict[str, CapturedTokens], *, block_size: int | None = 128, max_model_len=1024
) -> TokenIds:
    return TokenIds(
        prompts=dict(by_prompt),
        max_model_len=max_model_len,
        block_size=block_size,
        prefix_caching=block_size is not None,
    )


def acceptance_of(drafts: int, draft_tokens: int, accepted: int, per_position) -> Acceptance:
    return Acceptance(
        present=True,
        drafts=float(drafts),
        draft_tokens=float(draft_tokens),
        accepted=float(accepted),
        mean_acceptance_length=1 + accepted / drafts if drafts else None,
        draft_acceptance_rate=accepted / draft_tokens if draft_tokens else None,
        per_position_rates=[n / drafts for n in per_position] if drafts else [],
    )


def recorded_run(tmp_path: Path, *, lookahead: bool = True) -> RunRecord:
    """A run made of what the real CPU vLLM 0.32 gave (tests/data): the baseline's token ids,
    and per candidate (the `ngram` preset, and k=3 n=2..3) the server's counters over one
    greedy request of 96 tokens per prompt type. explanatory's candidate outputs differed."""
    data = json.loads(RECORDED_REPLAY.read_text())
    prompts = {w: f"the {w} prompt" for w in RECORDED_TYPES}
    s = settings(
        tmp_path,
        prompt_types=RECORDED_TYPES,
        candidates=("ngram", "ngram-min2"),
        samples=1,
        extra="[presets.ngram-min2]\n"
        + "\n".join(f"{k} = {json.dumps(v)}" for k, v in OTHER_MIN.items()),
    )
    rec = record(s)
    rates = {w: 20.0 for w in RECORDED_TYPES}
    add_phase(rec, "baseline", rates, seed=1)
    base_ids = {}
    for w in RECORDED_TYPES:
        b = data["baseline"][w]
        ahead = b["lookahead_ids"] if lookahead else ()
        base_ids[w] = captured(b["prompt_ids"], b["output_ids"], ahead)
    for name, values in (("ngram", PRESET), ("ngram-min2", OTHER_MIN)):
        counts = data["configs"][json.dumps(values, sort_keys=True)]
        texts = {w: [TEXT if counts[w]["outputs_equal"] else TEXT + " (differs)"] for w in rates}
        phase = add_phase(rec, name, rates, texts=texts, seed=2)
        for w, m in phase.measurements.items():
            c = counts[w]
            m.acceptance = acceptance_of(
                c["drafts"], c["draft_tokens"], c["accepted"], c["accepted_per_position"]
            )
            if c["outputs_equal"]:
                m.token_ids = token_ids({prompts[w]: base_ids[w]})
    for w, m in rec.phases["baseline"].measurements.items():
        m.token_ids = token_ids({prompts[w]: base_ids[w]})
    for phase in rec.phases.values():  # the counters cover one request, sent first: no warm-up
        for m in phase.measurements.values():
            m.warmup.clear()
    return rec


# --- runs with per-request speculative metrics (acceptance per level) ------------------------

PER_REQUEST = Path(__file__).parents[1] / "data" / "vllm-0.32-cpu-per-request-steps.json"


def per_request_data() -> dict:
    """The capture: per level, each request's ids and payload, and the counters' deltas."""
    return json.loads(PER_REQUEST.read_text())


def per_request_run(tmp_path: Path) -> RunRecord:
    """A run made of what the real CPU vLLM 0.32 gave with --per-request-spec-decode-metrics
    detailed (tests/data): the shipped math set at c1 and c4, each request's payload and token
    ids, and the counters over each level's window. The baseline's outputs are taken to be the
    candidate's at c1, at both levels (the capture has no baseline of its own)."""
    data = per_request_data()
    s = settings(
        tmp_path,
        prompt_types=(),
        samples=12,
        extra='[prompt_types.math]\nprompt_set = "math"',
        run_extra="concurrency = [1, 4]",
    )
    rec = record(s)
    base = {r["prompt_index"]: r for r in data["levels"]["c1"]["requests"]}
    for arm in ("baseline", "ngram"):
        phase = Phase(name=arm, arm=arm, spec=rec.candidates.get(arm), server_version="0.32.0")
        for level in s.run.levels:
            key = f"math@{level.label}"
            found = data["levels"][level.label]
            m = Measurement(prompt_type="math", level=level, key=key)
            for i, r in enumerate(found["requests"]):
                mine = base[r["prompt_index"]] if arm == "baseline" else r
                one = sample("math", arm, i, 40.0, tokens=len(mine["output_ids"]))
                one.prompt_index, one.level = r["prompt_index"], level.label
                one.prompt_ids, one.output_ids = mine["prompt_ids"], mine["output_ids"]
                one.started_at = 1.8e9 + 100 * (level.concurrency or 1) + i
                one.spec_decode = r["payload"] if arm == "ngram" else None
                m.samples.append(one)
            m.wall_s = sum(x.e2e_s for x in m.samples)
            if arm == "ngram":
                c = found["counters"]
                m.acceptance = acceptance_of(
                    c["drafts"], c["draft_tokens"], c["accepted"], c["accepted_per_position"]
                )
            phase.measurements[key] = m
        rec.phases[arm] = phase
    return rec


def aa_entry(run: str, version: str, sd: float, **extra) -> ProfileEntry:
    """A host profile's entry: one A/A run of 8 starts that measured `sd` on both metrics."""
    measured = RestartNoise(sd, 7.0, "8 server starts of this run")
    return ProfileEntry(
        run=run,
        date="2026-12-01T17:27:52+00:00",
        vllm_version=version,
        gpus=extra.pop("gpus", None),
        starts=8,
        noise={m: measured.to_dict() for m in ("throughput", "tpot")},
        **extra,
    )
