"""Every n-gram config predicted at every load level of a run, for the search. Pure.

`predict_run` (predict.py) predicts the first level from the untimed token-id captures and
puts the replay beside the counters. The search needs more: a prediction per level, since the
best config may change with load. Here, per measurement (a prompt type at a level):

- the baseline's own timed requests at that level are replayed (their recorded prompt and output
  ids; the capture's where a request carries none, with its look-ahead where the outputs agree),
  as `level_acceptance` predicts a measured candidate's acceptance there. In a batch, a greedy
  output moves with the batch's numerics, so each level replays its own outputs;
- the cost model is fitted per level, from the measured n-gram candidates' requests at that
  level (each replayed on its own output ids), relative to the baseline's TPOT at that level:
  a step's cost in a batch is not its cost alone. While the run's own observations cannot
  separate fixed and per-token cost, a prior of this host's stored runs at the same level is
  pooled in (cost_model.CostPrior);
- above the first level, the prediction stands only where the step checks on the requests' own
  tokens showed the proposer drafting in a batch as the replay says (`level_acceptance`'s batch
  rule); where they showed departures, that level is withheld, and says why.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.arms import BASELINE
from ...config.break_even import depth_of_arm, point_of
from ...config.specconfig import BATCH_TABLE_KEY, NGRAM_METHODS
from ...record.measurement import Measurement
from ...record.requests.token_capture import CapturedTokens
from ...record.schema import Phase, RunRecord
from ..map.break_even import measured_steps
from ..verdict import noise
from ..verdict.checks import facts
from .cost_model import (
    BaselineTiming,
    CandidateTiming,
    CostFit,
    CostPrior,
    Prediction,
    cost_points,
    fit_cost,
    predict,
    relative_noise,
)
from .inputs import replay_groups
from .level_acceptance import (
    acceptance_by_level,
    baseline_captures,
    lookahead_of,
    prefix_block_size,
    record_max_model_len,
    sent_times,
)
from .ngram_types import (
    NgramSettings,
    ReplayStats,
    RequestTokens,
    effective_settings,
    prefix_cached_tokens,
    unsupported_reason,
)

__all__ = [
    "KeyModel",
    "LevelPredictions",
    "config_settings",
    "cost_prior",
    "ngram_arms",
    "predict_levels",
    "without_arms",
]


@dataclass(frozen=True)
class KeyModel:
    """One measurement key of the baseline: what the replay and the cost model start from."""

    key: str
    prompt_type: str
    level: str  # the level's label
    baseline: BaselineTiming
    requests: tuple[RequestTokens, ...]
    basis: str  # what was replayed


@dataclass(frozen=True)
class LevelPredictions:
    """Per key, every asked config predicted; per level, the cost model and what it rests on."""

    keys: dict[str, KeyModel]
    replays: dict[str, dict[NgramSettings, ReplayStats]]
    predictions: dict[str, dict[NgramSettings, Prediction]]
    fits: dict[str, CostFit | None]  # level label -> fit (None: cost unknown there)
    levels: list[str]  # labels, in the run's order
    withheld: dict[str, str] = field(default_factory=dict)  # level label -> why not predicted
    missing: dict[str, str] = field(default_factory=dict)  # key -> why not predicted
    restart_sd: float = 0.0

    def keys_at(self, level: str) -> list[str]:
        return [k for k, m in self.keys.items() if m.level == level and k in self.predictions]

    def prediction(self, key: str, settings: NgramSettings) -> Prediction | None:
        return self.predictions.get(key, {}).get(settings)


def ngram_arms(record: RunRecord) -> dict[str, NgramSettings]:
    """The measured candidates that are n-gram configs, with their effective settings."""
    out = {}
    for arm in record.measured_candidates:
        settings = config_settings(record.candidates.get(arm) or {})
        if settings is not None:
            out[arm] = settings
    return out


def without_arms(record: RunRecord, arms: Iterable[str]) -> RunRecord:
    """The record as it was before these candidates were measured (for a held-out check)."""
    drop = set(arms)
    return dataclasses.replace(
        record,
        candidates={k: v for k, v in record.candidates.items() if k not in drop},
        phases={k: p for k, p in record.phases.items() if p.arm not in drop},
    )


def predict_levels(
    record: RunRecord,
    settings: Sequence[NgramSettings],
    *,
    prior: Mapping[str, CostPrior] | None = None,
    widen: Mapping[str, float] | None = None,
    batch_check: bool = True,
) -> LevelPredictions:
    """Every config in `settings` predicted at every key the baseline measured.

    `prior`: per level label, this host's stored runs' cost observations. `widen`: per prompt
    type, the factor the band's coverage over stored runs asks for
    (analysis/prediction/bands/coverage.py).
    """
    levels = [level.label for level in record.run.levels]
    models, missing = _key_models(record)
    withheld = _withheld(record, levels) if batch_check and len(levels) > 1 else {}
    replays = _replay(
        {k: m.requests for k, m in models.items() if m.level not in withheld},
        sorted(set(settings)),
        record_max_model_len(record),
    )
    fits: dict[str, CostFit | None] = {}
    restart_sd = noise.best_estimate(record)["throughput"].sd
    predictions: dict[str, dict[NgramSettings, Prediction]] = {}
    for level in levels:
        at = {k: m for k, m in models.items() if m.level == level}
        bases = {m.prompt_type: m.baseline for m in at.values()}
        observed = observations(record, level)
        fits[level] = fit_cost(bases, observed, prior=(prior or {}).get(level))
        for key, model in at.items():
            if key not in replays:
                continue
            found = predict(
                {model.prompt_type: model.baseline},
                {model.prompt_type: replays[key]},
                fits[level],
                restart_sd=restart_sd,
                widen=widen,
            )
            predictions[key] = found.get(model.prompt_type, {})
    return LevelPredictions(
        keys=models,
        replays=replays,
        predictions=predictions,
        fits=fits,
        levels=levels,
        withheld=withheld,
        missing=missing,
        restart_sd=restart_sd,
    )


def observations(record: RunRecord, level: str) -> list[CandidateTiming]:
    """One per timed request of each measured n-gram candidate at this level: its TPOT, and
    its steps replayed on its own output ids. Where the break-even map measured this level,
    its servers' requests instead: each step's cost measured at a known k and acceptance."""
    mapped = map_timings(record, level)
    if mapped:
        return mapped
    out: list[CandidateTiming] = []
    mml = record_max_model_len(record)
    for arm, settings in ngram_arms(record).items():
        for phase in record.arm_phases(arm):
            for m in phase.measurements.values():
                if m.level.label != level or not m.samples:
                    continue
                tpots = _positive([s.tpot_s for s in m.samples])
                spread = relative_noise(tpots)
                for sample, request in _own_requests(record, phase, m):
                    tpot = sample.tpot_s
                    if request is None or tpot is None or not (math.isfinite(tpot) and tpot > 0):
                        continue
                    stats = _replay({"r": (request,)}, [settings], mml)["r"][settings]
                    out.append(CandidateTiming.from_replay(m.prompt_type, stats, tpot, spread))
    return out


def map_timings(record: RunRecord, level: str) -> list[CandidateTiming]:
    """One per timed request of each break-even map server at this level: its TPOT, with the
    steps its counters measured (tokens and draft tokens per decode step) over its cell."""
    out: list[CandidateTiming] = []
    for arm, values in record.candidates.items():
        point = point_of(values)
        # n-gram's own map servers at the depth served: not another drafter's (its proposer's
        # cost is not n-gram's), nor the map's arms at another depth (analysis/map/shape.py)
        if point is None or depth_of_arm(arm) is not None or values["method"] not in NGRAM_METHODS:
            continue
        for phase in record.arm_phases(arm):
            for m in phase.measurements.values():
                if m.level.label != level or not m.samples:
                    continue
                steps = measured_steps([m])
                tau, per_step = steps.tokens_per_step, steps.drafts_per_step
                if tau is None or per_step is None:
                    continue
                tpots = _positive([s.tpot_s for s in m.samples])
                spread = relative_noise(tpots)
                out += [
                    CandidateTiming(m.prompt_type, arm, t, tau, per_step, spread, point[0])
                    for t in tpots
                ]
    return out


def cost_prior(stored: Sequence[tuple[str, RunRecord]], record: RunRecord) -> dict[str, CostPrior]:
    """Per level label, the cost observations of the stored runs of the same model, vLLM
    version and GPUs (the caller picks this host's runs), each relative to its own baseline."""
    mine = _server_facts(record)
    same = [(name, r) for name, r in stored if _server_facts(r) == mine]
    points: dict[str, list[Any]] = {}
    runs: dict[str, list[str]] = {}
    for name, r in same:
        if not ngram_arms(r):
            continue
        models, _ = _key_models(r)
        for level in (lv.label for lv in r.run.levels):
            bases = {m.prompt_type: m.baseline for m in models.values() if m.level == level}
            found = cost_points(bases, observations(r, level))
            if found:
                points.setdefault(level, []).extend(found)
                runs.setdefault(level, []).append(name)
    return {level: CostPrior(tuple(p), tuple(runs[level])) for level, p in points.items()}


def _server_facts(record: RunRecord) -> tuple[Any, ...]:
    """Model, vLLM version and GPUs. Before its first candidate starts, a run whose baseline is
    reused (--spec-baseline-from) has only that baseline's server to tell the version."""
    found = facts(record)
    reused = [p.server_version for p in record.phases.values() if p.reused_from]
    version = found["vllm_version"] or next((v for v in reused if v), None)
    return found["model"], version, found["gpus"]


# --- the inputs --------------------------------------------------------------------------------


def config_settings(values: Mapping[str, Any]) -> NgramSettings | None:
    """The effective settings of a plain n-gram config; None for anything else (a schedule,
    `num_speculative_tokens_per_batch_size`, varies k with the batch size)."""
    if not values or BATCH_TABLE_KEY in values or unsupported_reason(values) is not None:
        return None
    try:
        return effective_settings(values)
    except (ValueError, TypeError):
        return None


def _positive(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _key_models(record: RunRecord) -> tuple[dict[str, KeyModel], dict[str, str]]:
    """Per key the baseline measured: its timing and its requests as the replay needs them."""
    models: dict[str, KeyModel] = {}
    missing: dict[str, str] = {}
    for key in record.keys:
        windows = [
            (p, p.measurements[key])
            for p in record.arm_phases(BASELINE)
            if key in p.measurements and p.measurements[key].samples
        ]
        if not windows:
            continue
        m0 = windows[0][1]
        samples = [s for _, m in windows for s in m.samples]
        tpots = _positive([s.tpot_s for s in samples])
        if not tpots:
            missing[key] = "the baseline has no TPOT there (one-token outputs)"
            continue
        requests: list[RequestTokens] = []
        lacking = 0
        for phase, m in windows:
            for _, request in _own_requests(record, phase, m):
                if request is None:
                    lacking += 1
                else:
                    requests.append(request)
        if lacking or not requests:
            missing[key] = (
                f"the baseline has no token ids for {lacking or len(samples)} of its "
                f"{len(samples)} timed requests there"
            )
            continue
        baseline = BaselineTiming(
            tpot_s=statistics.median(tpots),
            ttft_s=statistics.median(s.ttft_s for s in samples),
            output_tokens=statistics.fmean(s.output_tokens for s in samples),
            tpot_noise=relative_noise(tpots),
        )
        models[key] = KeyModel(
            key=key,
            prompt_type=m0.prompt_type,
            level=m0.level.label,
            baseline=baseline,
            requests=tuple(requests),
            basis=f"the baseline's {len(requests)} timed requests at {m0.level.label}",
        )
    return models, missing


def _own_requests(
    record: RunRecord, phase: Phase, m: Measurement
) -> list[tuple[Any, RequestTokens | None]]:
    """Each timed request of a window with its own token ids (the capture's where it carries
    none), the capture's look-ahead where the outputs agree, and what the prefix cache served."""
    prompts = record.prompt_types[m.prompt_type].prompts
    captures: dict[str, CapturedTokens] = {}
    if m.token_ids is not None and m.token_ids.missing is None:
        captures = {t: c for t, c in m.token_ids.prompts.items() if c.consistent and c.output_ids}
    baseline = baseline_captures(record, m.prompt_type)
    seen = sent_times(phase, prompts, m.prompt_type)
    cache = prefix_block_size(phase, m.prompt_type)
    out: list[tuple[Any, RequestTokens | None]] = []
    for s in m.samples:
        text = prompts[s.prompt_index or 0].text
        capture = captures.get(text) or baseline.get(text)
        prompt_ids = s.prompt_ids or (list(capture.prompt_ids) if capture else None)
        output = s.output_ids or (list(capture.output_ids) if capture else None)
        if not prompt_ids or not output:
            out.append((s, None))
            continue
        cached = 0
        if cache and any(t < s.started_at for t in seen.get(text, ())):
            cached = prefix_cached_tokens(len(prompt_ids), cache)
        out.append((s, RequestTokens.of(prompt_ids, output, lookahead_of(capture, output), cached)))
    return out


def _withheld(record: RunRecord, levels: Sequence[str]) -> dict[str, str]:
    """Levels above the first where the step checks showed the replay does not hold."""
    found = acceptance_by_level(record)
    if found.batch_predictable is False:
        return {level: found.batch_rule or "" for level in levels[1:]}
    return {}


def _replay(
    groups: Mapping[str, Sequence[RequestTokens]],
    settings: Sequence[NgramSettings],
    max_model_len: int | None,
) -> dict[str, dict[NgramSettings, ReplayStats]]:
    """Each group's requests under every config, aggregated (prediction_inputs.replay_groups);
    an empty group or an empty grid predicts nothing."""
    if not settings:
        return {name: {} for name in groups}
    return replay_groups({n: r for n, r in groups.items() if r}, settings, max_model_len)
