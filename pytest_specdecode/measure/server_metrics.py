"""vLLM's speculative-decoding counters from /metrics, and what they mean. Pure functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


@dataclass(frozen=True)
class SpecCounters:
    """The counters summed over engine labels; None where the server does not export them."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_position: dict[int, float] = field(default_factory=dict)

    @property
    def present(self) -> bool:
        return self.drafts is not None


@dataclass(frozen=True)
class Acceptance:
    """Speculation's acceptance over one interval, as the server counted it."""

    present: bool
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    mean_acceptance_length: float | None = None  # 1 + accepted / drafts
    draft_acceptance_rate: float | None = None  # accepted / draft tokens
    per_position_rates: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_spec_counters(metrics_text: str) -> SpecCounters:
    """Read the spec-decode counters from Prometheus text, summing over engines."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == ACCEPTED_PER_POS:
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif sample.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return SpecCounters(
        drafts=totals.get(DRAFTS),
        draft_tokens=totals.get(DRAFT_TOKENS),
        accepted=totals.get(ACCEPTED),
        accepted_per_position=per_pos,
    )


def acceptance_between(before: SpecCounters, after: SpecCounters) -> Acceptance:
    """Acceptance over the interval between two scrapes."""
    if not after.present or after.draft_tokens is None or after.accepted is None:
        return Acceptance(present=False)
    drafts = after.drafts - (before.drafts or 0.0)  # type: ignore[operator]
    draft_tokens = after.draft_tokens - (before.draft_tokens or 0.0)
    accepted = after.accepted - (before.accepted or 0.0)
    positions = sorted(after.accepted_per_position)
    per_pos = [
        after.accepted_per_position[p] - before.accepted_per_position.get(p, 0.0) for p in positions
    ]
    return Acceptance(
        present=True,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        mean_acceptance_length=1.0 + accepted / drafts if drafts > 0 else None,
        draft_acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        per_position_rates=[n / drafts for n in per_pos] if drafts > 0 else [],
    )


def combine(parts: Sequence[Acceptance]) -> Acceptance:
    """Acceptance over consecutive intervals taken together."""
    present = [a for a in parts if a.present]
    if not present:
        return Acceptance(present=False)
    drafts = sum(a.drafts for a in present)
    draft_tokens = sum(a.draft_tokens for a in present)
    accepted = sum(a.accepted for a in present)
    width = max(len(a.per_position_rates) for a in present)
    per_pos_counts = [
        sum(a.per_position_rates[i] * a.drafts for a in present if i < len(a.per_position_rates))
        for i in range(width)
    ]
    return _from_counts(drafts, draft_tokens, accepted, per_pos_counts)


def _from_counts(
    drafts: float, draft_tokens: float, accepted: float, accepted_per_position: Sequence[float]
) -> Acceptance:
    """Acceptance from raw counts; rates only where there were drafts."""
    return Acceptance(
        present=True,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        mean_acceptance_length=1.0 + accepted / drafts if drafts > 0 else None,
        draft_acceptance_rate=accepted / draft_tokens if draft_tokens > 0 else None,
        per_position_rates=[n / drafts for n in accepted_per_position] if drafts > 0 else [],
    )


def client_accepted_tokens(tokens_per_chunk: Sequence[int]) -> int:
    """Tokens a request received beyond one per decode step: speculation's accepted tokens.

    The role chunk (0 tokens) and the first token (from prefill) are not decode steps.
    """
    counts = [n for n in tokens_per_chunk if n > 0][1:]
    return sum(n - 1 for n in counts)


def cross_check(
    server: Acceptance, client_accepted: int | None, *, requests: int, num_speculative_tokens: int
) -> str | None:
    """A disagreement between the server's accepted-token count and the client's, or None.

    The server may count a few more: tokens accepted past max_tokens or EOS are cut from the
    stream, at most num_speculative_tokens per request.
    """
    if not server.present:
        return None
    if client_accepted is None:
        return "the server sent no per-chunk usage, so acceptance could not be cross-checked"
    slack = requests * num_speculative_tokens
    if not client_accepted <= server.accepted <= client_accepted + slack:
        return (
            f"the server counted {server.accepted:.0f} accepted tokens but the client received "
            f"{client_accepted} beyond one per step (allowed: up to {slack} more on the server)"
        )
    return None
