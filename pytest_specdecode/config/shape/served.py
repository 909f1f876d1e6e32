"""A shape as the run serves it: the depth, the server's command and environment, and what is
real, random, cut and changed.

`ServedShape.argv(command)` (`words`: the same, keeping a unit file's raw words) is the target's
own server command with its model replaced by the folder that holds the shape's config.json
(`folder`), the weights drawn at random (`--load-format dummy`), the target's own tokenizer
(`--tokenizer`, so that prompts tokenize as in production), the served model name kept, and
`--hf-overrides` with the cut (merged with any the command had). `env` is what the server's
environment gains: for a MoE, its routing drawn uniformly (a container's command passes it with
-e and mounts the folder's parent).
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import ConfigError
from ..vllm_argv import option_value, parse_server_command
from .geometry import Shape
from .memory import DepthFit

LOAD_FORMAT = "dummy"
HF_OVERRIDES = "--hf-overrides"
MOE_ROUTING_ENV = "VLLM_MOE_ROUTING_SIMULATION_STRATEGY"
MOE_ROUTING = "uniform_random"
CONFIG_NAME = "config.json"
REPLACED = ("--load-format", HF_OVERRIDES)  # dropped from the command, then given anew


@dataclass(frozen=True)
class ServedShape:
    """The shape served with dummy weights at one depth, and how."""

    shape: Shape
    layers: int  # the depth served (`fit.depths`' largest where several were chosen)
    overrides: Mapping[str, Any]  # --hf-overrides as served: the command's, then the shape's
    env: Mapping[str, str]  # what the server's environment gains
    tokenizer: str  # the target's own tokenizer (or model), as its command names it
    served_name: str  # the model name the API serves, the target's own
    folder: str  # where the run writes the shape's config.json, on the serving host
    engine: str  # the real engine, e.g. "vLLM 0.32.0 on localhost"
    fit: DepthFit | None = None  # the depth chosen for the room; None: depths asked, room unread
    changed: tuple[str, ...] = ()  # what is changed besides the cut (the vocabulary raised)
    notes: tuple[str, ...] = ()  # what could not be checked before the start
    where: str = "window"  # "window": in the original's window; "beside": beside it
    extras: Mapping[str, Any] = field(default_factory=dict)  # for what is built on the shape

    @property
    def full(self) -> int:
        return self.shape.layers

    @property
    def cut(self) -> bool:
        return self.layers < self.full

    @property
    def label(self) -> str:
        """`llama-3.1-8b (LlamaForCausalLM), 2 of 32 layers`."""
        depth = f"{self.layers} of {self.full} layers"
        return f"{self.shape.source} ({self.shape.architecture}), {depth}"

    def model_label(self, model: str) -> str:
        """The run record's model: the served name with the shape, so that a shape's runs are
        never read as the model's own (stored runs, host profiles, a reused baseline)."""
        return f"{model} [shape {self.label}]"

    @property
    def routing(self) -> str | None:
        """The MoE routing strategy the server is given; None for a dense shape."""
        return self.env.get(MOE_ROUTING_ENV)

    def at_depth(self, layers: int) -> ServedShape:
        """The same shape served at another depth (the map's per-depth fit)."""
        overrides = {**self.overrides, "num_hidden_layers": layers}
        return _replace(self, layers=layers, overrides=overrides)

    # -- the server ----------------------------------------------------------------------------
    def argv(
        self, command: Sequence[str], *, where: str, images: Sequence[str] | None = None
    ) -> list[str]:
        """The target's server command, serving this shape (see the module's docstring)."""
        words = self.words(command, where=where, images=images)
        return [command[w] if isinstance(w, int) else w for w in words]

    def words(
        self, command: Sequence[str], *, where: str, images: Sequence[str] | None = None
    ) -> list[int | str]:
        """`argv`'s words, each the index of the command's own word kept as it is, or a new
        one (`shape_words`: a unit's drop-in keeps the unit's raw words)."""
        return shape_words(
            command,
            folder=self.folder,
            tokenizer=self.tokenizer,
            served_name=self.served_name,
            overrides=self.overrides,
            where=where,
            images=images,
            env=self.env,
        )

    def config_text(self) -> str:
        """The config.json the run writes into `folder`: the shape's, verbatim."""
        return json.dumps(dict(self.shape.config), indent=2, sort_keys=True) + "\n"

    # -- what is real, random, cut and changed -------------------------------------------------
    def real(self) -> str:
        dtype = self.shape.quantization or self.shape.dtype
        return (
            f"the engine: {self.engine}, with its own kernels for {self.shape.architecture} "
            f"in {dtype}; the hardware: {self.fit.room.where if self.fit else 'as the target'}; "
            f"the shape: {self.shape.describe()} ({self.shape.origin}); the tokenizer "
            f"{self.tokenizer}, the prompts, the load and the server's other flags"
        )

    def random(self) -> str:
        text = (
            "the weights (--load-format dummy): what the model generates is noise, so its "
            "acceptance is not the model's: only the step's cost is"
        )
        if self.routing:
            text += (
                f"; the routing ({MOE_ROUTING_ENV}={self.routing}): each token's "
                f"{self.shape.experts_per_token} experts drawn uniformly from "
                f"{self.shape.routed_experts}, the balanced load a trained router aims at"
            )
        return text

    def cut_text(self) -> str:
        if not self.cut:
            return f"nothing: all {self.full} layers are served"
        kept = ""
        if self.shape.first_dense:
            kept = (
                f" ({self.shape.first_dense} dense, {self.layers - self.shape.first_dense} MoE; "
                "first_k_dense_replace kept)"
            )
        fit = f"; {self.fit.describe(self.shape, self.layers)}" if self.fit else ""
        return (
            f"the layers: {self.full} → {self.layers}{kept} (--hf-overrides num_hidden_layers "
            f"{self.layers}){fit}"
        )

    def statement(self) -> list[str]:
        """The plan's and the report's lines: real, random, cut, and changed where anything is."""
        lines = [f"real: {self.real()}", f"random: {self.random()}", f"cut: {self.cut_text()}"]
        lines += [f"changed: {c}" for c in self.changed]
        return lines + [f"note: {n}" for n in self.notes]

    # -- results.json --------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.to_dict(),
            "layers": self.layers,
            "full": self.full,
            "overrides": dict(self.overrides),
            "env": dict(self.env),
            "tokenizer": self.tokenizer,
            "served_name": self.served_name,
            "folder": self.folder,
            "engine": self.engine,
            "fit": self.fit.to_dict() if self.fit else None,
            "changed": list(self.changed),
            "notes": list(self.notes),
            "where": self.where,
            "extras": dict(self.extras),
            "statement": self.statement(),  # for readers; recomputed
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServedShape:
        return cls(
            shape=Shape.from_dict(data["shape"]),
            layers=int(data["layers"]),
            overrides=dict(data.get("overrides") or {}),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            tokenizer=str(data["tokenizer"]),
            served_name=str(data["served_name"]),
            folder=str(data["folder"]),
            engine=str(data.get("engine") or ""),
            fit=DepthFit.from_dict(data["fit"]) if data.get("fit") else None,
            changed=tuple(map(str, data.get("changed") or ())),
            notes=tuple(map(str, data.get("notes") or ())),
            where=str(data.get("where") or "window"),
            extras=dict(data.get("extras") or {}),
        )


