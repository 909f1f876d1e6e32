"""The engine's measured speed, read from a server already answering at the API (its /metrics).

For the dry run's estimate where no stored run or host profile of this accelerator holds one:
vLLM's own histograms of the requests it served, never a guess. Reading /metrics changes
nothing on the server; where nothing answers, there is no such speed.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

E2E_SUM = "vllm:e2e_request_latency_seconds_sum"
GENERATION_TOKENS = "vllm:generation_tokens_total"


def seconds_per_output_token(metrics_text: str) -> float | None:
    """A served request's time per output token, over every request the server finished:
    the requests' end-to-end seconds over the tokens they generated (engines summed)."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(metrics_text):
            for sample in family.samples:
                if sample.name in (E2E_SUM, GENERATION_TOKENS):
                    totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError:  # not Prometheus text
        return None
    seconds, tokens = totals.get(E2E_SUM), totals.get(GENERATION_TOKENS)
    if not seconds or not tokens or seconds <= 0 or tokens <= 0:
        return None
    return seconds / tokens


def served_speed(
    api_base: str,
    headers: Mapping[str, str],
    transport: httpx.BaseTransport | None = None,
    *,
    timeout_s: float = 5.0,
) -> float | None:
    """The speed of the server answering at `api_base` now; None where none answers."""
    try:
        with httpx.Client(transport=transport, headers=dict(headers), timeout=timeout_s) as c:
            response = c.get(f"{api_base.rstrip('/')}/metrics")
    except httpx.HTTPError:
        return None
    return seconds_per_output_token(response.text) if response.status_code == 200 else None
