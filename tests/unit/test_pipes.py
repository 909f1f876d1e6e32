"""The real tests' pipe reader (tests/support/pipes.py): nothing read ahead is lost."""

from __future__ import annotations

import subprocess
import sys

from ..support.pipes import finish

TWO_LINES = "import sys; sys.stderr.write('first\\nsecond\\n'); sys.stderr.flush()"


def _started() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", TWO_LINES], stderr=subprocess.PIPE, text=True
    )  # fmt: skip
    assert proc.stderr is not None
    assert next(iter(proc.stderr)) == "first\n"  # the wrapper has read "second" ahead
    return proc


def test_finish_returns_the_lines_read_ahead_that_communicate_loses() -> None:
    assert finish(_started(), 30) == ("", "second\n")
    lost = _started()
    assert lost.communicate(timeout=30) == (None, "")  # why the real tests use finish
