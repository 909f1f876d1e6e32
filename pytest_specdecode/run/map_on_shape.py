"""The break-even map on a shape target, once the shape is resolved: its carrier and drafters
chosen on the shape, its depths, and the drafters' folders the run writes.

With `--spec-break-even` and a shape (config/shape/), the map's servers are chosen again on the
served shape (config/break_even.py → `map_carriers`): the shape serves random weights, so an
EAGLE-3 head of its shape (`auto`, where vLLM has EAGLE-3 for the architecture) or a draft
model of a named smaller shape needs only its config.json, written beside the shape's
(`<run folder>/map-drafters/…`, by the shape target before the first start: `ServedShape.extras`
`files`). Where the shape is cut, the original and every map server are served again at the
map's other depths (`map_depths`, `depth_arms`), so that analysis/map/shape.py can carry the
map to the full depth. Pure over the settings and the served shape: nothing is touched here.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.drafters.carrier import carrier_head_config, draft_model_config
from ..config.break_even import (
    DRAFT_MODEL,
    Carrier,
    TargetShape,
    depth_arms,
    is_map_arm,
    map_candidates,
    map_carriers,
    map_depths,
)
from ..config.settings import Settings
from ..config.shape.named import named_shape
from ..config.shape.served import CONFIG_NAME, ServedShape
from ..config.specconfig import SpecConfig
from ..report.plan import plain_seconds
from ..report.schedule import Timing
from ..report.sections.shape_map import plan_lines

MAP_DRAFTERS = "map-drafters"  # beside the shape's folder, in the run's own
FILES = "files"  # ServedShape.extras: path -> text, written with the shape's config.json
MAP = "map"  # ServedShape.extras: the map's depths and carriers, for the plan and the record


def with_map_on_shape(settings: Settings, served: ServedShape) -> tuple[Settings, ServedShape]:
    """The settings with the map's servers chosen on the shape and served at its depths, and
    the shape with the drafters' files to write; both unchanged without --spec-break-even."""
    run = settings.run
    if not run.break_even:
        return settings, served
    asked = served.fit.depths if served.fit is not None else ()
    depths = map_depths(served.layers, served.full, served.shape.min_depth, asked)
    folder = posixpath.join(posixpath.dirname(served.folder.rstrip("/")), MAP_DRAFTERS)
    shape = TargetShape(served.shape.config, min(depths), dummy=True, folder=folder)
    own = [c for c in settings.candidates if not is_map_arm(c.name, c.values)]
    carriers = map_carriers(
        run.break_even_carrier, run.break_even_drafters, own, shape, head=run.break_even_head
    )
    servers = map_candidates(run.break_even, own, run.break_even_points, carriers)
    others = [d for d in depths if d != served.layers]
    overrides = {d: served.at_depth(d).overrides for d in others}
    arms = depth_arms(servers, others, overrides)
    files = drafter_files(carriers, served, depth=min(depths))
    extras = {
        **served.extras,
        FILES: {**dict(served.extras.get(FILES) or {}), **files},
        MAP: {
            "depths": list(depths),
            "served": served.layers,
            "carriers": [{"label": c.label, "model": c.model, "why": c.why} for c in carriers],
            "servers": [c.name for c in (*servers, *arms)],
        },
    }
    candidates: tuple[SpecConfig, ...] = (*own, *servers, *arms)
    return (
        dataclasses.replace(settings, candidates=candidates),
        dataclasses.replace(served, extras=extras),
    )


def drafter_files(
    carriers: Sequence[Carrier], served: ServedShape, *, depth: int
) -> dict[str, str]:
    """The config.json of each drafter the run makes: an EAGLE-3 head of the shape (its aux
    ids within the shallowest depth served, so one head serves every depth), a named smaller
    shape's draft model with the shape's vocabulary. A ConfigError for an unknown name."""
    out = {}
    target = as_served(served)
    for carrier in carriers:
        if carrier.make is None or carrier.model is None:
            continue
        if carrier.make == "eagle3":
            config = carrier_head_config(target, depth=depth)
        else:
            name = carrier.make[len(DRAFT_MODEL) :]
            config = draft_model_config(named_shape(name).config, target)
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        out[posixpath.join(carrier.model, CONFIG_NAME)] = text
    return out


def as_served(served: ServedShape) -> dict[str, Any]:
    """The shape's config.json with the vocabulary it is served with (raised to the tokenizer's
    where it was smaller: `--hf-overrides vocab_size`), which a drafter must share."""
    config = dict(served.shape.config)
    vocab = served.overrides.get("vocab_size")
    if isinstance(vocab, int):
        config["vocab_size"] = vocab
        if isinstance(config.get("text_config"), Mapping):
            config["text_config"] = {**config["text_config"], "vocab_size": vocab}
    return config


def map_plan(
    settings: Settings, served: ServedShape | None, timing: Timing | None = None
) -> list[str]:
    """The plan's lines for the map on the shape (report/sections/shape_map.py), with the map's
    own share of the time where the pace is known: the original and the map's servers alone,
    as the plan's schedule counts them (report/plan.py → `plain_seconds`)."""
    if served is None or not settings.run.break_even:
        return []
    found = dict(served.extras.get(MAP) or {})
    seconds = None
    if timing is not None and timing.s_per_token is not None:
        alone = [c for c in settings.candidates if is_map_arm(c.name, c.values)]
        trial = dataclasses.replace(settings, candidates=tuple(alone))
        seconds, _ = plain_seconds(trial, timing, baseline=True, aba=False, adopts_original=False)
    return plan_lines(
        settings, found, served.full, seconds=seconds, pace=timing.source if timing else ""
    )
