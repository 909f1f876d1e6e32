"""The break-even map's drafters of the target's shape, before any is trained: their configs. Pure.

A map server accepts its drafts at a stated rate (`rejection_sample_method: "synthetic"`), so
its drafter only has to propose k tokens at every step, at the cost of a real one:

- **an EAGLE-3 head of the target's shape** (the map's carrier where the serving vLLM has
  EAGLE-3 for the target's architecture): one decoder layer of the target's width over three
  of its hidden states. For an MLA target (DeepSeek-V3, Kimi-K2.5: `kv_lora_rank`) vLLM 0.26
  has a head of MLA attention (`Eagle3DeepseekV3ForCausalLM`, `deepseek_eagle3.py`); for any
  other, the Llama head (`LlamaForCausalLMEagle3`, `llama_eagle3.py`), as trained heads for
  Qwen3 and GPT-OSS are.
- **a draft model of a named smaller shape**, e.g. Llama-3.2-1B's for Llama-3.1-8B: that
  shape's config.json, served with the target's load format.

With a target served with `--load-format dummy`, the drafter inherits it (vLLM 0.26:
`SpeculativeConfig.draft_load_config` unset → `llm_base_proposer.py` → `get_model(load_config=
None)` → the target's), so its config.json alone serves, weights random. vLLM applies a dict
`--hf-overrides` to the target only (`speculative.py`: "Dict overrides stay target-only"), so
the head's own layer count stands; its aux layer ids must be within the depth served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import ConfigError
from .check import AUX_KEY, default_aux_ids, text_config

LLAMA_HEAD = "LlamaForCausalLMEagle3"
MLA_HEAD = "Eagle3DeepseekV3ForCausalLM"
# A trained head predicts over a smaller vocabulary (EAGLE3-LLaMA3.1-Instruct-8B: 32000) mapped
# back by `d2t`; with dummy weights `d2t` stays zeros (vLLM's dummy loader leaves integer
# tensors alone), so draft id i is the target's id i, always within its vocabulary.
DRAFT_VOCAB = 32000
# The target's keys a Llama head keeps as they are.
LLAMA_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "vocab_size",
    "rope_theta",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)
# An MLA head keeps the target's attention as it is (deepseek_eagle3.py reads these).
MLA_KEYS = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "rope_scaling",
)


def carrier_aux_ids(depth: int) -> tuple[int, int, int]:
    """Three distinct hidden states within a target of `depth` layers (0: the embeddings, i: after
    layer i - 1): vLLM's own choice (2, L // 2, L - 3) where it is that, else (0, L // 2, L)."""
    if depth < 2:
        raise ConfigError(
            f"an EAGLE-3 head reads three hidden states of the target: {depth} layer(s) give "
            "fewer than three; serve at least 2 layers"
        )
    ids = default_aux_ids(depth)
    if len(set(ids)) == 3 and min(ids) >= 0 and max(ids) <= depth:
        return ids
    return (0, depth // 2, depth)


def is_mla(target: Mapping[str, Any]) -> bool:
    return isinstance(text_config(target).get("kv_lora_rank"), int)


def carrier_head_config(
    target: Mapping[str, Any], *, depth: int, draft_vocab: int | None = None
) -> dict[str, Any]:
    """An EAGLE-3 head's config.json for the target's shape served at `depth` layers: its
    width, one layer, aux ids within `depth`, a draft vocabulary of DRAFT_VOCAB (or the
    target's, where smaller). A ConfigError where the target's config lacks its sizes."""
    t = text_config(target)
    missing = [k for k in ("hidden_size", "num_attention_heads", "vocab_size") if k not in t]
    if missing:
        raise ConfigError(f"the target's config.json has no {', '.join(missing)}: no head made")
    ids = list(carrier_aux_ids(depth))
    vocab = int(t["vocab_size"])
    config: dict[str, Any] = {k: t[k] for k in LLAMA_KEYS if k in t}
    config.setdefault("intermediate_size", 4 * int(t["hidden_size"]))
    config.setdefault("num_key_value_heads", t["num_attention_heads"])
    if is_mla(target):
        config.update({k: t[k] for k in MLA_KEYS if k in t})
        config["architectures"] = [MLA_HEAD]
        # deepseek_v2: its transformers class reads MLA and the yarn rope; a draft of model_type
        # deepseek_v3 is taken for DeepSeek's MTP (speculative.py → hf_config_override)
        config["model_type"] = "deepseek_v2"
    else:
        config["architectures"] = [LLAMA_HEAD]
        config["model_type"] = "llama"
        if "head_dim" not in config:
            config["head_dim"] = int(t["hidden_size"]) // int(t["num_attention_heads"])
    config.update(
        num_hidden_layers=1,
        tie_word_embeddings=False,
        target_hidden_size=t["hidden_size"],
        draft_vocab_size=min(vocab, draft_vocab or DRAFT_VOCAB),
        num_aux_hidden_states=len(ids),
        eagle_config={AUX_KEY: ids, "use_aux_hidden_state": True},
        torch_dtype="bfloat16",
        **{AUX_KEY: ids},
    )
    return config


def draft_model_config(shape: Mapping[str, Any], target: Mapping[str, Any]) -> dict[str, Any]:
    """A named smaller shape as the target's draft model: its config with the target's
    vocabulary and special tokens (vLLM refuses a draft_model of another vocabulary); a
    ConfigError where the shape is no smaller."""
    t, s = text_config(target), dict(text_config(shape))
    for key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in t:
            s[key] = t[key]
    size = _width(s) * int(s.get("num_hidden_layers") or 0)
    if size >= _width(t) * int(t.get("num_hidden_layers") or 0):
        raise ConfigError(
            f"the draft shape ({_width(s)} wide, {s.get('num_hidden_layers')} layers) is not "
            f"smaller than the target ({_width(t)} wide, {t.get('num_hidden_layers')} layers)"
        )
    s.setdefault("torch_dtype", "bfloat16")
    return s


def _width(config: Mapping[str, Any]) -> int:
    return int(config.get("hidden_size") or 0)
