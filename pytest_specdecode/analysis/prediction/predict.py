"""The prediction of a run: the n-gram replay of its baseline, checked against the candidates.

`predict_run(record)` reads the run record only (pure; no vLLM, no server). From the baseline's
token ids (`Measurement.token_ids`, recorded after each prompt type's timed requests) it:

- replays vLLM's n-gram proposer (`ngram_replay`) over the baseline's timed requests for every
  config of the grid (k 1..8 x prompt_lookup_min <= prompt_lookup_max in 1..6) and for every
  configured n-gram candidate, each shown with its effective settings;
- for each measured n-gram candidate and prompt type, puts the replay beside the server's
  counters. Where the candidate's outputs equal the baseline's the two must agree: exactly when
  the look-ahead covered the last step, else within the stated bound (tokens the last step
  verified past the known output). A disagreement is a warning: the replay or vLLM's proposer
  differs from its description. Where outputs differ, it says where and how far apart the
  figures are, and replays the candidate's own outputs as well;
- fits the cost model (`cost_model`) from the baseline's TPOT and the measured n-gram
  candidates, predicts tok/s with a band for every config, and recommends the next reload;
- where the run measured a break-even map (`found`), every config at a k the map measured reads
  the map instead (from_map/read.py: the baseline's tok/s times the map's ratio at its replayed
  tokens per step, plus the measured n-gram candidates' own cost per step beyond the map's,
  `proposer`, taken from the other prompt types); the cost model stays for the other k.

Suffix decoding is not predicted; draft-model, EAGLE and MTP candidates have measured figures
only (`ngram_types.unsupported_reason`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.arms import BASELINE
from ...record.measurement import Measurement
from ...record.schema import RunRecord
from ..map.break_even import BreakEvenMap
from ..verdict import noise
from ..verdict.compare import PromptTypeVerdict
from .bands.bounded import Recommendation, Support, bounded, recommend, support_of
from .check import Comparison, compare_prediction, output_divergence
from .cost_model import (
    BaselineTiming,
    CandidateTiming,
    CostFit,
    Prediction,
    fit_cost,
    predict,
    relative_noise,
)
from .from_map.proposer import ProposerCost
from .from_map.read import proposer_costs, read_map
from .inputs import (
    baseline_ids,
    earlier_prompts,
    first_key,
    first_measurement,
    max_model_len_of,
    replay_groups,
    request_tokens,
    timed_prompts,
)
from .level_prediction import map_timings
from .ngram_types import (
    NgramSettings,
    ReplayStats,
    RequestTokens,
    effective_settings,
    grid_settings,
    unsupported_reason,
)
from .suffix_replay import SuffixReplay, missing_reason, replay_suffix, suffix_settings

__all__ = [
    "CandidateNote",
    "RunPrediction",
    "predict_run",
]


@dataclass(frozen=True)
class CandidateNote:
    """A configured candidate as the prediction sees it: its effective settings, or why not."""

    name: str
    values: Mapping[str, Any]
    settings: NgramSettings | None  # None: not replayable
    reason: str | None = None  # why not: suffix "not predicted", draft/EAGLE "measured only"

    @property
    def text(self) -> str:
        if self.settings is not None:
            return f"{self.name} (effective {self.settings.label})"
        return f"{self.name}: {self.reason}"


@dataclass(frozen=True)
class RunPrediction:
    """Everything the replay and the cost model say about one run."""

    candidates: dict[str, CandidateNote]
    token_ids: dict[str, str]  # prompt type -> where its baseline ids came from, or why none
    replays: dict[str, dict[NgramSettings, ReplayStats]]  # prompt type -> config -> replay
    predictions: dict[str, dict[NgramSettings, Prediction]]
    fit: CostFit | None
    recommendation: Recommendation | None
    comparisons: dict[str, dict[str, Comparison]]  # candidate -> prompt type
    warnings: list[str] = field(default_factory=list)
    # suffix candidates: candidate -> prompt type -> the baseline's requests replayed; or why not
    suffix: dict[str, dict[str, SuffixReplay]] = field(default_factory=dict)
    suffix_note: str | None = None
    support: Support | None = None  # the tokens per step the cost fit's observations measured
    # per measured n-gram candidate on the map: its own cost per step beyond the map's
    proposer: dict[str, ProposerCost] = field(default_factory=dict)
    mapped: tuple[int, ...] = ()  # the k whose configs were read from the map

    @property
    def available(self) -> bool:
        return bool(self.replays)

    @property
    def reason(self) -> str | None:
        """Why nothing was predicted, or None."""
        if self.available:
            return None
        if not self.token_ids:
            return "the baseline was not measured"
        return "; ".join(f"{name}: {why}" for name, why in self.token_ids.items())

    def to_json(self) -> dict[str, Any]:
        return {
            "available": self.available,
            "reason": self.reason,
            "candidates": {
                name: {
                    "values": dict(note.values),
                    "effective": note.settings.to_values() if note.settings else None,
                    "label": note.settings.label if note.settings else None,
                    "not_predicted": note.reason,
                }
                for name, note in self.candidates.items()
            },
            "token_ids": self.token_ids,
            "comparisons": {
                c: {name: comp.to_json() for name, comp in per.items()}
                for c, per in self.comparisons.items()
            },
            "suffix": {
                c: {name: r.to_dict() for name, r in per.items()} for c, per in self.suffix.items()
            },
            "suffix_note": self.suffix_note,
            "fit": _fit_json(self.fit),
            "support": self.support.to_json() if self.support else None,
            "proposer": {c: cost.to_json() for c, cost in self.proposer.items()},
            "mapped_k": list(self.mapped),
            "recommendation": _recommendation_json(self.recommendation),
            "grid": {
                name: _grid_json(replays, self.predictions.get(name, {}))
                for name, replays in self.replays.items()
            },
            "warnings": self.warnings,
        }


def predict_run(
    record: RunRecord,
    *,
    configs: Mapping[str, Mapping[str, Any]] | None = None,
    found: BreakEvenMap | None = None,
    verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]] | None = None,
) -> RunPrediction:
    """The replay, the comparisons and the cost model for one run (see the module docstring).

    `configs` are the candidates to predict (default: the run's own); the dry run passes the
    planned ones to read a stored baseline with. `found` is the run's break-even map, and
    `verdicts` its candidates' (the proposer's cost is measured from them). A pure function of
    its inputs; the replay of the grid is most of the analysis's time, so a run calls it once,
    in `analysis.run.analyze`, and hands that analysis to every renderer.
    """
    return _predict(record, configs, found, verdicts or {})


def _predict(
    record: RunRecord,
    configs: Mapping[str, Mapping[str, Any]] | None,
    the_map: BreakEvenMap | None,
    verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]],
) -> RunPrediction:
    notes = {name: _note(name, values) for name, values in (configs or record.candidates).items()}
    measured = {name: _note(name, record.candidates[name]) for name in record.measured_candidates}
    settings = sorted(
        set(grid_settings())
        | {n.settings for n in [*notes.values(), *measured.values()] if n.settings}
    )
    sources, baseline = baseline_ids(record)
    groups = {name: requests for name, (_, requests) in baseline.items()}
    replays = replay_groups(groups, settings, max_model_len_of(baseline)) if groups else {}

    comparisons: dict[str, dict[str, Comparison]] = {}
    observations: list[CandidateTiming] = []
    for name, note in measured.items():
        if note.settings is None:
            continue
        for prompt_type in record.prompt_types:
            found = compare_prediction(
                record, name, note.settings, prompt_type, baseline.get(prompt_type)
            )
            if found is not None:
                comparisons.setdefault(name, {})[prompt_type] = found
            observations += _observations(record, name, note.settings, prompt_type, baseline)

    bases = _baseline_timing(record)
    mapped = map_timings(record, record.run.levels[0].label) if record.run.levels else []
    observations = mapped or observations  # the map measured the step's cost: no guess
    fit = fit_cost(bases, observations) if observations else None
    restart = noise.best_estimate(record)["throughput"]  # measured, or the stated assumption
    support = (
        support_of(mapped, name="the map", points="its points")
        if mapped
        else support_of(observations, name="the measured candidates", points="they")
    )
    predictions = predict(bases, replays, fit, restart_sd=restart.sd) if replays else {}
    predictions = bounded(predictions, support)  # a band that does not bound is no prediction
    costs: dict[str, ProposerCost] = {}
    if the_map is not None and predictions and record.run.levels:
        costs = proposer_costs(record, verdicts, the_map, bases)
        predictions = read_map(predictions, bases, the_map, record.run.levels[0].label, costs)
    mapped = tuple(sorted({s.num_speculative_tokens for per in predictions.values()
                           for s, p in per.items() if p.basis}))  # fmt: skip
    advice = (
        recommend(predictions, measured=[n.settings for n in measured.values() if n.settings])
        if predictions and not noise.is_aa_run(record)
        else Recommendation(None, None, None, AA_NEXT)
        if predictions
        else None
    )
    warnings = [
        f"{c.candidate}/{c.prompt_type} prediction ({c.settings.label}): {c.detail}"
        for per in comparisons.values()
        for c in per.values()
        if c.status == "mismatch" or c.own_status == "mismatch"
    ]
    suffix, suffix_note = _suffix(record, notes, baseline)
    return RunPrediction(
        suffix=suffix,
        suffix_note=suffix_note,
        candidates=notes,
        token_ids=sources,
        replays=replays,
        predictions=predictions,
        fit=fit,
        recommendation=advice,
        comparisons=comparisons,
        warnings=warnings,
        support=support,
        proposer=costs,
        mapped=mapped,
    )


def _suffix(
    record: RunRecord,
    notes: Mapping[str, CandidateNote],
    baseline: Mapping[str, tuple[Measurement, list[RequestTokens]]],
) -> tuple[dict[str, dict[str, SuffixReplay]], str | None]:
    """Each suffix candidate, per prompt type: the baseline's requests in the order sent,
    replayed with Arctic Inference's cache (the cache starting empty for each prompt type)."""
    wanted = {n: s for n, note in notes.items() if (s := suffix_settings(note.values))}
    if not wanted or not baseline:
        return {}, None
    why = missing_reason()
    if why is not None:
        return {}, why
    mml = max_model_len_of(baseline)
    return {
        name: {w: replay_suffix(reqs, settings, mml) for w, (_, reqs) in baseline.items()}
        for name, settings in wanted.items()
    }, None


