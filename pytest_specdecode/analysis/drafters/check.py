"""The drafter check: a drafter's config.json against the target's, before anything restarts.

Pure: two dicts in, refusals and warnings out, each a sentence naming the key, both values and
what vLLM would do. What vLLM 0.32 does with each key (paths under the installed `vllm/`):

- the architecture: `transformers_utils/configs/eagle.py` (EAGLEConfig) renames a head's
  architecture for the method (eagle3: `X` -> `Eagle3X` unless it starts or ends with Eagle3;
  eagle: `X` -> `EagleX`); `model_executor/models/registry.py` (`_SPECULATIVE_DECODING_MODELS`)
  must then know the name, or the server does not start.
- the vocabulary: `draft_model` must have the target's `vocab_size`, or
  `config/speculative.py` → `verify_equal_vocab_size_if_draft_model` raises (after the original
  was stopped). An EAGLE-3 head embeds the target's tokens (`vocab_size`) and may predict over a
  smaller `draft_vocab_size` (absent: `vocab_size`), mapped back through `d2t` in its weights
  (`model_executor/models/llama_eagle3.py` → `Eagle3LlamaForCausalLM`); without `d2t` the map
  stays zeros and every draft id is taken as the target's id of the same number.
- the head's input (`fc`): `llama_eagle3.py` → `LlamaModel` builds
  `fc` with `target_hidden_size` (absent: the head's `hidden_size`) x `num_aux_hidden_states`
  inputs; that count, when absent, is the length of `eagle_config.eagle_aux_hidden_state_layer_ids`
  or 3 (the top-level key is not counted there). Where the head's model.safetensors is read, its
  `fc.weight` gives the input it really takes, and the presence of `d2t`.
- the aux layer ids: `v1/worker/gpu_model_runner.py` → `_get_eagle3_aux_layers_from_config`
  reads `eagle_aux_hidden_state_layer_ids`, then `eagle_config`'s; missing, the target's
  `get_eagle3_default_aux_hidden_state_layers` (`model_executor/models/interfaces.py`) guesses
  (2, L // 2, L - 3). An id i is the hidden state after the target's layer i - 1, 0 the
  embeddings (`model_executor/models/llama.py` → `_maybe_add_hidden_state`): 0..L are valid; an
  id outside is never captured. Neither is checked by vLLM: a head without the key served healthy
  at 1.21% acceptance (vllm#50170); ids off by one took position-0 acceptance from 45% to 10%
  (vllm#43671); SGLang counts them differently (sglang#25454).
- the maximum positions: for eagle/eagle3 `config/speculative.py` →
  `_maybe_override_draft_max_position_embeddings` raises a smaller value to the target's
  max_model_len (#48894), but a head trained on fewer positions accepts little past them
  (SpecForge#271); for draft_model, `_maybe_override_draft_max_model_len` keeps the smaller.
- mtp: the target's own layers (`num_nextn_predict_layers`, `mtp_num_hidden_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Methods whose speculative config loads a model of its own (a `model` path, or the target's).
DRAFTER_METHODS = ("draft_model", "eagle", "eagle3", "mtp")

# vLLM 0.32's registry (model_executor/models/registry.py, _SPECULATIVE_DECODING_MODELS): the
# names an EAGLE head's architecture may map to.
EAGLE3_ARCHITECTURES = frozenset(
    {
        "Eagle3LlamaForCausalLM",
        "Eagle3MiniMaxM2ForCausalLM",
        "LlamaForCausalLMEagle3",
        "Eagle3Qwen2_5vlForCausalLM",
        "Eagle3Qwen3vlForCausalLM",
        "Eagle3Qwen3ForCausalLM",
        "Eagle3DeepseekV2ForCausalLM",
        "Eagle3DeepseekV3ForCausalLM",
    }
)
EAGLE_ARCHITECTURES = frozenset(
    {
        "EagleCohereForCausalLM",
        "EagleLlamaForCausalLM",
        "EagleLlama4ForCausalLM",
        "EagleMiniCPMForCausalLM",
        "EagleMistralForCausalLM",
        "EagleMistralLarge3ForCausalLM",
        "EagleDeepSeekMTPModel",
    }
)
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


def drafter_kind(method: str) -> str | None:
    """The check that applies: `mtp` for every model's own MTP name (`deepseek_mtp`, …, which
    vLLM serves as mtp); None for a method without a model (n-gram, suffix)."""
    if method == "mtp" or method.endswith("_mtp"):
        return "mtp"
    return method if method in DRAFTER_METHODS else None


AUX_KEY = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class DrafterCheck:
    """What the check found for one candidate's drafter."""

    candidate: str
    method: str
    path: str
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refusals

    def error_text(self) -> str:
        """The refusal as one message: the candidate, the drafter, each mismatch."""
        return (
            f"candidate {self.candidate}: the drafter {self.path} ({self.method}) does not fit "
            "the target, refused before anything was touched: " + "; ".join(self.refusals)
        )


