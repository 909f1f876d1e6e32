"""systemd unit files: read the original's ExecStart, render a candidate's drop-in. Pure functions.

A candidate runs as the production unit itself, changed only by a runtime drop-in:

    /run/systemd/system/<unit>.d/zz-pytest-specdecode.conf
    [Service]
    ExecStart=
    ExecStart=<the original's command, its raw words reused verbatim> --speculative-config "<JSON>"

With a shape (config/shape/served.py), the same drop-in serves the shape: its model replaced by
the shape's folder, `--load-format dummy`, `--tokenizer`, `--hf-overrides`, and the shape's
`Environment=`; the shape's baseline is that drop-in without `--speculative-config`.

Specifiers (%i, %n, …), ${VAR}, EnvironmentFile=, User=, ExecStartPre=, the dependencies and the
unit's name all stay the unit's own: nothing is copied. /run is cleared at boot, so a reboot
brings back the original by itself. Nothing is ever written to /etc/systemd/system.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...config.specconfig import SpecConfig
from ...config.target import check_unit_name
from ...config.vllm_argv import (
    SPEC_FLAG,
    ServerCommand,
    parse_server_command,
    spec_flag_positions,
)
from ...errors import ConfigError
from ...redaction import redact_text
from .unit_environment import UnitEnvironment, expand_words, refuse_unset

if TYPE_CHECKING:
    from ...config.shape.served import ServedShape

ANY_UNIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9:_.@\\-]{0,250}\.[a-z]{3,9}$")
RUNTIME_UNIT_DIR = "/run/systemd/system"
PERSISTENT_UNIT_DIR = "/etc/systemd/system"  # never written by this tool
# systemd applies drop-ins in the order of their file names, across directories: ours sorts after
# the usual override.conf and NN-name.conf, and the preflight refuses any that would follow it.
DROPIN_NAME = "zz-pytest-specdecode.conf"
DROPIN_MARK = "# Written by pytest-specdecode"
# An ExecStart prefix that changes how the words are read ("@" takes argv[0] apart, ":" turns off
# $VAR expansion, "|" runs a shell) is refused; these only change privileges or failure handling.
_KEPT_PREFIX = set("-+!")


# A shape's files (shape.py): a folder of each run's, <root>/<run>/shape/config.json (and the map's
# drafters beside it, <root>/<run>/map-drafters/…), 0755 so that a unit's User= reads them
SHAPE_ROOT = "/run/pytest-specdecode-shape"
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,199}")


def shape_folder(run: str) -> str:
    """The shape's folder on the host for the run named `run` (its reports folder's name; made
    plain), `<SHAPE_ROOT>/<run>/shape`."""
    plain = re.sub(r"[^A-Za-z0-9._-]", "_", run).lstrip(".-") or "run"
    return checked_path(f"{SHAPE_ROOT}/{plain[:200]}/shape")


def checked_path(path: str) -> str:
    """`path` if it lies in one run's folder under SHAPE_ROOT, each of its names plain, else
    ValueError: nothing else is ever created or removed there."""
    names = path.removeprefix(SHAPE_ROOT + "/").split("/")
    if not path.startswith(SHAPE_ROOT + "/") or len(names) < 2:
        raise ValueError(f"not a path in a run's folder under {SHAPE_ROOT}: {path!r}")
    if not all(_PLAIN.fullmatch(name) for name in names):
        raise ValueError(f"not a plain path under {SHAPE_ROOT}: {path!r}")
    return path


def run_folder(path: str) -> str:
    """The run's own folder under SHAPE_ROOT that holds `path` (what its restore removes)."""
    return f"{SHAPE_ROOT}/{checked_path(path).removeprefix(SHAPE_ROOT + '/').split('/')[0]}"


def dropin_path(unit: str) -> str:
    """Where a candidate's drop-in goes: runtime only, for this unit (or instance) alone."""
    return f"{RUNTIME_UNIT_DIR}/{check_unit_name(unit)}.d/{DROPIN_NAME}"


@dataclass(frozen=True)
class Token:
    raw: str  # as written in the unit file, quotes and all
    value: str  # what the process receives (before systemd's $VAR and % expansion)


@dataclass(frozen=True)
class ExecStart:
    """The command systemd runs for the unit, as its raw words and as what they mean."""

    prefix: str
    tokens: tuple[Token, ...]
    server: ServerCommand

    @property
    def argv(self) -> list[str]:
        return [t.value for t in self.tokens]


