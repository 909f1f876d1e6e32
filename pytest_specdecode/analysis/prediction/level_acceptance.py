"""Acceptance per request, per prompt and per load level, and the replay checked step by step.

Pure: reads the run record only. For every measured candidate and measurement (prompt type at a
load level), from the timed requests' own speculative metrics (vLLM's
`--per-request-spec-decode-metrics`, record/requests/request_metrics.py), or the counters where the
requests carry none:

- the acceptance over the window, and per prompt;
- the counters' cross-check: over a quiet window their delta must equal the requests' sum;
- for an n-gram candidate, each request's per-step arrays against the replay
  (analysis/prediction/step_check.py): of the baseline's outputs at the same level (what the
  prediction replays), and of the request's own outputs (whether the proposer drafted as the replay
  says);
- the prediction at that level: the replay of the baseline's own outputs at the level, with its
  error against the measured accepted per draft.

`batch_rule` then says what the step checks above the first level show, and so what the
prediction there rests on (or that it cannot be made).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...config.arms import BASELINE
from ...record.counters import Acceptance, combine
from ...record.measurement import Measurement
from ...record.requests.request_metrics import read
from ...record.requests.samples import RequestSample
from ...record.requests.token_capture import CapturedTokens
from ...record.schema import Phase, RunRecord
from .ngram_replay import StepReplay, replay_many
from .ngram_types import (
    DraftRatios,
    NgramSettings,
    ReplayStats,
    RequestTokens,
    effective_settings,
    prefix_cached_tokens,
    unsupported_reason,
)
from .step_check import LevelSteps, StepCheck, check_steps


@dataclass(frozen=True)
class PromptFigure(DraftRatios):
    """One prompt's requests in one measurement: their own figures summed."""

    prompt_index: int | None
    requests: int
    drafts: int
    draft_tokens: int
    accepted: int

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_index": self.prompt_index,
            "requests": self.requests,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
        }


@dataclass(frozen=True)
class LevelAcceptance:
    """One candidate on one measurement (a prompt type at a level), over all its starts."""

    candidate: str
    prompt_type: str
    key: str
    level: str
    first_level: bool
    requests: int
    source: str  # "requests": their own metrics; "counters": the server's; or "none"
    measured: Acceptance | None
    counters_check: str | None  # where the requests' sum and the counters disagree
    per_prompt: tuple[PromptFigure, ...] = ()
    settings: NgramSettings | None = None
    steps: LevelSteps | None = None  # against the replay of the baseline's outputs
    own_steps: LevelSteps | None = None  # against the replay of each request's own outputs
    predicted: ReplayStats | None = None
    basis: str = ""  # what the prediction replayed, or why there is none

    @property
    def predicted_range(self) -> tuple[float, float] | None:
        """The predicted accepted per draft; a range where last steps verified draft tokens past
        the known tokens (no look-ahead), which the server may have accepted."""
        p = self.predicted
        if p is None or not p.drafts:
            return None
        return 1 + p.accepted / p.drafts, 1 + p.accepted_max / p.drafts

    @property
    def error(self) -> float | None:
        """Measured minus predicted accepted per draft: 0 inside the predicted range, else the
        distance to its nearer end."""
        found = self.predicted_range
        m = self.measured.mean_acceptance_length if self.measured else None
        if found is None or m is None:
            return None
        low, high = found
        return m - min(max(m, low), high)

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "prompt_type": self.prompt_type,
            "key": self.key,
            "level": self.level,
            "requests": self.requests,
            "source": self.source,
            "measured": self.measured.to_dict() if self.measured else None,
            "counters_check": self.counters_check,
            "per_prompt": [p.to_json() for p in self.per_prompt],
            "effective": self.settings.label if self.settings else None,
            "steps": self.steps.to_json() if self.steps else None,
            "own_steps": self.own_steps.to_json() if self.own_steps else None,
            "predicted": self.predicted.to_dict() if self.predicted else None,
            "basis": self.basis,
            "predicted_range": list(self.predicted_range) if self.predicted_range else None,
            "error": self.error,
        }


@dataclass(frozen=True)
class AcceptanceByLevel:
    """Every candidate's measurements, and what the step checks teach about batches."""

    levels: list[LevelAcceptance] = field(default_factory=list)
    batch_rule: str | None = None  # None: nothing measured above the first level
    batch_predictable: bool | None = None

    def for_candidate(self, candidate: str) -> list[LevelAcceptance]:
        return [entry for entry in self.levels if entry.candidate == candidate]

    @property
    def warnings(self) -> list[str]:
        return [
            f"{e.candidate}/{e.key}: {e.counters_check}" for e in self.levels if e.counters_check
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "levels": [e.to_json() for e in self.levels],
            "batch_rule": self.batch_rule,
            "batch_predictable": self.batch_predictable,
        }


