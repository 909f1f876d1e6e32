"""From a shape and what the serving host told, to the shape as served, or a refusal.

Pure: the shape's config.json, the target's server command and environment, the serving
vLLM's facts and the room are read before (targets/facts/shape_site.py); this decides. Refused
(ShapeRefused, naming where and saying that nothing was touched):
- an architecture the serving vLLM's model registry lacks;
- MoE routing left unbalanced: the serving vLLM lacks VLLM_MOE_ROUTING_SIMULATION_STRATEGY's
  uniform_random (or could not be asked), or the target's environment sets another strategy;
- a shape that cannot fit even cut (memory.py → `fit_depths`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ...errors import ShapeRefused
from ..specconfig import VllmFacts
from ..vllm_argv import option_value, parse_server_command
from .geometry import Shape
from .memory import Room, fit_depths
from .served import (
    MOE_ROUTING,
    MOE_ROUTING_ENV,
    ServedShape,
    command_overrides,
)
from .table import ShapeConfig

NOTHING = "Nothing was touched"
DEFAULT_MAX_MODEL_LEN = 4096  # where neither the command nor the config.json says


def serve_shape(
    shape: Shape,
    asked: ShapeConfig,
    *,
    command: Sequence[str],
    env: Mapping[str, str],
    served_name: str,
    facts: VllmFacts,
    room: Room | None,
    folder: str,
    where: str,
    tokenizer_vocab: int | None = None,
    images: Sequence[str] | None = None,
) -> ServedShape:
    """The shape served at the depth that fits (or the depths asked) on `where`'s vLLM."""
    notes = check_architecture(shape, facts, where=where) + remote_code(shape)
    routing = check_routing(shape, facts, env, where=where)
    max_model_len = max_model_len_of(command, shape)
    fit = None
    if room is not None:
        try:
            fit = fit_depths(
                shape,
                asked.layers,
                room,
                max_model_len=max_model_len,
                dtype_bytes=dtype_bytes(command, shape),
                kv_dtype_bytes=kv_dtype_bytes(command, shape),
            )
        except ShapeRefused as exc:
            raise ShapeRefused(f"{where}: {exc}. {NOTHING}") from None
        depth = fit.depths[-1]
    elif asked.layers is None:
        raise ShapeRefused(
            f"{where}: the room for the shape {shape.source} could not be read, so no depth can "
            "be chosen for it: give [shape] layers (or --spec-shape-layers). " + NOTHING
        )
    else:
        depth = asked.layers[-1]
        if depth > shape.layers or asked.layers[0] < shape.min_depth:
            raise ShapeRefused(
                f"{where}: the shape {shape.source}'s depths run from {shape.min_depth} to "
                f"{shape.layers}, not {asked.layers_text}. {NOTHING}"
            )
        notes += ("the room could not be read: the depths asked are served unchecked",)
    overrides = {**command_overrides(command, where=where), "num_hidden_layers": depth}
    changed: tuple[str, ...] = ()
    if tokenizer_vocab is not None and tokenizer_vocab > shape.vocab:
        overrides["vocab_size"] = tokenizer_vocab
        changed = (
            f"the vocabulary: {shape.vocab} → {tokenizer_vocab}, the tokenizer's (--hf-overrides "
            "vocab_size), so that every prompt token has an embedding",
        )
    return ServedShape(
        shape=shape,
        layers=depth,
        overrides=overrides,
        env={MOE_ROUTING_ENV: routing} if routing else {},
        tokenizer=option_value(command, "--tokenizer") or command_model(command, where, images),
        served_name=served_name,
        folder=folder,
        engine=facts.describe(),
        fit=fit,
        changed=changed,
        notes=notes,
    )


