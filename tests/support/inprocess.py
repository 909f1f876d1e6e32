"""The plugin run through pytester in this process: a fast test's pytest run without the
seconds a new interpreter takes to import pytest, numpy, scipy and the plugin.

What a run leaves in the process is put back: the signal handlers the plugin installs for a
run (`interrupt_on_signals`), and the progress lines, which the plugin writes to the
interpreter's own stderr (`sys.__stderr__`), go to the run's captured stderr as a subprocess's
would. Only for a conftest that changes nothing outside its own modules (no class patched in
the package): pytester restores `sys.modules`, not the attributes of modules it keeps.
"""

from __future__ import annotations

import signal
import sys
from typing import Any

import pytest

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
# Warnings only a run in this process gets, which a run of its own would not: the plugin is
# already imported (so not rewritten for asserts), and pytester's folder sets no asyncio scope.
# Without these, a run's summary line counts them ("1 failed, 1 passed, 2 warnings, ...")
# depending on which test ran first in the worker.
QUIET = (
    "-W",
    "ignore::pytest.PytestAssertRewriteWarning",
    "-o",
    "asyncio_default_fixture_loop_scope=function",
)


class _CurrentStderr:
    """`sys.__stderr__` for the run: whatever `sys.stderr` is at each write; the file
    descriptor (faulthandler's) is still the interpreter's."""

    def __init__(self, original: Any) -> None:
        self._original = original

    def fileno(self) -> int:
        return self._original.fileno()

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.stderr, name)


def run_in_process(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """`pytester.runpytest_inprocess(*args)`, the process as it was afterwards."""
    handlers = {sig: signal.getsignal(sig) for sig in SIGNALS}
    original = sys.__stderr__
    sys.__stderr__ = _CurrentStderr(original)  # type: ignore[misc,assignment]
    try:
        return pytester.runpytest_inprocess(*QUIET, *args)
    finally:
        sys.__stderr__ = original  # type: ignore[misc]
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
