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
  candidates, predicts tok/s with a band for every config, and recommends the next reload.

Suffix decoding is not predicted; draft-model, EAGLE and MTP candidates have measured figures
only (`ngram_types.unsupported_reason`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import statistics
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from ..config.arms import BASELINE, cell_key
from ..record.counters import Acceptance
from ..record.samples import RequestSample
from ..record.schema import Measurement, RunRecord
from ..record.token_capture import TokenIds
from . import noise
from .cost_model import (
    BaselineTiming,
    CandidateTiming,
    CostFit,
    Prediction,
    Recommendation,
    fit_cost,
    predict,
    recommend,
    relative_noise,
)
from .ngram_replay import grid
from .ngram_types import (
    DraftRatios,
    NgramSettings,
    ReplayStats,
    RequestTokens,
    aggregate,
    effective_settings,
    grid_settings,
    prefix_cached_tokens,
    unsupported_reason,
)

__all__ = [
    "CandidateNote",
    "Comparison",
    "RunPrediction",
    "predict_run",
]

Status = Literal["exact", "within bound", "mismatch", "outputs differ", "not compared"]
AGREES: tuple[Status, ...] = ("exact", "within bound")


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
class Counts(DraftRatios):
    """The server's spec-decode counts over a measured window."""

    drafts: int
    draft_tokens: int
    accepted: int
    per_position: tuple[int, ...]

    @classmethod
    def of(cls, acc: Acceptance, width: int) -> Counts:
        per = [round(r * acc.drafts) for r in acc.per_position_rates][:width]
        return cls(
            drafts=round(acc.drafts),
            draft_tokens=round(acc.draft_tokens),
            accepted=round(acc.accepted),
            per_position=tuple(per + [0] * (width - len(per))),
        )


@dataclass(frozen=True)
class Comparison:
    """One measured n-gram candidate on one prompt type: replayed against counted."""

    candidate: str
    prompt_type: str
    settings: NgramSettings
    status: Status
    detail: str  # one sentence: what agreed, or where outputs differ and how far apart
    predicted: ReplayStats | None = None  # the baseline's ids replayed
    measured: Counts | None = None
    own: ReplayStats | None = None  # outputs differ: the candidate's own ids replayed
    own_status: Status | None = None

    @property
    def agrees(self) -> bool:
        return self.status in AGREES

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "prompt_type": self.prompt_type,
            "effective": self.settings.label,
            "status": self.status,
            "detail": self.detail,
            "predicted": _stats_json(self.predicted),
            "measured": (
                {
                    **dataclasses.asdict(self.measured),
                    "mean_acceptance_length": self.measured.mean_acceptance_length,
                    "draft_acceptance_rate": self.measured.draft_acceptance_rate,
                }
                if self.measured
                else None
            ),
            "own": _stats_json(self.own),
            "own_status": self.own_status,
        }


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
            "fit": _fit_json(self.fit),
            "recommendation": _recommendation_json(self.recommendation),
            "grid": {
                name: _grid_json(replays, self.predictions.get(name, {}))
                for name, replays in self.replays.items()
            },
            "warnings": self.warnings,
        }


_MEMO: dict[str, RunPrediction] = {}  # by content: a live run analyses once per report piece


def predict_run(
    record: RunRecord, *, configs: Mapping[str, Mapping[str, Any]] | None = None
) -> RunPrediction:
    """The replay, the comparisons and the cost model for one run (see the module docstring).

    `configs` are the candidates to predict (default: the run's own); the dry run passes the
    planned ones to read a stored baseline with. A pure function of its inputs, remembered by
    their content (the replay of the grid is most of the analysis's time).
    """
    text = json.dumps([record.to_json(), configs], sort_keys=True, default=str)
    key = hashlib.sha256(text.encode()).hexdigest()
    found = _MEMO.get(key)
    if found is None:
        found = _MEMO[key] = _predict(record, configs)
        while len(_MEMO) > 8:
            _MEMO.pop(next(iter(_MEMO)))
    return found