AA_NEXT = (
    "this A/A run measured the host's noise, and no speculative candidate; its baseline's "
    "token ids predict any n-gram config: specdecode-predict on this run's folder, or a run "
    "with --spec-config ngram"
)

# --- the inputs (the record's prompts and token ids: inputs.py) -------------------------


def _note(name: str, values: Mapping[str, Any]) -> CandidateNote:
    reason = unsupported_reason(values)
    if reason is not None:
        return CandidateNote(name, values, None, reason)
    try:
        return CandidateNote(name, values, effective_settings(values))
    except (ValueError, TypeError) as exc:
        return CandidateNote(name, values, None, f"not replayable: {exc}")


# --- the cost model --------------------------------------------------------------------------


def _positive(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None and math.isfinite(v) and v > 0]


def _baseline_timing(record: RunRecord) -> dict[str, BaselineTiming]:
    out = {}
    for name in record.prompt_types:
        samples = [
            s
            for p in record.arm_phases(BASELINE)
            if first_key(record, name) in p.measurements
            for s in p.measurements[first_key(record, name)].samples
        ]
        tpots = _positive([s.tpot_s for s in samples])
        if not tpots:
            continue
        out[name] = BaselineTiming(
            tpot_s=statistics.median(tpots),
            ttft_s=statistics.median(s.ttft_s for s in samples),
            output_tokens=statistics.fmean(s.output_tokens for s in samples),
            tpot_noise=relative_noise(tpots),
        )
    return out


