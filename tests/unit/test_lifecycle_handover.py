"""The restore's logic on a stand-in target, in milliseconds: what the first signal hands over,
what a second one ends, and waiting out a host that is away. The same paths run against the
real systemd host in test_remote_host.py (signals, the cancel sequence, a reboot)."""

from __future__ import annotations

import signal

import pytest

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import HostError
from pytest_specdecode.targets import lifecycle
from pytest_specdecode.targets.lifecycle import Interrupts, RunEnding, experiment_services

SPEC = SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})


class StandInService:
    """A stand-in for a service: a flag, and a log of what was done to it."""

    def __init__(self, target: StandInTarget, label: str) -> None:
        self.target, self.label = target, label
        self.api_base, self.model = "http://stand-in", "m"
        self.running = False

    def is_active(self) -> bool:
        self.target.touch()
        return self.running

    def start(self) -> None:
        self.target.touch()
        self.target.log.append(f"start {self.label}")
        self.running = True

    def stop(self) -> None:
        self.target.touch()
        self.target.log.append(f"stop {self.label}")
        if self.target.on_stop is not None:
            hook, self.target.on_stop = self.target.on_stop, None
            hook()
        self.running = False

    def failure(self) -> str | None:
        return None

    def log_tail(self, lines: int = 20) -> list[str]:
        return []


class StandInTarget:
    """A stand-in for a systemd target; the next `away` calls fail as if the host rebooted."""

    host_name = "stand-in-host"

    def __init__(self) -> None:
        self.log: list[str] = []
        self.orig = StandInService(self, "original")
        self.orig.running = True
        self.away = 0
        self.on_stop = None

    def touch(self) -> None:
        if self.away:
            self.away -= 1
            raise HostError("stand-in-host: cannot connect")

    def preflight(self) -> None: ...

    def before_swap(self) -> None: ...

    def original(self) -> StandInService:
        return self.orig

    def candidate(self, spec: SpecConfig) -> StandInService:
        return StandInService(self, f"candidate {spec.name}")

    def plan(self, specs):
        return []

    def hand_over(self, reason: str) -> str | None:
        self.log.append(f"hand over ({reason})")
        return "the stand-in host restores"

    def await_host_restore(self, timeout_s, progress) -> None:
        self.log.append("await host restore")
        self.orig.running = True

    def reachable(self) -> bool:
        if self.away:  # a probe while the host is away fails too
            self.away -= 1
            return False
        return True

    def after_restore(self) -> list[str]:
        return ["dependents active again"]

    def close(self) -> None:
        self.log.append("close")


@pytest.fixture(autouse=True)
def no_http(monkeypatch):
    """The readiness wait asks the stand-in, not HTTP; no sleeping between retries."""
    monkeypatch.setattr(lifecycle, "wait_until_ready", lambda service, **kw: 0.0)
    monkeypatch.setattr(lifecycle.time, "sleep", lambda s: None)


def run(target: StandInTarget, body, interrupts: Interrupts) -> tuple[list[RunEnding], list[str]]:
    endings: list[RunEnding] = []
    lines: list[str] = []
    monkey = pytest.MonkeyPatch()
    monkey.setattr(lifecycle, "INTERRUPTS", interrupts)
    try:
        with experiment_services(
            target,
            ready_timeout_s=10,
            restore_timeout_s=60,
            progress=lines.append,
            record_ending=lambda e: endings.append(RunEnding(**e.to_dict())),
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
    assert target.log == [
        "stop original",
        "start candidate ngram",
        "stop candidate ngram",
        "start original",
        "close",
    ]
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
