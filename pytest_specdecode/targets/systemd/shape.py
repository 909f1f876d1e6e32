"""The shape on a unit (config/shape/served.py): the production unit, stopped for the run's
window, serves the shape's baseline and its candidates through the run's runtime drop-in.

What it writes on the host, and where (besides target.py's lock, watchdog and drop-in):
- /run/pytest-specdecode-shape/<run>/shape/config.json: the shape's config.json, <run> the run's
  reports folder's name; beside it, the map's drafters' config.json (run/map_on_shape.py,
  `ServedShape.extras` files: map-drafters/…). Folders 0755, files 0644 (config.json, no
  secret), so that a unit with User= reads them; /run is cleared at boot. The run's folder is
  removed by the run's end (`close`) and by the watchdog's restore.sh;
- the drop-in (unitfile.py → `render_dropin` with the shape): the baseline's ExecStart is the
  unit's own command serving the shape (`ServedShape.words`: the unit's words kept as written),
  a candidate's the same plus --speculative-config; the shape's environment (a MoE's routing)
  as Environment=, or -e for a container unit, whose command also mounts the run's folder
  read-only.

The original is not the baseline: the first start of the shape's servers stops it (the watchdog
armed before), and the restore puts it back as it was found (targets/lifecycle.py, `found`:
`found_original`), active and serving, or stopped. Side by side is not served on a unit: the
shape's servers run in the original's window, one at a time (docs/shape.md says why).
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ...config.shape.served import CONFIG_NAME, ServedShape
from ...config.specconfig import SpecConfig
from ..base import Progress
from ..hosts.base import Host
from .unitfile import DROPIN_NAME, SHAPE_ROOT, render_dropin, run_folder, shape_folder
from .units import SystemdUnit


class ShapeUnit(SystemdUnit):
    """The shape's baseline: the production unit with the shape's drop-in, no speculative
    config. Its start stops whatever the unit runs first (the original, found serving)."""

    def __init__(self, target: ShapeHost) -> None:
        super().__init__(target)  # type: ignore[arg-type]
        self.configured = True  # it runs exactly when the unit is active with the drop-in
        self.shape_host = target
        self.label = (
            f"the shape's baseline: unit {self.unit} on {target.host_name} with {DROPIN_NAME}"
        )

    def start(self) -> None:
        self.shape_host.configure_shape(None)
        super().start()


class ShapeHost:
    """The shape's servers for one SystemdTarget (which sets these attributes and inherits
    this)."""

    host: Host
    host_name: str
    unit: str
    dropin: str
    run_id: str
    vllm_images: tuple[str, ...]
    progress: Progress | None
    shape: ServedShape | None
    adopts_running_original: bool
    found_active: bool  # the unit was active when the run began (the restore starts it again)
    _found: SystemdUnit | None
    _original: SystemdUnit | None
    _wrote_dropin: bool
    _wrote_shape: bool

    if TYPE_CHECKING:  # SystemdTarget's

        def write_file(
            self, path: str, content: str, mode: str = "0644", *, host: Host | None = None
        ) -> None: ...

        def remove_files(self, *paths: str, empty_dir: str | None = None) -> None: ...

        def unit_text(self) -> str: ...

        def dropin_present(self) -> bool: ...

        def remove_dropin(self) -> None: ...

        def _arm_watchdog(self) -> None: ...

        def _check_port_free(self) -> None: ...

        def _check_dropin_took_effect(self, spec: SpecConfig | None) -> None: ...

    def shape_place(self, local: Path) -> str:
        """Where the shape's config.json goes on the host, for the run whose own folder on
        this machine would have held it (`local`, reports/<run>/shape): /run/…/<run>/shape."""
        return shape_folder(local.parent.name)

    def serve_shape(self, served: ServedShape) -> ServedShape:
        """From now on the unit's servers serve `served` (its folder on the host: `shape_place`);
        before the preflight, so that restore.sh removes the run's folder too."""
        run_folder(served.folder)  # checked: one run's folder under SHAPE_ROOT
        for path in self._shape_files(served):
            run_folder(path)
        self.shape = served
        self.adopts_running_original = False  # the baseline is the shape's, started by the run
        self._original = None
        return served

    def found_original(self) -> SystemdUnit:
        """The unit as the run found it, what the restore puts back (the baseline is the
        shape's, served in its place)."""
        if self._found is None:
            self._found = SystemdUnit(self)  # type: ignore[arg-type]
        return self._found

    def configure_shape(self, spec: SpecConfig | None) -> str:
        """The unit stopped (the original found serving, or what a restore cut short left), the
        shape's folder written, and the drop-in of the shape's baseline (spec None) or
        candidate written and checked; says what was done."""
        assert self.shape is not None
        self._arm_watchdog()
        found = self.found_original()
        if found.show().get("ActiveState") not in ("inactive", "failed"):
            if self.progress is not None:
                self.progress(f"stopping {found.label} (the shape serves in its place)")
            found.stop()
        if self.dropin_present():
            self.remove_dropin()
        self._check_port_free()
        self.write_shape_folder()
        content = render_dropin(
            self.unit,
            self.unit_text(),
            spec,
            run_id=self.run_id,
            images=self.vllm_images,
            shape=self.shape,
        )
        self._wrote_dropin = True
        self.write_file(self.dropin, content)
        self.host.check(["systemctl", "daemon-reload"], timeout=60)
        self._check_dropin_took_effect(spec)
        return content

    def write_shape_folder(self) -> list[str]:
        """The shape's config.json, and the map's drafters' beside it, in the run's folder on
        the host, each folder made 0755 (readable by the unit's User=); their paths."""
        assert self.shape is not None
        files = self._shape_files(self.shape)
        root = run_folder(self.shape.folder)
        folders = {root}
        for path in files:
            folder = posixpath.dirname(path)
            while folder != root:
                folders.add(folder)
                folder = posixpath.dirname(folder)
        self._wrote_shape = True
        for folder in [SHAPE_ROOT, *sorted(folders, key=len)]:  # each parent before its folders
            self.host.check(["mkdir", "-p", "-m", "0755", folder], timeout=30)
        for path, text in files.items():
            self.write_file(path, text)
        return list(files)

    def remove_shape_folder(self) -> None:
        """The run's folder under SHAPE_ROOT, and SHAPE_ROOT where no other run's is in it."""
        if self.shape is not None and self._wrote_shape:
            self.remove_files(run_folder(self.shape.folder), empty_dir=SHAPE_ROOT)
            self._wrote_shape = False

    @staticmethod
    def _shape_files(served: ServedShape) -> dict[str, str]:
        """Every file the run writes for the shape on the host: its config.json, and what is
        built on it (`extras["files"]`, the map's drafters), each checked in the run's folder."""
        files = {posixpath.join(served.folder, CONFIG_NAME): served.config_text()}
        for path, text in dict(served.extras.get("files") or {}).items():
            files[str(path)] = str(text)
        root = run_folder(served.folder)
        for path in files:
            if run_folder(path) != root or ".." in path.split("/"):
                raise ValueError(f"{path!r} is not in the run's folder {root}")
        return files

    def shape_plan(self, specs: Sequence[SpecConfig], head: list[str]) -> list[str]:
        """The steps of a run on the shape, after `head` (the lock and the watchdog)."""
        shape = self.shape
        assert shape is not None
        render = lambda spec: render_dropin(  # noqa: E731
            self.unit,
            self.unit_text(),
            spec,
            run_id=self.run_id,
            images=self.vllm_images,
            shape=shape,
        )
        steps = [
            *head,
            f"write the shape's config.json into {shape.folder}/ on {self.host_name} (0755, so "
            f"that the unit's User= reads it; /run is cleared at boot): {shape.shape.describe()}"
            + "".join(
                f"; {path} (built on the shape)"
                for path in self._shape_files(shape)
                if posixpath.dirname(path) != shape.folder
            ),
            f"systemctl stop {self.unit}: the original is not the baseline, the shape serves in "
            "its place; check that its process is gone and the port free",
            f"write {self.dropin} (the shape's baseline; runtime only):\n" + _indent(render(None)),
            f"systemctl daemon-reload; systemctl start {self.unit} (now the shape's baseline)",
        ]
        for spec in specs:
            steps += [
                f"systemctl stop {self.unit}; write {self.dropin}:\n" + _indent(render(spec)),
                f"systemctl daemon-reload; systemctl start {self.unit} (now candidate "
                f"{spec.name} on the shape)",
            ]
        steps.append(
            f"restore: systemctl stop {self.unit}; rm {self.dropin}; systemctl daemon-reload; "
            f"rm -rf {run_folder(shape.folder)}; systemctl start {self.unit} (the original, as it "
            "was found: a reload of the real model); wait until healthy; start again the units "
            "that its stop also stopped and that were active; disarm the watchdog; unlock. On "
            "Ctrl-C, SIGTERM or SIGHUP, or a silent controller, the host runs this restore "
            "itself (restore.sh, the folder included)"
        )
        return steps


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
