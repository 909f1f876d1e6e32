"""Progress lines: shown live, past pytest's capture, and kept in the run's log."""

from __future__ import annotations

import contextlib
import sys
import time
from collections import deque
from datetime import UTC, datetime
from pathlib import Path
from typing import TextIO

import pytest

from .redaction import redact_text

STEPS_KEPT = 500  # the recent lines and steps a cut run's step is looked up in


class ProgressLog:
    """Progress lines shown live (past pytest's capture) and kept in the run's log.

    Lines before the run folder exists are kept and written to the log when it opens. It also
    keeps the run's recent steps (`step`, not shown), each with its wall time, so that a cut
    run can say what it was doing (`step_at`).
    """

    def __init__(self, config: pytest.Config, *, stream: TextIO | None = None) -> None:
        self._start = time.monotonic()
        self._capman = config.pluginmanager.get_plugin("capturemanager")
        self._stream = stream
        self._log: Path | None = None
        self._pending: list[str] = []
        # (wall time, text, whether a step) of the recent lines and steps
        self._recent: deque[tuple[float, str, bool]] = deque(maxlen=STEPS_KEPT)

    def open(self, path: Path) -> None:
        self._log = path
        with path.open("a") as log:
            log.writelines(self._pending)
        self._pending = []

    def step(self, text: str) -> None:
        """What the run is doing from now on, e.g. "measuring slot 3 of 24 (coding) on
        baseline": kept, not shown."""
        self._recent.append((time.time(), redact_text(text), True))

    def step_at(self, wall: float) -> str | None:
        """The run's step at this wall time: the last step set before it, else the last line
        shown before it (None: nothing yet)."""
        before = [(text, is_step) for at, text, is_step in self._recent if at <= wall]
        steps = [text for text, is_step in before if is_step]
        if steps:
            return steps[-1]
        return f"after the line '{before[-1][0]}'" if before else None

    def __call__(self, message: str) -> None:
        message = redact_text(message)
        self._recent.append((time.time(), message, False))
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
