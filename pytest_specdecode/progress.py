"""Progress lines: shown live, past pytest's capture, and kept in the run's log."""

from __future__ import annotations

import contextlib
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import pytest

from .redaction import redact_text


class ProgressLog:
    """Progress lines shown live (past pytest's capture) and kept in the run's log.

    Lines before the run folder exists are kept and written to the log when it opens.
    """

    def __init__(self, config: pytest.Config, *, stream: TextIO | None = None) -> None:
        self._start = time.monotonic()
        self._capman = config.pluginmanager.get_plugin("capturemanager")
        self._stream = stream
        self._log: Path | None = None
        self._pending: list[str] = []

    def open(self, path: Path) -> None:
        self._log = path
        with path.open("a") as log:
            log.writelines(self._pending)
        self._pending = []

    def __call__(self, message: str) -> None:
        message = redact_text(message)
        stamped = f"{datetime.now(UTC).isoformat(timespec='seconds')} {message}\n"
        if self._log is None:
            self._pending.append(stamped)
        else:
            with self._log.open("a") as log:
                log.write(stamped)
        line = f"[specdecode {time.monotonic() - self._start:6.0f}s] {message}"
        if self._capman is not None:
            with self._capman.global_and_fixture_disabled():
                write_line(line, self._stream)
        else:
            write_line(line, self._stream)


def write_line(text: str, stream: TextIO | None = None) -> None:
    """To the terminal, if there still is one: a closed or broken one (EPIPE, EIO) is ignored."""
    stream = stream or sys.__stderr__ or sys.stderr
    with contextlib.suppress(OSError, ValueError):
        stream.write(text + "\n")
        stream.flush()
