"""The facts that make two runs comparable, recorded before anything is measured."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from ..targets.base import Target
from ..targets.gpu import GpuOutputError, parse_gpus
from ..targets.hosts import Host

_GPU_FIELDS = ("index", "name", "memory.total", "driver_version")
_GPU_QUERY = (
    "command -v nvidia-smi >/dev/null || exit 3; nvidia-smi "
    f"--query-gpu={','.join(_GPU_FIELDS)} --format=csv,noheader"
)


def gpu_list(host: Host) -> list[str] | None:
    """`index: name, memory, driver` per GPU; None where nvidia-smi is absent or fails."""
    try:
        result = host.run(["sh", "-c", _GPU_QUERY], timeout=30, privileged=False)
    except Exception:  # a fact, not a precondition: never stop a run over it
        return None
    if not result.ok:
        return None
    try:
        gpus = [g.describe() for g in parse_gpus(result.stdout, _GPU_FIELDS)]
    except GpuOutputError:
        gpus = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return gpus or None


def git_commit(path: Path) -> str | None:
    """The commit checked out where the suite lives, with '-dirty' for uncommitted changes."""
    where = path if path.is_dir() else path.parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10
        )

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def environment(target: Target, config_file: Path) -> dict[str, Any]:
    """Recorded in the run record before anything is measured."""
    return {"gpus": gpu_list(target.host), "git_commit": git_commit(config_file)}
