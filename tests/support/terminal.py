"""A command in a pseudo-terminal of its own, as a person runs it: keys go to the terminal.

The command is the session leader with the pty as its controlling terminal, and it is the
terminal's foreground process group, so Ctrl-C (b"\\x03") makes the line discipline send SIGINT
to every process of that group (a shell pipeline's pytest and tee alike), as a terminal does.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import termios
import threading
import time
from collections.abc import Sequence

import pytest

# The head of a child pytest run's conftest where the run sends itself Ctrl-C: SIGINT as a
# terminal's Python finds it. A child of tests started with SIGINT ignored (a background job of
# a script: `nohup bash .ci/run &`) inherits it ignored, and the plugin rightly leaves it so.
SIGINT_AS_IN_A_TERMINAL = (
    "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
)


def _take_terminal() -> None:
    """In the child, after setsid: the pty on stdin becomes the controlling terminal, and
    Ctrl-C and a hang-up act as in a login shell, even if these tests were started in the
    background (`cmd &` in a script ignores SIGINT) or under nohup."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    default_signals()


def default_signals() -> None:
    """For a child's preexec_fn: SIGINT, SIGHUP and SIGTERM as a terminal's processes get them
    (nohup ignores SIGHUP, a script's background job SIGINT)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class Terminal:
    def __init__(self, argv: Sequence[str], *, cwd: str | None = None) -> None:
        self._master, slave = os.openpty()
        self.proc = subprocess.Popen(
            list(argv),
            stdin=slave,
            stdout=slave,
            stderr=slave,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_take_terminal,
        )
        os.close(slave)
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def output(self) -> str:
        return b"".join(self._chunks).decode(errors="replace").replace("\r\n", "\n")

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:  # EIO: every process holding the terminal is gone
                return
            if not data:
                return
            self._chunks.append(data)

    def write(self, data: bytes) -> None:
        os.write(self._master, data)

    def wait_for(self, text: str, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"never saw {text!r} in the terminal:\n{self.output[-5000:]}")
            time.sleep(0.5)

    def wait_exit(self, *, timeout_s: float) -> int:
        return self.proc.wait(timeout_s)

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(10)
        os.close(self._master)
