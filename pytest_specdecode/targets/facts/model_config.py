"""A model's config.json, read on the host where it will be loaded: a drafter's, the target's.

One command per model through the target's `Host` (this machine, SSH, the unit's container):
the path is an argument of a fixed `sh -c` program, never part of a shell string, so nothing in
it is interpreted. A Hugging Face id that is not a path is looked for in the host's hub cache
(`HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`), where vLLM would find it.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigError, HostError
from ...record.safetensors_io import shapes_of_header
from ..hosts.base import Host

CONFIG_LIMIT = 1 << 20  # a config.json larger than this is not a config
HEADER_LIMIT = 1 << 24  # a head's safetensors header is a few KiB; a target shard's, some MiB
MISSING, NO_CONFIG, CONFIG_MARK = "specdecode-missing", "specdecode-no-config", "specdecode-config"
HEADER_MARK = "specdecode-safetensors-header"

# $1: the path or hub id; $3: the hub cache where the server's environment names one; $2: "weights"
# to add model.safetensors' header (the tensors' names and
# shapes, not the weights: the first 8 bytes give its length). Prints the resolved path, the size
# in KiB (or nothing), the mark, the config, then the header's mark and the header where asked;
# exits 3 where nothing is there, 4 where there is no config.json.
_READ = rf"""
p=$1
if [ ! -e "$p" ]; then
  case "$p" in
    /*|./*|../*|~*) ;;
    */*)
      hub=${{3:-${{HF_HUB_CACHE:-${{HF_HOME:-$HOME/.cache/huggingface}}/hub}}}}
      dir="$hub/models--$(printf '%s' "$p" | sed 's#/#--#g')/snapshots"
      for s in "$dir"/*/; do [ -e "$s/config.json" ] && p=${{s%/}}; done ;;
  esac
fi
[ -e "$p" ] || {{ echo {MISSING}; exit 3; }}
if [ -d "$p" ]; then c="$p/config.json"; else c=$p; fi
[ -r "$c" ] || {{ echo {NO_CONFIG}; exit 4; }}
printf '%s\n' "$p"
du -skL -- "$p" 2>/dev/null | cut -f1
echo {CONFIG_MARK}
head -c {CONFIG_LIMIT} -- "$c"
w="$p/model.safetensors"
if [ "$2" = weights ] && [ -d "$p" ] && [ -r "$w" ]; then
  n=$(head -c 8 -- "$w" | od -An -tu8 | tr -d ' ')
  case "$n" in ''|*[!0-9]*) exit 0 ;; esac
  [ "$n" -le {HEADER_LIMIT} ] || exit 0
  printf '\n%s\n' {HEADER_MARK}
  head -c $((8 + n)) -- "$w" | tail -c "$n"
fi
"""


@dataclass(frozen=True)
class ModelSite:
    """Where a target's models are loaded: the host (its container, for a container unit), the
    words that name it in messages, and the target's own model as its server command names it."""

    host: Host
    where: str
    model: str | None
    workdir: str | None = None  # the local server's working directory: relative paths start there
    hub_cache: str | None = None  # the Hugging Face cache the server's own environment names

    def on_host(self, path: str) -> str:
        """`path` as the server would open it: a relative one from the local server's folder."""
        if self.workdir is None or posixpath.isabs(path) or path.startswith("~"):
            return path
        joined = posixpath.normpath(posixpath.join(self.workdir, path))
        return joined if os.path.exists(joined) else path


@dataclass(frozen=True)
class ModelFiles:
    """A model's config.json as read on its host, and its size on disk where `du` could tell."""

    path: str  # as given
    resolved: str  # on the host: the path, or the hub cache's snapshot
    config: Mapping[str, Any]
    size_bytes: int | None
    # model.safetensors' tensors: name -> shape, where asked for and found (one file, not shards)
    tensors: Mapping[str, tuple[int, ...]] | None = None


def hub_cache_of(env: Mapping[str, str]) -> str | None:
    """The Hugging Face cache a server with this environment reads (huggingface_hub's order)."""
    if env.get("HF_HUB_CACHE"):
        return env["HF_HUB_CACHE"]
    if env.get("HF_HOME"):
        return posixpath.join(env["HF_HOME"], "hub")
    return None


def check_path(path: Any, *, where: str, what: str) -> str:
    """A path this tool will hand to the host: a non-empty string, one line, no NUL."""
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"{where}: {what} must be a path or a model id, not {path!r}")
    if "\0" in path or "\n" in path or len(path) > 4096:
        raise ConfigError(f"{where}: {what} {path[:80]!r} is not a path this tool will pass on")
    return path


def read_model_config(
    host: Host,
    path: str,
    *,
    where: str,
    what: str,
    weights: bool = False,
    hub_cache: str | None = None,
) -> ModelFiles:
    """`path`'s config.json on `host` (and, with `weights`, its tensors' shapes). A path that is
    not there is a ConfigError naming the host; nothing is changed on it."""
    check_path(path, where=where, what=what)
    argv = ["sh", "-c", _READ, "sh", path, "weights" if weights else "", hub_cache or ""]
    try:
        result = host.run(argv, timeout=60, privileged=False)
    except HostError as exc:
        raise ConfigError(f"{where}: {what} {path} could not be read: {exc}") from None
    out = result.stdout
    if result.exit_status == 3 or out.startswith(MISSING):
        hub = "/" in path and not path.startswith(("/", ".", "~"))
        raise ConfigError(
            f"{where}: {what} {path} is not on {host.name}"
            + (" (nor in its Hugging Face cache: download it there first)" if hub else "")
            + "; it is loaded there, and read there before anything is touched"
        )
    if result.exit_status == 4 or out.startswith(NO_CONFIG):
        raise ConfigError(f"{where}: {what} {path} on {host.name} has no readable config.json")
    head, mark, text = out.partition(f"\n{CONFIG_MARK}\n")
    if not result.ok or not mark:
        raise ConfigError(f"{where}: {what} {path} could not be read: {result.describe()}")
    resolved, _, size = head.partition("\n")
    text, _, header = text.partition(f"\n{HEADER_MARK}\n")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where}: {what} {path} on {host.name}: config.json is not JSON ({exc})"
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: {what} {path} on {host.name}: config.json is not an object")
    kib = size.strip()
    size_bytes = int(kib) * 1024 if kib.isdigit() else None
    return ModelFiles(path, resolved, config, size_bytes, tensor_shapes(header) if header else None)


def tensor_shapes(header: str) -> dict[str, tuple[int, ...]] | None:
    """A safetensors header's tensors and their shapes; None where it cannot be read."""
    try:
        found = json.loads(header)
    except json.JSONDecodeError:
        return None
    return shapes_of_header(found) if isinstance(found, dict) else None
