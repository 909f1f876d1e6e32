"""The `--speculative-config` value: parsed, checked against vLLM's methods and keys, rendered."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError

# Mirrors vllm.config.speculative (vLLM 0.32): the methods and user-settable keys.
NGRAM_METHODS = frozenset({"ngram", "ngram_gpu"})
MODEL_FREE_METHODS = NGRAM_METHODS | {"suffix"}
DRAFT_METHODS = frozenset(
    {
        "eagle",
        "eagle3",
        "draft_model",
        "medusa",
        "mlp_speculator",
        "dflash",
        "dspark",
        "extract_hidden_states",
        "custom_class",
    }
)
MTP_METHODS = frozenset(
    {
        "mtp",
        "deepseek_mtp",
        "dots3_note_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "glm4_moe_mtp",
        "glm4_moe_lite_mtp",
        "glm_ocr_mtp",
        "ernie_mtp",
        "nemotron_h_mtp",
        "exaone_moe_mtp",
        "exaone4_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "bailing_hybrid_v3_mtp",
        "minimax_m3_mtp",
        "bailing_hybrid_mtp",
        "kimi_k3_mtp",
        "pangu_ultra_moe_mtp",
        "step3p5_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "gemma4_mtp",
        "inkling_mtp",
        "glm5_next_mtp",
    }
)
KNOWN_METHODS = MODEL_FREE_METHODS | DRAFT_METHODS | MTP_METHODS

_INT_KEYS = {
    "num_speculative_tokens",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "max_model_len",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "dspark_draft_topk",
}
_FLOAT_KEYS = {
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "synthetic_acceptance_length",
}
_BOOL_KEYS = {
    "enforce_eager",
    "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch",
    "disable_eagle_block_drop",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "parallel_drafting",
    "enable_adaptive_verification",
}
_STR_KEYS = {
    "method",
    "model",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "revision",
    "code_revision",
    "rejection_sample_method",
    "draft_sample_method",
}
_LIST_KEYS = {"synthetic_acceptance_rates", "num_speculative_tokens_per_batch_size"}
KNOWN_KEYS = _INT_KEYS | _FLOAT_KEYS | _BOOL_KEYS | _STR_KEYS | _LIST_KEYS

# Model names and paths: letters, digits and a few separators; nothing a shell would read.
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_./:@+=,-]{1,512}$")


AA_NAME = "baseline"  # --spec-config baseline: the original's own configuration, again
AA_ARM = "baseline-again"  # the name of that candidate


@dataclass(frozen=True)
class SpecConfig:
    """One speculation hypothesis: a name and the exact JSON vLLM receives.

    The A/A candidate (`--spec-config baseline`) has no values: it is the original's own
    configuration started again, to measure what a restart alone changes.
    """

    name: str
    values: Mapping[str, Any]

    @property
    def is_original(self) -> bool:
        return not self.values

    @property
    def method(self) -> str:
        return str(self.values["method"]) if self.values else "none (the original, again)"

    def to_json(self) -> str:
        """Compact JSON, keys sorted, as passed to `--speculative-config`."""
        return json.dumps(dict(self.values), separators=(",", ":"), sort_keys=True)


def parse_spec_config(text: str, presets: Mapping[str, Mapping[str, Any]]) -> SpecConfig:
    """Resolve `text` (a preset name or inline JSON) into a validated SpecConfig."""
    stripped = text.strip()
    if stripped == AA_NAME:
        return SpecConfig(name=AA_ARM, values={})
    if stripped.startswith("{"):
        try:
            values = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"--spec-config is not valid JSON ({exc.msg} at column {exc.colno}): {text!r}"
            ) from None
        if not isinstance(values, dict):
            raise ConfigError(f"--spec-config JSON must be an object, got: {text!r}")
        name = _derive_name(values)
    else:
        if stripped not in presets:
            known = ", ".join(sorted(presets)) or "none"
            raise ConfigError(
                f"--spec-config {text!r} is neither inline JSON nor a preset; "
                f"known presets: {known}"
            )
        name, values = stripped, dict(presets[stripped])
    return SpecConfig(name=name, values=validate_spec_values(values, source=name))


def validate_spec_values(values: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """Check one speculative config against vLLM's rules; returns a plain dict copy."""
    where = f"speculative config {source!r}"
    unknown = sorted(set(values) - KNOWN_KEYS)
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"vLLM's keys are: {', '.join(sorted(KNOWN_KEYS))}"
        )
    for key, value in values.items():
        _check_type(where, key, value)
    method = values.get("method")
    if method is None:
        known = ", ".join(sorted(KNOWN_METHODS))
        raise ConfigError(f"{where}: 'method' is required (one of {known})")
    if method not in KNOWN_METHODS:
        raise ConfigError(
            f"{where}: unknown method {method!r}; known: {', '.join(sorted(KNOWN_METHODS))}"
        )
    k = values.get("num_speculative_tokens")
    if k is None:
        raise ConfigError(f"{where}: 'num_speculative_tokens' is required (an integer > 0)")
    if k <= 0:
        raise ConfigError(f"{where}: num_speculative_tokens must be > 0, got {k}")
    if method in NGRAM_METHODS:
        lo, hi = values.get("prompt_lookup_min"), values.get("prompt_lookup_max")
        for key, v in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if v is not None and v < 1:
                raise ConfigError(f"{where}: {key} must be >= 1, got {v}")
        if lo is not None and hi is not None and lo > hi:
            raise ConfigError(f"{where}: prompt_lookup_min={lo} must be <= prompt_lookup_max={hi}")
    if method in DRAFT_METHODS and not values.get("model"):
        raise ConfigError(
            f"{where}: method {method!r} needs a draft 'model' (a model name or path)"
        )
    return dict(values)


def _check_type(where: str, key: str, value: Any) -> None:
    if key in _INT_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if key in _FLOAT_KEYS and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if key in _BOOL_KEYS and not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    if key in _LIST_KEYS and not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list, got {value!r}")
    if key in _STR_KEYS and not (isinstance(value, str) and _SAFE_STRING.match(value)):
        raise ConfigError(
            f"{where}: {key} must be a plain name or path (letters, digits, '_./:@+=,-'), "
            f"got {value!r}"
        )


def _derive_name(values: Mapping[str, Any]) -> str:
    method = str(values.get("method", "custom"))
    k = values.get("num_speculative_tokens")
    name = f"{method}-k{k}" if isinstance(k, int) else method
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
