"""A model's shape: the architecture and dimensions its config.json states, from any source.

`Shape` keeps the config.json as read (verbatim: it is what the shape server loads) and reads
the figures the plan, the depth fit and the map need from it. A multimodal config (Kimi-K2.5's
`text_config`) is read for its language model's figures; the file itself stays whole.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError

# the keys of a routed-expert count, by family: DeepSeek-V2/V3 and Kimi; Mixtral; Qwen-MoE
EXPERT_KEYS = ("n_routed_experts", "num_local_experts", "num_experts")
REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size")


@dataclass(frozen=True)
class Shape:
    """A model's geometry: where it was read (`source`, `origin`) and its config.json."""

    source: str  # as asked: "unit", "file:PATH" or a named shape (named.py)
    origin: str  # in words: "config.json of /models/x on root@gpu:22 (unit vllm.service)"
    config: Mapping[str, Any] = field(repr=False)  # the config.json, verbatim

    def __post_init__(self) -> None:
        missing = [k for k in REQUIRED if not isinstance(self.text.get(k), int)]
        if missing or not self.architecture:
            what = ", ".join(missing + ([] if self.architecture else ["architectures"]))
            raise ConfigError(
                f"the shape {self.source} ({self.origin}) is not a model's config.json: it "
                f"lacks {what}. Nothing was touched"
            )

    # -- what it says --------------------------------------------------------------------------
    @property
    def text(self) -> Mapping[str, Any]:
        """The language model's part: `text_config` where the model nests one, else all."""
        nested = self.config.get("text_config")
        return nested if isinstance(nested, Mapping) else self.config

    @property
    def architecture(self) -> str:
        found = self.config.get("architectures")
        return str(found[0]) if isinstance(found, list) and found else ""

    @property
    def model_type(self) -> str:
        return str(self.text.get("model_type") or self.config.get("model_type") or "")

    @property
    def layers(self) -> int:
        """The full depth, as the config.json states it."""
        return int(self.text["num_hidden_layers"])

    @property
    def hidden(self) -> int:
        return int(self.text["hidden_size"])

    @property
    def vocab(self) -> int:
        return int(self.text["vocab_size"])

    @property
    def heads(self) -> int:
        return int(self.text.get("num_attention_heads") or 1)

    @property
    def kv_heads(self) -> int:
        return int(self.text.get("num_key_value_heads") or self.heads)

    @property
    def head_dim(self) -> int:
        return int(self.text.get("head_dim") or self.hidden // self.heads)

    @property
    def intermediate(self) -> int:
        """A dense layer's MLP width."""
        return int(self.text.get("intermediate_size") or 4 * self.hidden)

    @property
    def routed_experts(self) -> int:
        """Routed experts per MoE layer; 0 for a dense model."""
        return next((int(self.text[k]) for k in EXPERT_KEYS if self.text.get(k)), 0)

    @property
    def is_moe(self) -> bool:
        return self.routed_experts > 1

    @property
    def experts_per_token(self) -> int:
        return int(self.text.get("num_experts_per_tok") or 0) if self.is_moe else 0

    @property
    def shared_experts(self) -> int:
        """Experts every token passes (DeepSeek's `n_shared_experts`; Qwen's one shared)."""
        if not self.is_moe:
            return 0
        if self.text.get("n_shared_experts") is not None:
            return int(self.text["n_shared_experts"])
        return 1 if self.text.get("shared_expert_intermediate_size") else 0

    @property
    def moe_intermediate(self) -> int:
        """One expert's MLP width (Mixtral's experts use `intermediate_size`)."""
        return int(self.text.get("moe_intermediate_size") or self.intermediate)

    @property
    def shared_intermediate(self) -> int:
        """The shared experts' MLP width, all of them together."""
        width = self.text.get("shared_expert_intermediate_size")
        return int(width) if width else self.shared_experts * self.moe_intermediate

    @property
    def first_dense(self) -> int:
        """Dense layers before the first MoE layer (DeepSeek's `first_k_dense_replace`)."""
        return int(self.text.get("first_k_dense_replace") or 0) if self.is_moe else 0

    @property
    def min_depth(self) -> int:
        """The shallowest cut that keeps the architecture: past the dense layers, one MoE."""
        return self.first_dense + 1

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3, Kimi): a compressed KV cache."""
        return bool(self.text.get("kv_lora_rank"))

    @property
    def quantization(self) -> str | None:
        """The checkpoint's quantization method (`fp8`, ...), None for plain weights."""
        found = self.text.get("quantization_config") or self.config.get("quantization_config")
        return str(found.get("quant_method")) if isinstance(found, Mapping) else None

    @property
    def dtype(self) -> str:
        return str(self.text.get("torch_dtype") or self.text.get("dtype") or "bfloat16")

    @property
    def tied(self) -> bool:
        return bool(self.text.get("tie_word_embeddings", self.config.get("tie_word_embeddings")))

    @property
    def max_position(self) -> int | None:
        found = self.text.get("max_position_embeddings")
        return int(found) if isinstance(found, int) else None

    def describe(self) -> str:
        """`LlamaForCausalLM: hidden 4096, 32 layers, 32 heads (8 KV), vocab 128256`, with the
        experts and MLA for a MoE."""
        kv = f" ({self.kv_heads} KV)" if self.kv_heads < self.heads else ""
        parts = [
            f"hidden {self.hidden}",
            f"{self.layers} layers",
            f"{self.heads} heads{kv}",
            f"vocab {self.vocab}",
        ]
        if self.is_moe:
            parts.append(
                f"{self.routed_experts} routed experts, {self.experts_per_token} per token, "
                f"{self.shared_experts} shared, expert width {self.moe_intermediate}"
                + (f", first {self.first_dense} layers dense" if self.first_dense else "")
            )
        else:
            parts.append(f"MLP {self.intermediate}")
        if self.mla:
            parts.append(
                f"MLA (kv_lora {self.text.get('kv_lora_rank')}, q_lora "
                f"{self.text.get('q_lora_rank')})"
            )
        if self.quantization:
            parts.append(f"{self.quantization} weights")
        return f"{self.architecture}: " + ", ".join(parts)

    # -- results.json --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "origin": self.origin, "config": dict(self.config)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Shape:
        return cls(str(data["source"]), str(data["origin"]), dict(data["config"]))
