"""vLLM's counters read from /metrics, and what they mean over a measured window. Pure functions.

Two kinds: speculation's counters (drafts, accepted tokens, per position), and the server's
traffic counters (requests, prompt and generation tokens, decode steps), which tell whether a
window held only this run's requests and let the client's view be checked exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from ..record.counters import Acceptance, Traffic, from_counts

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
