"""What every part of the experiment shares: the settings, the record, the progress line, the
current step (for a cut run's report), and the server's own endpoints read untimed (/metrics,
/version)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from ...clock import Clock
from ...config.settings import Settings
from ...record.schema import RunRecord
from ...record.store import RunStore
from ...targets.base import Progress, Service, Transports
from ..server_metrics import ServerCounters, parse_counters


def _no_step(text: str) -> None:
    """Where nobody keeps the run's steps."""


@dataclass
class RunContext:
    settings: Settings
    store: RunStore
    progress: Progress
    headers: dict[str, str] = field(default_factory=dict)
    transports: Transports = field(default_factory=Transports)
    step: Progress = _no_step  # what the run is doing now, kept for a cut run's report
    # called once, after the run's first round (rounds.py), with a slot's seconds per server
    first_round: Callable[[float], None] | None = None

    @property
    def record(self) -> RunRecord:
        return self.store.record

    @property
    def clock(self) -> Clock:
        return self.transports.clock

    def counters(self, service: Service) -> ServerCounters:
        text = self.get(service, "/metrics")
        return parse_counters(text) if text is not None else ServerCounters()

    def version(self, service: Service) -> str | None:
        text = self.get(service, "/version")
        if text is None:
            return None
        try:
            return str(httpx.Response(200, text=text).json().get("version"))
        except ValueError:
            return text.strip()[:80]

    def get(self, service: Service, path: str) -> str | None:
        try:
            with httpx.Client(transport=self.transports.sync, headers=self.headers) as client:
                response = client.get(f"{service.api_base}{path}", timeout=10)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None