@dataclass(frozen=True)
class ExpandedExecStart:
    """The command as the process receives it: systemd's specifiers and variables resolved."""

    argv: list[str]
    server: ServerCommand  # read from argv: a container's image, name, ports; the server's args
    used: list[str]  # the variables it refers to
    env: UnitEnvironment

    @property
    def server_argv(self) -> list[str]:
        return self.argv[self.server.server_args :]

    def sources(self) -> str:
        """Where each variable it uses comes from (names only: values may be secrets)."""
        return self.env.describe(self.used)


def expand_exec_start(
    exec_start: ExecStart,
    env: UnitEnvironment,
    *,
    where: str,
    images: Sequence[str] | None = (),
    words: Sequence[str] | None = None,
) -> ExpandedExecStart:
    """ExecStart expanded with the unit's environment, as systemd will when it starts it.

    `words`: the command's words as systemd itself reports them (specifiers resolved); when
    absent, or not word for word the unit file's, the unit file's are used. A variable set
    nowhere is refused.
    """
    if words is None or len(words) != len(exec_start.tokens):
        words = exec_start.argv
    expansion = expand_words(words, env)
    refuse_unset(expansion, env, where=where)
    try:
        server = parse_server_command(expansion.argv, where=where, images=images)
    except ConfigError as exc:  # the expanded words may hold a value of a secret
        raise ConfigError(redact_text(str(exc))) from None
    return ExpandedExecStart(expansion.argv, server, expansion.used, env)


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


def unit_files(unit_text: str) -> list[tuple[str, str]]:
    """`systemctl cat` output as (path, text) per file, in the order systemd applies them."""
    files: list[tuple[str, list[str]]] = []
    for line in unit_text.splitlines():
        if line.startswith("# /") and (not files or _looks_like_header(line)):
            files.append((line[2:].strip(), []))
        elif files:
            files[-1][1].append(line)
        else:
            files.append(("", [line]))
    return [(path, "\n".join(lines)) for path, lines in files]


def _looks_like_header(line: str) -> bool:
    path = line[2:].strip()
    return path.endswith((".service", ".conf")) and " " not in path


def own_dropins(unit_text: str) -> list[tuple[str, str]]:
    """Drop-ins of this tool in `systemctl cat` output: a candidate may be configured."""
    return [(p, t) for p, t in unit_files(unit_text) if p.endswith("/" + DROPIN_NAME)]