@dataclass(frozen=True)
class Drafter:
    """One candidate's drafter: what the check found, and the line that names it."""

    check: DrafterCheck
    description: str


def text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """A multimodal config's language part (`text_config`); else the config itself."""
    inner = config.get("text_config")
    if isinstance(inner, Mapping) and "num_hidden_layers" not in config:
        return inner
    return config


def _int(config: Mapping[str, Any], key: str) -> int | None:
    value = config.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _architectures(config: Mapping[str, Any]) -> list[str]:
    found = config.get("architectures")
    return [str(a) for a in found] if isinstance(found, list) else []


def mapped_architectures(method: str, architectures: Sequence[str]) -> list[str]:
    """The names vLLM asks its registry for (transformers_utils/configs/eagle.py)."""
    if method == "eagle3":
        return [
            a if a.startswith("Eagle3") or a.endswith("Eagle3") else f"Eagle3{a}"
            for a in architectures
        ]
    if method == "eagle":
        return [a if a.startswith("Eagle") else f"Eagle{a}" for a in architectures]
    return list(architectures)


def aux_layer_ids(drafter: Mapping[str, Any]) -> list[int] | None:
    """The head's aux layer ids as vLLM reads them: top-level first, then `eagle_config`'s."""
    ids = drafter.get(AUX_KEY)
    if not ids:
        eagle_config = drafter.get("eagle_config")
        ids = eagle_config.get(AUX_KEY) if isinstance(eagle_config, Mapping) else None
    return [int(i) for i in ids] if isinstance(ids, list) and ids else None


