"""A run started with SIGINT ignored, as a background job of a script starts (`nohup bash
.ci/run < /dev/null > log 2>&1 &` from a non-interactive shell): the plugin leaves SIGINT
ignored, says that Ctrl-C cannot cut the run, and SIGTERM still cuts it and hands the restore
over. Seen in CI: such a run's own Ctrl-C test found SIGINT ignored (issue 48)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ...support.inprocess import run_in_process
from .test_gate import CONFTEST, write_gate

REPO = Path(__file__).resolve().parents[3]
SAID = "SIGINT is ignored in this process (started in the background?): Ctrl-C cannot cut this run"


@contextmanager
def dispositions(sigint: Any) -> Iterator[None]:
    """This process, as the run finds it: SIGINT as given, SIGTERM and SIGHUP as they come
    (even where these tests run under nohup or in the background); then as it was."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, sigint)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


SEEN_AT_THE_END = """

def pytest_sessionfinish(session):
    import signal
    from pathlib import Path
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    Path({path!r}).write_text("ignored" if ignored else "handled")
"""


def test_the_plugin_leaves_an_ignored_sigint_ignored_and_says_so(pytester: pytest.Pytester) -> None:
    seen = pytester.path / "sigint.txt"
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed()")
    conftest += SEEN_AT_THE_END.format(path=str(seen))
    with dispositions(signal.SIG_IGN):  # as a script's background job starts
        result = run_in_process(pytester, *write_gate(pytester, conftest))
    err = result.stderr.str()
    assert f"{SAID}; SIGTERM or SIGHUP still can" in err, err
    assert seen.read_text() == "ignored"  # through the whole run, to its end
    (run,) = (pytester.path / "reports").iterdir()
    assert SAID in (run / "run.log").read_text()  # said before the folder opened, kept


def test_a_run_started_in_a_terminal_says_nothing_of_sigint(pytester: pytest.Pytester) -> None:
    conftest = CONFTEST.format(base_coding="Speed()", cand_coding="Speed()")
    with dispositions(signal.default_int_handler):  # Python's own, started from a terminal
        result = run_in_process(pytester, *write_gate(pytester, conftest))
    assert "SIGINT is ignored" not in result.stderr.str()


# A run in a process of its own, SIGINT ignored from its start: it sends itself Ctrl-C while a
# candidate serves (nothing happens), then the test sends SIGTERM, which cuts it.
CHILD = """
import os
import signal
import time
from pytest_specdecode.targets import interrupts, lifecycle
from tests.support.standin_target import SPEC, StandInTarget
from tests.support.virtual_clock import VirtualTime

lifecycle.wait_until_ready = lambda service, **kw: 0.0
interrupts.interrupt_on_signals(print)  # what the plugin installs for a run
target = StandInTarget()
try:
    with lifecycle.experiment_services(
        target, ready_timeout_s=10, restore_timeout_s=60, progress=print,
        clock=VirtualTime().clock,
    ) as board:
        board.activate(SPEC)
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        print("measuring, SIGINT", "ignored" if ignored else "handled", flush=True)
        for _ in range(300):  # short sleeps: a signal is seen when a call returns
            time.sleep(0.1)
except KeyboardInterrupt:
    print("unwound", flush=True)
print("log:", target.log, flush=True)
"""


def _as_a_background_job() -> None:
    """A script's `cmd &`: SIGINT ignored; SIGTERM and SIGHUP as they come."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def test_ctrl_c_cannot_cut_it_and_sigterm_still_does() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_as_a_background_job,
    )
    try:
        assert child.stdout is not None
        lines = []
        for line in child.stdout:
            lines.append(line)
            if line.startswith("measuring"):
                break
        child.send_signal(signal.SIGTERM)
        out = "".join(lines) + child.communicate(timeout=20)[0]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == 0, out
    assert f"{SAID}; SIGTERM or SIGHUP still can" in out
    assert "measuring, SIGINT ignored" in out  # its own Ctrl-C cut nothing
    assert "run ending: interrupted by SIGTERM; the restore was handed over" in out
    assert "unwound" in out and "SIGINT" not in out.split("measuring, SIGINT ignored")[1]
