"""The shape target: the target's own server command serving a shape with dummy weights.

`shaped_target` opens the configured backend on the shape's server command
(config/shape/served.py → `ServedShape.argv`) and environment, and wraps it: `ShapedTarget` is
that target in every respect (its original is the shape server, its candidates the shape with
`--speculative-config`, side by side where the host has room), and it writes the shape's
config.json into the run's own folder before the first server starts. The restore is the
backend's own: the local backend's original was not running before the run (it starts it), so
the shape server takes its place in the run's window and nothing of the real model is started
or stopped.

On a systemd unit the unit's own target serves the shape (systemd/shape.py → `serve_shape`):
its drop-in serves the shape's baseline and candidates in the unit's window, one at a time, the
config.json in a folder of the run's on the host; the original, stopped for the window, is put
back as it was found, and the folder removed (by the watchdog's restore.sh too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config.shape.resolve import serve_shape
from ..config.shape.served import CONFIG_NAME, ServedShape
from ..config.shape.table import ShapeConfig
from ..config.specconfig import SpecConfig, VllmFacts
from ..config.target import TargetConfig
from ..files import write_atomically
from .base import Progress, Target
from .beside.placement import GPU_SHARE, gpu_share_of
from .facts.model_config import ModelSite
from .facts.shape_site import read_room, read_shape

OpenTarget = Callable[..., Target]
SHAPE_FOLDER = "shape"  # in the run's folder: the shape's config.json


def resolve_shape(
    target: Target,
    config: TargetConfig,
    asked: ShapeConfig,
    facts: VllmFacts,
    *,
    folder: Path,
    beside: int = 0,
    progress: Progress | None = None,
) -> ServedShape:
    """Before anything is touched: the shape read where it is, the room read on the serving
    host (each server's part, where `beside` servers may serve beside the baseline), the depth
    chosen, and the refusals (config/shape/resolve.py). Reads only."""
    say = progress or (lambda _line: None)
    if config.backend != "local":
        beside = 0  # a unit serves the shape one server at a time (systemd/shape.py)
    site: ModelSite | None = getattr(target, "model_site", lambda: None)()
    argv, env = served_command(target, config)
    shape, vocab = read_shape(asked, site)
    say(f"shape: {shape.describe()} ({shape.origin})")
    room = read_room(target.host, argv, env)
    if room is not None and beside:
        servers = beside + 1
        room = room.shared(
            servers,
            share=gpu_share_of(
                GPU_SHARE, servers, min(room.totals_mib) if room.totals_mib else None
            ),
            beside=f"each of {servers} servers side by side gets its part (--spec-arms "
            "one-at-a-time gives one server all of it)",
        )
    say(f"shape: the room on {target.host_name}: " + (room.where if room else "not read"))
    where = site.where if site is not None else f"the server on {target.host_name}"
    place = getattr(target, "shape_place", None)  # a unit's: a folder of the run's on its host
    served = serve_shape(
        shape,
        asked,
        command=argv,
        env=env,
        served_name=config.model,
        facts=facts,
        room=room,
        folder=place(folder) if place is not None else str(folder),
        where=where,
        tokenizer_vocab=vocab,
        images=config.vllm_images or None,
    )
    return served


def served_command(target: Target, config: TargetConfig) -> tuple[list[str], dict[str, str]]:
    """The target's server command and environment: the local command, or the unit's
    ExecStart as systemd expands it."""
    if config.backend == "local":
        return list(config.command), dict(config.env)
    found = target.command()  # type: ignore[attr-defined]
    return list(found.argv), dict(found.env.values)


def shaped_target(
    config: TargetConfig,
    served: ServedShape,
    *,
    open_target: OpenTarget,
    log_dir: Path,
    progress: Progress | None = None,
) -> ShapedTarget:
    """The configured backend, serving `served`: the local command and environment changed,
    or a unit's own drop-ins (its folder then on the unit's host)."""
    if config.backend != "local":
        inner = open_target(config, log_dir=log_dir, progress=progress)
        return ShapedTarget(inner, inner.serve_shape(served), writes=False)  # type: ignore[attr-defined]
    argv = served.argv(config.command, where=f"{config.workdir}: [target] command")
    shaped = dataclasses.replace(
        config, command=tuple(argv), env={**dict(config.env), **dict(served.env)}
    )
    return ShapedTarget(open_target(shaped, log_dir=log_dir, progress=progress), served)


class ShapedTarget:
    """A target whose servers serve the shape: the wrapped backend's, with the shape's
    config.json written before the first start (`writes`: here; else the backend writes it on
    its host, a unit's). Everything else is the backend's own."""

    def __init__(self, inner: Target, served: ServedShape, *, writes: bool = True) -> None:
        self.inner = inner
        self.served = served
        self.folder = Path(served.folder)
        self.writes = writes
        self._written = not writes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write_config(self) -> Path:
        """The shape's config.json in its folder (the run's own): written once, before the
        first server starts."""
        path = self.folder / CONFIG_NAME
        if not self._written:
            write_atomically(path, self.served.config_text())
            # what is built on the shape: the map's drafters' config.json (run/map_on_shape.py)
            for where, text in dict(self.served.extras.get("files") or {}).items():
                write_atomically(Path(where), str(text))
            self._written = True
        return path

    def before_swap(self) -> None:
        self.write_config()
        self.inner.before_swap()

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        if not self.writes:
            return self.inner.plan(specs)
        return [
            f"write the shape's config.json into {self.folder} (the run's own folder): "
            f"{self.served.shape.describe()}",
            *self.inner.plan(specs),
        ]
