"""The shape target: the target's own server command serving a shape with dummy weights.

`shaped_target` opens the configured backend on the shape's server command
(config/shape/served.py → `ServedShape.argv`) and environment, and wraps it: `ShapedTarget` is
that target in every respect (its original is the shape server, its candidates the shape with
`--speculative-config`, side by side where the host has room), and it writes the shape's
config.json into the run's own folder before the first server starts. The restore is the
backend's own: the local backend's original was not running before the run (it starts it), so
the shape server takes its place in the run's window and nothing of the real model is started
or stopped.

On a systemd unit (an original adopted as it runs) the shape would have to be a drop-in on the
unit, its folder written on the host and removed by the restore: not built yet, so it is
refused here, before anything is touched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config.shape.served import CONFIG_NAME, ServedShape
from ..config.specconfig import SpecConfig
from ..config.target import TargetConfig
from ..errors import ShapeRefused
from ..files import write_atomically
from .base import Progress, Target

OpenTarget = Callable[..., Target]


def shaped_target(
    config: TargetConfig,
    served: ServedShape,
    *,
    open_target: OpenTarget,
    log_dir: Path,
    progress: Progress | None = None,
) -> ShapedTarget:
    """The configured backend, serving `served` (its command and environment changed)."""
    refuse_backend(config, served)
    argv = served.argv(config.command, where=f"{config.workdir}: [target] command")
    shaped = dataclasses.replace(
        config, command=tuple(argv), env={**dict(config.env), **dict(served.env)}
    )
    return ShapedTarget(open_target(shaped, log_dir=log_dir, progress=progress), served)


def refuse_backend(config: TargetConfig, served: ServedShape | None = None) -> None:
    """A backend the shape target cannot serve on yet: refused, nothing touched."""
    if config.backend == "local":
        return
    what = f"the shape {served.shape.source}" if served else "a shape"
    raise ShapeRefused(
        f"unit {config.unit} on {config.host}: {what} cannot be served on a systemd unit yet "
        "(its server would be a drop-in on the unit, its config.json written on the host and "
        "removed by the restore: not built). Serve it with the local backend on the same GPUs "
        "and vLLM ([target] backend = 'local' with the unit's command); the unit is left as it "
        "runs. Nothing was touched"
    )


class ShapedTarget:
    """A target whose servers serve the shape: the wrapped backend's, with the shape's
    config.json written before the first start. Everything else is the backend's own."""

    def __init__(self, inner: Target, served: ServedShape) -> None:
        self.inner = inner
        self.served = served
        self.folder = Path(served.folder)
        self._written = False

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
        return [
            f"write the shape's config.json into {self.folder} (the run's own folder): "
            f"{self.served.shape.describe()}",
            *self.inner.plan(specs),
        ]