def _observations(
    record: RunRecord,
    candidate: str,
    settings: NgramSettings,
    prompt_type: str,
    baseline: Mapping[str, tuple[Measurement, list[RequestTokens]]],
) -> list[CandidateTiming]:
    """One per timed request of a measured candidate: its TPOT, and its steps replayed on its
    own token ids (the baseline's where the candidate's were not recorded and outputs agree)."""
    mc = first_measurement(record, candidate, prompt_type)
    if mc is None or not mc.samples:
        return []
    prompts, earlier = timed_prompts(record, mc), earlier_prompts(record, mc)
    requests = None
    if mc.token_ids is not None and mc.token_ids.missing is None:
        requests = request_tokens(prompts, earlier, mc.token_ids)
    if requests is None and prompt_type in baseline:
        mb, _ = baseline[prompt_type]
        if output_divergence(record, mb, mc, prompts) is None and mb.token_ids is not None:
            requests = request_tokens(prompts, earlier, mb.token_ids, mc.token_ids)
    if requests is None:
        return []
    mml = mc.token_ids.max_model_len if mc.token_ids else None
    distinct: dict[Hashable, list[RequestTokens]] = {r: [r] for r in requests}
    single = replay_groups(distinct, [settings], mml)  # each request on its own
    noise = relative_noise(_positive([s.tpot_s for s in mc.samples]))
    return [
        CandidateTiming.from_replay(prompt_type, single[r][settings], s.tpot_s, noise)
        for s, r in zip(mc.samples, requests, strict=True)
        if s.tpot_s is not None and math.isfinite(s.tpot_s) and s.tpot_s > 0
    ]