def check_architecture(shape: Shape, facts: VllmFacts, *, where: str) -> tuple[str, ...]:
    """Refuse an architecture the serving vLLM lacks; a note where it could not tell."""
    if facts.architectures is None:
        why = facts.shape_note or facts.note or "it did not list them"
        return (
            f"not checked whether {facts.describe()} serves {shape.architecture} ({why}): its "
            "start will tell",
        )
    if shape.architecture not in facts.architectures:
        near = sorted(a for a in facts.architectures if a[:5] == shape.architecture[:5])[:6]
        raise ShapeRefused(
            f"{where}: {facts.describe()} has no {shape.architecture} in its model registry "
            f"({len(facts.architectures)} architectures"
            + (f"; near it: {', '.join(near)}" if near else "")
            + f"), so the shape {shape.source} cannot be served there. {NOTHING}"
        )
    return ()


def remote_code(shape: Shape) -> tuple[str, ...]:
    """A note where the config.json names remote code: the shape's folder holds it alone."""
    found = shape.config.get("auto_map")
    if not isinstance(found, dict) or not found:
        return ()
    modules = sorted({str(v).split(".", 1)[0] + ".py" for v in found.values() if "." in str(v)})
    return (
        f"its config.json names remote code (auto_map: {', '.join(modules)}), which the "
        "shape's folder does not hold: a server run with --trust-remote-code may fail to "
        "read it; a named shape or a file: source without auto_map avoids that",
    )


def check_routing(
    shape: Shape, facts: VllmFacts, env: Mapping[str, str], *, where: str
) -> str | None:
    """The routing strategy a MoE shape is served with (uniform_random); None for a dense one.
    Refused where it would be left unbalanced (random gates route unevenly)."""
    if not shape.is_moe:
        return None
    set_to = env.get(MOE_ROUTING_ENV)
    if set_to is not None and set_to.lower() != MOE_ROUTING:
        raise ShapeRefused(
            f"{where}: the target's environment sets {MOE_ROUTING_ENV}={set_to}: the shape "
            f"{shape.source}'s experts would be routed by it, not uniformly. Remove it (the "
            f"run sets {MOE_ROUTING}). {NOTHING}"
        )
    known = facts.moe_routing
    if known is None or MOE_ROUTING not in known:
        why = (
            f"could not be asked ({facts.shape_note or facts.note or 'no answer'})"
            if known is None
            else f"lacks {MOE_ROUTING_ENV}"
            if not known
            else f"knows only {', '.join(known)}"
        )
        raise ShapeRefused(
            f"{where}: the shape {shape.source} is a MoE ({shape.routed_experts} experts), and "
            f"{facts.describe()} {why}: with random weights its gates would route unevenly, "
            f"and the step's cost with them. A vLLM with {MOE_ROUTING_ENV}={MOE_ROUTING} is "
            f"needed. {NOTHING}"
        )
    return MOE_ROUTING


def command_model(command: Sequence[str], where: str, images: Sequence[str] | None) -> str:
    """The model the command loads: `--model X` or `vllm serve X` (its tokenizer, unless it
    names one)."""
    start = parse_server_command(command, where=where, images=images).server_args
    args = list(command[start:])
    named = option_value(args, "--model")
    if named is not None:
        return named
    if args and not args[0].startswith("-"):
        return args[0]
    raise ShapeRefused(f"{where}: the server command names no model. {NOTHING}")


def max_model_len_of(command: Sequence[str], shape: Shape) -> int:
    """The server's max_model_len: --max-model-len (`32768`, `32k`, `32K`), else the config's."""
    text = (option_value(command, "--max-model-len") or "").strip()
    factor = {"k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}.get(text[-1:], 1)
    digits = text[:-1] if factor > 1 else text
    if digits.isdigit():
        return int(digits) * factor
    return shape.max_position or DEFAULT_MAX_MODEL_LEN


def dtype_bytes(command: Sequence[str], shape: Shape) -> int:
    """2, or 4 where the command's --dtype (or, for auto, the config) says float32."""
    said = (option_value(command, "--dtype") or "auto").lower()
    if said == "auto":
        said = shape.dtype.lower().removeprefix("torch.")
    return 4 if said in ("float32", "float") else 2


def kv_dtype_bytes(command: Sequence[str], shape: Shape) -> int:
    said = (option_value(command, "--kv-cache-dtype") or "auto").lower()
    return 1 if said.startswith("fp8") else dtype_bytes(command, shape)
