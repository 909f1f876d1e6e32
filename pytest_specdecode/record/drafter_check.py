"""The drafter check's figures, kept in the run record: one candidate start's first requests
and what its counters counted, before its timed windows (measure/experiment/drafter_check.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .counters import Acceptance

HEALTHY = "healthy"
BROKEN = "broken"
TOO_FEW = "too few drafted"  # not enough draft tokens counted to say; the run goes on
NO_COUNTERS = "no counters"  # the server exports no speculation counters; the run goes on


@dataclass
class DrafterCheck:
    """One start's drafter check: its requests, the counters' delta over them, the verdict."""

    start: str  # the phase the start was to measure
    method: str
    k: int | None  # num_speculative_tokens
    requests: int  # the check's requests sent (never in any window or verdict)
    acceptance: Acceptance
    floor: float  # the draft acceptance rate below which the drafter is called broken
    verdict: str  # HEALTHY, BROKEN, TOO_FEW or NO_COUNTERS
    text: str  # what was accepted and, where broken, what to check
    per_position: list[float] = field(default_factory=list)  # accepted tokens, per position

    @property
    def stopped(self) -> bool:
        return self.verdict == BROKEN

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DrafterCheck:
        acc = dict(data.get("acceptance") or {"present": False})
        return cls(
            start=data["start"],
            method=data["method"],
            k=data.get("k"),
            requests=int(data["requests"]),
            acceptance=Acceptance(**acc),
            floor=float(data["floor"]),
            verdict=data["verdict"],
            text=data.get("text", ""),
            per_position=[float(n) for n in data.get("per_position") or []],
        )
