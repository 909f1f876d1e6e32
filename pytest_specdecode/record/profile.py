"""A host's profile: the restart noise its A/A runs measured, kept where it outlives a run folder.

A run folder under `reports/` is gone with a cleaned CI checkout; the restart noise of a host
is worth keeping. An A/A run (`--spec-config baseline`) adds what it measured to the host's
profile, one small reviewed JSON file per host and model:

    <host profiles>/<host>--<model>.json

The folder is `--spec-host-profiles`, else `$SPECDECODE_HOST_PROFILES`, else the experiment's
`host_profiles` key (relative to its file: inside a repository, to be committed), else
`~/.local/state/pytest-specdecode/host-profiles` (outside every checkout).

Each entry is one A/A run: its folder's name, when, the vLLM version, the GPUs, and per metric
the estimate with its degrees of freedom. The noise itself is pooled by the analysis.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import write_atomically

PROFILES_ENV = "SPECDECODE_HOST_PROFILES"
DEFAULT_DIR = Path("~/.local/state/pytest-specdecode/host-profiles")
VERSION = 1


@dataclass(frozen=True)
class ProfileEntry:
    """One A/A run's measurement of the restart noise."""

    run: str  # the run folder's name
    date: str
    vllm_version: str | None
    gpus: str | None
    starts: int
    noise: Mapping[str, Mapping[str, Any]]  # per metric, RestartNoise.to_dict()

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "date": self.date,
            "vllm_version": self.vllm_version,
            "gpus": self.gpus,
            "starts": self.starts,
            "noise": {k: dict(v) for k, v in self.noise.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProfileEntry:
        return cls(
            run=str(data["run"]),
            date=str(data["date"]),
            vllm_version=data.get("vllm_version"),
            gpus=data.get("gpus"),
            starts=int(data["starts"]),
            noise={str(k): dict(v) for k, v in data["noise"].items()},
        )


@dataclass(frozen=True)
class HostProfile:
    host: str
    model: str
    entries: tuple[ProfileEntry, ...] = field(default_factory=tuple)

    def matching(self, version: str | None) -> list[ProfileEntry]:
        """The entries of this vLLM version (all of them when it is not known)."""
        return [e for e in self.entries if version is None or e.vllm_version == version]

    @property
    def runs(self) -> set[str]:
        return {e.run for e in self.entries}

    def with_entry(self, entry: ProfileEntry) -> HostProfile:
        kept = tuple(e for e in self.entries if e.run != entry.run)
        return HostProfile(self.host, self.model, (*kept, entry))

    def to_json(self) -> dict[str, Any]:
        return {
            "pytest_specdecode_host_profile": VERSION,
            "host": self.host,
            "model": self.model,
            "entries": [e.to_json() for e in self.entries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], *, source: str) -> HostProfile:
        if data.get("pytest_specdecode_host_profile") != VERSION:
            raise ConfigError(f"{source} is not a pytest-specdecode host profile (version 1)")
        try:
            return cls(
                host=str(data["host"]),
                model=str(data["model"]),
                entries=tuple(ProfileEntry.from_json(e) for e in data["entries"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{source} is not a complete host profile: {exc!r}") from None


def profiles_dir(option: str | None, configured: Path | None) -> Path:
    """Where host profiles live: the option, the environment, the experiment's key, the default."""
    given = option or os.environ.get(PROFILES_ENV)
    if given:
        return Path(given).expanduser().absolute()
    return configured if configured is not None else DEFAULT_DIR.expanduser()


def profile_path(directory: Path, host: str, model: str) -> Path:
    return directory / f"{_slug(host)}--{_slug(model)}.json"


def read_profile(directory: Path, host: str, model: str) -> HostProfile | None:
    path = profile_path(directory, host, model)
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"host profile {path} is not readable JSON: {exc}") from None
    profile = HostProfile.from_json(data, source=str(path))
    if (profile.host, profile.model) != (host, model):
        raise ConfigError(
            f"host profile {path} is for {profile.model} on {profile.host}, not {model} on {host}"
        )
    return profile


def add_entry(directory: Path, host: str, model: str, entry: ProfileEntry) -> Path:
    """The host's profile with this run's measurement added (or replaced): written atomically."""
    profile = read_profile(directory, host, model) or HostProfile(host, model)
    path = profile_path(directory, host, model)
    text = json.dumps(profile.with_entry(entry).to_json(), indent=1, allow_nan=False)
    write_atomically(path, text + "\n")
    return path


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)[:80] or "_"
