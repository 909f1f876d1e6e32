"""Whether a drafter with a model works, from the counters over a start's first requests. Pure.

A broken drafter looks like a healthy server: it starts, serves, and accepts almost nothing. An
EAGLE-3 head whose config omitted `eagle_aux_hidden_state_layer_ids` got 1.21% acceptance while
the server stayed healthy (vllm#50170); aux ids off by one took position 0 from about 45% to
about 10% (vllm#43671); a `draft_model` cut to SmolLM2-135M's first 6 layers counted 5 of 555
draft tokens accepted, all at position 0 (vLLM 0.32, on the CPU). The rule: a drafter with a
model whose draft acceptance rate (accepted / draft tokens) is below the floor, over enough
draft tokens to say so, is broken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...config.specconfig import DRAFT_METHODS, MTP_METHODS
from ...record.counters import Acceptance
from ...record.drafter_check import BROKEN, HEALTHY, NO_COUNTERS, TOO_FEW

MIN_DRAFT_TOKENS = 100  # fewer counted: too few to call a drafter broken
MOST_ROUNDS = 4  # the check sends its requests at most this many times over, for more drafts
SYNTHETIC_KEYS = ("synthetic_acceptance_rates", "synthetic_acceptance_length")
# methods with a model that draft nothing of their own to judge
NOT_JUDGED = frozenset({"extract_hidden_states", "custom_class"})

# What a healthy head of the method typically accepts, and what a broken one did (cited).
TYPICAL = {
    "eagle3": (
        "a working EAGLE-3 head accepted about 45% at position 0 (vllm#43671); one whose config "
        "omitted eagle_aux_hidden_state_layer_ids got 1.21% while the server stayed healthy "
        "(vllm#50170)"
    ),
    "eagle": (
        "a working EAGLE head accepts tens of percent at position 0; one near zero is as a "
        "broken EAGLE-3 head was: 1.21% (vllm#50170)"
    ),
    "draft_model": (
        "a drafter of the target's own family accepts tens of percent; a draft model cut to "
        "SmolLM2-135M's first 6 layers counted 5 of 555 draft tokens accepted (0.9%), all at "
        "position 0 (vLLM 0.32)"
    ),
    "mtp": "a model's own MTP layers accept most of their first position's drafts",
}
TO_CHECK = {
    "eagle3": (
        "eagle_aux_hidden_state_layer_ids in the head's config.json (missing, vLLM guesses; "
        "vLLM and SGLang count them differently, sglang#25454), the draft vocabulary and its "
        "d2t mapping, max_position_embeddings, and that the head was trained for this target "
        "and its version"
    ),
    "eagle": (
        "that the head was trained for this target and its version, its vocabulary, and "
        "max_position_embeddings"
    ),
    "draft_model": (
        "that the drafter has the target's tokenizer (the same vocabulary, the same ids) and "
        "is of the target's family, trained or distilled for it, not cut or random"
    ),
    "mtp": (
        "that the checkpoint holds its MTP layers (num_nextn_predict_layers) with their "
        "weights, and the method's name for this model"
    ),
}


@dataclass(frozen=True)
class Health:
    """The verdict over the check's requests, and the sentence that says it."""

    verdict: str  # HEALTHY, BROKEN, TOO_FEW, NO_COUNTERS (record/drafter_check.py)
    text: str
    per_position: tuple[float, ...]  # accepted tokens per position

    @property
    def more(self) -> bool:
        """Whether more requests could still decide it."""
        return self.verdict == TOO_FEW


def judged(values: Mapping[str, Any] | None) -> bool:
    """Whether a candidate's drafter is checked: a method with a model, its acceptance its own
    (not vLLM's synthetic rejection, set on purpose)."""
    if not values:
        return False
    method = str(values.get("method", ""))
    has_model = method in DRAFT_METHODS or method in MTP_METHODS or method.endswith("_mtp")
    if not has_model or method in NOT_JUDGED:
        return False
    return not any(key in values for key in SYNTHETIC_KEYS)


def _family(method: str) -> str:
    return "mtp" if method.endswith("_mtp") else method


def per_position_counts(acc: Acceptance, k: int | None = None) -> tuple[float, ...]:
    """Accepted tokens at each position, the first k where k is known (the counters keep them
    as rates per draft)."""
    counts = tuple(round(r * acc.drafts, 6) for r in acc.per_position_rates)
    return counts[:k] if k else counts


def accepted_text(acc: Acceptance, k: int | None) -> str:
    """What the counters counted, in words: accepted of drafted, the rate, per position."""
    counts = per_position_counts(acc, k)
    positions = ", ".join(f"{n:g}" for n in counts) or "none"
    rate = acc.draft_acceptance_rate
    share = f" ({rate:.1%})" if rate is not None else ""
    of_k = f" of k = {k}" if k else ""
    return (
        f"{acc.accepted:g} of {acc.draft_tokens:g} draft tokens accepted{share} over "
        f"{acc.drafts:g} drafts{of_k}; accepted per position [{positions}]"
    )


def drafter_health(
    method: str,
    k: int | None,
    acc: Acceptance,
    *,
    floor: float,
    min_draft_tokens: int = MIN_DRAFT_TOKENS,
) -> Health:
    """Healthy or broken: broken where the draft acceptance rate is below `floor` over at least
    `min_draft_tokens` draft tokens; too few drafted to say below that; no counters, nothing."""
    if not acc.present:
        return Health(NO_COUNTERS, "the server exports no speculation counters: not judged", ())
    counts = per_position_counts(acc, k)
    said = accepted_text(acc, k)
    if acc.draft_tokens < min_draft_tokens:
        return Health(
            TOO_FEW,
            f"{said}: not enough drafted to judge (at least {min_draft_tokens} draft tokens)",
            counts,
        )
    rate = acc.draft_acceptance_rate or 0.0
    if rate >= floor:
        return Health(HEALTHY, f"{said}: at or above the floor of {floor:.0%}", counts)
    family = _family(method)
    typical = TYPICAL.get(family, "a working drafter accepts tens of percent")
    check = TO_CHECK.get(family, "that the drafter was made for this target and its version")
    return Health(
        BROKEN,
        f"{said}: below the floor of {floor:.0%} ([run] drafter_floor). For comparison, "
        f"{typical}. Check {check}.",
        counts,
    )


def first_prompts(prompt_counts: Sequence[tuple[str, int]], requests: int) -> list[tuple[str, int]]:
    """The check's requests: each prompt type's first prompts in turn, `requests` in all, as
    (prompt type, prompt index)."""
    types = [(name, count) for name, count in prompt_counts if count > 0]
    out: list[tuple[str, int]] = []
    index = 0
    while types and len(out) < requests:
        for name, count in types:
            if len(out) == requests:
                break
            out.append((name, index % count))
        index += 1
    return out
