"""A unit's environment, and its ExecStart expanded with it, the way systemd does. Pure functions.

systemd expands `${VAR}` and `$VAR` in ExecStart when it starts the unit, from (later wins):
1. the manager's own environment (`systemctl show-environment`);
2. `Environment=` of the unit and its drop-ins, in order (an empty `Environment=` resets);
3. the files of `EnvironmentFile=`, in order (`-` before the path: a missing file is skipped).

`systemctl show -p Environment -p EnvironmentFiles` reports 2 and the list of 3 as systemd has
merged them from the unit and its drop-ins; the files themselves are read as they are now.

The rules followed are systemd 252's, checked against it (Debian 12):
- a word that is `$NAME` as a whole becomes the value split at whitespace: no word when unset;
- `${NAME}` inside a word becomes the value, or nothing when unset;
- `$$` is `$`; a `$` before anything else, and `${…}` around an invalid name, stay as written
  (no `${NAME:-default}`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import ConfigError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_WHITESPACE = " \t\n\r"
# Set by systemd itself for each start, so never known beforehand: references stay as written.
_SET_AT_START_NAMES = """
    INVOCATION_ID SYSTEMD_EXEC_PID JOURNAL_STREAM NOTIFY_SOCKET MAINPID MANAGERPID USER LOGNAME
    HOME SHELL RUNTIME_DIRECTORY STATE_DIRECTORY CACHE_DIRECTORY LOGS_DIRECTORY
    CONFIGURATION_DIRECTORY CREDENTIALS_DIRECTORY LISTEN_FDS LISTEN_PID LISTEN_FDNAMES
    WATCHDOG_PID WATCHDOG_USEC PIDFILE
"""
SET_AT_START = frozenset(_SET_AT_START_NAMES.split())


@dataclass(frozen=True)
class UnitEnvironment:
    """What a unit's ExecStart is expanded with, and where each value came from."""

    values: dict[str, str] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)  # name -> where its value was found
    looked_in: tuple[str, ...] = ()  # every place looked, in systemd's order

    @classmethod
    def merge(
        cls,
        manager: Mapping[str, str],
        assignments: Sequence[str],
        files: Sequence[tuple[str, bool, Mapping[str, str] | None]],
    ) -> UnitEnvironment:
        """The environment in systemd's order; `files` as (path, optional, values or None)."""
        values: dict[str, str] = {}
        origin: dict[str, str] = {}
        looked = ["the manager's environment (systemctl show-environment)"]
        for name, value in manager.items():
            values[name], origin[name] = value, looked[0]
        looked.append("Environment= of the unit and its drop-ins")
        for assignment in assignments:
            name, _, value = assignment.partition("=")
            values[name], origin[name] = value, "Environment="
        for path, optional, content in files:
            shown = f"EnvironmentFile={'-' if optional else ''}{path}"
            if content is None:
                looked.append(f"{shown} (missing: skipped, as systemd does)")
                continue
            looked.append(shown)
            for name, value in content.items():
                values[name], origin[name] = value, shown
        return cls(values, origin, tuple(looked))

    def describe(self, names: Sequence[str]) -> str:
        """`NAME from WHERE` for each name, values left out (they may be secrets)."""
        return ", ".join(f"{n} from {self.origin.get(n, 'nowhere')}" for n in names)


@dataclass(frozen=True)
class Expansion:
    argv: list[str]
    used: list[str]  # the variables the words referred to, in order, once each
    unset: list[str]  # those of them that are set nowhere


def expand_words(words: Sequence[str], env: UnitEnvironment) -> Expansion:
    """The words as systemd passes them to the process (see the module's rules)."""
    argv: list[str] = []
    used: list[str] = []
    unset: list[str] = []

    def look(name: str) -> str | None:
        if name not in used:
            used.append(name)
        value = env.values.get(name)
        if value is None and name not in unset:
            unset.append(name)
        return value

    for word in words:
        if word.startswith("$") and word[1:2] not in ("{", "$"):
            name = word[1:]
            if name in SET_AT_START:
                argv.append(word)
                continue
            value = look(name)
            argv += [w for w in re.split(f"[{_WHITESPACE}]+", value or "") if w]
            continue
        argv.append(_replace_in_word(word, look))
    return Expansion(argv, used, unset)


def _replace_in_word(word: str, look) -> str:
    out: list[str] = []
    i = 0
    while i < len(word):
        ch = word[i]
        if ch == "$" and word[i + 1 : i + 2] == "$":
            out.append("$")
            i += 2
        elif ch == "$" and word[i + 1 : i + 2] == "{":
            end = word.find("}", i + 2)
            name = word[i + 2 : end] if end >= 0 else ""
            if end < 0 or not _NAME.match(name) or name in SET_AT_START:
                out.append(word[i : end + 1] if end >= 0 else word[i:])
                i = end + 1 if end >= 0 else len(word)
                continue
            out.append(look(name) or "")
            i = end + 1
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def refuse_unset(expansion: Expansion, env: UnitEnvironment, *, where: str) -> None:
    """A variable that ExecStart uses and nothing sets: refused, with where it was looked for."""
    if not expansion.unset:
        return
    names = ", ".join(f"${{{n}}}" for n in expansion.unset)
    raise ConfigError(
        f"{where}: ExecStart uses {names}, which is set nowhere systemd looks: "
        f"{'; '.join(env.looked_in)}. systemd would pass an empty string, so this tool cannot "
        "tell what the unit runs. Set it there (even to an empty value). Nothing was touched"
    )


