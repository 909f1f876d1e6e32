"""`--spec-break-even`: the map's servers, each a synthetic-acceptance config.

vLLM's `rejection_sample_method: "synthetic"` accepts the drafter's proposals at a stated
accepted per draft L (vLLM's mean acceptance length, 1 + accepted tokens / drafting steps),
whatever the target model says. One server per (k, L) then measures what a step of k drafts
costs on this engine, hardware and load: no drafter has to be good for it.

The drafter that proposes on the map's servers is its carrier (`[run] break_even_carrier`):
n-gram proposes only where its lookup matches (on random weights, where they happen to repeat),
so its points lie at the tokens per step counted; an EAGLE-3 head of the target's shape always
proposes k (`auto` takes it where vLLM has EAGLE-3 for the target's architecture and the head
can be had). `[run] break_even_drafters` adds the drafters whose pay-off the run should tell
(an EAGLE-3 head, a draft model of a named smaller shape), each with its own servers.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .specconfig import NGRAM_METHODS, SpecConfig
from .target import TargetConfig
from .vllm_argv import option_value, parse_server_command, served_model

__all__ = [
    "CARRIERS",
    "EAGLE3_TARGETS",
    "MAP_PREFIX",
    "Carrier",
    "carrier_of",
    "depth_arms",
    "depth_of_arm",
    "is_map_arm",
    "map_candidates",
    "map_depths",
    "map_ks",
    "map_lengths",
    "map_spec",
    "point_of",
]

MAP_PREFIX = "map-"
DEPTH_ARM = re.compile(r"^map-d(\d+)-")  # a map arm served at another depth: map-d4-k3-L1
DEPTH_BASELINE = "baseline"  # map-d4-baseline: the original's configuration at depth 4
OTHER_K = {1: 3, 2: 4, 3: 5}  # the candidate's k and one other: 2 further, down where k > 3
CARRIERS = ("auto", "ngram", "eagle3")  # [run] break_even_carrier
DRAFT_MODEL = "draft_model:"  # [run] break_even_drafters: "draft_model:NAME" (a named shape)

# vLLM 0.26.0's target architectures with EAGLE-3: their model class implements SupportsEagle3
# (model_executor/models/*.py, through subclasses, against the registry). Another vLLM may have
# more or fewer: `break_even_carrier = "eagle3"` asks for it anyway, and the server says.
EAGLE3_TARGETS = frozenset(
    {
        "AfmoeForCausalLM", "ApertusForCausalLM", "ArceeForCausalLM", "CwmForCausalLM",
        "DeepseekForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM",
        "DeepseekV3ForCausalLM", "Ernie4_5ForCausalLM", "Gemma4ForCausalLM",
        "Gemma4ForConditionalGeneration", "GlmForCausalLM", "GlmMoeDsaForCausalLM",
        "GptOssForCausalLM", "HunYuanDenseV1ForCausalLM", "HunYuanMoEV1ForCausalLM",
        "InternLM3ForCausalLM", "KimiK25ForConditionalGeneration", "LLaMAForCausalLM",
        "LagunaForCausalLM", "Llama4ForCausalLM", "Llama4ForConditionalGeneration",
        "LlamaForCausalLM", "MiMoForCausalLM", "MiMoV2FlashForCausalLM", "MiniCPM3ForCausalLM",
        "MiniCPMForCausalLM", "MiniMaxM2ForCausalLM", "Ministral3ForCausalLM",
        "MistralForCausalLM", "MistralLarge3ForCausalLM", "NemotronHForCausalLM",
        "Phi3ForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM",
        "Qwen3NextForCausalLM", "Qwen3VLForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration", "Step1ForCausalLM",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Carrier:
    """What drafts on a set of the map's servers.

    `method`: ngram (or ngram_gpu), eagle3 or draft_model; `model`: the drafter's folder where
    it loads one (on the serving host); `tag`: "" for the map's own carrier, else the part of
    its servers' names that tells them apart (`map-eagle3-k3-L4`); `make`: what the run writes
    into `model` before its first start ("eagle3": a head of the target's shape, "draft_model:
    NAME": that shape's config), None where the folder is the user's; `why`: how it was chosen.
    """

    method: str
    model: str | None = None
    tag: str = ""
    lookup_max: int | None = None
    make: str | None = None
    why: str = ""

    @property
    def label(self) -> str:
        """How the reports name it: `ngram`, `eagle3`, `draft_model:llama-3.2-1b`."""
        return carrier_label(self.method, self.model, self.make)


def carrier_label(method: str, model: Any, make: str | None = None) -> str:
    if make and make.startswith(DRAFT_MODEL):
        return make
    if method == "draft_model":
        name = posixpath.basename(str(model or "").rstrip("/")) or "?"
        return f"{DRAFT_MODEL}{name}"
    return method


def carrier_of(spec: Mapping[str, Any]) -> str:
    """The carrier's label of a map server's config (`ngram`, `eagle3`, `draft_model:NAME`)."""
    return carrier_label(str(spec.get("method", "?")), spec.get("model"))


def map_spec(carrier: Carrier, k: int, length: float) -> dict[str, Any]:
    """One map server's `--speculative-config`: the carrier at k, its drafts accepted at mean
    length `length`. n-gram proposes wherever any earlier token matches (prompt_lookup_min 1);
    a drafter with a model proposes k at every step."""
    spec: dict[str, Any] = {"method": carrier.method, "num_speculative_tokens": k}
    if carrier.method in NGRAM_METHODS:
        spec["prompt_lookup_min"] = 1
        spec["prompt_lookup_max"] = max(1, carrier.lookup_max or k)
    else:
        spec["model"] = carrier.model
    spec["rejection_sample_method"] = "synthetic"
    spec["synthetic_acceptance_length"] = round(float(length), 3)
    return spec


def point_of(spec: Mapping[str, Any]) -> tuple[int, float] | None:
    """(k, asked accepted per draft) of a map server's config; None for any other config."""
    if spec.get("rejection_sample_method") != "synthetic":
        return None
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return None
    length = spec.get("synthetic_acceptance_length")
    rates = spec.get("synthetic_acceptance_rates")
    if isinstance(length, int | float) and not isinstance(length, bool):
        return k, float(length)
    if isinstance(rates, list) and all(isinstance(r, int | float) for r in rates):
        return k, 1.0 + float(sum(rates))
    return None


def depth_of_arm(name: str) -> int | None:
    """The depth a map arm was served at where it is not the run's own (`map-d4-...`)."""
    found = DEPTH_ARM.match(name)
    return int(found.group(1)) if found else None


def is_map_arm(name: str, spec: Mapping[str, Any]) -> bool:
    """A server of the map (synthetic acceptance), or the original at another depth for it:
    it measures the engine, never a hypothesis, and never gates the run."""
    return point_of(spec) is not None or depth_of_arm(name) is not None


def map_depths(served: int, full: int, least: int, asked: Sequence[int] = ()) -> tuple[int, ...]:
    """The depths the map is measured at: the one served where it is the full depth (nothing to
    carry); else those asked (two or more), else the one served and about half of it (no less
    than `least`, the shape's shallowest cut, nor 2: an EAGLE-3 head reads three states)."""
    if served >= full:
        return (full,)
    if len(set(asked)) >= 2:
        return tuple(sorted(set(asked)))
    half = max(least, 2, (served + 1) // 2)
    return tuple(sorted({half, served}))


def depth_arms(
    servers: Sequence[SpecConfig], depths: Sequence[int], overrides: Mapping[int, Mapping[str, Any]]
) -> tuple[SpecConfig, ...]:
    """The original and each map server again at each of `depths` (`map-d4-baseline`,
    `map-d4-k3-L1`, ...), served with that depth's `--hf-overrides` (given last, it is the one
    vLLM takes)."""
    out = []
    for depth in depths:
        args = ("--hf-overrides", json.dumps(dict(overrides[depth]), sort_keys=True))
        out.append(SpecConfig(f"{MAP_PREFIX}d{depth}-{DEPTH_BASELINE}", {}, extra_args=args))
        for spec in servers:
            name = f"{MAP_PREFIX}d{depth}-{spec.name[len(MAP_PREFIX) :]}"
            out.append(SpecConfig(name, spec.values, extra_args=args))
    return tuple(out)


def map_ks(text: str, candidates: Sequence[SpecConfig]) -> tuple[int, ...]:
    """The k the map measures: `auto` (the first n-gram candidate's k and one other; 3 and 5
    without one), or a list such as `3,5`."""
    if text.strip() == "auto":
        k = next(
            (c.values.get("num_speculative_tokens") for c in candidates if _drafts(c.values)),
            None,
        )
        if not isinstance(k, int):
            return (3, 5)
        other = OTHER_K.get(k, k - 2)
        return tuple(sorted({k, other}))
    found: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 16:
            raise ConfigError(
                f"--spec-break-even {text!r}: give 'auto' or the k to map, e.g. 3,5 (each "
                "from 1 to 16)"
            )
        found.append(int(part))
    return tuple(sorted(set(found)))


def map_lengths(k: int, points: int) -> tuple[float, ...]:
    """`points` accepted per draft from 1 (nothing accepted) to k + 1 (everything), evenly."""
    if points < 2:
        raise ConfigError(f"[run] break_even_points must be 2 or more (a line), got {points}")
    return tuple(round(1.0 + k * i / (points - 1), 3) for i in range(points))


def ngram_carrier(candidates: Sequence[SpecConfig], why: str = "") -> Carrier:
    """n-gram as the carrier: the first model-free candidate's method and prompt_lookup_max,
    else n-gram's own."""
    first = next((c.values for c in candidates if _drafts(c.values)), None)
    lookup = first.get("prompt_lookup_max") if first else None
    return Carrier(
        method=str(first["method"]) if first else "ngram",
        lookup_max=lookup if isinstance(lookup, int) else None,
        why=why,
    )


def map_candidates(
    text: str,
    candidates: Sequence[SpecConfig],
    points: int,
    carriers: Sequence[Carrier] = (),
) -> tuple[SpecConfig, ...]:
    """The map's servers as candidates, named `map-k3-L1`, `map-k3-L4`, ... for the first
    carrier (default: n-gram, `ngram_carrier`), `map-<tag>-k3-L1`, ... for each further one."""
    out = []
    for carrier in carriers or (ngram_carrier(candidates),):
        tag = f"{carrier.tag}-" if carrier.tag else ""
        for k in map_ks(text, candidates):
            for length in map_lengths(k, points):
                name = f"{MAP_PREFIX}{tag}k{k}-L{length:g}".replace(".", "p")
                out.append(SpecConfig(name=name, values=map_spec(carrier, k, length)))
    return tuple(out)


def _drafts(values: Mapping[str, Any]) -> bool:
    return values.get("method") in NGRAM_METHODS and point_of(values) is None


# --- the carrier, chosen ------------------------------------------------------------------------


@dataclass(frozen=True)
class TargetShape:
    """What the map's carrier needs of the target, as read here before anything starts:
    its config.json (None where it cannot be read here), the depth served, random weights."""

    config: Mapping[str, Any] | None
    layers: int | None  # served: --hf-overrides' num_hidden_layers, else the config's
    dummy: bool  # --load-format dummy: a drafter it loads inherits it (random weights too)
    folder: str | None  # where the run makes drafters on the serving host; None: it cannot

    @property
    def architectures(self) -> list[str]:
        found = (self.config or {}).get("architectures")
        return [str(a) for a in found] if isinstance(found, list) else []


def target_shape(target: TargetConfig) -> TargetShape:
    """The target as the map's carrier sees it before the plan: a local server's model folder
    is read on this machine (its config.json), its depth and load format from its command.
    The run makes a drafter's folder only for a shape target (run/map_on_shape.py chooses the
    carrier again once the shape is resolved); here a head must be named ([run]
    break_even_head)."""
    if target.backend != "local" or not target.command:
        return TargetShape(config=None, layers=None, dummy=False, folder=None)
    argv = list(target.command)
    dummy = option_value(argv, "--load-format") == "dummy"
    config = None
    try:
        model = served_model(argv, parse_server_command(argv, where="[target] command"))
    except ConfigError:
        model = None
    if model:
        path = Path(model).expanduser()
        path = path if path.is_absolute() else target.workdir / path
        try:
            found = json.loads((path / "config.json").read_text())
            config = found if isinstance(found, dict) else None
        except (OSError, ValueError):
            config = None
    return TargetShape(config, served_layers(argv, config), dummy, folder=None)


def served_layers(argv: Sequence[str], config: Mapping[str, Any] | None) -> int | None:
    """The depth a server command serves: `--hf-overrides`' num_hidden_layers (its
    text_config's too), else the config's own."""
    text = option_value(argv, "--hf-overrides")
    try:
        overrides = json.loads(text) if text else {}
    except ValueError:
        overrides = {}
    tables = [t for t in (overrides, config) if isinstance(t, Mapping)]
    for table in [*tables, *(t.get("text_config") for t in tables)]:
        if isinstance(table, Mapping) and isinstance(table.get("num_hidden_layers"), int):
            return int(table["num_hidden_layers"])
    return None


def eagle3_unavailable(shape: TargetShape, head: str = "") -> str | None:
    """Why no EAGLE-3 head can carry the map on this target; None where one can."""
    if shape.config is None:
        return "the target's config.json cannot be read here"
    archs = shape.architectures
    if not any(a in EAGLE3_TARGETS for a in archs):
        return f"vLLM 0.26 has no EAGLE-3 for the target's architecture {archs or '(unnamed)'}"
    if shape.layers is not None and shape.layers < 2:
        return f"an EAGLE-3 head reads three hidden states: {shape.layers} layer served"
    if head:
        return None
    if not shape.dummy:
        return (
            "the target serves its own weights, so a head loads weights too: make one with "
            "`specdecode-drafter eagle3` and name it in [run] break_even_head"
        )
    if shape.folder is None:
        return (
            "the run makes a drafter's folder for a shape target only (--spec-shape): name a "
            "head in [run] break_even_head"
        )
    return None


def map_carriers(
    setting: str,
    drafters: Sequence[str],
    candidates: Sequence[SpecConfig],
    shape: TargetShape,
    *,
    head: str = "",
) -> tuple[Carrier, ...]:
    """The map's carrier (`[run] break_even_carrier`: auto, ngram, eagle3) and each further
    drafter of `[run] break_even_drafters` (eagle3, draft_model:NAME), in that order; a
    ConfigError, nothing touched, where one asked for cannot be had."""
    check_carrier_keys(setting, drafters)
    why_not = eagle3_unavailable(shape, head)
    if setting == "eagle3" and why_not:
        raise ConfigError(f"[run] break_even_carrier = 'eagle3': {why_not}; nothing was touched")
    if setting == "ngram" or why_not:
        why = "asked for" if setting == "ngram" else f"auto: {why_not}"
        out = [ngram_carrier(candidates, f"{why}; it drafts only where its lookup matches")]
    else:
        why = "auto: " if setting == "auto" else ""
        why += "vLLM has EAGLE-3 for the target, and a head of its shape drafts k every step"
        out = [_eagle3(shape, head, tag="", why=why)]
    for entry in drafters:
        if entry == "eagle3":
            if why_not:
                raise ConfigError(f"[run] break_even_drafters 'eagle3': {why_not}")
            if out[0].method != "eagle3":
                out.append(_eagle3(shape, head, tag="eagle3", why="asked for its pay-off"))
        else:
            out.append(_draft_model(shape, entry[len(DRAFT_MODEL) :]))
    return tuple(out)


def check_carrier_keys(setting: str, drafters: Sequence[str]) -> None:
    """`[run] break_even_carrier` and `break_even_drafters` as written; a ConfigError else."""
    if setting not in CARRIERS:
        raise ConfigError(
            f"[run] break_even_carrier must be one of {', '.join(CARRIERS)}, got {setting!r}"
        )
    for entry in drafters:
        named = isinstance(entry, str) and entry.startswith(DRAFT_MODEL)
        if entry != "eagle3" and not (named and _slug(entry[len(DRAFT_MODEL) :])):
            raise ConfigError(
                f"[run] break_even_drafters: {entry!r} is neither 'eagle3' nor "
                "'draft_model:NAME' (a named shape, e.g. draft_model:llama-3.2-1b)"
            )


def _eagle3(shape: TargetShape, head: str, *, tag: str, why: str) -> Carrier:
    if head:
        return Carrier("eagle3", head, tag, why=f"{why} (the head in {head})")
    folder = f"{shape.folder}/eagle3-d{shape.layers}"
    return Carrier("eagle3", folder, tag, make="eagle3", why=why)


def _draft_model(shape: TargetShape, name: str) -> Carrier:
    if not shape.dummy or shape.folder is None:
        raise ConfigError(
            f"[run] break_even_drafters 'draft_model:{name}': a draft model of a named shape is "
            "served with random weights, which it inherits from a target served with "
            "--load-format dummy on this machine; this target is not"
        )
    folder = f"{shape.folder}/draft-{_slug(name)}"
    return Carrier(
        "draft_model", folder, f"dm-{_slug(name).replace('.', 'p')}", make=f"{DRAFT_MODEL}{name}",
        why=f"asked for its pay-off: {name}'s shape, random weights",
    )  # fmt: skip


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "-" for c in name.lower()).strip("-.")
