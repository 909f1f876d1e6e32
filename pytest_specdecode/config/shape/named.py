"""Named shapes: a few canonical geometries, as their published config.json states them.

transformers is not a dependency of this plugin, so each geometry is kept here as the small dict
its Hugging Face config.json holds (the keys transformers' config class reads; tokenizer ids and
remote-code maps left out), with where it comes from. tests/unit/config/test_shape_named.py
loads each into transformers' own config class where transformers is importable (the embedded
server's venv has it) and checks the figures against the class's reading of them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from ...errors import ConfigError
from .geometry import Shape

_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "rope_type": "llama3"}

# meta-llama/Llama-3.1-8B config.json; transformers LlamaConfig (whose defaults are Llama-2-7B's)
LLAMA_3_1_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        **_LLAMA3_ROPE,
    },
    "attention_bias": False,
    "mlp_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}

# meta-llama/Llama-3.2-1B config.json: a draft_model for a Llama-3 target (same vocabulary)
LLAMA_3_2_1B: dict[str, Any] = {
    **LLAMA_3_1_8B,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "rope_scaling": {
        "factor": 32.0,
        "original_max_position_embeddings": 8192,
        **_LLAMA3_ROPE,
    },
    "tie_word_embeddings": True,
}

# deepseek-ai/DeepSeek-V3 config.json (FP8 blocks of 128x128); transformers DeepseekV3Config,
# whose defaults hold the same geometry (but max_position_embeddings 4096 and no quantization)
DEEPSEEK_V3: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "hidden_act": "silu",
    "max_position_embeddings": 163840,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000,
    "rope_scaling": {
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "attention_bias": False,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
    "quantization_config": {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    },
}

# moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's architecture (DeepseekV3ForCausalLM)
# with 384 routed experts in one group, 64 heads, one dense layer and a vocabulary of 163840.
# Its model_type `kimi_k2` names remote code; `deepseek_v3` here lets transformers' own
# DeepseekV3Config read it, as vLLM reads the checkpoint
KIMI_K2: dict[str, Any] = {
    **DEEPSEEK_V3,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 384,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
    "num_nextn_predict_layers": 0,
    "max_position_embeddings": 131072,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 32.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 1.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
    "vocab_size": 163840,
}

NAMED: Mapping[str, tuple[str, Mapping[str, Any]]] = MappingProxyType(
    {
        "llama-3.1-8b": ("meta-llama/Llama-3.1-8B's config.json (LlamaConfig)", LLAMA_3_1_8B),
        "llama-3.2-1b": ("meta-llama/Llama-3.2-1B's config.json (LlamaConfig)", LLAMA_3_2_1B),
        "deepseek-v3": (
            "deepseek-ai/DeepSeek-V3's config.json (DeepseekV3Config)",
            DEEPSEEK_V3,
        ),
        "kimi-k2": (
            "moonshotai/Kimi-K2-Instruct's config.json, read as DeepseekV3Config",
            KIMI_K2,
        ),
    }
)


def named_shape(name: str) -> Shape:
    """The named geometry as a Shape; a ConfigError listing the names for any other."""
    found = NAMED.get(name.lower())
    if found is None:
        raise ConfigError(
            f"no named shape {name!r}: known are {', '.join(NAMED)}; or give `unit` (the "
            "served model's own config.json) or `file:PATH` (a config.json on this machine)"
        )
    origin, config = found
    name = name.lower()
    return Shape(name, f"the named shape {name}: {origin}", copy.deepcopy(dict(config)))
