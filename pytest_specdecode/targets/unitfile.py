"""systemd unit files: read the original's ExecStart, render the candidate's. Pure functions."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..config.specconfig import SpecConfig
from ..errors import ConfigError
from .vllm_argv import SPEC_FLAG, check_vllm_command

UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,200}\.service$")
CANDIDATE_SUFFIX = "-specdecode"


def check_unit_name(unit: str) -> str:
    """A plain .service name: nothing a shell or a path could misread."""
    if not UNIT_NAME.match(unit) or ".." in unit:
        raise ConfigError(
            f"unit {unit!r} is not a plain systemd service name (letters, digits, ':_.@-', "
            "ending in .service)"
        )
    return unit


def candidate_unit_name(unit: str) -> str:
    return unit.removesuffix(".service") + CANDIDATE_SUFFIX + ".service"


@dataclass(frozen=True)
class Token:
    raw: str  # as written in the unit file, quotes and all
    value: str  # what the process receives (before systemd's $VAR and % expansion)


def split_exec(value: str) -> list[Token]:
    """Split an ExecStart value by systemd's quoting rules, keeping each token's raw text."""
    tokens: list[Token] = []
    i, n = 0, len(value)
    while i < n:
        if value[i].isspace():
            i += 1
            continue
        start, out = i, []
        while i < n and not value[i].isspace():
            ch = value[i]
            if ch in "\"'":
                end = i + 1
                while end < n and value[end] != ch:
                    if value[end] == "\\" and ch == '"' and end + 1 < n:
                        end += 1
                    end += 1
                if end >= n:
                    raise ConfigError(f"ExecStart has an unterminated quote: {value!r}")
                inner = value[i + 1 : end]
                out.append(re.sub(r'\\(["\\])', r"\1", inner) if ch == '"' else inner)
                i = end + 1
            elif ch == "\\" and i + 1 < n:
                out.append(value[i + 1])
                i += 2
            else:
                out.append(ch)
                i += 1
        tokens.append(Token(value[start:i], "".join(out)))
    return tokens


def quote_arg(arg: str) -> str:
    """One argument for an ExecStart line, double-quoted, with $ and % made literal."""
    if any(c in arg for c in "\n\r\0"):
        raise ConfigError(f"refusing to write a control character into a unit file: {arg!r}")
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("$", "$$").replace("%", "%%") + '"'


def effective_exec_start(unit_text: str, *, where: str) -> tuple[str, list[Token]]:
    """The ExecStart that systemd will run, from `systemctl cat` output (drop-ins included).

    Returns its prefix (such as "-") and its tokens. Refuses what it cannot safely rewrite.
    """
    section = ""
    commands: list[str] = []
    for line in _logical_lines(unit_text):
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
        elif section == "[Service]" and re.match(r"ExecStart\s*=", stripped):
            value = stripped.split("=", 1)[1].strip()
            commands = [] if not value else [*commands, value]
    if not commands:
        raise ConfigError(f"{where}: no ExecStart= in the unit")
    if len(commands) > 1:
        raise ConfigError(f"{where}: {len(commands)} ExecStart= lines; expected one command")
    value = commands[0]
    prefix = re.match(r"^[-@:+!|]*", value).group(0)  # type: ignore[union-attr]
    if set(prefix) - {"-"}:
        raise ConfigError(
            f"{where}: ExecStart prefix {prefix!r} changes how systemd runs the command; "
            "only '-' is supported"
        )
    tokens = split_exec(value[len(prefix) :])
    check_vllm_command([t.value for t in tokens], where=where)
    return prefix, tokens


def candidate_exec_start(unit_text: str, spec: SpecConfig, *, where: str) -> str:
    """The original's ExecStart plus `--speculative-config JSON`, replacing any it had.

    The A/A candidate keeps the original's ExecStart as it is.
    """
    prefix, tokens = effective_exec_start(unit_text, where=where)
    if spec.is_original:
        return prefix + " ".join(t.raw for t in tokens)
    kept: list[str] = []
    skip = False
    for token in tokens:
        if skip:
            skip = False
        elif token.value == SPEC_FLAG:
            skip = True
        elif not token.value.startswith(SPEC_FLAG + "="):
            kept.append(token.raw)
    return prefix + " ".join([*kept, SPEC_FLAG, quote_arg(spec.to_json())])


def render_candidate_unit(unit: str, unit_text: str, spec: SpecConfig, *, run_id: str) -> str:
    """The candidate unit file: the original's settings, its ExecStart, no [Install]."""
    where = f"unit {unit}"
    exec_start = candidate_exec_start(unit_text, spec, where=where)
    body: list[str] = [
        f"# Written by pytest-specdecode (run {run_id}): candidate {spec.name!r} for {unit}.",
        "# Removed when the run restores the original, or by its watchdog.",
    ]
    section = ""
    for line in _logical_lines(unit_text):
        stripped = line.strip()
        if stripped.startswith("# /"):  # systemctl cat's file headers
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            section = stripped
            if section != "[Install]":
                body.append(stripped)
            continue
        if section == "[Install]":
            continue
        if section == "[Service]" and re.match(r"ExecStart\s*=", stripped):
            continue
        if section == "[Unit]" and re.match(r"Description\s*=", stripped):
            line = f"{stripped} (pytest-specdecode candidate {spec.name})"
        body.append(line)
    body += ["", "[Service]", f"ExecStart={exec_start}", ""]
    return "\n".join(body)


def _logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined, as systemd reads them."""
    out: list[str] = []
    pending = ""
    for line in text.splitlines():
        if line.rstrip().endswith("\\") and not line.lstrip().startswith(("#", ";")):
            pending += line.rstrip()[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    if pending:
        out.append(pending)
    return out