def _predict(record: RunRecord, configs: Mapping[str, Mapping[str, Any]] | None) -> RunPrediction:
    notes = {name: _note(name, values) for name, values in (configs or record.candidates).items()}
    measured = {name: _note(name, record.candidates[name]) for name in record.measured_candidates}
    settings = sorted(
        set(grid_settings())
        | {n.settings for n in [*notes.values(), *measured.values()] if n.settings}
    )
    sources, baseline = _baseline_ids(record)
    groups = {name: requests for name, (_, requests) in baseline.items()}
    replays = _replay(groups, settings, _max_model_len(baseline)) if groups else {}

    comparisons: dict[str, dict[str, Comparison]] = {}
    observations: list[CandidateTiming] = []
    for name, note in measured.items():
        if note.settings is None:
            continue
        for prompt_type in record.prompt_types:
            found = _compare(record, name, note.settings, prompt_type, baseline.get(prompt_type))
            if found is not None:
                comparisons.setdefault(name, {})[prompt_type] = found
            observations += _observations(record, name, note.settings, prompt_type, baseline)

    bases = _baseline_timing(record)
    fit = fit_cost(bases, observations) if observations else None
    restart = noise.best_estimate(record)["throughput"]  # measured, or the stated assumption
    predictions = predict(bases, replays, fit, restart_sd=restart.sd) if replays else {}
    advice = (
        recommend(predictions, measured=[n.settings for n in measured.values() if n.settings])
        if predictions
        else None
    )
    warnings = [
        f"{c.candidate}/{c.prompt_type} prediction ({c.settings.label}): {c.detail}"
        for per in comparisons.values()
        for c in per.values()
        if c.status == "mismatch" or c.own_status == "mismatch"
    ]
    return RunPrediction(
        candidates=notes,
        token_ids=sources,
        replays=replays,
        predictions=predictions,
        fit=fit,
        recommendation=advice,
        comparisons=comparisons,
        warnings=warnings,
    )


# --- the inputs ------------------------------------------------------------------------------


def _note(name: str, values: Mapping[str, Any]) -> CandidateNote:
    reason = unsupported_reason(values)
    if reason is not None:
        return CandidateNote(name, values, None, reason)
    try:
        return CandidateNote(name, values, effective_settings(values))
    except (ValueError, TypeError) as exc:
        return CandidateNote(name, values, None, f"not replayable: {exc}")


def timed_prompts(record: RunRecord, m: Measurement) -> list[str]:
    """The prompt of each timed request, in order."""
    return _sent_prompts(record, m, m.samples)


def earlier_prompts(record: RunRecord, m: Measurement) -> list[str]:
    """Prompts the same server saw before the timed requests: the warm-up requests."""
    return _sent_prompts(record, m, m.warmup)


def _sent_prompts(record: RunRecord, m: Measurement, samples: Sequence[RequestSample]) -> list[str]:
    prompts = record.prompt_types[m.prompt_type].prompts
    return [prompts[s.prompt_index or 0].text for s in samples]


def first_key(record: RunRecord, prompt_type: str) -> str:
    """The measurement the prediction reads: the prompt type at the run's first load level
    (one stream in the default design; the replay models requests one after another)."""
    levels = record.run.levels
    return cell_key(prompt_type, levels[0], several=len(levels) > 1)


def _requests(
    prompts: Sequence[str], earlier: Sequence[str], ids: TokenIds, cache: TokenIds | None = None
) -> list[RequestTokens] | None:
    """The timed requests as the replay needs them; None when a prompt has no usable ids.

    A prompt the server saw before is served partly from its prefix cache (whole blocks, never
    the last token); `cache` says how that server's cache was set (default: as `ids` says).
    """
    cache = cache if cache is not None and cache.missing is None else ids
    seen = set(earlier)
    out = []
    for prompt in prompts:
        captured = ids.prompts.get(prompt)
        if captured is None or not captured.consistent or not captured.output_ids:
            return None
        cached = 0
        if prompt in seen and cache.prefix_caching and cache.block_size:
            cached = prefix_cached_tokens(len(captured.prompt_ids), cache.block_size)
        out.append(
            RequestTokens.of(
                captured.prompt_ids, captured.output_ids, captured.lookahead_ids, cached
            )
        )
        seen.add(prompt)
    return out


