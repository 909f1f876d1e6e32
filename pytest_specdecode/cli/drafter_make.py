"""A drafter of the intended shape, before one exists: an EAGLE-3 head with random weights from a
Llama-architecture target's config, or a draft model cut from the target's first layers.

What vLLM 0.32 loads for an EAGLE-3 Llama head (`model_executor/models/llama_eagle3.py`):
`Eagle3LlamaForCausalLM.load_weights` prefixes every name but `lm_head` with `model.`, renames
`d2t` to `draft_id_to_target_id`, skips `t2d`; `LlamaModel.hf_to_vllm_mapper` maps `midlayer.`
to `layers.0.` and stacks q/k/v and gate/up. Its one decoder layer takes 2 x hidden (the
embeddings beside the fc's output) into q, k and v, and has a `hidden_norm`; `fc` takes
`target_hidden_size` x the aux states (`num_aux_hidden_states`, else `eagle_config`'s ids,
else 3); `lm_head` predicts over `draft_vocab_size`. Without `embed_tokens` in the head, the
proposer shares the target's. A draft model is a plain checkpoint of the target's architecture.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.drafters.carrier import LLAMA_KEYS
from ..analysis.drafters.check import AUX_KEY, default_aux_ids, text_config
from ..errors import ConfigError
from ..record.safetensors_io import SafetensorsFile, TensorOut, bf16_bytes, chunked

EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
# What a server reads beside the weights: copied where the target has them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "generation_config.json",
)
# The target's keys an EAGLE-3 head keeps as they are: the carrier's (analysis/drafters/
# carrier.py), with the rope's in either transformers' form and the biases.
HEAD_KEYS = (*LLAMA_KEYS, "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias")
INIT_STD = 0.02
CHUNK = 1 << 22  # float32 values drawn at once: 16 MiB


@dataclass(frozen=True)
class Made:
    """What a command wrote: the config, the tensors' names and shapes, the size on disk."""

    config: dict[str, Any]
    tensors: dict[str, tuple[int, ...]]
    size_bytes: int


def read_target(target: Path) -> dict[str, Any]:
    """The target's config.json, refused where it is not a Llama-like decoder."""
    path = target / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"the target {target} has no readable config.json ({exc})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"the target {target}: config.json is not an object")
    return config


def _layers(config: Mapping[str, Any], target: Path) -> int:
    layers = config.get("num_hidden_layers")
    if not isinstance(layers, int) or layers < 1:
        raise ConfigError(f"the target {target}: num_hidden_layers is {layers!r}, not a count")
    return layers


# --- an EAGLE-3 head ---------------------------------------------------------------------------


def eagle3_config(
    target: Mapping[str, Any],
    *,
    aux_layers: Sequence[int] | None = None,
    draft_vocab: int | None = None,
    where: Path = Path("."),
) -> dict[str, Any]:
    """An EAGLE-3 head's config.json for a Llama-architecture target: its sizes, one layer, the
    aux ids (default: vLLM's own guess, 2, L // 2, L - 3), the draft vocabulary."""
    t = text_config(target)
    archs = target.get("architectures") or []
    if t.get("model_type") != "llama" and not any("Llama" in str(a) for a in archs):
        raise ConfigError(
            f"the target {where} is {t.get('model_type')!r} ({archs}): an EAGLE-3 head is made "
            "here for a Llama-architecture target only (vLLM's Eagle3LlamaForCausalLM)"
        )
    layers = _layers(t, where)
    ids = list(aux_layers) if aux_layers is not None else list(default_aux_ids(layers))
    vocab = int(t["vocab_size"])
    config = {k: t[k] for k in HEAD_KEYS if k in t}
    config.update(
        architectures=[EAGLE3_ARCHITECTURE],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        target_hidden_size=t["hidden_size"],
        draft_vocab_size=draft_vocab or vocab,
        num_aux_hidden_states=len(ids),
        eagle_config={AUX_KEY: ids, "use_aux_hidden_state": True},
        **{AUX_KEY: ids},
    )
    config["dtype" if "dtype" in t else "torch_dtype"] = "bfloat16"
    return config


