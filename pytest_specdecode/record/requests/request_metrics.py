"""vLLM's own per-request speculative-decoding metrics: each timed request's acceptance. Pure.

What vLLM 0.32 offers (read from its source, `config/observability.py`, `v1/metrics/stats.py`
`RequestSpecDecodeMetrics`, `v1/core/sched/scheduler.py`, and seen on the embedded CPU server):

- The server option `--per-request-spec-decode-metrics {none,summary,detailed}` (default none;
  the server refuses it without `--speculative-config`).
- A streamed request's final usage chunk (`stream_options.include_usage`) then carries
  `metrics.speculative_decoding`: `num_spec_tokens` (k), `acceptance_histogram` (index j: the
  verify steps that accepted exactly j draft tokens), `num_spec_steps`,
  `num_accepted_draft_tokens`, `num_draft_tokens`, `mean_acceptance_length` (1 + accepted /
  steps) and `draft_acceptance_rate`; `detailed` adds `per_step_drafted` and
  `per_step_accepted`, one entry per verify step, in order.
- A step is observed where the counters count a draft (`Scheduler.update_from_output`, the same
  branch): a step that drafted nothing is in neither, so the arrays list only the steps that
  drafted. Summed over a window's requests, the figures equal the `vllm:spec_decode_*`
  counters' delta over it, per position too (position p is accepted on every step with j > p).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..counters import Acceptance, from_counts


@dataclass(frozen=True)
class RequestSpecDecode:
    """One request's payload, read and checked."""

    num_spec_tokens: int
    histogram: tuple[int, ...]  # index j: verify steps that accepted exactly j draft tokens
    num_draft_tokens: int
    per_step_drafted: tuple[int, ...] | None = None  # `detailed` only
    per_step_accepted: tuple[int, ...] | None = None

    @classmethod
    def of(cls, payload: Mapping[str, Any]) -> RequestSpecDecode:
        """From `metrics.speculative_decoding`; ValueError saying what is wrong with it."""
        k = _int(payload, "num_spec_tokens")
        hist = _ints(payload.get("acceptance_histogram"), "acceptance_histogram")
        if hist is None or len(hist) != k + 1:
            raise ValueError(f"acceptance_histogram must list {k + 1} counts, got {hist!r}")
        drafted = _ints(payload.get("per_step_drafted"), "per_step_drafted")
        accepted = _ints(payload.get("per_step_accepted"), "per_step_accepted")
        if drafted is None and accepted is None and not any(hist):
            drafted = accepted = ()  # vLLM omits empty arrays: no verify step, nothing to list
        if (drafted is None) != (accepted is None):
            raise ValueError("per_step_drafted and per_step_accepted come together")
        out = cls(k, hist, _int(payload, "num_draft_tokens"), drafted, accepted)
        steps, total = _int(payload, "num_spec_steps"), _int(payload, "num_accepted_draft_tokens")
        if (steps, total) != (out.drafts, out.accepted):
            raise ValueError(
                f"num_spec_steps {steps} and num_accepted_draft_tokens {total} disagree with "
                f"the histogram ({out.drafts} steps, {out.accepted} accepted)"
            )
        if drafted is not None and accepted is not None:
            if len(drafted) != len(accepted) or len(drafted) != out.drafts:
                raise ValueError(
                    f"{len(drafted)} drafted and {len(accepted)} accepted entries for "
                    f"{out.drafts} verify steps"
                )
            if sum(drafted) != out.num_draft_tokens or sum(accepted) != out.accepted:
                raise ValueError("the per-step arrays do not sum to the request's totals")
            if any(a > d or d > k or a < 0 for d, a in zip(drafted, accepted, strict=True)):
                raise ValueError("a step accepted more than it drafted, or drafted more than k")
        return out

    @property
    def drafts(self) -> int:
        """Verify steps that carried a draft (vLLM's num_drafts)."""
        return sum(self.histogram)

    @property
    def accepted(self) -> int:
        return sum(j * n for j, n in enumerate(self.histogram))

    @property
    def detailed(self) -> bool:
        return self.per_step_drafted is not None

    def per_position(self, width: int | None = None) -> tuple[int, ...]:
        """Accepted tokens at each draft position: position p on every step with j > p."""
        width = self.num_spec_tokens if width is None else width
        return tuple(sum(self.histogram[p + 1 :]) for p in range(width))

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def steps(self) -> list[tuple[int, int]]:
        """(drafted, accepted) of every verify step, in order; empty without `detailed`."""
        if self.per_step_drafted is None or self.per_step_accepted is None:
            return []
        return list(zip(self.per_step_drafted, self.per_step_accepted, strict=True))


def read(payload: Mapping[str, Any] | None) -> RequestSpecDecode | None:
    """A sample's payload read, or None where it has none or it cannot be read."""
    if not payload:
        return None
    try:
        return RequestSpecDecode.of(payload)
    except (ValueError, TypeError):
        return None


def payload_problem(payload: Mapping[str, Any] | None) -> str | None:
    """Why a payload cannot be used; None when it can (or there is none)."""
    if not payload:
        return None
    try:
        RequestSpecDecode.of(payload)
    except (ValueError, TypeError) as exc:
        return str(exc)
    return None


def acceptance_of(payloads: Iterable[Mapping[str, Any] | None]) -> Acceptance | None:
    """The requests' figures summed, in the counters' shape; None unless every one has one."""
    read_ = [read(p) for p in payloads]
    if not read_ or any(r is None for r in read_):
        return None
    found = [r for r in read_ if r is not None]
    width = max(r.num_spec_tokens for r in found)
    per_pos = [sum(r.per_position(width)[p] for r in found) for p in range(width)]
    return from_counts(
        sum(r.drafts for r in found),
        sum(r.num_draft_tokens for r in found),
        sum(r.accepted for r in found),
        per_pos,
    )


def against_counters(requests: Acceptance, counters: Acceptance) -> str | None:
    """Where the requests' sum differs from the counters' delta over a quiet window, or None.

    Both count the same steps in the same branch of the scheduler, so they must be equal:
    drafts, draft tokens, accepted tokens and every position.
    """
    if not counters.present:
        return None
    pairs = {
        "drafts": (requests.drafts, counters.drafts),
        "draft tokens": (requests.draft_tokens, counters.draft_tokens),
        "accepted tokens": (requests.accepted, counters.accepted),
    }
    wrong = [f"{name} {a:.0f} vs {b:.0f}" for name, (a, b) in pairs.items() if round(a) != round(b)]
    mine, theirs = _positions(requests), _positions(counters)
    width = max(len(mine), len(theirs))
    mine, theirs = mine + [0] * (width - len(mine)), theirs + [0] * (width - len(theirs))
    if not wrong and mine != theirs:
        wrong.append(f"per position {mine} vs {theirs}")
    if not wrong:
        return None
    return (
        "the requests' own spec-decode figures do not sum to the counters' delta over the "
        f"window (requests vs counters: {', '.join(wrong)})"
    )


def _positions(acc: Acceptance) -> list[int]:
    return [round(r * acc.drafts) for r in acc.per_position_rates]


def _int(payload: Mapping[str, Any], key: str) -> int:
    value = payload.get(key)
    if type(value) is not int or value < 0:
        raise ValueError(f"{key} must be a count, got {value!r}")
    return value


def _ints(value: Any, key: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(type(v) is int and v >= 0 for v in value):
        raise ValueError(f"{key} must be a list of counts, got {str(value)[:80]}")
    return tuple(value)