def effective_exec_start(
    unit_text: str, *, where: str, images: Sequence[str] | None = ()
) -> ExecStart:
    """The ExecStart that systemd will run, from `systemctl cat` output (drop-ins included).

    Refuses what it cannot safely rewrite.
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
    if set(prefix) - _KEPT_PREFIX:
        raise ConfigError(
            f"{where}: ExecStart prefix {prefix!r} changes how systemd reads the command; only "
            "'-', '+' and '!' are supported"
        )
    tokens = split_exec(value[len(prefix) :])
    if any(t.raw == ";" for t in tokens):
        raise ConfigError(f"{where}: ExecStart holds several commands (';'); expected one")
    server = parse_server_command([t.value for t in tokens], where=where, images=images)
    return ExecStart(prefix, tuple(tokens), server)


def candidate_exec_start(
    unit_text: str, spec: SpecConfig, *, where: str, images: Sequence[str] | None = ()
) -> str:
    """The original's ExecStart plus `--speculative-config JSON`, replacing any it had.

    The original's words are reused as written (they are the unit's own: its specifiers and
    variables keep their meaning); only the JSON is quoted here. The A/A candidate keeps the
    original's ExecStart as it is.
    """
    exec_start = effective_exec_start(unit_text, where=where, images=images)
    if spec.is_original:  # the A/A candidate: the original's command as it is; a control: plus
        words = [t.raw for t in exec_start.tokens] + list(map(quote_arg, spec.extra_args))
        return exec_start.prefix + " ".join(words)
    drop = spec_flag_positions(exec_start.argv, exec_start.server.server_args)
    kept = [t.raw for i, t in enumerate(exec_start.tokens) if i not in drop]
    added = [SPEC_FLAG, quote_arg(spec.to_json()), *map(quote_arg, spec.extra_args)]
    return exec_start.prefix + " ".join([*kept, *added])


def shape_exec_start(
    unit_text: str,
    served: ServedShape,
    spec: SpecConfig | None,
    *,
    where: str,
    images: Sequence[str] | None = (),
) -> str:
    """The original's ExecStart serving the shape (`ServedShape.words`: the unit's own words
    reused as written, the new ones quoted here); a candidate's plus `--speculative-config
    JSON`, replacing any the unit had; spec None: the shape's baseline."""
    exec_start = effective_exec_start(unit_text, where=where, images=images)
    words = served.words(exec_start.argv, where=where, images=images)
    values = [exec_start.argv[w] if isinstance(w, int) else w for w in words]
    raw = [exec_start.tokens[w].raw if isinstance(w, int) else _new_word(w) for w in words]
    if spec is not None and not spec.is_original:
        start = parse_server_command(values, where=where, images=images).server_args
        drop = spec_flag_positions(values, start)
        raw = [r for i, r in enumerate(raw) if i not in drop]
        raw += [SPEC_FLAG, quote_arg(spec.to_json())]
    if spec is not None:
        raw += map(quote_arg, spec.extra_args)
    return exec_start.prefix + " ".join(raw)


def _new_word(word: str) -> str:
    """A word the unit did not have: as it is where nothing in it means anything to systemd
    (a flag, a path), else quoted (`quote_arg`)."""
    return word if re.fullmatch(r"[A-Za-z0-9_./:@+,=-]+", word) else quote_arg(word)


def render_dropin(
    unit: str,
    unit_text: str,
    spec: SpecConfig | None,
    *,
    run_id: str,
    images: Sequence[str] | None = (),
    shape: ServedShape | None = None,
) -> str:
    """The candidate's drop-in: reset ExecStart, then the original's plus the speculative config.

    With a shape: the original's command serving the shape (`shape_exec_start`), and the shape's
    environment (a MoE's routing; a container's gets it with -e); spec None is the shape's
    baseline."""
    where = f"unit {unit}"
    check_dropin_wins(unit_text, where=where)
    if shape is not None:
        exec_start = shape_exec_start(unit_text, shape, spec, where=where, images=images)
        what = "the shape's baseline" if spec is None else f"candidate {spec.name!r} on the shape"
        what += f" {shape.label}"
    elif spec is not None:
        exec_start = candidate_exec_start(unit_text, spec, where=where, images=images)
        what = f"candidate {spec.name!r}"
    else:
        raise ValueError("render_dropin: a candidate's spec, or a shape")
    container = effective_exec_start(unit_text, where=where, images=images).server.image
    environment = {} if shape is None or container is not None else dict(shape.env)
    if spec is not None and spec.env:
        if container is not None:
            raise ConfigError(
                f"{where}: candidate {spec.name!r} needs {', '.join(sorted(spec.env))} in the "
                "server's environment, which a container unit's Environment= does not reach; "
                "that side change cannot be reproduced here"
            )
        environment.update(spec.env)
    return "\n".join(
        [
            f"{DROPIN_MARK} (run {run_id}): {what} for {unit}.",
            "# Runtime only: /run is cleared at boot, so a reboot brings back the original.",
            "# Removed when the run restores the original, or by its watchdog.",
            "[Service]",
            *_environment_lines(environment, where=where),
            "ExecStart=",
            f"ExecStart={exec_start}",
            "",
        ]
    )


def _environment_lines(env: Mapping[str, str], *, where: str) -> list[str]:
    """`Environment=NAME=value` for a control arm's variables or a shape's routing (after the
    unit's own, so they win); each a plain name and value, nothing a unit file would expand."""
    for name, value in env.items():
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name) or not re.fullmatch(r"[\w.,:/-]*", value):
            raise ConfigError(f"{where}: environment {name}={value!r} is not a plain variable")
    return [f"Environment={name}={value}" for name, value in sorted(env.items())]


def check_dropin_wins(unit_text: str, *, where: str) -> None:
    """Refuse when a drop-in applied after ours would set ExecStart again."""
    for path, text in unit_files(unit_text)[1:]:
        name = path.rsplit("/", 1)[-1]
        if name > DROPIN_NAME and any(
            re.match(r"\s*ExecStart\s*=", line) for line in _logical_lines(text)
        ):
            raise ConfigError(
                f"{where}: drop-in {path} sets ExecStart= and is applied after this tool's "
                f"{DROPIN_NAME} (systemd orders drop-ins by file name), so a candidate's "
                "command could not take effect; rename it to sort before "
                f"{DROPIN_NAME}. Nothing was touched"
            )


def dropin_run_id(text: str) -> str | None:
    """The run that wrote a drop-in of this tool, from its first line."""
    match = re.search(r"\(run ([^)\s]+)\)", text)
    return match.group(1) if match else None


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
