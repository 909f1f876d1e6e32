"""Swapping services for an experiment. The context manager's teardown is the restore."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ..config.specconfig import SpecConfig
from ..errors import ServiceError
from .base import Progress, Service, Target, wait_until_ready


@dataclass
class RestoreReport:
    """How the original was put back: the one text of it, in every report."""

    original: str
    was_active: bool
    is_active: bool
    seconds: float
    errors: list[str]
    serving: bool = False  # it answered /health and /v1/models with its model again

    @property
    def failed(self) -> bool:
        """Not as it was found: a serving original must be active and serving again."""
        if self.was_active:
            return not (self.is_active and self.serving)
        return self.is_active

    def describe(self) -> str:
        if self.is_active:
            state = "active and serving" if self.serving else "active but NOT serving"
        else:
            state = "stopped"
        text = f"{self.original} restored to {state} in {self.seconds:.0f}s"
        return text + ("; problems on the way: " + "; ".join(self.errors) if self.errors else "")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RestoreReport:
        return cls(
            **{k: data[k] for k in ("original", "was_active", "is_active", "seconds")},
            errors=list(data.get("errors", [])),
        )


class Switchboard:
    """Which service is up right now; brings up the original or a candidate on demand."""

    def __init__(
        self,
        target: Target,
        *,
        ready_timeout_s: float,
        restore_timeout_s: float,
        progress: Progress,
        headers: dict[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.target = target
        self.original = target.original()
        self.was_active = self.original.is_active()
        self.active: Service | None = self.original if self.was_active else None
        self.active_spec: SpecConfig | None = None
        self.restore_report: RestoreReport | None = None
        self._ready_timeout_s = ready_timeout_s
        self._restore_timeout_s = restore_timeout_s
        self._checked_running_original = False
        self._headers = headers
        self._transport = transport
        self._progress = progress

    def activate(self, spec: SpecConfig | None, *, restart: bool = False) -> Service:
        """Make the original (spec None) or the candidate for `spec` the one serving.

        `restart`: a fresh start even if that one serves already (a repeated start).
        """
        if self.active is not None and self.active_spec == spec and not restart:
            if not self._checked_running_original:
                # Found running: it must serve the configured model before it is measured.
                self._wait(self.active, self._ready_timeout_s)
                self._checked_running_original = True
            return self.active
        self.target.before_swap()
        if self.active is not None:
            self._progress(f"stopping {self.active.label}")
            self.active.stop()
            self.active = None
        wanted = self.original if spec is None else self.target.candidate(spec)
        self._progress(f"starting {wanted.label}")
        wanted.start()
        self.active, self.active_spec = wanted, spec
        self._wait(wanted, self._ready_timeout_s)
        return wanted

    def _wait(self, service: Service, timeout_s: float) -> float:
        return wait_until_ready(
            service,
            timeout_s=timeout_s,
            progress=self._progress,
            headers=self._headers,
            transport=self._transport,
        )

    def restore(self) -> RestoreReport:
        """Stop any candidate and put the original back as it was found."""
        start = time.monotonic()
        errors: list[str] = []
        serving = False
        if self.active is not None and self.active is not self.original:
            try:
                self._progress(f"restore: stopping {self.active.label}")
                self.active.stop()
            except Exception as exc:  # keep going: the original matters more
                errors.append(f"stopping {self.active.label}: {exc}")
            self.active = None
        try:
            if self.was_active:
                if not self.original.is_active():
                    self._progress(f"restore: starting {self.original.label}")
                    self.original.start()
                self._wait(self.original, self._restore_timeout_s)
                serving = True
            elif self.original.is_active():
                self._progress(f"restore: stopping {self.original.label} (it was not running)")
                self.original.stop()
        except Exception as exc:
            errors.append(str(exc))
        self.active = self.original if self.original.is_active() else None
        self.restore_report = RestoreReport(
            original=self.original.label,
            was_active=self.was_active,
            is_active=self.original.is_active(),
            seconds=time.monotonic() - start,
            errors=errors,
            serving=serving,
        )
        return self.restore_report


@contextmanager
def experiment_services(
    target: Target,
    *,
    ready_timeout_s: float,
    restore_timeout_s: float,
    progress: Progress,
    headers: dict[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Iterator[Switchboard]:
    """Yield a Switchboard; on any exit, restore the original service and check it.

    Call `target.preflight()` first: it refuses, before anything is touched, what is unsafe.
    """
    board = Switchboard(
        target,
        ready_timeout_s=ready_timeout_s,
        restore_timeout_s=restore_timeout_s,
        progress=progress,
        headers=headers,
        transport=transport,
    )
    try:
        yield board
    finally:
        report = board.restore()
        progress(report.describe())
        target.close()
        if report.failed:
            raise ServiceError(
                f"restore failed on {target.host_name}: {report.describe()}. "
                f"The original was {'active' if report.was_active else 'stopped'} before the run"
            )
