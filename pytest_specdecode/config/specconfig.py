"""The `--speculative-config` value: parsed, checked against a vLLM's methods and keys, rendered."""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .arms import AA_ARM

# Mirrors vllm.config.speculative (vLLM 0.32): the methods and user-settable keys. The offline
# fallback (OFFLINE_FACTS) where the target's own vLLM cannot be asked.
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
# vLLM's dynamic speculative decoding: [start, end, k] batch-size ranges (_check_batch_table)
BATCH_TABLE_KEY = "num_speculative_tokens_per_batch_size"
_LIST_KEYS = {"synthetic_acceptance_rates", BATCH_TABLE_KEY}
KNOWN_KEYS = _INT_KEYS | _FLOAT_KEYS | _BOOL_KEYS | _STR_KEYS | _LIST_KEYS

# Model names and paths: letters, digits and a few separators; nothing a shell would read.
_SAFE_STRING = re.compile(r"^[A-Za-z0-9_./:@+=,-]{1,512}$")
_KEY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
KINDS = ("int", "float", "bool", "str", "list", "dict", "any")


@dataclass(frozen=True)
class VllmFacts:
    """What one vLLM accepts in `--speculative-config`: its version, methods and keys.

    Asked from the target's own vLLM (targets/facts/vllm.py), or OFFLINE_FACTS: the copy of
    vLLM 0.32's lists kept in this module, the fallback where no vLLM could be asked.
    """

    version: str
    methods: frozenset[str] | None  # None: this vLLM does not enumerate them
    keys: Mapping[str, str]  # user-settable key -> kind, one of KINDS
    choices: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # str keys, if closed
    host: str | None = None  # where it was asked; None for the offline list
    interpreter: str | None = None  # the Python that answered
    seconds: float | None = None  # how long the asking took
    note: str | None = None  # why the offline list stands in, where it does
    # the levels of --per-request-spec-decode-metrics; None: this vLLM has no such option
    per_request_metrics: tuple[str, ...] | None = None
    per_request_note: str | None = None  # why it could not be told, where it could not
    synthetic_note: str | None = None  # why synthetic acceptance cannot run there (a CPU build)
    remembered: str | None = None  # the cache file of an earlier ask (targets/facts/cache.py)
    # the side changes per method, read from this vLLM's own vllm/config/vllm.py (None: not
    # told; the known rules of analysis/verdict/side_changes.py stand in): the methods with
    # which it keeps async scheduling on, those its Model Runner V2 does not support, and
    # whether it has Triton (without it, every start runs the V1 model runner)
    async_kept: frozenset[str] | None = None
    v2_unsupported: frozenset[str] | None = None
    triton: bool | None = None
    async_never: str | None = None  # why no start schedules asynchronously there (a CPU build)
    # the shape target (config/shape/): the architectures its model registry serves, and the
    # MoE routing strategies of VLLM_MOE_ROUTING_SIMULATION_STRATEGY (() where it has no such
    # variable); None: not told, with `shape_note` saying why
    architectures: frozenset[str] | None = None
    moe_routing: tuple[str, ...] | None = None
    shape_note: str | None = None

    @property
    def offline(self) -> bool:
        return self.host is None

    def describe(self) -> str:
        """`vLLM 0.32.0 on root@gpu:22 (/opt/vllm/bin/python)`, or the offline list."""
        if self.offline:
            return f"the offline list of vLLM {self.version}'s speculative methods and keys"
        return f"vLLM {self.version} on {self.host} ({self.interpreter})"

    def digest(self) -> str:
        """A short hash of the methods, keys and choices: equal lists, equal digests."""
        body = json.dumps(
            [sorted(self.methods or ()), dict(sorted(self.keys.items())), _sorted(self.choices)],
            sort_keys=True,
        )
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def record(self) -> dict[str, Any]:
        """For results.json: which vLLM validated the candidates, and what it knew."""
        return {
            "version": self.version,
            "source": "offline" if self.offline else "host",
            "host": self.host,
            "interpreter": self.interpreter,
            "seconds": self.seconds,
            "remembered": self.remembered,
            "note": self.note,
            "digest": self.digest(),
            "methods": sorted(self.methods) if self.methods is not None else None,
            "keys": dict(sorted(self.keys.items())),
            "per_request_spec_decode_metrics": (
                list(self.per_request_metrics) if self.per_request_metrics is not None else None
            ),
            "async_kept": sorted(self.async_kept) if self.async_kept is not None else None,
            "v2_unsupported": (
                sorted(self.v2_unsupported) if self.v2_unsupported is not None else None
            ),
            "triton": self.triton,
            "async_never": self.async_never,
            "architectures": len(self.architectures) if self.architectures is not None else None,
            "moe_routing": list(self.moe_routing) if self.moe_routing is not None else None,
            "shape_note": self.shape_note,
        }


