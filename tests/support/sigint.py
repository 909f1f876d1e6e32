"""SIGINT as a terminal's Ctrl-C finds it, for a test that sends one to its own process.

A process started in the background of a non-interactive shell (`nohup ... &`, as some CI
runners start jobs) inherits SIGINT ignored, and the plugin rightly leaves an ignored SIGINT
alone (targets/interrupts.py → `interrupt_on_signals`). So a test that relies on SIGINT raising
sets the disposition itself: `signal.default_int_handler`, then the plugin's own handler on
top, as a run installs it. Every handler it touched is put back afterwards. (A child pytest
run's conftest does the same with terminal.py's `SIGINT_AS_IN_A_TERMINAL`.)
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pytest_specdecode.targets import interrupts, lifecycle
from pytest_specdecode.targets.interrupts import Interrupts, interrupt_on_signals

TOUCHED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what interrupt_on_signals may set


@contextmanager
def plugin_sigint() -> Iterator[None]:
    """SIGINT reset to its default, then handled as the plugin's run handles it (the signal
    noted in `INTERRUPTS`, then KeyboardInterrupt in the main thread); restored on exit."""
    saved = {sig: signal.getsignal(sig) for sig in TOUCHED}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        interrupt_on_signals()
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(sig, handler)


def own_interrupts(monkeypatch: pytest.MonkeyPatch) -> Interrupts:
    """The test's own record of signals, in place of the run's global one: the plugin's handler
    (interrupts.py → `note_signal`) and every Switchboard made from now on (lifecycle.py) use
    it, so no signal of an earlier test is read, and none of this one is left behind."""
    own = Interrupts()
    monkeypatch.setattr(interrupts, "INTERRUPTS", own)
    monkeypatch.setattr(lifecycle, "INTERRUPTS", own)
    return own
