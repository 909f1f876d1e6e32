"""A host's profile: the restart noise its A/A runs measured, kept where it outlives a run folder.

A run folder under `reports/` is gone with a cleaned CI checkout; the restart noise of a host
is worth keeping. An A/A run (`--spec-config baseline`) adds what it measured to the profile of
what changes the noise: the host, its accelerator (GPU model and count, or the CPU model) and
the model, one small reviewed JSON file each,

    <host profiles>/<host>--<accelerator>--<model>.json

whose entries each name their vLLM version. A comparison uses the entries of its own host,
accelerator, model and vLLM version only (`ProfileKey`); a profile of another accelerator, or
an entry of another version, is named but not used.

The folder is `--spec-host-profiles`, else `$SPECDECODE_HOST_PROFILES`, else the experiment's
`host_profiles` key (relative to its file: inside a repository, to be committed), else
`~/.local/state/pytest-specdecode/host-profiles` (outside every checkout).

Each entry is one A/A run: its folder's name, when, the vLLM version, the GPUs (a list) or the
CPU, per metric the estimate with its degrees of freedom, and how fast the engine ran (for the
dry run's estimate), and per metric the drift within a start (analysis/variance/time_drift.py;
absent in entries written before it was measured: such a file reads as it did), and the design its
requests were sent in (`DESIGNS`): a blocked start's restart noise holds the drift that
interleaving spreads out, so a run reads the entries of its own design first. The noise itself
is pooled by the analysis. A profile of version 1 (keyed by host and model only) is read as
unkeyed: named, never used as measured.
"""

from __future__ import annotations

import ast
import json
import os
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import write_atomically
from .schema import RunRecord

PROFILES_ENV = "SPECDECODE_HOST_PROFILES"
DEFAULT_DIR = Path("~/.local/state/pytest-specdecode/host-profiles")
VERSION = 2
UNKEYED_VERSION = 1  # keyed by host and model only: read, named, never used as measured
# How a start's requests were sent: one prompt type after another, in one shuffled order, or
# with the arms served side by side (each slot to one server, then the other)
DESIGNS = ("blocked", "interleaved", "together")


def design_of(order: str | None, *, together: bool) -> str:
    """The design of a run's starts: side by side, else its order (before the order was
    recorded, every start was blocked)."""
    return "together" if together else (order or "blocked")


def record_design(record: RunRecord) -> str:
    """The design a stored run's baseline was measured in."""
    phases = [p for p in record.phases.values() if not p.reused_from]
    return design_of(
        next((p.order for p in phases if p.order), None),
        together=any(p.together_with for p in phases),
    )


