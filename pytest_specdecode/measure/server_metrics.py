"""vLLM's counters from /metrics, and what they mean over a measured window. Pure functions.

Two kinds: speculation's counters (drafts, accepted tokens, per position), and the server's
traffic counters (requests, prompt and generation tokens, decode steps), which tell whether a
window held only this run's requests and let the client's view be checked exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUESTS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
DECODE_STEPS = "vllm:inter_token_latency_seconds_count"  # one per decode step and request
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
_TRAFFIC = {
    REQUESTS: "requests",
    PROMPT_TOKENS: "prompt_tokens",
    GENERATION_TOKENS: "generation_tokens",
    DECODE_STEPS: "decode_steps",
    RUNNING: "running",
    WAITING: "waiting",
}


@dataclass(frozen=True)
class ServerCounters:
    """The counters summed over engine labels; None where the server does not export them."""

    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    accepted_per_position: dict[int, float] = field(default_factory=dict)
    traffic: dict[str, float] = field(default_factory=dict)  # _TRAFFIC's names, where exported

    @property
    def present(self) -> bool:
        return self.drafts is not None


@dataclass(frozen=True)
class Traffic:
    """What the server counted over a window, for every client, not only this run's."""

    requests: float | None = None  # finished successfully
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    decode_steps: float | None = None  # a step of one request, after its first token
    busy_before: float | None = None  # running + waiting requests when the window opened
    busy_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def parse_counters(metrics_text: str) -> ServerCounters:
    """Read the spec-decode counters from Prometheus text, summing over engines."""
    totals: dict[str, float] = {}
    per_pos: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == ACCEPTED_PER_POS:
                pos = int(sample.labels.get("position", "0"))
                per_pos[pos] = per_pos.get(pos, 0.0) + sample.value
            elif sample.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED) or sample.name in _TRAFFIC:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    return ServerCounters(
        drafts=totals.get(DRAFTS),
        draft_tokens=totals.get(DRAFT_TOKENS),
        accepted=totals.get(ACCEPTED),
        accepted_per_position=per_pos,
        traffic={name: totals[metric] for metric, name in _TRAFFIC.items() if metric in totals},
    )


def traffic_between(before: ServerCounters, after: ServerCounters) -> Traffic:
    """The server's traffic counts over the window between two scrapes."""

    def delta(name: str) -> float | None:
        if name not in after.traffic or name not in before.traffic:
            return None
        return after.traffic[name] - before.traffic[name]

    def busy(counters: ServerCounters) -> float | None:
        parts = [counters.traffic.get(n) for n in ("running", "waiting")]
        return None if None in parts else sum(p for p in parts if p is not None)

    return Traffic(
        requests=delta("requests"),
        prompt_tokens=delta("prompt_tokens"),
        generation_tokens=delta("generation_tokens"),
        decode_steps=delta("decode_steps"),
        busy_before=busy(before),
        busy_after=busy(after),
    )


def acceptance_between(before: ServerCounters, after: ServerCounters) -> Acceptance:
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
    return from_counts(drafts, draft_tokens, accepted, per_pos)


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
    return from_counts(drafts, draft_tokens, accepted, per_pos_counts)


def from_counts(
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
