"""Suffix decoding (vLLM's `suffix` method) replayed offline, with Arctic Inference's own cache.

vLLM's proposer (vllm/v1/spec_decode/suffix_decoding.py) keeps one `SuffixDecodingCache` per
server: a tree of each request's prompt, and a global tree of the earlier responses. Each step
it adds the tokens just emitted, then speculates from the last `max_tree_depth` tokens, at most
k (`num_speculative_tokens`, by default the tree depth) and fewer where the match is short. The
replay does the same over recorded requests in the order they were sent, accepting greedily
against the recorded output, as the server's verification does at temperature 0. It needs the
optional `arctic-inference` package (`pip install 'pytest-specdecode[suffix]'`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .ngram_types import RequestTokens

__all__ = ["SuffixReplay", "SuffixSettings", "missing_reason", "replay_suffix", "suffix_settings"]


@dataclass(frozen=True)
class SuffixSettings:
    """What vLLM 0.32 runs for a suffix `--speculative-config` (its defaults where unset)."""

    k: int
    max_tree_depth: int = 24
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1
    max_cached_requests: int = 10000

    @property
    def label(self) -> str:
        return f"suffix k={self.k} depth={self.max_tree_depth}"


def suffix_settings(values: Mapping[str, Any]) -> SuffixSettings | None:
    """The settings of a suffix config; None for any other."""
    if values.get("method") != "suffix":
        return None
    depth = int(values.get("suffix_decoding_max_tree_depth", 24))
    return SuffixSettings(
        k=int(values.get("num_speculative_tokens") or depth),
        max_tree_depth=depth,
        max_spec_factor=float(values.get("suffix_decoding_max_spec_factor", 1.0)),
        min_token_prob=float(values.get("suffix_decoding_min_token_prob", 0.1)),
        max_cached_requests=int(values.get("suffix_decoding_max_cached_requests", 10000)),
    )


@dataclass(frozen=True)
class SuffixReplay:
    """What the server's counters would show for these requests, suffix decoding on."""

    settings: SuffixSettings
    requests: int
    output_tokens: int
    steps: int  # decode steps: each emits its accepted drafts and one token of its own
    drafts: int  # steps that proposed at least one token
    draft_tokens: int
    accepted: int

    @property
    def tokens_per_step(self) -> float:
        return (self.output_tokens - self.requests) / self.steps if self.steps else 1.0

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.settings.label,
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "tokens_per_step": self.tokens_per_step,
            "mean_acceptance_length": self.mean_acceptance_length,
        }


def missing_reason() -> str | None:
    """Why suffix decoding cannot be replayed here (None: it can)."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache  # noqa: F401
    except ImportError as exc:
        return (
            f"suffix decoding is replayed with Arctic Inference's cache, which is not installed "
            f"here ({exc}): pip install 'pytest-specdecode[suffix]'"
        )
    return None


def replay_suffix(
    requests: Sequence[RequestTokens], settings: SuffixSettings, max_model_len: int | None = None
) -> SuffixReplay:
    """The requests, in the order given (one server's cache sees them in that order), each
    greedy: a draft's tokens are accepted while they equal the recorded output."""
    import numpy as np
    from arctic_inference.suffix_decoding import SuffixDecodingCache

    cache = SuffixDecodingCache(
        max_tree_depth=settings.max_tree_depth, max_cached_requests=settings.max_cached_requests
    )
    steps = drafts = draft_tokens = accepted = output = 0
    for n, request in enumerate(requests):
        prompt, out = list(request.prompt_ids), list(request.output_ids)
        if not out:
            continue
        output += len(out)
        cache.start_request(n, np.array(prompt, dtype=np.int32))
        done = 1  # the prefill's token
        cache.add_active_response(n, out[:1])
        while done < len(out):
            context = prompt + out[:done]
            room = (max_model_len - len(context) - 1) if max_model_len else settings.k
            draft = cache.speculate(
                n,
                np.array(context[-settings.max_tree_depth :], dtype=np.int32),
                max_spec_tokens=max(0, min(settings.k, room)),
                max_spec_factor=settings.max_spec_factor,
                min_token_prob=settings.min_token_prob,
            )
            proposed = list(draft.token_ids)
            took = 0
            while took < len(proposed) and done + took < len(out):
                if proposed[took] != out[done + took]:
                    break
                took += 1
            steps += 1
            drafts += bool(proposed)
            draft_tokens += len(proposed)
            accepted += took
            emitted = out[done : done + took + 1]
            cache.add_active_response(n, emitted)
            done += len(emitted)
        cache.stop_request(n)
    return SuffixReplay(settings, len(requests), output, steps, drafts, draft_tokens, accepted)