def _first(record: RunRecord, arm: str, prompt_type: str) -> Measurement | None:
    for phase in record.arm_phases(arm):
        key = first_key(record, prompt_type)
        if key in phase.measurements:
            return phase.measurements[key]
    return None


def _baseline_ids(
    record: RunRecord,
) -> tuple[dict[str, str], dict[str, tuple[Measurement, list[RequestTokens]]]]:
    """Per prompt type: where the baseline's ids came from (or why none), and its requests."""
    sources: dict[str, str] = {}
    found: dict[str, tuple[Measurement, list[RequestTokens]]] = {}
    for name in record.prompt_types:
        m = _first(record, BASELINE, name)
        if m is None:
            continue
        ids = m.token_ids
        if ids is None:
            sources[name] = "no token ids recorded (the run ended before it recorded them)"
            continue
        if ids.missing is not None:
            sources[name] = f"no token ids: {ids.missing}"
            continue
        bad = [c.check for c in ids.prompts.values() if not c.consistent]
        if bad:
            sources[name] = f"the token ids do not reproduce the timed output: {bad[0]}"
            continue
        requests = _requests(timed_prompts(record, m), earlier_prompts(record, m), ids)
        if not requests:
            sources[name] = "no token ids for the timed requests' prompts"
            continue
        found[name] = (m, requests)
        sources[name] = _source_text(ids)
    return sources, found


def _source_text(ids: TokenIds) -> str:
    first = next(iter(ids.prompts.values()))
    ahead = min(len(c.lookahead_ids) for c in ids.prompts.values())
    cache = (
        f"prefix cache {'on' if ids.prefix_caching else 'off'}, block size {ids.block_size}"
        if ids.block_size
        else "KV block size unknown: a padded prefill after a prefix-cache hit is not modelled"
    )
    return (
        f"{len(ids.prompts)} prompt(s); output ids from {first.support.output}, prompt ids from "
        f"{first.support.prompt}; look-ahead {ahead}; {cache}"
    )


def _max_model_len(baseline: Mapping[str, tuple[Measurement, list[RequestTokens]]]) -> int | None:
    lengths = [m.token_ids.max_model_len for m, _ in baseline.values() if m.token_ids]
    known = [n for n in lengths if n]
    return min(known) if known else None


def _replay(
    groups: Mapping[Any, Sequence[RequestTokens]],
    settings: Sequence[NgramSettings],
    max_model_len: int | None,
) -> dict[Any, dict[NgramSettings, ReplayStats]]:
    """Each group's requests under every config, aggregated; repeated requests replayed once."""
    distinct = {name: Counter(requests) for name, requests in groups.items()}
    keyed = {
        (name, j): [request]
        for name, counts in distinct.items()
        for j, request in enumerate(counts)
    }
    replayed = grid(keyed, settings, max_model_len=max_model_len)
    return {
        name: {
            s: aggregate(
                [_scaled(replayed[(name, j)][s], n) for j, n in enumerate(counts.values())]
            )
            for s in settings
        }
        for name, counts in distinct.items()
    }


def _scaled(stats: ReplayStats, times: int) -> ReplayStats:
    """One request's replay counted `times` times."""
    if times == 1:
        return stats
    return dataclasses.replace(
        stats,
        requests=stats.requests * times,
        output_tokens=stats.output_tokens * times,
        steps=stats.steps * times,
        drafts=stats.drafts * times,
        draft_tokens=stats.draft_tokens * times,
        accepted=stats.accepted * times,
        accepted_per_position=tuple(x * times for x in stats.accepted_per_position),
        unverified_tokens=stats.unverified_tokens * times,
        accepted_per_position_max=tuple(x * times for x in stats.accepted_per_position_max),
    )


