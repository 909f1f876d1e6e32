"""Other clients of the server: told apart from this run's requests by the server's counters."""

from __future__ import annotations

from collections.abc import Sequence

from ..record.counters import Traffic
from ..record.requests.samples import RequestSample


def foreign(traffic: Traffic, samples: Sequence[RequestSample]) -> str | None:
    """What in a measured window was not this run's, or None where it held only its requests.

    Over a window the server counts every client's finished requests and generated tokens;
    this run knows its own. Any excess, or a request in flight when the window opened or closed
    (this run's own never are), is another client's.
    """
    notes = []
    ours = len(samples)
    if traffic.requests is not None and traffic.requests > ours:
        notes.append(f"{traffic.requests - ours:.0f} other requests finished")
    tokens = sum(s.output_tokens for s in samples)
    if traffic.generation_tokens is not None and traffic.generation_tokens > tokens:
        notes.append(f"{traffic.generation_tokens - tokens:.0f} tokens were generated for others")
    for when, busy in (("began", traffic.busy_before), ("ended", traffic.busy_after)):
        if busy:
            notes.append(f"{busy:.0f} requests were in flight when the window {when}")
    return "; ".join(notes) or None


def rate_text(traffic: Traffic, seconds: float) -> str:
    """The traffic a watch saw, per minute, as a user reads it."""
    if traffic.requests is None and traffic.generation_tokens is None:
        return "unknown (the server exports no request counters)"
    requests = (traffic.requests or 0) * 60 / seconds
    tokens = (traffic.generation_tokens or 0) / seconds
    busy = max(traffic.busy_before or 0, traffic.busy_after or 0)
    return f"{requests:.1f} requests/min, {tokens:.1f} generated tok/s, {busy:.0f} in flight"


def quiet(traffic: Traffic) -> bool:
    return not any((traffic.requests, traffic.generation_tokens, traffic.busy_after))
