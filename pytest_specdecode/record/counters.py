"""What the server counted over a measured window: speculation's acceptance, and the traffic of
every client. Pure data and sums; read from /metrics by measure/server_metrics.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Two quantities, one name each, in every report, plot and doc (issue 41):
ACCEPTED_PER_DRAFT = "accepted per draft"
ACCEPTED_PER_DRAFT_MEANS = (
    "accepted per draft: vLLM's mean acceptance length, 1 + accepted tokens / drafting steps "
    "(steps that drafted nothing are not counted)"
)
TOKENS_PER_STEP = "tokens per step"
TOKENS_PER_STEP_MEANS = (
    "tokens per step: output tokens / decode steps, drafting or not (the break-even map's axis)"
)


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

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Traffic:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class TrafficWatch:
    """Other clients' traffic on the running original, seen before anything was touched."""

    seconds: float
    traffic: Traffic
    text: str  # as the progress line said it
    quiet: bool

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "traffic": self.traffic.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrafficWatch:
        return cls(
            seconds=float(data["seconds"]),
            traffic=Traffic.from_dict(data.get("traffic") or {}),
            text=str(data.get("text", "")),
            quiet=bool(data.get("quiet", True)),
        )


@dataclass(frozen=True)
class Acceptance:
    """Speculation's acceptance over one interval, as the server counted it."""

    present: bool
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    # ACCEPTED_PER_DRAFT; results.json keeps vLLM's own name for it
    mean_acceptance_length: float | None = None  # 1 + accepted / drafts
    draft_acceptance_rate: float | None = None  # accepted / draft tokens
    per_position_rates: list[float] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


def add_traffic(parts: Sequence[Traffic]) -> Traffic:
    """Traffic over several intervals taken together: counts summed, the busiest in flight."""

    def total(name: str, pick: Any = sum) -> float | None:
        known = [getattr(t, name) for t in parts if getattr(t, name) is not None]
        return pick(known) if known else None

    return Traffic(
        requests=total("requests"),
        prompt_tokens=total("prompt_tokens"),
        generation_tokens=total("generation_tokens"),
        decode_steps=total("decode_steps"),
        busy_before=total("busy_before", max),
        busy_after=total("busy_after", max),
    )


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
