"""One timed request, as the load generator measured it: the unit every statistic is built on.

`RequestSample.to_json` is its one serialisation: in results.json, and in the sample journal
(samples.jsonl) the moment the request finished.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RequestSample:
    """One streamed request, timed on the client."""

    prompt_type: str
    phase: str
    index: int
    warmup: bool
    started_at: float  # unix time
    ttft_s: float  # to the first chunk carrying choices (as vLLM's benchmark client)
    e2e_s: float  # to the last chunk carrying choices
    output_tokens: int  # from usage: with speculation, one chunk may carry several tokens
    prompt_tokens: int
    chunks: int
    chunk_gaps_s: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] | None = None  # from continuous usage, when the server sends it
    text: str = ""
    prompt_index: int | None = None  # which prompt of the prompt type (config/prompts.py)
    level: str | None = None  # the load level's label, e.g. "c4"
    # vLLM's own per-request speculative-decoding metrics (`--per-request-spec-decode-metrics`),
    # as the final usage chunk carried them under `metrics.speculative_decoding`
    spec_decode: dict[str, Any] | None = None
    prompt_ids: list[int] | None = None  # with return_token_ids: the prompt after its template
    output_ids: list[int] | None = None  # with return_token_ids: every output token's id
    finish_reason: str | None = None  # the last choice's: "length" (max_tokens), "stop" (EOS)
    slot: int | None = (
        None  # its slot in the start's interleaved order (measure/experiment/order.py)
    )

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.e2e_s if self.e2e_s > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        """Its fields (numbers, text and flat lists), and the derived figures for readers."""
        data = dict(vars(self))  # dataclasses.asdict's deep walk is slow on long runs
        data["tpot_s"] = self.tpot_s
        data["tokens_per_s"] = self.tokens_per_s
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestSample:
        """Back from `to_json` (the derived figures are recomputed, never read)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