def acceptance_by_level(record: RunRecord) -> AcceptanceByLevel:
    """The per-request acceptance of every measured candidate, level by level."""
    out: list[LevelAcceptance] = []
    first_label = record.run.levels[0].label
    for candidate in record.measured_candidates:
        settings = _settings(record.candidates[candidate])
        for key in record.keys:
            found = _level(record, candidate, key, settings, first_label)
            if found is not None:
                out.append(found)
    rule, predictable = _batch_rule(out)
    return AcceptanceByLevel(out, rule, predictable)


def _settings(values: Mapping[str, Any]) -> NgramSettings | None:
    if unsupported_reason(values) is not None:
        return None
    try:
        return effective_settings(values)
    except (ValueError, TypeError):
        return None


def _level(
    record: RunRecord,
    candidate: str,
    key: str,
    settings: NgramSettings | None,
    first_label: str,
) -> LevelAcceptance | None:
    phases = [p for p in record.arm_phases(candidate) if key in p.measurements]
    windows = [(p, p.measurements[key]) for p in phases if p.measurements[key].samples]
    if not windows:
        return None
    m0 = windows[0][1]
    samples = [s for _, m in windows for s in m.samples]
    own = [m.request_acceptance for _, m in windows]
    if all(a is not None for a in own):
        source, measured = "requests", combine([a for a in own if a is not None])
    else:
        clean = [m.acceptance for _, m in windows if m.foreign is None and m.acceptance.present]
        source, measured = ("counters", combine(clean)) if clean else ("none", None)
    entry = LevelAcceptance(
        candidate=candidate,
        prompt_type=m0.prompt_type,
        key=key,
        level=m0.level.label,
        first_level=m0.level.label == first_label,
        requests=len(samples),
        source=source,
        measured=measured,
        counters_check=next((c for _, m in windows if (c := m.request_check)), None),
        per_prompt=_per_prompt(samples),
        settings=settings,
    )
    if settings is None:
        return entry
    return _replayed(record, entry, windows, settings)


def _per_prompt(samples: Sequence[RequestSample]) -> tuple[PromptFigure, ...]:
    groups: dict[int | None, list[Any]] = {}
    for s in samples:
        found = read(s.spec_decode)
        if found is None:
            return ()  # all or none: a partial figure would mislead
        groups.setdefault(s.prompt_index, []).append(found)
    return tuple(
        PromptFigure(
            prompt_index=index,
            requests=len(found),
            drafts=sum(f.drafts for f in found),
            draft_tokens=sum(f.num_draft_tokens for f in found),
            accepted=sum(f.accepted for f in found),
        )
        for index, found in sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    )


# --- the replay, step by step ----------------------------------------------------------------


def _replayed(
    record: RunRecord,
    entry: LevelAcceptance,
    windows: Sequence[tuple[Phase, Measurement]],
    settings: NgramSettings,
) -> LevelAcceptance:
    """The step checks and the prediction of one n-gram measurement."""
    captures = baseline_captures(record, entry.prompt_type)
    references = _baseline_outputs(record, entry.key)
    mml = record_max_model_len(record)
    checks: list[StepCheck] = []
    own_checks: list[StepCheck] = []
    predicted_requests: list[RequestTokens] = []
    missing = 0
    from_capture = 0
    prompts = record.prompt_types[entry.prompt_type].prompts
    for phase, m in windows:
        seen = sent_times(phase, prompts, entry.prompt_type)
        cache = prefix_block_size(phase, entry.prompt_type)
        for s in m.samples:
            text = prompts[s.prompt_index or 0].text
            capture = captures.get(text)
            prompt_ids = s.prompt_ids or (list(capture.prompt_ids) if capture else None)
            cached = 0
            if prompt_ids and cache and any(t < s.started_at for t in seen.get(text, ())):
                cached = prefix_cached_tokens(len(prompt_ids), cache)
            reference = references.get(s.prompt_index)
            if reference is None and capture is not None:
                reference, from_capture = list(capture.output_ids), from_capture + 1
            if prompt_ids is None or not reference:
                missing += 1
                continue
            request = RequestTokens.of(
                prompt_ids, reference, lookahead_of(capture, reference), cached
            )
            predicted_requests.append(request)
            found = read(s.spec_decode)
            if found is None or not found.detailed:
                continue
            replay = StepReplay(request, settings, max_model_len=mml)
            checks.append(check_steps(found.steps, replay, output_ids=s.output_ids))
            if s.output_ids:
                mine = RequestTokens.of(
                    prompt_ids, s.output_ids, lookahead_of(capture, s.output_ids), cached
                )
                own = StepReplay(mine, settings, max_model_len=mml)
                own_checks.append(check_steps(found.steps, own, output_ids=s.output_ids))
    predicted = (
        replay_many(predicted_requests, settings, max_model_len=mml)
        if (predicted_requests and not missing)
        else None
    )
    basis = _basis(entry, len(predicted_requests), missing, from_capture)
    return LevelAcceptance(
        **{
            **entry.__dict__,
            "steps": LevelSteps.of(checks) if checks else None,
            "own_steps": LevelSteps.of(own_checks) if own_checks else None,
            "predicted": predicted,
            "basis": basis,
        }
    )