# --- predicted against measured ----------------------------------------------------------------


def _compare(
    record: RunRecord,
    candidate: str,
    settings: NgramSettings,
    prompt_type: str,
    baseline: tuple[Measurement, list[RequestTokens]] | None,
) -> Comparison | None:
    mc = _first(record, candidate, prompt_type)
    if mc is None or not mc.samples:
        return None

    def skip(why: str) -> Comparison:
        return Comparison(candidate, prompt_type, settings, "not compared", why)

    if baseline is None:
        return skip("not predicted: the baseline has no token ids for this prompt type")
    if not mc.acceptance.present:
        return skip("the candidate's server exported no spec-decode counters")
    mb, _ = baseline
    assert mb.token_ids is not None
    prompts, earlier = timed_prompts(record, mc), earlier_prompts(record, mc)
    requests = _requests(prompts, earlier, mb.token_ids, mc.token_ids)
    if requests is None:
        return skip("the baseline has no token ids for a prompt the candidate was timed on")
    mml = mb.token_ids.max_model_len
    predicted = _replay({"p": requests}, [settings], mml)["p"][settings]
    measured = Counts.of(mc.acceptance, settings.num_speculative_tokens)
    differs = _divergence(record, mb, mc, prompts)
    if differs is None:
        status = _agreement(predicted, measured)
        detail = f"outputs equal the baseline's; {_figures(predicted, measured, status)}"
        return Comparison(candidate, prompt_type, settings, status, detail, predicted, measured)
    own = own_status = None
    own_text = "the candidate's own token ids were not recorded"
    if mc.token_ids is not None and mc.token_ids.missing is None:
        own_requests = _requests(prompts, earlier, mc.token_ids)
        if own_requests is not None and _self_consistent(record, mc, prompts):
            own = _replay({"p": own_requests}, [settings], mml)["p"][settings]
            own_status = _agreement(own, measured)
            own_text = f"its own outputs replayed: {_figures(own, measured, own_status)}"
        else:
            own_text = "its own timed outputs were not all alike, so they were not replayed"
    detail = (
        f"outputs differ from the baseline's ({differs}): predicted from the baseline "
        f"{_apart(predicted, measured)}; {own_text}"
    )
    return Comparison(
        candidate, prompt_type, settings, "outputs differ", detail, predicted, measured, own,
        own_status,
    )  # fmt: skip


def _agreement(predicted: ReplayStats, measured: Counts) -> Status:
    """exact, within the stated last-step bound, or a mismatch."""
    same_drafts = (predicted.drafts, predicted.draft_tokens) == (
        measured.drafts,
        measured.draft_tokens,
    )
    if (
        same_drafts
        and predicted.exact
        and measured.accepted == predicted.accepted
        and measured.per_position == predicted.accepted_per_position
    ):
        return "exact"
    within = (
        same_drafts
        and predicted.accepted <= measured.accepted <= predicted.accepted_max
        and all(
            lo <= x <= hi
            for lo, x, hi in zip(
                predicted.accepted_per_position,
                measured.per_position,
                predicted.accepted_per_position_max,
                strict=True,
            )
        )
    )
    return "within bound" if within and not predicted.exact else "mismatch"


def _figures(predicted: ReplayStats, measured: Counts, status: Status) -> str:
    bound = (
        f" (+0..{predicted.unverified_tokens} verified past the recorded tokens)"
        if predicted.unverified_tokens
        else ""
    )
    said = {
        "exact": "predicted exactly",
        "within bound": "predicted within the last-step bound",
        "mismatch": "MISMATCH: the replay or vLLM's proposer differs from its description",
    }[status]
    return (
        f"{said}: predicted {predicted.drafts} drafts, {predicted.draft_tokens} draft tokens, "
        f"{predicted.accepted}{bound} accepted {list(predicted.accepted_per_position)}; "
        f"measured {measured.drafts}, {measured.draft_tokens}, {measured.accepted} "
        f"{list(measured.per_position)}"
    )


