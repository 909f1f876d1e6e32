"""vLLM server command lines: recognise one, and derive the candidate's from it."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

from ..config.specconfig import SpecConfig
from ..errors import ConfigError

SPEC_FLAG = "--speculative-config"
API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def check_vllm_command(argv: Sequence[str], *, where: str) -> None:
    """Accept `vllm serve MODEL …` or `python -m vllm.entrypoints.openai.api_server …`."""
    if len(argv) >= 3 and posixpath.basename(argv[0]) == "vllm" and argv[1] == "serve":
        return
    if (
        len(argv) >= 3
        and posixpath.basename(argv[0]).startswith("python")
        and argv[1] == "-m"
        and argv[2] == API_SERVER_MODULE
    ):
        return
    shown = " ".join(argv[:4]) + (" …" if len(argv) > 4 else "")
    raise ConfigError(
        f"{where}: cannot derive a candidate from `{shown}`: expected `vllm serve MODEL …` or "
        f"`python -m {API_SERVER_MODULE} …` (a wrapper script hides the flags this tool must edit)"
    )


def with_speculative_config(argv: Sequence[str], spec: SpecConfig, *, where: str) -> list[str]:
    """The same command with `--speculative-config JSON`, replacing any that was there.

    The A/A candidate is the original's command unchanged.
    """
    check_vllm_command(argv, where=where)
    if spec.is_original:
        return list(argv)
    out: list[str] = []
    skip_next = False
    for arg in argv:
        if skip_next:
            skip_next = False
            continue
        if arg == SPEC_FLAG:
            skip_next = True
            continue
        if arg.startswith(SPEC_FLAG + "="):
            continue
        out.append(arg)
    return [*out, SPEC_FLAG, spec.to_json()]


def option_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of `--flag V` or `--flag=V` in argv, the last one winning."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value