def _basis(entry: LevelAcceptance, replayed: int, missing: int, from_capture: int) -> str:
    if missing:
        return (
            f"not predicted: the baseline has no token ids for {missing} of the "
            f"{replayed + missing} timed requests' prompts at {entry.level}"
        )
    if from_capture == replayed:
        return (
            f"the baseline's recorded token ids, {replayed} requests: its outputs at "
            f"{entry.level} carried none"
        )
    own = replayed - from_capture
    text = f"the baseline's own outputs at {entry.level}, {own} requests"
    return text + (f", and its recorded ids for {from_capture} more" if from_capture else "")


def baseline_captures(record: RunRecord, prompt_type: str) -> dict[str, CapturedTokens]:
    """The baseline's untimed token-id captures of a prompt type, by prompt text (consistent
    ones only): the look-ahead that makes a last step exact."""
    out: dict[str, CapturedTokens] = {}
    for phase in record.arm_phases(BASELINE):
        for m in phase.measurements.values():
            if m.prompt_type != prompt_type or m.token_ids is None or m.token_ids.missing:
                continue
            for text, found in m.token_ids.prompts.items():
                if found.consistent and found.output_ids:
                    out.setdefault(text, found)
    return out


def _baseline_outputs(record: RunRecord, key: str) -> dict[int | None, list[int]]:
    """The baseline's own output ids at this measurement, per prompt (its first request)."""
    out: dict[int | None, list[int]] = {}
    for phase in record.arm_phases(BASELINE):
        m = phase.measurements.get(key)
        for s in m.samples if m else ():
            if s.output_ids:
                out.setdefault(s.prompt_index, list(s.output_ids))
    return out


def lookahead_of(capture: CapturedTokens | None, output: Sequence[int]) -> tuple[int, ...]:
    """The capture's look-ahead, where its output is this one."""
    if capture is not None and list(capture.output_ids) == list(output):
        return capture.lookahead_ids
    return ()


def record_max_model_len(record: RunRecord) -> int | None:
    found = [
        m.token_ids.max_model_len
        for p in record.phases.values()
        for m in p.measurements.values()
        if m.token_ids is not None and m.token_ids.max_model_len
    ]
    return min(found) if found else None


def prefix_block_size(phase: Phase, prompt_type: str) -> int | None:
    """The phase's KV block size where its prefix cache is on, else None."""
    for m in phase.measurements.values():
        ids = m.token_ids
        if m.prompt_type == prompt_type and ids is not None and ids.missing is None:
            return ids.block_size if ids.prefix_caching and ids.block_size else None
    return None


def sent_times(phase: Phase, prompts: Sequence[Any], prompt_type: str) -> dict[str, list[float]]:
    """When each prompt (by text) of the prompt type was sent in this phase, warm-ups included:
    a prompt sent before is served partly from the prefix cache."""
    out: dict[str, list[float]] = {}
    for m in phase.measurements.values():
        if m.prompt_type != prompt_type:
            continue
        for s in [*m.warmup, *m.samples, *m.discarded]:
            out.setdefault(prompts[s.prompt_index or 0].text, []).append(s.started_at)
    return out


# --- what the levels above the first teach ---------------------------------------------------


def _batch_rule(entries: Sequence[LevelAcceptance]) -> tuple[str | None, bool | None]:
    """What the step checks above the first level show about the proposer in a batch."""
    above = [e for e in entries if not e.first_level and e.own_steps is not None]
    if not above:
        return None, None
    own = LevelSteps.merged([e.own_steps for e in above if e.own_steps])
    apart = sum(own.by_class.values())
    levels = ", ".join(sorted({e.level for e in above}))
    vs_base = LevelSteps.merged([e.steps for e in above if e.steps])
    differ = vs_base.by_first.get("outputs differ", 0)
    if apart == 0:
        return (
            f"in a batch ({levels}) the n-gram proposer drafted exactly as the replay says on "
            f"each request's own tokens ({own.steps} verify steps of {own.requests} requests, "
            f"none apart): acceptance above the first level is predicted by replaying the "
            f"baseline's own outputs at that level. What it cannot foresee is where speculation "
            f"changes the greedy outputs: {differ} of {vs_base.requests} requests here",
            True,
        )
    classes = ", ".join(f"{k} {v}" for k, v in own.by_class.items())
    return (
        f"not predicted above the first level: in a batch ({levels}) {apart} of "
        f"{own.steps + own.by_class.get('no draft', 0)} verify steps depart from the replay even "
        f"on the requests' own tokens ({classes}), which the replay does not model",
        False,
    )