def _apart(predicted: ReplayStats, measured: Counts) -> str:
    p_len, m_len = predicted.mean_acceptance_length, measured.mean_acceptance_length
    p_rate, m_rate = predicted.draft_acceptance_rate, measured.draft_acceptance_rate
    length = (
        f"acceptance length {p_len:.2f} vs measured {m_len:.2f} ({m_len - p_len:+.2f})"
        if p_len is not None and m_len is not None
        else f"{predicted.drafts} drafts vs measured {measured.drafts}"
    )
    rate = (
        f", draft acceptance {p_rate:.1%} vs {m_rate:.1%}"
        if p_rate is not None and m_rate is not None
        else ""
    )
    return f"{length}{rate}, drafts {predicted.drafts} vs {measured.drafts}"


def _texts(record: RunRecord, m: Measurement, prompt: str) -> list[str]:
    return [s.text for s, p in zip(m.samples, timed_prompts(record, m), strict=True) if p == prompt]


def _divergence(
    record: RunRecord, mb: Measurement, mc: Measurement, prompts: Sequence[str]
) -> str | None:
    """Where the candidate's outputs first differ from the baseline's; None when all equal."""
    distinct = list(dict.fromkeys(prompts))
    for i, prompt in enumerate(distinct):
        where = f"prompt {i + 1} of {len(distinct)}: " if len(distinct) > 1 else ""
        base = mb.token_ids.prompts.get(prompt) if mb.token_ids else None
        own = mc.token_ids.prompts.get(prompt) if mc.token_ids else None
        if base is not None and own is not None and own.output_ids != base.output_ids:
            at = _first_difference(base.output_ids, own.output_ids)
            return (
                f"{where}from output token {at} of {len(base.output_ids)} "
                f"(the candidate gave {len(own.output_ids)})"
            )
        reference = _texts(record, mb, prompt)
        for text in _texts(record, mc, prompt):
            if reference and text != reference[0]:
                at = _first_difference(reference[0], text)
                return f"{where}a timed output differs from character {at}"
    return None


def _first_difference(a: Sequence[Any], b: Sequence[Any]) -> int:
    return next(
        (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _self_consistent(record: RunRecord, m: Measurement, prompts: Sequence[str]) -> bool:
    """Every timed output of each prompt alike, and the recorded ids reproduce them."""
    for prompt in dict.fromkeys(prompts):
        captured = m.token_ids.prompts.get(prompt) if m.token_ids else None
        if captured is None or not captured.consistent or len(set(_texts(record, m, prompt))) > 1:
            return False
    return True


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
    mc = _first(record, candidate, prompt_type)
    if mc is None or not mc.samples:
        return []
    prompts, earlier = timed_prompts(record, mc), earlier_prompts(record, mc)
    requests = None
    if mc.token_ids is not None and mc.token_ids.missing is None:
        requests = _requests(prompts, earlier, mc.token_ids)
    if requests is None and prompt_type in baseline:
        mb, _ = baseline[prompt_type]
        if _divergence(record, mb, mc, prompts) is None and mb.token_ids is not None:
            requests = _requests(prompts, earlier, mb.token_ids, mc.token_ids)
    if requests is None:
        return []
    mml = mc.token_ids.max_model_len if mc.token_ids else None
    distinct: dict[Hashable, list[RequestTokens]] = {r: [r] for r in requests}
    single = _replay(distinct, [settings], mml)  # each request on its own
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
    "tokens_per_step",
    "decode_tokens_per_step",
    "exact",
    "ceiling_speedup",
    "tokens_per_s",
    "tokens_per_s_low",
    "tokens_per_s_high",
    "speedup",
    "speedup_low",
    "speedup_high",
    "p_faster",
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
        ]
        rows.append([round(x, 4) if isinstance(x, float) else x for x in row])
    return {"columns": list(GRID_COLUMNS), "rows": rows}


def _stats_json(stats: ReplayStats | None) -> dict[str, Any] | None:
    return stats.to_dict() if stats is not None else None


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