def _sorted(choices: Mapping[str, tuple[str, ...]]) -> dict[str, list[str]]:
    return {k: sorted(v) for k, v in sorted(choices.items())}


def _offline_kinds() -> dict[str, str]:
    kinds = {k: "int" for k in _INT_KEYS} | {k: "float" for k in _FLOAT_KEYS}
    kinds |= {k: "bool" for k in _BOOL_KEYS} | {k: "str" for k in _STR_KEYS}
    return kinds | {k: "list" for k in _LIST_KEYS}


OFFLINE_FACTS = VllmFacts(version="0.32", methods=KNOWN_METHODS, keys=_offline_kinds())


AA_NAME = "baseline"  # --spec-config baseline: the original's own configuration, again


@dataclass(frozen=True)
class SpecConfig:
    """One speculation hypothesis: a name and the exact JSON vLLM receives.

    The A/A candidate (`--spec-config baseline`) has no values: it is the original's own
    configuration started again, to measure what a restart alone changes.
    """

    name: str
    values: Mapping[str, Any]
    # server arguments added beside --speculative-config to measure it (not a hypothesis):
    # `--per-request-spec-decode-metrics detailed` where the target's vLLM knows it
    extra_args: tuple[str, ...] = ()
    # the server's environment over the target's: a control arm's (VLLM_USE_V2_MODEL_RUNNER)
    env: Mapping[str, str] = field(default_factory=dict)
    control_of: str | None = None  # --spec-control: the candidate whose side changes it has

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
    """Resolve `text` (a preset name or inline JSON) into a SpecConfig of a safe shape.

    Whether its method and keys exist is the target's vLLM's to say: `validate_spec_values`
    with that vLLM's facts, before anything is touched.
    """
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
    return SpecConfig(name=name, values=check_spec_shape(values, source=name))


def check_spec_shape(values: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """What holds for every vLLM version: plain key names and values, the tool's own rules.

    Refuses before any host is asked: a value that is not a plain name, number, boolean or a
    list or table of those; a wrong type for a key of the offline list; a missing method or
    num_speculative_tokens. Unknown methods and keys are left to `validate_spec_values`.
    """
    where = f"speculative config {source!r}"
    for key, value in values.items():
        if not isinstance(key, str) or not _KEY_NAME.match(key):
            raise ConfigError(f"{where}: {key!r} is not a plain key name (a-z, 0-9, '_')")
        _check_plain(where, key, value)
        if key in OFFLINE_FACTS.keys:
            _check_kind(where, key, value, OFFLINE_FACTS.keys[key])
        if key == BATCH_TABLE_KEY:
            _check_batch_table(where, value)
    _check_rules(where, values, OFFLINE_FACTS, membership=False)
    return dict(values)


def validate_spec_values(
    values: Mapping[str, Any], *, source: str, facts: VllmFacts | None = None
) -> dict[str, Any]:
    """Check one speculative config against a vLLM's methods and keys; returns a dict copy.

    `facts` come from the target's own vLLM; without them, the offline list (vLLM 0.32).
    Every refusal names that vLLM: its version, and the host it was asked on.
    """
    check_spec_shape(values, source=source)
    facts = facts or OFFLINE_FACTS
    if facts.offline:
        where = f"speculative config {source!r} (offline list of vLLM {facts.version})"
    else:
        where = f"speculative config {source!r} on {facts.host} (vLLM {facts.version})"
    unknown = sorted(set(values) - set(facts.keys))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"this vLLM knows: {', '.join(sorted(facts.keys))}"
        )
    for key, value in values.items():
        _check_kind(where, key, value, facts.keys[key])
        allowed = facts.choices.get(key)
        if allowed and key != "method" and value not in allowed:
            raise ConfigError(
                f"{where}: {key}={value!r} is not one of this vLLM's: {', '.join(sorted(allowed))}"
            )
    _check_rules(where, values, facts, membership=True)
    return dict(values)


