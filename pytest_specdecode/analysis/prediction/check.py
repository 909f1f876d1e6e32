"""Predicted against measured: a measured n-gram candidate's replay beside the server's counters
(Comparison), exact, within the last-step bound, a mismatch, or where its outputs differ from
the baseline's (analysis/prediction/predict.py runs it for every candidate and prompt type)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...record.counters import Acceptance
from ...record.measurement import Measurement
from ...record.schema import RunRecord
from .inputs import (
    earlier_prompts,
    first_measurement,
    replay_groups,
    request_tokens,
    timed_prompts,
)
from .ngram_types import DraftRatios, NgramSettings, ReplayStats, RequestTokens

__all__ = ["Comparison", "Counts", "Status"]

Status = Literal["exact", "within bound", "mismatch", "outputs differ", "not compared"]


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


def _stats_json(stats: ReplayStats | None) -> dict[str, Any] | None:
    return stats.to_dict() if stats is not None else None


# --- predicted against measured ----------------------------------------------------------------


def compare_prediction(
    record: RunRecord,
    candidate: str,
    settings: NgramSettings,
    prompt_type: str,
    baseline: tuple[Measurement, list[RequestTokens]] | None,
) -> Comparison | None:
    mc = first_measurement(record, candidate, prompt_type)
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
    requests = request_tokens(prompts, earlier, mb.token_ids, mc.token_ids)
    if requests is None:
        return skip("the baseline has no token ids for a prompt the candidate was timed on")
    mml = mb.token_ids.max_model_len
    predicted = replay_groups({"p": requests}, [settings], mml)["p"][settings]
    measured = Counts.of(mc.acceptance, settings.num_speculative_tokens)
    differs = output_divergence(record, mb, mc, prompts)
    if differs is None:
        status = _agreement(predicted, measured)
        detail = f"outputs equal the baseline's; {_figures(predicted, measured, status)}"
        return Comparison(candidate, prompt_type, settings, status, detail, predicted, measured)
    own = own_status = None
    own_text = "the candidate's own token ids were not recorded"
    if mc.token_ids is not None and mc.token_ids.missing is None:
        own_requests = request_tokens(prompts, earlier, mc.token_ids)
        if own_requests is not None and _self_consistent(record, mc, prompts):
            own = replay_groups({"p": own_requests}, [settings], mml)["p"][settings]
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
        f"accepted per draft {p_len:.2f} vs measured {m_len:.2f} ({m_len - p_len:+.2f})"
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


def output_divergence(
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