# --- serialisation ---------------------------------------------------------------------------

GRID_COLUMNS = (
    "label",
    "k",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "drafts_per_step",
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "tokens_per_forward_pass",  # output tokens / forward passes, prefill included
    "tokens_per_step",  # output tokens after the first / decode steps: the map's axis
    "exact",
    "ceiling_speedup",
    "tokens_per_s",
    "tokens_per_s_low",
    "tokens_per_s_high",
    "speedup",
    "speedup_low",
    "speedup_high",
    "p_faster",
    "withheld",  # why the band is no prediction (cost_model.withheld_reason), or null
    "basis",  # read from the map (and the proposer's cost), or null: the cost model
)


def _grid_json(
    replays: Mapping[NgramSettings, ReplayStats], predictions: Mapping[NgramSettings, Prediction]
) -> dict[str, Any]:
    """Compact: one row per config, the columns named once, figures to 4 decimals."""
    rows = []
    for s, r in replays.items():
        p = predictions.get(s)
        band = p.tokens_per_s_band if p and p.tokens_per_s_band else (None, None)
        speed_band = p.speedup_band if p and p.speedup_band else (None, None)
        row = [
            s.label,
            s.num_speculative_tokens,
            s.prompt_lookup_min,
            s.prompt_lookup_max,
            r.drafts_per_step,
            r.mean_acceptance_length,
            r.draft_acceptance_rate,
            r.tokens_per_step,
            r.decode_tokens_per_step,
            r.exact,
            p.ceiling_speedup if p else None,
            p.tokens_per_s if p else None,
            *band,
            p.speedup if p else None,
            *speed_band,
            p.p_faster if p else None,
            p.withheld if p else None,
            p.basis if p else None,
        ]
        rows.append([round(x, 4) if isinstance(x, float) else x for x in row])
    return {"columns": list(GRID_COLUMNS), "rows": rows}


def _fit_json(fit: CostFit | None) -> dict[str, Any] | None:
    if fit is None:
        return None
    return {
        "overhead": fit.overhead,
        "per_token": fit.per_token,
        "method": fit.method,
        "observations": fit.observations,
        "text": fit.describe(),
    }


def _recommendation_json(advice: Recommendation | None) -> dict[str, Any] | None:
    if advice is None:
        return None
    return {
        "settings": advice.settings.to_values() if advice.settings else None,
        "label": advice.settings.label if advice.settings else None,
        "mean_speedup": advice.mean_speedup,
        "mean_p_faster": advice.mean_p_faster,
        "reason": advice.reason,
    }
