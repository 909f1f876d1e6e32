"""The n-gram replay's inputs and outputs: a config (NgramSettings) and the grid, a request's
token ids (RequestTokens), the server's counters a replay yields (ReplayStats), and vLLM's rule
for the effective settings (see ngram_replay.py for the rules the replay follows)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "NGRAM_GRID_K",
    "NGRAM_GRID_N",
    "DraftRatios",
    "NgramSettings",
    "ReplayStats",
    "RequestTokens",
    "aggregate",
    "effective_settings",
    "grid_settings",
    "prefix_cached_tokens",
    "unsupported_reason",
]

NGRAM_GRID_K = range(1, 9)  # num_speculative_tokens on the grid
NGRAM_GRID_N = range(1, 7)  # prompt_lookup_min/max on the grid
_NGRAM_METHODS = ("ngram", "[ngram]")


@dataclass(frozen=True, order=True)
class NgramSettings:
    """An n-gram config as vLLM runs it: k and the effective lookup bounds."""

    num_speculative_tokens: int
    prompt_lookup_min: int
    prompt_lookup_max: int

    def __post_init__(self) -> None:
        k, lo, hi = self.num_speculative_tokens, self.prompt_lookup_min, self.prompt_lookup_max
        if k < 1 or lo < 1 or lo > hi:
            raise ValueError(
                f"n-gram settings need k >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max; "
                f"got k={k}, min={lo}, max={hi}"
            )

    @property
    def label(self) -> str:
        """Short and explicit, e.g. ``k=5 n=4..4``."""
        return (
            f"k={self.num_speculative_tokens} n={self.prompt_lookup_min}..{self.prompt_lookup_max}"
        )

    def to_values(self) -> dict[str, Any]:
        """The `--speculative-config` values that give exactly these settings."""
        return {
            "method": "ngram",
            "num_speculative_tokens": self.num_speculative_tokens,
            "prompt_lookup_min": self.prompt_lookup_min,
            "prompt_lookup_max": self.prompt_lookup_max,
        }


def unsupported_reason(values: Mapping[str, Any]) -> str | None:
    """Why a speculative config cannot be replayed, or None when it can."""
    if not values:
        return "the original's configuration, without speculation: nothing to replay"
    if values.get("rejection_sample_method") == "synthetic":
        return (
            "a server of the break-even map: vLLM accepts its drafts at a stated rate, so its "
            "acceptance is not the drafter's to replay"
        )
    method = values.get("method")
    if method is None and values.get("model") in _NGRAM_METHODS:
        method = "ngram"
    if method in _NGRAM_METHODS:
        if not values.get("num_speculative_tokens"):
            return "an n-gram config without num_speculative_tokens is refused by vLLM"
        return None
    if method == "suffix":
        return (
            "suffix decoding is not on the n-gram grid: its drafts come from a tree of the "
            "prompt and earlier responses, replayed with Arctic Inference's own cache (below)"
        )
    if method == "ngram_gpu":
        return "method 'ngram_gpu' is not replayed (only 'ngram'); its measured figures stand"
    return (
        f"method {method!r} drafts with a model: no replay is possible, "
        "only the measured figures count"
    )


def effective_settings(values: Mapping[str, Any]) -> NgramSettings:
    """The settings vLLM 0.32 runs for a `--speculative-config` (see the module docstring)."""
    reason = unsupported_reason(values)
    if reason:
        raise ValueError(reason)
    lo, hi = values.get("prompt_lookup_min"), values.get("prompt_lookup_max")
    if lo is None and hi is None:
        lo = hi = 5
    elif lo is None:
        lo = hi
    elif hi is None:
        hi = lo
    return NgramSettings(int(values["num_speculative_tokens"]), int(lo), int(hi))


def grid_settings(
    ks: Iterable[int] = NGRAM_GRID_K, ns: Iterable[int] = NGRAM_GRID_N
) -> list[NgramSettings]:
    """Every k in `ks` with every prompt_lookup_min <= prompt_lookup_max from `ns`."""
    n_values = sorted(set(ns))
    return [
        NgramSettings(k, lo, hi)
        for k in sorted(set(ks))
        for lo in n_values
        for hi in n_values
        if lo <= hi
    ]


def prefix_cached_tokens(prompt_len: int, block_size: int) -> int:
    """Tokens of a repeated prompt that vLLM's prefix cache serves: whole blocks, never the last."""
    return (max(prompt_len - 1, 0) // block_size) * block_size


@dataclass(frozen=True)
class RequestTokens:
    """One baseline request's token ids, as the replay needs them.

    `lookahead_ids` are the target's greedy tokens after `output_ids` (recorded outside the timed
    requests); they make the last step exact. `cached_prompt_tokens` is what the prefix cache
    served for this prompt (see :func:`prefix_cached_tokens`), 0 for a first request.
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    lookahead_ids: tuple[int, ...] = ()
    cached_prompt_tokens: int = 0

    @classmethod
    def of(
        cls,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        lookahead_ids: Sequence[int] = (),
        cached_prompt_tokens: int = 0,
    ) -> RequestTokens:
        return cls(
            tuple(int(t) for t in prompt_ids),
            tuple(int(t) for t in output_ids),
            tuple(int(t) for t in lookahead_ids),
            int(cached_prompt_tokens),
        )


class DraftRatios:
    """vLLM's two acceptance figures, from the counts of the class that mixes this in."""

    drafts: int
    draft_tokens: int
    accepted: int

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts, as vLLM reports it (counts only the steps that drafted)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        return self.accepted / self.draft_tokens if self.draft_tokens else None


@dataclass(frozen=True)
class ReplayStats(DraftRatios):
    """What the server's counters would show for these requests under `settings`.

    Counts are summed over requests; rates are computed from the sums, as vLLM does.

    The last step of a request may verify draft tokens beyond the tokens known here (past
    max_tokens, or past EOS), which the server counts but the client never sees. `accepted`
    counts only acceptances checked against known tokens, and `unverified_tokens` the draft
    tokens that could not be checked: the server's count lies in
    [accepted, accepted + unverified_tokens], per position likewise in
    [accepted_per_position, accepted_per_position_max]. Zero unverified tokens means exact.
    The bound is at most k - 1 tokens per request, all at its last step: that step starts at
    most one token before the output's end, so its first draft token is always checked.
    """

    settings: NgramSettings
    requests: int
    output_tokens: int  # tokens delivered to the client
    steps: int  # forward passes: one prefill per request plus every decode step
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: tuple[int, ...]
    unverified_tokens: int = 0
    accepted_per_position_max: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.accepted_per_position_max:
            object.__setattr__(self, "accepted_per_position_max", self.accepted_per_position)

    @property
    def decode_steps(self) -> int:
        return self.steps - self.requests

    @property
    def exact(self) -> bool:
        return self.unverified_tokens == 0

    @property
    def accepted_max(self) -> int:
        return self.accepted + self.unverified_tokens

    @property
    def drafts_per_step(self) -> float | None:
        """Share of decode steps that carried a draft."""
        return self.drafts / self.decode_steps if self.decode_steps else None

    @property
    def per_position_rates(self) -> list[float]:
        return [n / self.drafts for n in self.accepted_per_position] if self.drafts else []

    @property
    def tokens_per_step(self) -> float:
        """Output tokens per forward pass over all steps, prefill included."""
        return self.output_tokens / self.steps if self.steps else 0.0

    @property
    def decode_tokens_per_step(self) -> float:
        """Tokens after the first per decode step: baseline TPOT / candidate TPOT at equal cost."""
        if not self.decode_steps:
            return 1.0
        return (self.output_tokens - self.requests) / self.decode_steps

    @property
    def draft_tokens_per_step(self) -> float:
        """Mean draft tokens verified per decode step (each step also verifies one more)."""
        return self.draft_tokens / self.decode_steps if self.decode_steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "settings": self.settings.to_values(),
            "label": self.settings.label,
            "requests": self.requests,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "decode_steps": self.decode_steps,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted": self.accepted,
            "accepted_per_position": list(self.accepted_per_position),
            "unverified_tokens": self.unverified_tokens,
            "exact": self.exact,
            "accepted_per_position_max": list(self.accepted_per_position_max),
            "drafts_per_step": self.drafts_per_step,
            "mean_acceptance_length": self.mean_acceptance_length,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "per_position_rates": self.per_position_rates,
            # tokens per step, one name for one quantity in every report (issue 41):
            "tokens_per_forward_pass": self.tokens_per_step,  # prefill included
            "tokens_per_step": self.decode_tokens_per_step,  # decode steps: the map's axis
            "draft_tokens_per_step": self.draft_tokens_per_step,
        }


def aggregate(parts: Sequence[ReplayStats]) -> ReplayStats:
    """Several requests' stats under one config taken together: counts summed."""
    if not parts:
        raise ValueError("nothing to aggregate")
    settings = parts[0].settings
    if any(p.settings != settings for p in parts):
        raise ValueError("cannot aggregate replays of different settings")
    width = settings.num_speculative_tokens

    def total(name: str) -> int:
        return sum(getattr(p, name) for p in parts)

    def positions(name: str) -> tuple[int, ...]:
        return tuple(sum(getattr(p, name)[i] for p in parts) for i in range(width))

    return ReplayStats(
        settings=settings,
        requests=total("requests"),
        output_tokens=total("output_tokens"),
        steps=total("steps"),
        drafts=total("drafts"),
        draft_tokens=total("draft_tokens"),
        accepted=total("accepted"),
        accepted_per_position=positions("accepted_per_position"),
        unverified_tokens=total("unverified_tokens"),
        accepted_per_position_max=positions("accepted_per_position_max"),
    )