def _check_rules(
    where: str, values: Mapping[str, Any], facts: VllmFacts, *, membership: bool
) -> None:
    method = values.get("method")
    known = ", ".join(sorted(facts.methods or ()))
    if method is None:
        raise ConfigError(f"{where}: 'method' is required (one of {known})")
    if not isinstance(method, str):
        raise ConfigError(f"{where}: 'method' must be a string, got {method!r}")
    if membership and facts.methods is not None and method not in facts.methods:
        raise ConfigError(f"{where}: unknown method {method!r}; this vLLM knows: {known}")
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


def _check_batch_table(where: str, value: Any) -> None:
    """vLLM 0.32's own checks (v1/spec_decode/dynamic/utils.py), on JSON integers only.

    A non-empty list of [start, end, k]: inclusive batch-size ranges, 1 <= start <= end,
    k >= 0 (0: no drafts). In start order they must not overlap, and the first starts at 1.
    Gaps, any order and k above num_speculative_tokens are accepted, as vLLM does: it sorts the
    ranges, carries the previous k through a gap and the last past the end, and caps k at
    num_speculative_tokens.
    """
    key = BATCH_TABLE_KEY
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where}: {key} must be a non-empty list of [start, end, k] ranges")
    rows: list[tuple[int, int, str]] = []
    for i, entry in enumerate(value):
        name = f"{key} entry {i} {json.dumps(entry)}"
        if not isinstance(entry, list) or len(entry) != 3:
            raise ConfigError(f"{where}: {name} must be [start, end, k], three integers")
        if any(isinstance(x, bool) or not isinstance(x, int) for x in entry):
            raise ConfigError(f"{where}: {name}: start, end and k must be integers")
        start, end, k = entry
        if start < 1 or end < 1:
            raise ConfigError(f"{where}: {name}: batch sizes must be >= 1")
        if start > end:
            raise ConfigError(f"{where}: {name}: start {start} is above end {end}")
        if k < 0:
            raise ConfigError(f"{where}: {name}: k must be >= 0 (0: no drafts)")
        rows.append((start, end, name))
    rows.sort(key=lambda row: row[0])
    for (_, prev_end, prev), (start, _, name) in itertools.pairwise(rows):
        if start <= prev_end:
            raise ConfigError(f"{where}: {name} overlaps {prev}")
    if rows[0][0] != 1:
        raise ConfigError(
            f"{where}: {key} must cover batch size 1: its lowest range, {rows[0][2]}, "
            f"starts at {rows[0][0]}"
        )


def _check_plain(where: str, key: str, value: Any, depth: int = 0) -> None:
    """A value that could reach a unit file: plain names, numbers, booleans, lists, tables."""
    if value is None or isinstance(value, bool | int | float):
        return
    if isinstance(value, str):
        if not _SAFE_STRING.match(value):
            raise ConfigError(
                f"{where}: {key} must be a plain name or path (letters, digits, '_./:@+=,-'), "
                f"got {value!r}"
            )
        return
    if depth < 3 and isinstance(value, list):
        for item in value:
            _check_plain(where, key, item, depth + 1)
        return
    if depth < 3 and isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str) or not _SAFE_STRING.match(k):
                raise ConfigError(f"{where}: {key} has a table key that is not plain: {k!r}")
            _check_plain(where, key, item, depth + 1)
        return
    raise ConfigError(f"{where}: {key} has a value this tool does not pass on: {value!r}")


def _check_kind(where: str, key: str, value: Any, kind: str) -> None:
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{where}: {key} must be an integer, got {value!r}")
    if kind == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ConfigError(f"{where}: {key} must be a number, got {value!r}")
    if kind == "bool" and not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    if kind == "list" and not isinstance(value, list):
        raise ConfigError(f"{where}: {key} must be a list, got {value!r}")
    if kind == "dict" and not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a table, got {value!r}")
    if kind == "str" and not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a plain name or path, got {value!r}")


def _derive_name(values: Mapping[str, Any]) -> str:
    method = str(values.get("method", "custom"))
    k = values.get("num_speculative_tokens")
    name = f"{method}-k{k}" if isinstance(k, int) else method
    if BATCH_TABLE_KEY in values:
        name += "-dynamic"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)
