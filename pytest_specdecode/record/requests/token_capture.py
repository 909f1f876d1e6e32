"""The token ids captured for the n-gram replay (analysis/prediction/predict.py): per prompt, the
prompt's after its chat template, the output's, and the greedy look-ahead past it; recorded untimed
by measure/requests/token_ids.py after a prompt type's timed requests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

OutputSource = Literal["return_token_ids", "logprobs"]


PromptSource = Literal["return_token_ids", "tokenize"]


@dataclass(frozen=True)
class TokenIdSupport:
    """How this server hands out token ids; None where it does not."""

    output: OutputSource | None
    prompt: PromptSource | None


@dataclass(frozen=True)
class CapturedTokens:
    """One request's ids: prompt (after the chat template), output, and look-ahead.

    `lookahead_ids` are the greedy tokens after the first max_tokens output tokens; empty when
    the output stopped before max_tokens (EOS: nothing follows) or when the check against the
    timed output failed. `check` says what the ids were compared with.
    """

    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    lookahead_ids: tuple[int, ...]
    finish_reason: str | None
    support: TokenIdSupport
    consistent: bool  # False: the ids do not reproduce the timed output
    check: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_ids": list(self.prompt_ids),
            "output_ids": list(self.output_ids),
            "lookahead_ids": list(self.lookahead_ids),
            "finish_reason": self.finish_reason,
            "source": {"output": self.support.output, "prompt": self.support.prompt},
            "consistent": self.consistent,
            "check": self.check,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CapturedTokens:
        source = data.get("source") or {}
        return cls(
            prompt_ids=tuple(int(t) for t in data["prompt_ids"]),
            output_ids=tuple(int(t) for t in data["output_ids"]),
            lookahead_ids=tuple(int(t) for t in data.get("lookahead_ids", ())),
            finish_reason=data.get("finish_reason"),
            support=TokenIdSupport(output=source.get("output"), prompt=source.get("prompt")),
            consistent=bool(data.get("consistent", True)),
            check=str(data.get("check", "")),
        )


@dataclass
class TokenIds:
    """One prompt type's token ids in one phase, or why there are none.

    One capture per distinct prompt, keyed by the prompt's text (a prompt set sends several),
    taken after the prompt type's timed requests. Beside them, what the replay needs to know
    of the server: its max_model_len (the proposer's cap) and its prefix cache (a repeated
    prompt can be scheduled as a padded decode; see analysis.ngram_replay).
    """

    prompts: dict[str, CapturedTokens] = field(default_factory=dict)
    missing: str | None = None  # why no ids were captured
    max_model_len: int | None = None
    block_size: int | None = None
    prefix_caching: bool | None = None
    recorded_s: float | None = None  # the untimed requests' wall time

    def to_json(self) -> dict[str, Any]:
        return {
            "missing": self.missing,
            "recorded_s": self.recorded_s,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "prefix_caching": self.prefix_caching,
            "prompts": [{"prompt": text, **ids.to_dict()} for text, ids in self.prompts.items()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TokenIds:
        return cls(
            prompts={
                str(entry["prompt"]): CapturedTokens.from_dict(entry)
                for entry in data.get("prompts") or ()
            },
            missing=data.get("missing"),
            max_model_len=data.get("max_model_len"),
            block_size=data.get("block_size"),
            prefix_caching=data.get("prefix_caching"),
            recorded_s=data.get("recorded_s"),
        )