@dataclass(frozen=True)
class Accelerator:
    """What runs the model: `count` GPUs of one `model`, or a CPU (`kind` "cpu", count 1)."""

    kind: str  # "gpu" or "cpu"
    model: str
    count: int = 1

    def describe(self) -> str:
        """`1 x NVIDIA H200`, `CPU AMD EPYC`."""
        return f"{self.count} x {self.model}" if self.kind == "gpu" else f"CPU {self.model}"

    def slug(self) -> str:
        return _slug(f"{self.count}x-{self.model}" if self.kind == "gpu" else f"cpu-{self.model}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "model": self.model, "count": self.count}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Accelerator:
        return cls(kind=str(data["kind"]), model=str(data["model"]), count=int(data["count"]))


def accelerator_of(gpus: Sequence[str] | None, cpu: str | None = None) -> Accelerator | None:
    """From the machine's facts (measure/environment.py): its GPUs as `index: name, memory,
    driver`, else its CPU model; None where neither is known. Mixed GPUs: the first's model."""
    if gpus:
        names = [_gpu_name(g) for g in gpus]
        return Accelerator("gpu", names[0], len(names))
    if cpu:
        return Accelerator("cpu", cpu)
    return None


def recorded_accelerator(environment: Mapping[str, Any]) -> Accelerator | None:
    """A run record's accelerator: as recorded, else from its GPUs; None for an older run of
    a CPU (its CPU model was not recorded)."""
    found = environment.get("accelerator")
    if isinstance(found, Mapping):
        try:
            return Accelerator.from_json(found)
        except (KeyError, TypeError, ValueError):
            return None
    gpus = environment.get("gpus")
    return accelerator_of(_gpu_list(gpus), environment.get("cpu"))


@dataclass(frozen=True)
class ProfileKey:
    """What changes the restart noise: a profile of another key is not used as measured."""

    host: str
    accelerator: Accelerator | None
    model: str
    vllm_version: str | None  # None: not known yet (before the server starts)

    def describe(self) -> str:
        machine = self.accelerator.describe() if self.accelerator else "an unknown accelerator"
        version = f"vLLM {self.vllm_version}" if self.vllm_version else "vLLM version unknown"
        return f"{self.model} on {self.host} ({machine}, {version})"


@dataclass(frozen=True)
class EngineSpeed:
    """How fast the engine ran in one run: a server start, and a request per output token."""

    start_s: float | None
    s_per_token: float

    def to_json(self) -> dict[str, Any]:
        return {"start_s": self.start_s, "s_per_token": self.s_per_token}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EngineSpeed:
        start = data.get("start_s")
        return cls(None if start is None else float(start), float(data["s_per_token"]))


def speed_of(record: RunRecord) -> EngineSpeed | None:
    """How fast the engine ran in a run: the median start, and the median request's time per
    output token (at the levels it was measured at); None without a timed request."""
    per_token = [
        s.e2e_s / s.output_tokens
        for p in record.phases.values()
        if not p.reused_from
        for m in p.measurements.values()
        for s in m.samples
        if s.output_tokens and s.e2e_s > 0
    ]
    if not per_token:
        return None
    starts = [p.startup_s for p in record.phases.values() if p.startup_s is not None]
    return EngineSpeed(statistics.median(starts) if starts else None, statistics.median(per_token))


@dataclass(frozen=True)
class ProfileEntry:
    """One A/A run's measurement of the restart noise."""

    run: str  # the run folder's name
    date: str
    vllm_version: str | None
    gpus: tuple[str, ...] | None
    starts: int
    noise: Mapping[str, Mapping[str, Any]]  # per metric, RestartNoise.to_dict()
    cpu: str | None = None
    speed: EngineSpeed | None = None
    # per metric, the drift within a start (analysis/variance/time_drift.py TimeDrift.to_dict());
    # None in an entry written before drift was measured
    drift: Mapping[str, Mapping[str, Any]] | None = None
    design: str = "blocked"  # DESIGNS; entries written before it was kept: inferred on reading
    # which machine measured it (measure/environment.py machine_of); None: not recorded
    machine: str | None = None
    # side by side: per metric, the second place's speed beside the first (analysis pairs.py)
    position_bias: Mapping[str, Mapping[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "design": self.design,
            "machine": self.machine,
            "position_bias": (
                None
                if self.position_bias is None
                else {k: dict(v) for k, v in self.position_bias.items()}
            ),
            "date": self.date,
            "vllm_version": self.vllm_version,
            "gpus": None if self.gpus is None else list(self.gpus),
            "cpu": self.cpu,
            "starts": self.starts,
            "speed": self.speed.to_json() if self.speed else None,
            "noise": {k: dict(v) for k, v in self.noise.items()},
            "drift": None if self.drift is None else {k: dict(v) for k, v in self.drift.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProfileEntry:
        speed = data.get("speed")
        drift = data.get("drift")
        return cls(
            run=str(data["run"]),
            date=str(data["date"]),
            vllm_version=data.get("vllm_version"),
            gpus=_gpu_list(data.get("gpus")),
            starts=int(data["starts"]),
            noise={str(k): dict(v) for k, v in data["noise"].items()},
            cpu=data.get("cpu"),
            speed=EngineSpeed.from_json(speed) if speed else None,
            drift={str(k): dict(v) for k, v in drift.items()} if drift else None,
            design=str(data.get("design") or _design_before_kept(drift)),
            machine=data.get("machine"),
            position_bias=data.get("position_bias"),
        )


@dataclass(frozen=True)
class HostProfile:
    host: str
    model: str
    accelerator: Accelerator | None = None  # None: unknown, or an unkeyed (version 1) profile
    entries: tuple[ProfileEntry, ...] = field(default_factory=tuple)
    keyed: bool = True  # False: version 1, keyed by host and model only

    def matching(self, version: str | None) -> list[ProfileEntry]:
        """The entries of this vLLM version; none when it is not known, nor when unkeyed."""
        if not self.keyed or version is None:
            return []
        return [e for e in self.entries if e.vllm_version == version]

    def of_design(self, version: str | None, design: str | None) -> tuple[list[ProfileEntry], str]:
        """The entries of this vLLM version measured in `design`, if any; else all of them.
        With a phrase naming the design(s) they were measured in, for the source."""
        entries = self.matching(version)
        same = [e for e in entries if e.design == design]
        if same or design is None:
            return same or entries, f"{design} design" if same else ""
        others = sorted({e.design for e in entries})
        return entries, f"{' and '.join(others)} design, none {design}" if others else ""

    @property
    def versions(self) -> list[str]:
        return sorted({e.vllm_version or "unknown" for e in self.entries})

    @property
    def runs(self) -> set[str]:
        return {e.run for e in self.entries}

    def describe(self) -> str:
        """`CPU AMD EPYC, vLLM 0.32.0`: what its entries were measured on."""
        versions = ", ".join(f"vLLM {v}" for v in self.versions) or "no entries"
        if not self.keyed:
            return f"unkeyed: any accelerator, {versions}"
        machine = self.accelerator.describe() if self.accelerator else "an unknown accelerator"
        return f"{machine}, {versions}"

    def with_entry(self, entry: ProfileEntry) -> HostProfile:
        kept = tuple(e for e in self.entries if e.run != entry.run)
        return HostProfile(self.host, self.model, self.accelerator, (*kept, entry))

    def to_json(self) -> dict[str, Any]:
        return {
            "pytest_specdecode_host_profile": VERSION,
            "host": self.host,
            "accelerator": self.accelerator.to_json() if self.accelerator else None,
            "model": self.model,
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str) -> HostProfile:
        version = data.get("pytest_specdecode_host_profile")
        if version not in (VERSION, UNKEYED_VERSION):
            raise ConfigError(
                f"{source} is not a pytest-specdecode host profile (version {VERSION})"
            )
        try:
            found = data.get("accelerator")
            return cls(
                host=str(data["host"]),
                model=str(data["model"]),
                accelerator=Accelerator.from_json(found) if found else None,
                entries=tuple(ProfileEntry.from_json(e) for e in data["entries"]),
                keyed=version == VERSION,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source} is not a complete host profile: {exc!r}") from None


@dataclass(frozen=True)
class ProfileLookup:
    """The profiles of one host and model in the folder: the one of this key's accelerator,
    and the others (another accelerator, or unkeyed), which are named but not used."""

    key: ProfileKey
    path: Path  # where this key's profile is, or would be written
    profile: HostProfile | None
    others: tuple[tuple[Path, HostProfile], ...] = ()

    def not_used(self) -> list[str]:
        """What was found and is not used as measured, one phrase each."""
        out = [f"host profile {p} ({other.describe()})" for p, other in self.others]
        if self.profile is not None and self.key.vllm_version is not None:
            other_versions = [v for v in self.profile.versions if v != self.key.vllm_version]
            if other_versions:
                out.append(
                    f"host profile {self.path}'s entries of "
                    + ", ".join(f"vLLM {v}" for v in other_versions)
                )
        return out


def profiles_dir(option: str | None, configured: Path | None) -> Path:
    """Where host profiles live: the option, the environment, the experiment's key, the default."""
    given = option or os.environ.get(PROFILES_ENV)
    if given:
        return Path(given).expanduser().absolute()
    return configured if configured is not None else DEFAULT_DIR.expanduser()


def profile_path(directory: Path, host: str, accelerator: Accelerator | None, model: str) -> Path:
    machine = accelerator.slug() if accelerator else "unknown-accelerator"
    return directory / f"{_slug(host)}--{machine}--{_slug(model)}.json"


def read_profile(
    directory: Path, host: str, accelerator: Accelerator | None, model: str
) -> HostProfile | None:
    """The profile of this host, accelerator and model; None where there is none."""
    path = profile_path(directory, host, accelerator, model)
    if not path.is_file():
        return None
    profile = _read(path)
    if (profile.host, profile.accelerator, profile.model) != (host, accelerator, model):
        raise ConfigError(
            f"host profile {path} is for {profile.model} on {profile.host} "
            f"({profile.describe()}), not {model} on {host}"
        )
    return profile


def lookup(directory: Path, key: ProfileKey) -> ProfileLookup:
    """This key's profile, and every other profile of its host and model in the folder."""
    path = profile_path(directory, key.host, key.accelerator, key.model)
    profile = read_profile(directory, key.host, key.accelerator, key.model)
    others = []
    prefix, suffix = f"{_slug(key.host)}--", f"--{_slug(key.model)}.json"
    unkeyed = directory / f"{_slug(key.host)}--{_slug(key.model)}.json"
    candidates = sorted(directory.glob(f"{prefix}*{suffix}")) if directory.is_dir() else []
    for found in [*candidates, unkeyed] if unkeyed.is_file() else candidates:
        if found == path:
            continue
        try:
            other = _read(found)
        except ConfigError:
            continue  # not a profile of this host and model: another's name that matched
        if (other.host, other.model) == (key.host, key.model) and (other.keyed or found == unkeyed):
            others.append((found, other))
    return ProfileLookup(key, path, profile, tuple(others))


def with_held_version(directory: Path, key: ProfileKey) -> ProfileKey:
    """A key whose vLLM version is not known yet (before the server starts): the one version
    its profile holds, if it holds exactly one; else as it is."""
    if key.vllm_version is not None:
        return key
    profile = read_profile(directory, key.host, key.accelerator, key.model)
    held = profile.versions if profile else []
    if len(held) == 1 and held[0] != "unknown":
        return ProfileKey(key.host, key.accelerator, key.model, held[0])
    return key


def add_entry(
    directory: Path, host: str, accelerator: Accelerator | None, model: str, entry: ProfileEntry
) -> Path:
    """The profile with this run's measurement added (or replaced): written atomically."""
    profile = read_profile(directory, host, accelerator, model) or HostProfile(
        host, model, accelerator
    )
    path = profile_path(directory, host, accelerator, model)
    text = json.dumps(profile.with_entry(entry).to_json(), indent=1, allow_nan=False)
    write_atomically(path, text + "\n")
    return path


def _read(path: Path) -> HostProfile:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"host profile {path} is not readable JSON: {exc}") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"host profile {path} is not a JSON object")
    return HostProfile.from_json(data, source=str(path))


def _design_before_kept(drift: Any) -> str:
    """An entry written before its design was kept: interleaved where its drift says it was not
    blocked (interleaving came with the drift), else blocked."""
    found = [d.get("blocked") for d in (drift or {}).values() if isinstance(d, Mapping)]
    return "interleaved" if found and found[0] is False else "blocked"


def _gpu_list(value: Any) -> tuple[str, ...] | None:
    """A list of GPUs, also from an earlier version's Python list string `"['0: …']"`."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            parsed = ast.literal_eval(value) if value.startswith("[") else [value]
        except (ValueError, SyntaxError):
            parsed = [value]
        value = parsed
    if not isinstance(value, list | tuple):
        return None
    return tuple(str(g) for g in value)


def _gpu_name(described: str) -> str:
    """`0: NVIDIA H200, 143771 MiB, driver 570.1` -> `NVIDIA H200`."""
    body = described.split(": ", 1)[1] if ": " in described else described
    return body.split(",")[0].strip() or described


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80] or "_"
