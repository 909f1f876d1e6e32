"""Searches over synthetic runs with a known step cost (no tests here).

The baseline's token ids are what the real CPU vLLM 0.32 gave (tests/data); a candidate's
requests are those outputs replayed under its config, each taking, per decode step,
t0 * (1 + b + c * draft tokens) at its level: the cost model's own form, with known b and c.
So a search's choices can be checked against the truth.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pytest_specdecode.analysis.prediction.ngram_replay import replay_many
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings, RequestTokens
from pytest_specdecode.analysis.run import candidate_verdicts
from pytest_specdecode.analysis.search.policy import Reload, SearchPolicy, Stop
from pytest_specdecode.config.arms import BASELINE, cell_key
from pytest_specdecode.config.specconfig import BATCH_TABLE_KEY
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.requests.samples import RequestSample
from pytest_specdecode.record.schema import Phase, RunRecord
from pytest_specdecode.record.search import SearchRecord, SearchReload, slot_name

from . import synthetic

DATA = json.loads(synthetic.RECORDED_REPLAY.read_text())
TTFT = 0.05


@dataclass(frozen=True)
class Truth:
    """The step cost per level label, (b, c), and the baseline's TPOT per level."""

    cost: Mapping[str, tuple[float, float]] = field(default_factory=lambda: {"c1": (0.1, 0.03)})
    t0: Mapping[str, float] = field(default_factory=lambda: {"c1": 0.016})
    noise: float = 0.01  # relative, per request

    def tpot(self, level: str, tau: float, m: float, rng: np.random.Generator) -> float:
        b, c = self.cost[level]
        return self.t0[level] * (1 + b + c * m) / tau * (1 + rng.normal(0, self.noise))


def search_record(
    tmp_path: Path,
    truth: Truth,
    *,
    types: Sequence[str] = ("coding", "math"),
    concurrency: Sequence[int] = (1,),
    samples: int = 6,
    seed: int = 0,
    restart_noise: float | None = 0.005,
) -> RunRecord:
    """A run with its baseline measured at every level, token ids and all. The truth has no
    restart noise: the host's profile says so (`restart_noise`, measured; None: assumed 5%),
    so that a config's verdict can be improved in one start per arm."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    s = synthetic.settings(
        tmp_path,
        prompt_types=types,
        candidates=(),
        samples=samples,
        run_extra=f"concurrency = {list(concurrency)}",
    )
    rec = synthetic.record(s)
    rng = np.random.default_rng(seed)
    phase = Phase(name=BASELINE, arm=BASELINE, spec=None, server_version="0.32.0")
    for w in types:
        b = DATA["baseline"][w]
        for level in s.run.levels:
            key = cell_key(w, level, several=len(s.run.levels) > 1)
            m = Measurement(prompt_type=w, level=level, key=key)
            for i in range(samples):
                tpot = truth.t0[level.label] * (1 + rng.normal(0, truth.noise))
                m.samples.append(_sample(w, BASELINE, level.label, i, tpot, b))
            m.wall_s = sum(x.e2e_s for x in m.samples)
            if level == s.run.levels[0]:
                m.token_ids = synthetic.token_ids(
                    {
                        f"the {w} prompt": synthetic.captured(
                            b["prompt_ids"], b["output_ids"], b["lookahead_ids"]
                        )
                    }
                )
            phase.measurements[key] = m
    rec.phases[BASELINE] = phase
    if restart_noise is not None:
        quiet = {"sd": restart_noise, "df": 40.0, "source": "the simulation", "measured": True}
        rec.restart_noise_prior = {"throughput": quiet, "tpot": quiet}
    return rec


def _sample(w: str, phase: str, level: str, i: int, tpot: float, ids: dict) -> RequestSample:
    n = len(ids["output_ids"])
    start = 1.8e9 + i
    return RequestSample(
        prompt_type=w,
        phase=phase,
        index=i,
        warmup=False,
        started_at=start,
        ttft_s=TTFT,
        e2e_s=TTFT + (n - 1) * tpot,
        output_tokens=n,
        prompt_tokens=len(ids["prompt_ids"]),
        chunks=n,
        text=synthetic.TEXT,
        prompt_index=0,
        level=level,
        prompt_ids=list(ids["prompt_ids"]),
        output_ids=list(ids["output_ids"]),
    )


def measure(rec: RunRecord, arm: str, values: Mapping, truth: Truth, *, seed: int = 1) -> Phase:
    """A candidate measured as the truth says: its config replayed over the baseline's outputs."""
    rec.candidates[arm] = dict(values)
    rng = np.random.default_rng(seed)
    phase = Phase(name=arm, arm=arm, spec=dict(values), server_version="0.32.0")
    for key, base in rec.phases[BASELINE].measurements.items():
        k = _k_at(values, base.level.concurrency or 1)
        m = Measurement(prompt_type=base.prompt_type, level=base.level, key=key)
        ids = DATA["baseline"][base.prompt_type]
        for i in range(len(base.samples)):
            if k == 0:
                tpot = truth.t0[base.level.label] * (1 + rng.normal(0, truth.noise))
            else:
                lo = values.get("prompt_lookup_min", values.get("prompt_lookup_max", 5))
                hi = values.get("prompt_lookup_max", lo)
                r = replay_many(
                    [RequestTokens.of(ids["prompt_ids"], ids["output_ids"], ids["lookahead_ids"])],
                    NgramSettings(k, lo, hi),
                )
                tau, mbar = r.decode_tokens_per_step, r.draft_tokens_per_step
                tpot = truth.tpot(base.level.label, tau, mbar, rng)
            m.samples.append(_sample(base.prompt_type, arm, base.level.label, i, tpot, ids))
        m.wall_s = sum(x.e2e_s for x in m.samples)
        phase.measurements[key] = m
    rec.phases[arm] = phase
    return phase


def _k_at(values: Mapping, batch: int) -> int:
    table = values.get(BATCH_TABLE_KEY)
    if not table:
        return int(values["num_speculative_tokens"])
    return next(k for start, end, k in table if start <= batch <= end)


def verdicts(rec: RunRecord) -> dict:
    return {a: candidate_verdicts(rec, a) for a in rec.measured_candidates}


def run_search(rec: RunRecord, policy: SearchPolicy, truth: Truth) -> list[Reload | Stop]:
    """The search loop as the run drives it: ask, measure, until it stops."""
    rec.search = SearchRecord("ngram", policy.max_reloads, policy.margin)
    steps: list[Reload | Stop] = []
    while True:
        step = policy.next(rec, verdicts(rec))
        steps.append(step)
        if isinstance(step, Stop):
            rec.search.stopped = step.why
            return steps
        slot = rec.search.used + 1
        rec.search.reloads.append(
            SearchReload(
                slot, slot_name(slot), step.values, step.label, step.kind, step.why, step.predicted
            )
        )
        measure(rec, slot_name(slot), step.values, truth, seed=slot)
