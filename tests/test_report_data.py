"""Synthetic experiments for the report tests (helpers only, no tests here).

The phases are recorded exactly as `Experiment._measure` records them (set_phase, the samples,
each prompt type's summary), so the reports read what a real run would leave behind.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pytest_specdecode.config.settings import Settings, load_settings
from pytest_specdecode.measure.experiment import Experiment, PhaseResult, WorkloadMeasurement
from pytest_specdecode.measure.loadgen import RequestSample
from pytest_specdecode.measure.server_metrics import Acceptance
from pytest_specdecode.record.store import ResultsFile

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
    workloads: Sequence[str] = ("coding", "math"),
    candidates: Sequence[str] = ("ngram",),
    samples: int = 6,
    prompts: dict[str, str] | None = None,
) -> Settings:
    prompts = prompts or {}
    tables = "\n".join(
        f'[workloads.{w}]\nprompt = "{prompts.get(w, f"the {w} prompt")}"' for w in workloads
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
warmup = 1
max_tokens = 64
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
eagle = {{ method = "eagle", model = "org/eagle-draft", num_speculative_tokens = 3 }}
{tables}
""")
    return load_settings(path, spec_configs=list(candidates))


def experiment(tmp_path: Path, s: Settings, *, run_dir: Path | None = None) -> Experiment:
    run_dir = run_dir or tmp_path / "run"
    results = ResultsFile(
        run_dir / "results.json",
        {
            "plugin_version": "0.1.0",
            "config_file": str(s.source),
            "target": {
                "backend": "local",
                "host": "localhost",
                "unit": None,
                "api_base": s.target.api_base,
                "model": s.target.model,
            },
            "run": s.run.__dict__,
            "candidates": {c.name: dict(c.values) for c in s.candidates},
            "workloads": {w.name: w.__dict__ for w in s.workloads.values()},
            "environment": {"gpus": None, "git_commit": "0123456789abcdef0123"},
        },
    )
    board = SimpleNamespace(restore_report=None)
    return Experiment(s, board, results, progress=lambda message: None)  # type: ignore[arg-type]


def add_phase(
    exp: Experiment,
    name: str,
    tokens_per_s: dict[str, float],
    *,
    acceptance: Acceptance | None = None,
    texts: dict[str, list[str]] | None = None,
    version: str = "0.32.0",
    seed: int = 0,
    spread: float = 0.02,
) -> PhaseResult:
    """A measured phase with about `tokens_per_s[w]` tok/s per request on each prompt type."""
    rng = np.random.default_rng(seed)
    spec = None if name.startswith("baseline") else exp.candidate(name)
    phase = PhaseResult(name=name, spec=spec, server_version=version)
    exp.results.set_phase(
        name,
        {
            "spec": spec.values if spec else None,
            "server_version": version,
            "service": f"local vLLM process '{name}'",
            "workloads": {},
        },
    )
    for w, rate in tokens_per_s.items():
        samples = []
        for i in range(-1, exp.settings.run.samples):  # one warm-up first
            tokens = 64
            e2e = tokens / (rate * (1 + rng.normal(0, spread)))
            sample = RequestSample(
                workload=w,
                phase=name,
                index=i + 1,
                warmup=i < 0,
                started_at=1.8e9 + i,
                ttft_s=0.08,
                e2e_s=e2e,
                output_tokens=tokens,
                prompt_tokens=40,
                chunks=tokens + 1,
                tokens_per_chunk=[0] + [1] * tokens,
                text=(texts or {}).get(w, [TEXT])[max(i, 0) % len((texts or {}).get(w, [TEXT]))],
            )
            exp.results.add_sample(sample.to_dict())
            if not sample.warmup:
                samples.append(sample)
        acc = acceptance if spec is not None and acceptance else Acceptance(present=False)
        m = WorkloadMeasurement(w, samples, sum(s.e2e_s for s in samples), acc)
        phase.measurements[w] = m
        exp.results.data["phases"][name]["workloads"][w] = m.summary()
    exp.results.data["phases"][name]["acceptance"] = phase.acceptance.to_dict()
    exp.results.flush()
    exp.phases[name] = phase
    return phase
