"""A timed window's environment on the serving host: what else used its CPUs and GPUs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class WindowEnvironment:
    """What the host did during one timed window, sampled through it (measure/host_load.py).

    `off` says what moved beyond the run's bounds (other work, another process on the server's
    GPUs, a throttle the other arm's window did not have); `contaminated` is set where such a
    window was kept and counts as contaminated (no clean window came, and the run did not allow
    a busy host). `remeasured` keeps why each earlier try of this window was measured again.
    """

    samples: int = 0
    cpus: int | None = None
    other_cpu_share: float | None = None  # of the machine's CPU time, not the server's
    steal_share: float | None = None  # taken by the hypervisor, where the host is a VM
    gpus: str | None = None  # whose clocks these are: the server's GPUs, or every GPU's
    sm_mhz: float | None = None  # the lowest seen on those GPUs
    memory_mhz: float | None = None
    throttle: list[str] = field(default_factory=list)  # reasons active in any sample
    temperature_c: float | None = None  # the highest
    power_w: float | None = None  # the highest
    other_gpu_processes: list[str] = field(default_factory=list)  # on the server's GPUs
    missing: str | None = None  # why nothing was sampled
    off: str | None = None
    contaminated: str | None = None
    remeasured: list[str] = field(default_factory=list)  # why each earlier window was set aside

    def describe(self) -> str:
        """One short line: the strip beside a window's figures."""
        if self.missing:
            return f"not sampled ({self.missing})"
        parts = []
        if self.other_cpu_share is not None:
            parts.append(f"other work {self.other_cpu_share:.0%} of {self.cpus or '?'} CPUs")
        if self.steal_share:
            parts.append(f"steal {self.steal_share:.0%}")
        if self.sm_mhz is not None:
            whose = "" if self.gpus == "the server's" else f" ({self.gpus or 'GPUs'})"
            parts.append(f"SM {self.sm_mhz:.0f} MHz, memory {self.memory_mhz or 0:.0f} MHz{whose}")
        if self.temperature_c is not None:
            parts.append(f"{self.temperature_c:.0f} °C")
        if self.power_w is not None:
            parts.append(f"{self.power_w:.0f} W")
        if self.throttle:
            parts.append("throttle: " + ", ".join(self.throttle))
        if self.other_gpu_processes:
            parts.append("other GPU processes: " + "; ".join(self.other_gpu_processes))
        return ", ".join(parts) or "nothing sampled"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowEnvironment:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
