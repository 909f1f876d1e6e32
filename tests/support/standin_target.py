"""A stand-in for a systemd target, for millisecond tests of the restore's logic: services that
are flags, a host that can be away (a reboot) or failing, a handover that can fail. The same
paths run against the real systemd host in tests/real_host (signals, the cancel sequence, a
reboot)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import HostError

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

    def start_log(self) -> list[str]:
        return []

    def settings_log(self) -> list[str]:
        return []


class StandInTarget:
    """A stand-in for a systemd target. The next `away` calls fail as if the host rebooted (its
    reachability probe too); the next `failing` commands fail on a host that answers."""

    host_name = "stand-in-host"

    def __init__(self) -> None:
        self.log: list[str] = []
        self.orig = StandInService(self, "original")
        self.orig.running = True
        self.away = 0
        self.failing = 0
        self.handover_fails: Exception | None = None
        self.on_stop: Callable[[], None] | None = None

    def touch(self) -> None:
        if self.away:
            self.away -= 1
            raise HostError("stand-in-host: cannot connect")
        if self.failing:
            self.failing -= 1
            raise HostError("`systemctl stop vllm.service` on stand-in-host exited 1")

    def preflight(self) -> None: ...

    def before_swap(self) -> None: ...

    def original(self) -> StandInService:
        return self.orig

    def candidate(self, spec: SpecConfig) -> StandInService:
        return StandInService(self, f"candidate {spec.name}")

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        return []

    def hand_over(self, reason: str) -> str | None:
        self.log.append(f"hand over ({reason})")
        if self.handover_fails is not None:
            raise self.handover_fails
        return "the stand-in host restores"

    def await_host_restore(self, timeout_s: float, progress: Callable[[str], None]) -> None:
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
