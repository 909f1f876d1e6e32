"""The restore's logic on a stand-in target, in milliseconds: what the first signal hands over,
what a second one ends, a handover that fails, the retries on a failing host and waiting out a
host that is away. The same paths run against the real systemd host in test_remote_host.py
(signals, the cancel sequence, a reboot)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_specdecode.errors import HostError, ServiceError
from pytest_specdecode.progress import ProgressLog
from pytest_specdecode.record.ending import RunEnding
from pytest_specdecode.targets import lifecycle
from pytest_specdecode.targets.interrupts import Interrupts
from pytest_specdecode.targets.lifecycle import experiment_services

from ...support.standin_target import SPEC, StandInTarget
from ...support.virtual_clock import VirtualTime

REPO = Path(__file__).resolve().parents[3]
SWAPPED_AND_RESTORED = [
    "stop original",
    "start candidate ngram",
    "stop candidate ngram",
    "start original",
    "close",
]


@pytest.fixture(autouse=True)
def no_http(monkeypatch):
    """The readiness wait asks the stand-in, not HTTP."""
    monkeypatch.setattr(lifecycle, "wait_until_ready", lambda service, **kw: 0.0)


def run(
    target: StandInTarget,
    body,
    interrupts: Interrupts,
    *,
    time: VirtualTime | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[RunEnding], list[str]]:
    """The restore after `body`, on virtual time (a retry's 5 s cost nothing); the endings
    recorded and the progress lines (unless `progress` takes them)."""
    endings: list[RunEnding] = []
    lines: list[str] = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(lifecycle, "INTERRUPTS", interrupts)
    try:
        with experiment_services(
            target,
            ready_timeout_s=10,
            restore_timeout_s=60,
            progress=progress or lines.append,
            record_ending=lambda e: endings.append(RunEnding(**e.to_dict())),
            clock=(time or VirtualTime()).clock,
        ) as board:
            body(board)
    except KeyboardInterrupt:
        pass
    finally:
        monkey.undo()
    return endings, lines


def interrupt(interrupts: Interrupts, sig: signal.Signals) -> None:
    """What the plugin's handler does: note the signal, then raise."""
    interrupts.signalled(sig)
    raise KeyboardInterrupt


def test_an_uninterrupted_run_restores_here_and_says_so():
    target = StandInTarget()
    endings, lines = run(target, lambda board: board.activate(SPEC), Interrupts())
    assert target.log == SWAPPED_AND_RESTORED
    assert endings[-1].how == "finished" and endings[-1].restore_observed is True
    assert endings[-1].restore_s is not None and not endings[-1].handed_over
    assert "restored to active and serving" in lines[-1] and "dependents active again" in lines[-1]


def test_the_first_signal_hands_over_and_the_controller_only_watches():
    target, interrupts = StandInTarget(), Interrupts()

    def body(board):
        board.activate(SPEC)
        interrupt(interrupts, signal.SIGINT)

    endings, lines = run(target, body, interrupts)
    # After the handover, the controller neither stops nor starts anything itself.
    assert target.log[2:] == ["hand over (interrupted by SIGINT)", "await host restore", "close"]
    first, last = endings[0], endings[-1]
    assert first.handed_over == "the stand-in host restores" and first.restore_observed is None
    assert last.signals == ["SIGINT"] and last.how == "interrupted"
    assert last.restore_observed is True and last.restore_s is not None
    assert any("run ending: interrupted by SIGINT; the restore was handed over" in x for x in lines)


def test_a_second_signal_ends_the_watching_without_claiming_a_failure():
    target, interrupts = StandInTarget(), Interrupts()

    def watch_then_interrupted(timeout_s, progress):
        target.log.append("await host restore")
        interrupt(interrupts, signal.SIGTERM)

    target.await_host_restore = watch_then_interrupted

    def body(board):
        board.activate(SPEC)
        interrupt(interrupts, signal.SIGINT)

    endings, lines = run(target, body, interrupts)  # no ServiceError: the host is restoring
    assert endings[-1].signals == ["SIGINT", "SIGTERM"]
    assert endings[-1].restore_observed is False and endings[-1].restore_s is None
    assert "stopped watching the restore on SIGTERM" in "\n".join(lines)
    assert "the host restores it; not watched to the end" in lines[-1]
    assert target.log.count("hand over (interrupted by SIGINT)") == 1


def test_a_first_signal_during_the_controllers_own_restore_switches_to_watching():
    target, interrupts = StandInTarget(), Interrupts()

    def body(board):
        board.activate(SPEC)
        target.on_stop = lambda: interrupt(interrupts, signal.SIGHUP)

    endings, _ = run(target, body, interrupts)
    assert target.log[2:] == [
        "stop candidate ngram",
        "hand over (interrupted by SIGHUP)",
        "await host restore",
        "close",
    ]
    assert endings[-1].signals == ["SIGHUP"] and endings[-1].restore_observed is True


def test_the_restore_waits_out_a_host_that_is_away():
    target = StandInTarget()

    def body(board):
        board.activate(SPEC)
        target.away = 4  # the next four calls fail: a reboot

    endings, lines = run(target, body, Interrupts())
    assert target.log[-3:] == ["stop candidate ngram", "start original", "close"]
    assert sum("the host is unreachable, retrying" in line for line in lines) == 2
    assert endings[-1].restore_observed is True


# --------------------------------------------------------------------- the restore's retries


def test_a_step_that_fails_on_a_reachable_host_is_tried_again_and_restores():
    target = StandInTarget()

    def body(board):
        board.activate(SPEC)
        target.failing = 2  # the next two commands fail; the host answers throughout

    _, lines = run(target, body, Interrupts())
    assert target.log[-3:] == ["stop candidate ngram", "start original", "close"]
    assert sum("exited 1; trying again, retrying" in line for line in lines) == 2
    assert "restored to active and serving" in lines[-1] and "problems" not in lines[-1]


def test_a_step_that_keeps_failing_on_a_reachable_host_is_given_up_after_three_tries():
    target = StandInTarget()

    def body(board):
        board.activate(SPEC)
        target.failing = 3

    _, lines = run(target, body, Interrupts())
    assert sum("trying again, retrying" in line for line in lines) == 2
    # the original matters more: it is started all the same, and the failure is reported
    assert target.log[-2:] == ["start original", "close"]
    assert "problems on the way: stopping candidate ngram: `systemctl stop" in lines[-1]


def test_a_host_away_for_many_tries_is_waited_for_until_it_is_back():
    target, time = StandInTarget(), VirtualTime()

    def body(board):
        board.activate(SPEC)
        target.away = 16  # 8 failed tries (a command and a probe each): 40 s of a reboot

    endings, lines = run(target, body, Interrupts(), time=time)
    assert sum("the host is unreachable, retrying" in line for line in lines) == 8
    assert target.log[-3:] == ["stop candidate ngram", "start original", "close"]
    assert endings[-1].restore_observed is True and "restored to active and" in lines[-1]
    assert time.now == pytest.approx(40)  # 5 s between tries, on the virtual clock


def test_a_host_that_stays_away_fails_the_restore_loudly_at_its_deadline():
    target, time = StandInTarget(), VirtualTime()

    def body(board):
        board.activate(SPEC)
        target.away = 10_000

    with pytest.raises(ServiceError, match="restore failed on stand-in-host"):
        run(target, body, Interrupts(), time=time)
    assert 60 <= time.now < 70  # restore_timeout_s: 60


# ---------------------------------------------------------------------- a handover that fails


def test_a_handover_that_fails_falls_back_to_the_controllers_own_restore():
    target, interrupts = StandInTarget(), Interrupts()
    target.handover_fails = HostError("stand-in-host: systemd-run refused")

    def body(board):
        board.activate(SPEC)
        interrupt(interrupts, signal.SIGTERM)

    endings, lines = run(target, body, interrupts)
    assert target.log[2:] == [
        "hand over (interrupted by SIGTERM)",
        "stop candidate ngram",  # the controller restores, as without a handover
        "start original",
        "close",
    ]
    assert any(
        "handing the restore to the host failed: stand-in-host: systemd-run refused" in line
        for line in lines
    )
    assert endings[-1].how == "interrupted" and not endings[-1].handed_over
    assert "restored to active and serving" in lines[-1]


# ------------------------------------------------------------ a real signal, a closed terminal

CHILD = """
import signal
import time
from pytest_specdecode.targets import interrupts, lifecycle
from tests.support.standin_target import SPEC, StandInTarget
from tests.support.virtual_clock import VirtualTime

lifecycle.wait_until_ready = lambda service, **kw: 0.0
signal.signal(signal.SIGHUP, signal.SIG_DFL)  # a terminal's, even if the tests run under nohup
interrupts.interrupt_on_signals()  # what the plugin installs for a run
target = StandInTarget()
try:
    with lifecycle.experiment_services(
        target, ready_timeout_s=10, restore_timeout_s=60, progress=print,
        clock=VirtualTime().clock,
    ) as board:
        board.activate(SPEC)
        print("measuring", flush=True)
        # Short waits: a signal that lands just before a blocking call starts is only seen
        # when that call returns (CPython checks for signals on EINTR).
        for _ in range(300):
            time.sleep(0.1)
except KeyboardInterrupt:
    print("unwound", flush=True)
print("log:", target.log, flush=True)
"""


def test_a_closed_terminals_sighup_hands_the_restore_over_and_unwinds():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert child.stdout is not None
        for line in child.stdout:
            if line.strip() == "measuring":
                break
        child.send_signal(signal.SIGHUP)
        out = child.communicate(timeout=20)[0]
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert child.returncode == 0, out  # not killed by the signal
    assert "run ending: interrupted by SIGHUP; the restore was handed over" in out
    assert "unwound" in out
    assert (
        "log: ['stop original', 'start candidate ngram', 'hand over (interrupted by SIGHUP)', "
        "'await host restore', 'close']" in out
    )


def hung_up_terminal() -> tuple[io.TextIOWrapper, list[int]]:
    """A pty whose other end is closed: a write gets EIO, as on a closed terminal."""
    master, slave = os.openpty()
    os.close(master)
    return io.TextIOWrapper(io.FileIO(slave, "w", closefd=False)), [slave]


def broken_pipe() -> tuple[io.TextIOWrapper, list[int]]:
    """A pipe whose reader is gone: a write gets EPIPE, as under `pytest ... | head`."""
    read, write = os.pipe()
    os.close(read)
    return io.TextIOWrapper(io.FileIO(write, "w", closefd=False)), [write]


@pytest.mark.parametrize("terminal", [hung_up_terminal, broken_pipe])
def test_progress_to_a_closed_terminal_never_stops_the_restore(
    terminal, pytestconfig: pytest.Config
) -> None:
    stream, fds = terminal()
    with pytest.raises(OSError):  # the terminal really is gone
        stream.write("x" * 100_000)
        stream.flush()
    target = StandInTarget()
    progress = ProgressLog(pytestconfig, stream=stream)
    try:
        run(target, lambda board: board.activate(SPEC), Interrupts(), progress=progress)
    finally:
        for fd in fds:
            os.close(fd)
    assert target.log == SWAPPED_AND_RESTORED
