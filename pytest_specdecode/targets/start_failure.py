"""Why a server did not start: the first error of each of its processes, read from its log.

vLLM runs as several processes (the API server, the engine core, its workers), each line of
its log prefixed with the process, e.g. `(EngineCore_DP0 pid=123) ERROR 12-02 10:46:20
[core.py:1510] ...`. The last lines are usually the API server's "Engine core initialization
failed. See root cause above": the cause sits earlier, in another process. A start's log may
also hold the lines of the server before it (a unit's journal since the start, whose stop can
log `EngineDeadError`) or after it (its restarts), in either order: the cause is what the log
says caused the death, never the engine's death itself, wherever each line lands (`start_cause`).
Pure: lines in, findings out.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
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
# The engine's death told again, up the processes: never the cause where the log holds another
_ECHO = re.compile(
    r"EngineDeadError|Engine core initialization failed|See (?:the )?root cause above"
    r"|See stack trace (?:\(above\) )?for (?:the )?root cause"
)
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
    the server's main process: the first that logged, or the latest process of its name (the
    server started again, in a unit's journal)."""
    found: dict[str, ProcessError] = {}
    fallback: dict[str, ProcessError] = {}  # a process's first ERROR record, without exception
    for error in _errors(lines):
        if error.exception:
            found.setdefault(error.process, ProcessError(error.process, error.text, error.line))
        else:
            fallback.setdefault(error.process, ProcessError(error.process, error.text, error.line))
    for process, first in fallback.items():
        found.setdefault(process, first)
    merged = _merge_unprefixed(found)
    return sorted(merged.values(), key=lambda e: e.line)


@dataclass(frozen=True)
class _Error(ProcessError):
    exception: bool  # an exception line; else an ERROR or CRITICAL record's message


def _errors(lines: Sequence[str]) -> Iterator[_Error]:
    """Every exception line and every ERROR record of the log, with its process, in order."""
    names: dict[str, str] = {}  # pid: the process's first name (a worker renames itself)
    main: str | None = None
    main_name: str | None = None
    child: str | None = None
    previous = ""
    for number, raw in enumerate(lines):
        line = _ANSI.sub("", raw).rstrip()
        prefix = _PREFIX.search(line)
        if prefix:
            name = names.setdefault(prefix["pid"], prefix["name"])
            process = f"{name} pid={prefix['pid']}"
            if main is None or name == main_name:  # the server's main process, or its restart
                main, main_name = process, name
            child = None
            message = line[prefix.end() :]
            record = _RECORD.match(message)
            if record:
                if record["level"] in _QUIET_LEVELS:
                    continue
                message = record["message"]
                if record["level"] in ("ERROR", "CRITICAL") and message.strip():
                    yield _Error(process, _cut(message), number, exception=False)
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
        if _EXCEPTION_START.match(message):
            yield _Error(process, _cut(message), number, exception=True)


def _merge_unprefixed(found: dict[str, ProcessError]) -> dict[str, ProcessError]:
    """A child's unprefixed traceback ("Process EngineCore:") repeats what the prefixed
    process of that name (EngineCore pid=…) logged: keep the prefixed one."""
    prefixed = {key.split(" pid=")[0] for key in found if " pid=" in key}
    return {k: v for k, v in found.items() if " pid=" in k or k not in prefixed}


def config_refusal(lines: Sequence[str]) -> str | None:
    """The line by which vLLM refused the configuration of a start that died, or None where it
    died for another reason (which a second start may not repeat).

    Read from the start's errors only (argparse's, each process's first error, and every
    exception line, wherever it lands beside the engine's death), never its warnings: vLLM
    warns "not supported" on starts that serve."""
    for raw in lines:
        line = _ANSI.sub("", raw).strip()
        if _ARGPARSE.match(line):
            return _cut(line)
    errors = [*first_errors(lines), *(e for e in _errors(lines) if e.exception)]
    for error in sorted(errors, key=lambda e: e.line):
        if _REFUSAL.search(error.text):
            return error.text
    return None


def root_cause(errors: Sequence[ProcessError]) -> ProcessError | None:
    """The earliest error in the log that is not the engine's death told again (the others are
    usually its echo up the processes); the earliest echo where the log holds nothing else."""
    causes = [e for e in errors if not _ECHO.search(e.text)]
    return min(causes or errors, key=lambda e: e.line, default=None)


@dataclass(frozen=True)
class StartCause:
    """Why a start died, read from its whole log."""

    cause: str | None  # the refusal, else the root cause's text; None: the log names no error
    refused: str | None  # the line by which vLLM refused the configuration (`config_refusal`)
    pending: bool  # the log names the engine's death, not yet what caused it: more may come


def start_cause(lines: Sequence[str]) -> StartCause:
    """The cause of a start's death, whatever the order its lines arrived in."""
    refused = config_refusal(lines)
    errors = first_errors(lines)
    root = root_cause(errors)
    pending = refused is None and bool(errors) and all(_ECHO.search(e.text) for e in errors)
    pending = pending and all(_ECHO.search(e.text) for e in _errors(lines) if e.exception)
    return StartCause(refused or (root.text if root else None), refused, pending)


def settled(before: Sequence[str], now: Sequence[str]) -> bool:
    """Whether a dead start's log can be judged: it did not grow between two reads, and it does
    not name the engine's death without its cause (a journal behind its unit may still bring
    it)."""
    return list(now) == list(before) and not start_cause(now).pending


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
