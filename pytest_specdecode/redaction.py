"""Secrets never reach a file or the terminal: every text written by the run passes through here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

REDACTED = "***redacted***"
SECRET_FLAGS = ("--api-key", "--hf-token", "--token")
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)

# The rules, each a (prefix, secret) pattern: the prefix stays, the secret is replaced.
RULES = {
    "secret flag": re.compile(r"(--(?:api-key|hf-token|token)(?:=|\s+))(\S+)"),
    # No word boundary on purpose: any key that ends in one of these (hf_token, access_token,
    # openai_api_key) is a secret too.
    "secret key in JSON or Python": re.compile(
        r"((?:api_key|token)['\"]?\s*[:=]\s*\[?\s*['\"])([^'\"]+)", re.IGNORECASE
    ),
    "secret variable": re.compile(r"(\b\w*(?:KEY|TOKEN|SECRET|PASSWORD)\w*=)(\S+)"),
    "bearer header": re.compile(r"(Authorization:\s*Bearer\s+)(\S+)", re.IGNORECASE),
}

_KNOWN_SECRETS: set[str] = set()


def register_secret(value: str) -> None:
    """A value that must never be written anywhere: it is replaced wherever it appears."""
    if len(value) >= 4:
        _KNOWN_SECRETS.add(value)


def register_secret_values(env: Mapping[str, str]) -> None:
    """The values of secret-looking names (HF_TOKEN=…, API_KEY=…) are never written anywhere."""
    for name, value in env.items():
        if _SECRET_NAME.search(name):
            register_secret(value)


def redact_text(text: str) -> str:
    """Text with registered secrets and secret-looking assignments hidden."""
    for secret in _KNOWN_SECRETS:
        text = text.replace(secret, REDACTED)
    for pattern in RULES.values():
        text = pattern.sub(lambda m: m.group(1) + REDACTED, text)
    return text


def redact_data(value: Any) -> Any:
    """Every string inside a JSON-ready value redacted: before serialising, not after."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_data(v) for v in value]
    return value


def redact_argv(argv: Sequence[str]) -> list[str]:
    """A command line with the values of secret-bearing flags hidden."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide_next = True
        elif any(arg.startswith(flag + "=") for flag in SECRET_FLAGS):
            out.append(arg.split("=", 1)[0] + "=" + REDACTED)
        else:
            out.append(redact_text(arg))
    return out


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """Environment with the values of secret-looking names hidden."""
    return {k: (REDACTED if _SECRET_NAME.search(k) else redact_text(v)) for k, v in env.items()}
