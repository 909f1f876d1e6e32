"""results.json, rewritten atomically after every sample so an interrupted run keeps its data."""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REDACTED = "***redacted***"
_SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


_KNOWN_SECRETS: set[str] = set()
_SECRET_PATTERNS = [
    re.compile(r"(--(?:api-key|hf-token|token)(?:=|\s+))(\S+)"),
    re.compile(r"((?:api_key|hf_token|token)['\"]?\s*[:=]\s*\[?\s*['\"])([^'\"]+)"),
    re.compile(r"(\b\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*=)(\S+)"),
    re.compile(r"(Authorization:\s*Bearer\s+)(\S+)", re.IGNORECASE),
]


def register_secret(value: str) -> None:
    """A value that must never be written anywhere: it is replaced wherever it appears."""
    if len(value) >= 4:
        _KNOWN_SECRETS.add(value)


def redact_text(text: str) -> str:
    """Text with registered secrets and secret-looking assignments hidden."""
    for secret in _KNOWN_SECRETS:
        text = text.replace(secret, REDACTED)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of secret-bearing flags hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in _SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in _SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(arg)
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with the values of secret-looking names hidden."""
    return {k: (REDACTED if _SECRET_NAME.search(k) else v) for k, v in env.items()}


class ResultsFile:
    """One run's results.json."""

    def __init__(self, path: Path, header: Mapping[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {
            "schema": 1,
            **header,
            "samples": [],
            "phases": {},
            "verdicts": {},
        }
        self.flush()

    def add_sample(self, sample: Mapping[str, Any]) -> None:
        self.data["samples"].append(dict(sample))
        self.flush()

    def set_phase(self, name: str, info: Mapping[str, Any]) -> None:
        self.data["phases"][name] = dict(info)
        self.flush()

    def set(self, key: str, value: Any) -> None:
        self.data[key] = value
        self.flush()

    def flush(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".results-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                text = json.dumps(_finite(self.data), indent=1, default=str, allow_nan=False)
                f.write(redact_text(text))
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _finite(value: Any) -> Any:
    """NaN and infinities become None: results.json stays strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