def _replace(served: ServedShape, **changes: Any) -> ServedShape:
    return dataclasses.replace(served, **changes)


def command_overrides(command: Sequence[str], *, where: str) -> dict[str, Any]:
    """The `--hf-overrides` JSON object the command already has, or {}."""
    text = option_value(command, HF_OVERRIDES)
    if text is None:
        return {}
    try:
        found = json.loads(text)
    except json.JSONDecodeError:
        found = None
    if not isinstance(found, dict):
        raise ConfigError(
            f"{where}: {HF_OVERRIDES} {text!r} is not a JSON object, so the shape's cut cannot "
            "be merged with it. Nothing was touched"
        )
    return found


def shape_words(
    command: Sequence[str],
    *,
    folder: str,
    tokenizer: str,
    served_name: str,
    overrides: Mapping[str, Any],
    where: str,
    images: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[int | str]:
    """`command` serving the config.json in `folder` with dummy weights, each word either the
    index of the command's own word, kept as it is (a unit file keeps its raw text), or a new
    one: `vllm serve MODEL` or `--model MODEL` replaced by the folder; --tokenizer and
    --served-model-name added where the command has none; --load-format and --hf-overrides
    replaced. A container's command (`docker run … IMAGE …`) also mounts the folder's parent
    (the run's: the shape's folder and what is built beside it) read-only at the same path and
    passes `env` (the MoE routing) with -e, before the image."""
    server = parse_server_command(command, where=where, images=images)
    start = server.server_args
    out: list[int | str] = list(range(start))
    if server.image_at is not None:
        given = [w for k, v in sorted((env or {}).items()) for w in ("-e", f"{k}={v}")]
        run = posixpath.dirname(folder.rstrip("/")) or folder  # the map's drafters beside it
        out[server.image_at : server.image_at] = ["-v", f"{run}:{run}:ro", *given]
    rest: list[int | str] = list(range(start, len(command)))
    named = _model_at(command, rest)
    if named is not None:
        at, split = named
        rest[at : at + 1] = ["--model", folder] if split else [folder]
    elif rest and not command[start].startswith("-"):
        rest[0] = folder  # `vllm serve MODEL`
    else:
        raise ConfigError(
            f"{where}: the server command names no model (`vllm serve MODEL` or --model), so "
            "the shape cannot take its place. Nothing was touched"
        )
    for flag in REPLACED:
        rest = _without(command, rest, flag)
    values = [command[w] if isinstance(w, int) else w for w in rest]
    if option_value(values, "--tokenizer") is None:
        rest += ["--tokenizer", tokenizer]
    if option_value(values, "--served-model-name") is None:
        rest += ["--served-model-name", served_name]
    rest += ["--load-format", LOAD_FORMAT, HF_OVERRIDES, json.dumps(dict(overrides))]
    return out + rest


def _model_at(command: Sequence[str], rest: list[int | str]) -> tuple[int, bool] | None:
    """Where `--model`'s value is among the server's words (the last one wins), and whether it
    is one `--model=X` word (split in two when replaced)."""
    found = None
    for at, w in enumerate(rest):
        word = command[w] if isinstance(w, int) else w
        if word == "--model" and at + 1 < len(rest):
            found = (at + 1, False)
        elif word.startswith("--model="):
            found = (at, True)
    return found


def _without(command: Sequence[str], words: list[int | str], flag: str) -> list[int | str]:
    out, i = [], 0
    while i < len(words):
        w = words[i]
        word = command[w] if isinstance(w, int) else w
        if word == flag:
            i += 2
            continue
        if not word.startswith(flag + "="):
            out.append(w)
        i += 1
    return out
