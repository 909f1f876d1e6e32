"""The facts that make two runs comparable, recorded before anything is measured."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..record.profile import accelerator_of
from ..targets.base import Target
from ..targets.facts.gpu import GpuOutputError, parse_gpus
from ..targets.hosts.base import Host

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


_CPU_QUERY = (
    "grep -m1 -i '^model name' /proc/cpuinfo 2>/dev/null || "
    "LC_ALL=C lscpu 2>/dev/null | grep -m1 -i '^model name'"
)


def cpu_model(host: Host) -> str | None:
    """The serving host's CPU model (`/proc/cpuinfo`, else `lscpu`); None where unreadable."""
    try:
        result = host.run(["sh", "-c", _CPU_QUERY], timeout=30, privileged=False)
    except Exception:  # a fact, not a precondition: never stop a run over it
        return None
    return parse_cpu_model(result.stdout) if result.ok else None


def parse_cpu_model(text: str) -> str | None:
    """`model name\t: AMD EPYC` (cpuinfo) or `Model name:  AMD EPYC` (lscpu) -> `AMD EPYC`."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip().lower() == "model name" and value.strip():
            return " ".join(value.split())
    return None


_MACHINE_QUERY = (
    "nvidia-smi --query-gpu=uuid --format=csv,noheader 2>/dev/null | grep -i '^GPU-' "
    "&& exit 0; cat /etc/machine-id 2>/dev/null"
)


def machine_of(output: str) -> str | None:
    """Which machine this is, as a fingerprint: a hash of its GPUs' UUIDs where nvidia-smi
    lists any, else of /etc/machine-id (a hash: the id itself is not for sharing). Two leases
    of "the same" GPU model, or two CPUs of one name, are told apart by it."""
    lines = sorted(line.strip() for line in output.splitlines() if line.strip())
    if not lines:
        return None
    kind = "gpus" if lines[0].upper().startswith("GPU-") else "machine-id"
    return f"{kind}:{hashlib.sha256(chr(10).join(lines).encode()).hexdigest()[:12]}"


def machine_id(host: Host) -> str | None:
    """The serving host's fingerprint (`machine_of`); None where neither can be read."""
    try:
        result = host.run(["sh", "-c", _MACHINE_QUERY], timeout=30, privileged=False)
    except Exception:  # a fact, not a precondition: never stop a run over it
        return None
    return machine_of(result.stdout) if result.ok else None


def machine(host: Host) -> dict[str, Any]:
    """What runs the model on the serving host: its GPUs, its CPU, the accelerator that keys
    its host profile (record/profile.py), and which machine it is (`machine_of`)."""
    gpus = gpu_list(host)
    cpu = cpu_model(host)
    found = accelerator_of(gpus, cpu)
    return {
        "gpus": gpus,
        "cpu": cpu,
        "accelerator": found.to_json() if found else None,
        "machine": machine_id(host),
    }


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


_SUITE_FILES = (".py", ".toml", ".json", ".jsonl", ".txt", ".yaml", ".yml", ".cfg", ".ini")
_NOT_SUITE = {"__pycache__", "node_modules", "reports", "venv"}
_MOST_FILES = 5000


def suite_content(path: Path, *, besides: Sequence[Path] = ()) -> str | None:
    """Where the suite is not a git checkout: its folder and a hash of its files' content
    (sources and data, not caches, venvs or reports, nor `besides`: the host profiles, whose
    measured noise is no suite content), e.g. "/srv/suite, content 3f2a9c01b7e4 (14 files)";
    None where nothing could be read."""
    where = (path if path.is_dir() else path.parent).resolve()
    skipped = [b.resolve() for b in besides]
    digest = hashlib.sha256()
    count = 0
    try:
        files = sorted(
            f
            for f in where.rglob("*")
            if f.suffix in _SUITE_FILES
            and f.is_file()
            and not any(f.is_relative_to(b) for b in skipped)
            and not any(part in _NOT_SUITE or part.startswith(".") for part in
                        f.relative_to(where).parts[:-1])
        )  # fmt: skip
        for f in files[:_MOST_FILES]:
            digest.update(str(f.relative_to(where)).encode() + b"\0" + f.read_bytes() + b"\0")
            count += 1
    except OSError:
        return None
    if not count:
        return None
    return f"{where}, content {digest.hexdigest()[:12]} ({count} files)"


def environment(
    target: Target,
    config_file: Path,
    facts: dict[str, Any] | None = None,
    *,
    besides: Sequence[Path] = (),
) -> dict[str, Any]:
    """Recorded in the run record before anything is measured; `facts`: `machine`'s, if read;
    `besides`: folders whose files are no suite content (the host profiles)."""
    commit = git_commit(config_file)
    found: dict[str, Any] = {**(facts or machine(target.host)), "git_commit": commit}
    if commit is None:
        found["suite_content"] = suite_content(config_file, besides=besides)
    return found
