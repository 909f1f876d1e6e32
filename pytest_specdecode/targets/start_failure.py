"""Why a server did not start: the first error of each of its processes, read from its log.

vLLM runs as several processes (the API server, the engine core, its workers), each line of
its log prefixed with the process, e.g. `(EngineCore_DP0 pid=123) ERROR 12-02 10:46:20
[core.py:1510] ...`. The last lines are usually the API server's "Engine core initialization
failed. See root cause above": the cause sits earlier, in another process. Pure: lines in,
findings out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_PREFIX = re.compile(r"\((?P<name>[A-Za-z_][\w.:-]*) pid=(?P<pid>\d+)\)\s?")
# A logging record after the prefix: LEVEL MM-DD HH:MM:SS [file.py:123] message
_RECORD = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s?(?P<message>.*)$"
)
# multiprocessing's header before a child's unprefixed traceback: "Process EngineCore:"
_CHILD_HEADER = re.compile(r"^Process (?P<name>[\w.:-]+):$")
# An exception line is not indented (a traceback's source lines are): "ValueError: ..."
_EXCEPTION_START = re.compile(r"^(?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt): \S")
_EXCEPTION_ANYWHERE = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception|Exit)\b: ")
_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = ("Process ", "During handling of the above exception", "The above exception was")
_QUIET_LEVELS = ("DEBUG", "INFO", "WARNING")
_MAX_CHARS = 300
# argparse's refusal of the command line: "api_server.py: error: argument --speculative-config:"
_ARGPARSE = re.compile(r"^\S+: error: (?:argument |unrecognized arguments|the following arguments)")
# An error that a second start would repeat: the configuration refused (validation, a value, a
# type, an unknown or unsupported option) or a package the method needs missing
_REFUSAL = re.compile(
    r"^(?:[\w.]*\.)?(?:ValueError|TypeError|ValidationError|NotImplementedError|ImportError"
    r"|ModuleNotFoundError|ArgumentError|ArgumentTypeError)\b"
    r"|validation errors? for |unrecognized|not supported|unsupported|invalid choice",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ProcessError:
    """The first error one process of the server logged."""

    process: str  # e.g. "EngineCore pid=20984", or "EngineCore" from an unprefixed traceback
    text: str  # e.g. "ModuleNotFoundError: No module named 'flashinfer'"
    line: int  # where in the log, to tell which came first


def first_errors(lines: Sequence[str]) -> list[ProcessError]:
    """Per process, its first exception line (else its first ERROR record), in log order.

    Unprefixed lines belong to the process named by the last "Process NAME:" header, else to
    the first process that logged (the server's main process, which logs first)."""
    found: dict[str, ProcessError] = {}
    fallback: dict[str, ProcessError] = {}  # a process's first ERROR record, without exception
    names: dict[str, str] = {}  # pid: the process's first name (a worker renames itself)
    main: str | None = None
    child: str | None = None
    previous = ""
    for number, raw in enumerate(lines):
        line = _ANSI.sub("", raw).rstrip()
        prefix = _PREFIX.search(line)
        if prefix:
            process = f"{names.setdefault(prefix['pid'], prefix['name'])} pid={prefix['pid']}"
            main = main or process
            child = None
            message = line[prefix.end() :]
            record = _RECORD.match(message)
            if record:
                if record["level"] in _QUIET_LEVELS:
                    continue
                message = record["message"]
                if record["level"] in ("ERROR", "CRITICAL") and message.strip():
                    fallback.setdefault(process, ProcessError(process, _cut(message), number))
        else:
            stripped = line.strip()
            header = _CHILD_HEADER.match(stripped)
            if header:
                child, previous = header["name"], stripped
                continue
            if stripped == _TRACEBACK and not previous.startswith(_CHAINED):
                child = None  # a new traceback, not the child's: the main process's
            if stripped:
                previous = stripped
            process = child or main or "server"
            message = line
        if process not in found and _EXCEPTION_START.match(message):
            found[process] = ProcessError(process, _cut(message), number)
    for process, error in fallback.items():
        found.setdefault(process, error)
    merged = _merge_unprefixed(found)
    return sorted(merged.values(), key=lambda e: e.line)


def _merge_unprefixed(found: dict[str, ProcessError]) -> dict[str, ProcessError]:
    """A child's unprefixed traceback ("Process EngineCore:") repeats what the prefixed
    process of that name (EngineCore pid=…) logged: keep the prefixed one."""
    prefixed = {key.split(" pid=")[0] for key in found if " pid=" in key}
    return {k: v for k, v in found.items() if " pid=" in k or k not in prefixed}


def config_refusal(lines: Sequence[str]) -> str | None:
    """The line by which vLLM refused the configuration of a start that died, or None where it
    died for another reason (which a second start may not repeat).

    Read from the start's errors only (argparse's, and each process's first error), never its
    warnings: vLLM warns "not supported" on starts that serve."""
    for raw in lines:
        line = _ANSI.sub("", raw).strip()
        if _ARGPARSE.match(line):
            return _cut(line)
    for error in first_errors(lines):
        if _REFUSAL.search(error.text):
            return error.text
    return None


def root_cause(errors: Sequence[ProcessError]) -> ProcessError | None:
    """The earliest error in the log: the others are usually its echo up the processes."""
    return min(errors, key=lambda e: e.line, default=None)


def last_exception(lines: Sequence[str]) -> str | None:
    """The last exception line of a log tail, as Python prints it: what killed the server, when
    its log names no processes."""
    found = [_ANSI.sub("", line).strip() for line in lines if _EXCEPTION_ANYWHERE.search(line)]
    if not found:
        return None
    line = found[-1]
    return _cut(line[_EXCEPTION_ANYWHERE.search(line).start() :])  # type: ignore[union-attr]


def failure_lines(errors: Sequence[ProcessError]) -> list[str]:
    """The first error of each process, one line each, for a failure's message."""
    return [f"  {e.process}: {e.text}" for e in errors]


def _cut(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_CHARS else text[: _MAX_CHARS - 1] + "…"
