"""Signals this controller receives: the first hands every watched target's restore over.

On the first interrupt of any kind (Ctrl-C, SIGTERM, SIGHUP), the restore is handed over at once,
from the signal handler, before anything unwinds: the systemd backend starts its host-side
restore, which completes even if this controller is killed a second later; the local backend
sends SIGTERM to its server at once. From then on the controller only observes (lifecycle.py →
`Switchboard.restore` waits for the handover, then watches the host).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from .base import Progress, Target

HANDOVER_WAIT_S = 20.0  # how long the unwinding waits for the handover to reach the host


class Interrupts:
    """Signals this controller received. The first hands every watched target's restore over."""

    def __init__(self) -> None:
        self.signals: list[str] = []
        self.first_at: float | None = None
        self._watched: list[tuple[Target, Progress]] = []
        self._thread: threading.Thread | None = None
        self.handed_over: str | None = None
        self.handover_s: float | None = None

    def watch(self, target: Target, progress: Progress) -> None:
        if not self._watched:  # a new experiment: forget an earlier one's signals
            self.__init__()  # type: ignore[misc]
        self._watched.append((target, progress))

    def unwatch(self, target: Target) -> None:
        self._watched = [(t, p) for t, p in self._watched if t is not target]

    def signalled(self, signum: int) -> None:
        """Called from the signal handler, before it raises KeyboardInterrupt."""
        self.signals.append(_signal_name(signum))
        if len(self.signals) > 1 or not self._watched:
            return
        self.first_at = time.monotonic()
        # A thread of its own: a second signal raising in the main thread cannot cut it short,
        # and interpreter exit waits for it (non-daemon).
        self._thread = threading.Thread(
            target=self._hand_over, args=(list(self._watched),), name="specdecode-handover"
        )
        self._thread.start()

    def handover(self, target: Target, timeout_s: float = HANDOVER_WAIT_S) -> str | None:
        """Wait (bounded) for the handover started by the first signal; what it did, or None."""
        if self._thread is not None:
            self._thread.join(timeout_s)
        return self.handed_over if any(t is target for t, _ in self._watched) else None

    def _hand_over(self, watched: list[tuple[Target, Progress]]) -> None:
        for target, progress in watched:
            reason = f"interrupted by {self.signals[0]}"
            try:
                done = target.hand_over(reason)
            except Exception as exc:  # the controller restores itself, as without a handover
                _say(progress, f"{reason}: handing the restore to the host failed: {exc}")
                continue
            if done:
                self.handed_over = done
                self.handover_s = time.monotonic() - (self.first_at or time.monotonic())
                _say(progress, f"{reason}: the restore was handed over at once: {done}")


INTERRUPTS = Interrupts()


def note_signal(signum: int) -> None:
    """For the signal handlers: record the signal and, the first time, hand over."""
    INTERRUPTS.signalled(signum)


def interrupt_on_signals(progress: Progress | None = None) -> None:
    """SIGTERM (a cancelled CI job), SIGHUP (a closed terminal) and Ctrl-C all unwind like
    Ctrl-C, so the restore runs; the first of them first hands the restore to the host.
    Handlers someone else installed are left alone, and so is a SIGINT ignored on entry (a
    background job of a script, `cmd &`, starts so): `progress` is told that Ctrl-C cannot cut
    the run. Installed by the plugin for a run."""

    def interrupt(signum: int, frame: object) -> None:
        note_signal(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    for sig, default in (
        (signal.SIGTERM, signal.SIG_DFL),
        (signal.SIGHUP, signal.SIG_DFL),
        (signal.SIGINT, signal.default_int_handler),
    ):
        try:
            if signal.getsignal(sig) in (default, None):
                signal.signal(sig, interrupt)
        except ValueError:  # not the main thread
            return
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN and progress is not None:
        cut = [s.name for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) is interrupt]
        still = f"; {' or '.join(cut)} still can" if cut else ""
        progress(
            "SIGINT is ignored in this process (started in the background?): Ctrl-C cannot cut "
            f"this run{still}"
        )


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _say(progress: Progress, message: str) -> None:
    with contextlib.suppress(Exception):  # a progress line must never cost the handover
        progress(message)