def default_aux_ids(layers: int) -> tuple[int, int, int]:
    """vLLM's guess without the key (model_executor/models/interfaces.py)."""
    return (2, layers // 2, layers - 3)


def fc_aux_count(drafter: Mapping[str, Any]) -> int:
    """How many aux states the head's `fc` takes (model_executor/models/llama_eagle3.py)."""
    count = _int(drafter, "num_aux_hidden_states")
    if count is not None:
        return count
    eagle_config = drafter.get("eagle_config")
    ids = eagle_config.get(AUX_KEY) if isinstance(eagle_config, Mapping) else None
    return len(ids) if isinstance(ids, list) and ids else 3


def check_drafter(
    method: str,
    drafter: Mapping[str, Any],
    target: Mapping[str, Any],
    *,
    candidate: str = "",
    path: str = "",
    tensors: Mapping[str, Sequence[int]] | None = None,
) -> DrafterCheck:
    """Check a drafter's config.json (`drafter`) against the target's for `method`; `tensors`:
    the head's weights' names and shapes (its safetensors header), where they were read."""
    d, t = text_config(drafter), text_config(target)
    refusals: list[str] = []
    warnings: list[str] = []
    if drafter_kind(method) == "mtp":
        _check_mtp(method, d, refusals)
    elif method in ("eagle", "eagle3"):
        _check_architecture(method, d, refusals)
        _check_head_vocab(d, t, refusals, warnings, tensors)
        if method == "eagle3":
            _check_aux(d, t, refusals, warnings)
            _check_fc_weight(d, t, refusals, tensors)
        _check_positions(method, d, t, warnings)
    elif method == "draft_model":
        _check_draft_model(d, t, refusals)
        _check_positions(method, d, t, warnings)
    return DrafterCheck(candidate, method, path, tuple(refusals), tuple(warnings))


def _check_mtp(method: str, d: Mapping[str, Any], refusals: list[str]) -> None:
    counts = {k: _int(d, k) for k in MTP_KEYS}
    if not any(v for v in counts.values()):
        found = ", ".join(f"{k}={v}" for k, v in counts.items())
        refusals.append(
            f"method {method} drafts with the model's own MTP layers, and its config has none "
            f"({found}): vLLM would have no layers to draft with"
        )


def _check_architecture(method: str, d: Mapping[str, Any], refusals: list[str]) -> None:
    archs = _architectures(d)
    known = EAGLE3_ARCHITECTURES if method == "eagle3" else EAGLE_ARCHITECTURES
    mapped = mapped_architectures(method, archs)
    if not archs:
        refusals.append(
            f"architectures is missing from the drafter's config: vLLM maps it for {method}"
        )
    elif not any(a in known for a in mapped):
        refusals.append(
            f"architectures {archs} map to {mapped} for method {method}, which vLLM 0.32 does not "
            f"register (it knows {sorted(known)}): the server would not start"
        )


def _check_head_vocab(
    d: Mapping[str, Any],
    t: Mapping[str, Any],
    refusals: list[str],
    warnings: list[str],
    tensors: Mapping[str, Sequence[int]] | None,
) -> None:
    dv, tv = _int(d, "vocab_size"), _int(t, "vocab_size")
    if dv is not None and tv is not None and dv != tv:
        refusals.append(
            f"vocab_size {dv} in the drafter, {tv} in the target: the head embeds the target's "
            "tokens, so its vocabulary must be the target's"
        )
    draft = _int(d, "draft_vocab_size") or dv
    if draft is None or tv is None:
        return
    if draft > tv:
        refusals.append(
            f"draft_vocab_size {draft} in the drafter is larger than the target's vocab_size {tv}: "
            "vLLM maps draft ids into the target's vocabulary"
        )
    elif draft < tv and tensors is not None and not any(n.endswith("d2t") for n in tensors):
        refusals.append(
            f"draft_vocab_size {draft} is smaller than the target's vocab_size {tv}, and the "
            "head's weights have no `d2t` to map its draft ids to the target's: vLLM would keep "
            "a map of zeros and draft the wrong tokens (acceptance near zero)"
        )
    elif draft < tv and tensors is None:
        warnings.append(
            f"draft_vocab_size {draft} is smaller than the target's vocab_size {tv}: vLLM maps "
            "each draft id to the target's through `d2t` in the head's weights; a checkpoint "
            "without it drafts the wrong tokens (acceptance near zero), and this check reads "
            "only the config"
        )


def _check_aux(
    d: Mapping[str, Any], t: Mapping[str, Any], refusals: list[str], warnings: list[str]
) -> None:
    eagle_config = d.get("eagle_config")
    if isinstance(eagle_config, Mapping) and eagle_config.get("use_aux_hidden_state") is False:
        return  # the head takes the last hidden state only: no fc over aux states
    layers = _int(t, "num_hidden_layers")
    ids = aux_layer_ids(d)
    if ids is None:
        guess = (
            f"{list(default_aux_ids(layers))} for its {layers} layers"
            if layers
            else "(2, L // 2, L - 3)"
        )
        warnings.append(
            f"{AUX_KEY} is missing from the drafter's config: vLLM will guess the target's "
            f"default aux layers {guess}; a head trained on other layers serves healthy with "
            "acceptance near zero (vllm#50170: 1.21%)"
        )
    elif layers is not None:
        outside = [i for i in ids if not 0 <= i <= layers]
        if outside:
            refusals.append(
                f"{AUX_KEY} {ids} against the target's {layers} layers: {outside} outside "
                f"0..{layers} (id i is the hidden state after layer i - 1, 0 the embeddings): "
                "vLLM never captures those, and the head's fc gets fewer inputs than it takes"
            )
    th_key = "target_hidden_size" if "target_hidden_size" in d else "hidden_size"
    head_in, hidden = _int(d, th_key), _int(t, "hidden_size")
    count = fc_aux_count(d)
    used = len(ids) if ids is not None else 3
    if head_in is not None and hidden is not None and head_in != hidden:
        refusals.append(
            f"{th_key} {head_in} in the drafter, hidden_size {hidden} in the target: the head's fc "
            f"takes {head_in} x {count} = {head_in * count} inputs, the target gives {hidden} x "
            f"{used} = {hidden * used}"
        )
    elif count != used:
        size = hidden or head_in or 0
        refusals.append(
            f"the head's fc takes {count} aux states (num_aux_hidden_states or "
            f"eagle_config.{AUX_KEY}: {size * count} inputs), and vLLM captures {used} "
            f"({AUX_KEY} {ids}: {size * used}): the shapes do not meet"
        )


def _check_fc_weight(
    d: Mapping[str, Any],
    t: Mapping[str, Any],
    refusals: list[str],
    tensors: Mapping[str, Sequence[int]] | None,
) -> None:
    """The fc's real input, from the weights: what the config builds, and what the target gives."""
    fc = next((n for n in sorted(tensors or {}) if n.endswith("fc.weight")), None)
    if fc is None or tensors is None or len(tensors[fc]) != 2:
        return
    taken = int(tensors[fc][1])
    head_in = _int(d, "target_hidden_size") or _int(d, "hidden_size")
    built = head_in * fc_aux_count(d) if head_in else None
    hidden, ids = _int(t, "hidden_size"), aux_layer_ids(d)
    used = len(ids) if ids is not None else 3
    given = hidden * used if hidden else None
    why = []
    if built is not None and built != taken:
        why.append(f"its config builds an fc of {built} (vLLM would not load the weights)")
    if given is not None and given != taken:
        why.append(f"the target gives {given} (hidden_size {hidden} x {used} aux states)")
    if why:
        refusals.append(
            f"{fc} in the head's weights is {list(tensors[fc])}: it takes {taken} inputs; "
            + "; ".join(why)
        )


def _check_draft_model(d: Mapping[str, Any], t: Mapping[str, Any], refusals: list[str]) -> None:
    archs = _architectures(d)
    heads = [a for a in archs if a.startswith(("Eagle", "Peagle")) or a.endswith("Eagle3")]
    if heads or "eagle_config" in d or AUX_KEY in d:
        refusals.append(
            f"the drafter is an EAGLE head (architectures {archs}), not a model: serve it with "
            "method eagle3 (or eagle)"
        )
    dv, tv = _int(d, "vocab_size"), _int(t, "vocab_size")
    if dv is not None and tv is not None and dv != tv:
        refusals.append(
            f"vocab_size {dv} in the drafter, {tv} in the target: vLLM refuses a draft_model "
            "with another vocabulary (config/speculative.py), after the original was stopped"
        )


def _check_positions(
    method: str, d: Mapping[str, Any], t: Mapping[str, Any], warnings: list[str]
) -> None:
    dp, tp = _int(d, "max_position_embeddings"), _int(t, "max_position_embeddings")
    if dp is None or tp is None or dp >= tp:
        return
    if method == "draft_model":
        what = "vLLM keeps the smaller as the drafter's max_model_len"
    else:
        what = (
            "vLLM raises it to the target's max_model_len, but a head trained on fewer positions "
            "accepts little past them (SpecForge#271)"
        )
    warnings.append(f"max_position_embeddings {dp} in the drafter, {tp} in the target: {what}")


def describe_drafter(
    method: str, path: str, drafter: Mapping[str, Any], *, size_bytes: int | None = None
) -> str:
    """One line: path, architecture, layers, hidden size, vocabulary, size on disk."""
    d = text_config(drafter)
    archs = _architectures(d)
    parts = [
        f"{method} drafter {path}",
        "/".join(archs) if archs else "architecture unknown",
        _layers(d.get("num_hidden_layers")),
        f"hidden {d.get('hidden_size', '?')}",
    ]
    vocab = d.get("vocab_size", "?")
    draft = d.get("draft_vocab_size")
    parts.append(f"vocab {vocab}" + (f" (drafts over {draft})" if draft and draft != vocab else ""))
    ids = aux_layer_ids(d) if method == "eagle3" else None
    if ids is not None:
        parts.append(f"aux layers {ids}")
    if size_bytes is not None:
        parts.append(_size(size_bytes))
    return ", ".join(parts)


def _layers(n: Any) -> str:
    return "1 layer" if n == 1 else f"{n if n is not None else '?'} layers"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit} on disk"
    return f"{n} B on disk"