def eagle3_shapes(config: Mapping[str, Any]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The head's tensors as vLLM's loader takes them: name -> (dtype, shape)."""
    h, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or h // heads)
    aux = int(config["num_aux_hidden_states"])
    vocab, draft = int(config["vocab_size"]), int(config["draft_vocab_size"])
    bf = "BF16"
    shapes = {
        "midlayer.input_layernorm.weight": (bf, (h,)),
        "midlayer.hidden_norm.weight": (bf, (h,)),
        "midlayer.post_attention_layernorm.weight": (bf, (h,)),
        "midlayer.self_attn.q_proj.weight": (bf, (heads * hd, 2 * h)),
        "midlayer.self_attn.k_proj.weight": (bf, (kv * hd, 2 * h)),
        "midlayer.self_attn.v_proj.weight": (bf, (kv * hd, 2 * h)),
        "midlayer.self_attn.o_proj.weight": (bf, (h, heads * hd)),
        "midlayer.mlp.gate_proj.weight": (bf, (inter, h)),
        "midlayer.mlp.up_proj.weight": (bf, (inter, h)),
        "midlayer.mlp.down_proj.weight": (bf, (h, inter)),
        "fc.weight": (bf, (h, int(config["target_hidden_size"]) * aux)),
        "norm.weight": (bf, (h,)),
        "lm_head.weight": (bf, (draft, h)),
    }
    if draft < vocab:
        shapes["d2t"] = ("I64", (draft,))
        shapes["t2d"] = ("BOOL", (vocab,))
    return shapes


def _random_bf16(rng: np.random.Generator, count: int) -> Iterator[bytes]:
    for n in chunked(count, CHUNK):
        yield bf16_bytes(rng.normal(0.0, INIT_STD, n).astype(np.float32))


def eagle3_tensors(config: Mapping[str, Any], seed: int) -> list[TensorOut]:
    """The head's tensors with their bytes: norms at 1, matrices normal(0, 0.02), and for a
    smaller draft vocabulary a random (seeded) subset of the target's ids as `d2t`/`t2d`."""
    rng = np.random.default_rng(seed)
    vocab, draft = int(config["vocab_size"]), int(config["draft_vocab_size"])
    kept = np.sort(rng.choice(vocab, size=draft, replace=False)) if draft < vocab else None
    out = []
    for name, (dtype, shape) in eagle3_shapes(config).items():
        count = int(np.prod(shape))
        if name == "d2t" and kept is not None:
            d2t = (kept - np.arange(draft)).astype("<i8").tobytes()
            out.append(TensorOut(name, dtype, shape, lambda b=d2t: [b]))
        elif name == "t2d" and kept is not None:
            mask = np.zeros(vocab, dtype=np.uint8)
            mask[kept] = 1
            t2d = mask.tobytes()
            out.append(TensorOut(name, dtype, shape, lambda b=t2d: [b]))
        elif name.endswith("norm.weight"):
            ones = bf16_bytes(np.ones(count, dtype=np.float32))
            out.append(TensorOut(name, dtype, shape, lambda b=ones: [b]))
        else:
            # drawn as it is written, in the file's order, a chunk at a time: the same seed gives
            # the same head, and a large vocabulary's lm_head is never whole in memory
            out.append(TensorOut(name, dtype, shape, lambda n=count: _random_bf16(rng, n)))
    return out


# --- a draft model cut from the target -----------------------------------------------------------

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def cut_config(
    target: Mapping[str, Any], layers: int, *, where: Path = Path(".")
) -> dict[str, Any]:
    """The target's config with its first `layers` layers."""
    if "text_config" in target and "num_hidden_layers" not in target:
        raise ConfigError(f"the target {where} is multimodal (text_config): not cut here")
    total = _layers(target, where)
    if not 1 <= layers < total:
        raise ConfigError(
            f"--layers {layers} against the target {where}'s {total} layers: a cut keeps "
            f"1..{total - 1} of them"
        )
    config = dict(target)
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    return config


def target_weights(target: Path) -> dict[str, SafetensorsFile]:
    """Each tensor of the target's checkpoint and the file that holds it (one or shards)."""
    single = target / WEIGHTS
    if single.exists():
        f = SafetensorsFile.open(single)
        return dict.fromkeys(f.entries, f)
    index = target / INDEX
    if not index.exists():
        raise ConfigError(f"the target {target} has neither {WEIGHTS} nor {INDEX}")
    weight_map = json.loads(index.read_text()).get("weight_map", {})
    files = {name: SafetensorsFile.open(target / name) for name in set(weight_map.values())}
    return {tensor: files[name] for tensor, name in weight_map.items()}


def cut_tensors(weights: Mapping[str, SafetensorsFile], layers: int) -> list[TensorOut]:
    """The tensors of the first `layers` layers and all outside the layers, bytes as they are."""
    out = []
    for name in sorted(weights):
        found = _LAYER.search(name)
        if found and int(found.group(1)) >= layers:
            continue
        entry = weights[name].entries[name]
        out.append(
            TensorOut(name, entry.dtype, entry.shape, lambda f=weights[name], n=name: [f.read(n)])
        )
    if not any(_LAYER.search(t.name) for t in out):
        raise ConfigError("the target's weights have no `layers.N.` tensors: nothing to cut")
    return out


def copy_tokenizer(target: Path, out: Path) -> list[str]:
    """The tokenizer's files (and generation_config.json) that the target has."""
    copied = []
    for name in TOKENIZER_FILES:
        if (target / name).is_file():
            shutil.copy2(target / name, out / name)
            copied.append(name)
    return copied