# ---------------------------------------------------------------------------- systemd's outputs


def parse_show_environment(value: str) -> list[str]:
    """`systemctl show -p Environment`'s value: NAME=VALUE words, quoted and C-escaped."""
    return [w for w in _c_words(value) if "=" in w and _NAME.match(w.split("=", 1)[0])]


def parse_environment_files(lines: Sequence[str]) -> list[tuple[str, bool]]:
    """`EnvironmentFiles=PATH (ignore_errors=yes|no)` lines as (path, optional)."""
    out = []
    for line in lines:
        found = re.match(r"^(?:EnvironmentFiles=)?(.+) \(ignore_errors=(yes|no)\)$", line.strip())
        if found:
            out.append((found.group(1), found.group(2) == "yes"))
    return out


def parse_manager_environment(text: str) -> dict[str, str]:
    """`systemctl show-environment`: one NAME=VALUE a line, values shell-quoted when needed."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and _NAME.match(name):
            out[name] = _unquote_shell(value)
    return out


def _c_words(text: str) -> list[str]:
    """Words split at whitespace; "…" with C escapes, '…' literal (systemd's quoting)."""
    words: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            i += 1
            continue
        out: list[str] = []
        while i < n and not text[i].isspace():
            ch = text[i]
            if ch == '"':
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        decoded, i = _c_escape(text, i + 1)
                        out.append(decoded)
                    else:
                        out.append(text[i])
                        i += 1
                i += 1
            elif ch == "'":
                end = text.find("'", i + 1)
                end = n if end < 0 else end
                out.append(text[i + 1 : end])
                i = end + 1
            elif ch == "\\" and i + 1 < n:
                decoded, i = _c_escape(text, i + 1)
                out.append(decoded)
            else:
                out.append(ch)
                i += 1
        words.append("".join(out))
    return words


_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def _c_escape(text: str, i: int) -> tuple[str, int]:
    """The character escaped at text[i] (after the backslash), and the index after it."""
    ch = text[i]
    if ch in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[ch], i + 1
    if ch == "x" and re.match(r"[0-9a-fA-F]{2}", text[i + 1 : i + 3]):
        return chr(int(text[i + 1 : i + 3], 16)), i + 3
    if ch == "u" and re.match(r"[0-9a-fA-F]{4}", text[i + 1 : i + 5]):
        return chr(int(text[i + 1 : i + 5], 16)), i + 5
    if re.match(r"[0-7]{3}", text[i : i + 3]):
        return chr(int(text[i : i + 3], 8)), i + 3
    return ch, i + 1


def _unquote_shell(value: str) -> str:
    """A value as show-environment prints it: as is, or $'…' with C escapes when it must be."""
    if not (value.startswith("$'") and value.endswith("'") and len(value) >= 3):
        return value
    inner, out, i = value[2:-1], [], 0
    while i < len(inner):
        if inner[i] == "\\" and i + 1 < len(inner):
            decoded, i = _c_escape(inner, i + 1)
            out.append(decoded)
        else:
            out.append(inner[i])
            i += 1
    return "".join(out)


# ------------------------------------------------------------------------------ EnvironmentFile=


def parse_env_file(text: str) -> dict[str, str]:
    """An EnvironmentFile's assignments, by systemd's rules.

    `#`/`;` lines are comments; `NAME=VALUE`, with whitespace around both trimmed; a value in
    '…' is literal, in "…" takes backslash escapes of " \\ ` $ only; unquoted, a backslash
    escapes the next character; a backslash at the end of a line continues it. Lines whose name
    is invalid (`export NAME=…`) are ignored, as systemd ignores them (with a warning).
    """
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            continue
        start = i
        while i < n and text[i] not in "=\n":
            i += 1
        if i >= n or text[i] == "\n":
            continue  # no '=': not an assignment
        name = text[start:i].strip()
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        value, i = _env_value(text, i)
        if _NAME.match(name):
            out[name] = value
    return out


def _env_value(text: str, i: int) -> tuple[str, int]:
    """One value from text[i:] (after `=` and its blanks), by systemd's states; the index after.

    After a closing quote, blanks are skipped and another quoted or bare part may follow; in a
    bare part, quotes are literal and trailing blanks are trimmed.
    """
    out: list[str] = []
    n = len(text)
    bare_blanks = 0  # bare whitespace at the end of out, trimmed at the end of the line
    while i < n and text[i] != "\n":
        ch = text[i]
        if ch == "'":
            end = text.find("'", i + 1)
            end = n if end < 0 else end
            out.append(text[i + 1 : end])
            i, bare_blanks = _skip_blanks(text, end + 1), 0
            continue
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt in '"\\`$':
                        out.append(nxt)
                    elif nxt != "\n":
                        out.append("\\" + nxt)
                    i += 2
                else:
                    out.append(text[i])
                    i += 1
            i, bare_blanks = _skip_blanks(text, i + 1), 0
            continue
        while i < n and text[i] != "\n":  # a bare part, to the end of the line
            ch = text[i]
            if ch == "\\" and i + 1 < n:
                if text[i + 1] != "\n":
                    out.append(text[i + 1])
                i, bare_blanks = i + 2, 0
                continue
            out.append(ch)
            bare_blanks = bare_blanks + 1 if ch in " \t" else 0
            i += 1
    value = "".join(out)
    return (value[: len(value) - bare_blanks] if bare_blanks else value), i


def _skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i
