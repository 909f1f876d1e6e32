"""Other work on the serving host: watched through each timed window, judged like other clients.

A window's environment is summarised from samples of the host (targets/host_env.py) taken at
its start, every few seconds through it, and at its end. It is off where other work took more
than a set share of the machine beyond its usual (the least of the run's clean windows so far
and of the host before the run), where the hypervisor
stole more than that share, where another process ran on the server's GPUs, or where its GPUs'
clocks throttled for a reason the other arm's window of the same prompt type did not have.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..record.host_env import WindowEnvironment
from ..targets.base import Service
from ..targets.host_env import HostSample

Probe = Callable[[Service], "HostSample | None"]


def one_server(samples: Sequence[HostSample | None]) -> HostSample | None:
    """Samples of the servers of one pair (arms side by side), read as one server's: their CPU
    time and processes are the run's own, not other work on the host or on their GPUs."""
    read = [s for s in samples if s is not None]
    if not read:
        return None
    times = [s.server_s for s in read]
    notes = [s.note for s in read if s.note]
    return replace(
        read[0],
        server_s=None if None in times else sum(t for t in times if t is not None),
        server_pids=frozenset().union(*(s.server_pids for s in read)),
        note="; ".join(dict.fromkeys(notes)) or None,
    )


def pair_probe(probe: Probe, services: Sequence[Service]) -> Probe:
    """A probe that samples every server of a pair and reads them as one (see `one_server`);
    `probe` itself for one server or none."""
    if len(services) < 2:
        return probe

    def sample(_: Service) -> HostSample | None:
        return one_server([probe(s) for s in services])

    return sample


@dataclass(frozen=True)
class Bounds:
    """How far a window's environment may move before it is contaminated."""

    other_share: float = 0.25  # of the machine's CPU time, beyond the host's usual
    steal_share: float = 0.10


def summarise(samples: Sequence[HostSample]) -> WindowEnvironment:
    """A window's environment from its samples (the first at its start, the last at its end)."""
    notes = [s.note for s in samples if s.note]
    if len(samples) < 2:
        return WindowEnvironment(samples=len(samples), missing=notes[0] if notes else "no sample")
    read = [s for s in samples if s.total_ticks is not None and s.idle_ticks is not None]
    first, last = (read[0], read[-1]) if len(read) >= 2 else (samples[0], samples[-1])
    env = WindowEnvironment(samples=len(samples), cpus=last.cpus)
    if len(read) >= 2:
        total = (last.total_ticks or 0) - (first.total_ticks or 0)
        busy = total - ((last.idle_ticks or 0) - (first.idle_ticks or 0))
        steal = (last.steal_ticks or 0) - (first.steal_ticks or 0)
        if total > 0:
            env.steal_share = max(0.0, steal / total)
            if first.server_s is not None and last.server_s is not None:
                server = last.server_s - first.server_s + last.own_s - first.own_s
                other = (busy - steal) * last.tick_s - server
                env.other_cpu_share = min(1.0, max(0.0, other / (total * last.tick_s)))
    readings = [g for s in samples for g in s.clock_gpus()]
    if readings:
        told = all(s.server_gpus() for s in samples if s.gpus)
        env.gpus = "the server's" if told else "every GPU of the host: none listed the server"
        env.sm_mhz = _least([g.sm_mhz for g in readings])
        env.memory_mhz = _least([g.memory_mhz for g in readings])
        env.temperature_c = _most([g.temperature_c for g in readings])
        env.power_w = _most([g.power_w for g in readings])
        env.throttle = sorted({r for g in readings for r in g.throttle})
    others = {
        f"pid {a.pid} ({a.name or '?'}) {a.used_mib} MiB on {a.gpu_uuid}": None
        for s in samples
        for a in s.others_on_server_gpus()
    }
    env.other_gpu_processes = list(others)
    if env.other_cpu_share is None and notes:
        env.missing = notes[0]
    return env


def judge(
    env: WindowEnvironment,
    *,
    usual_share: float,
    other_arm: WindowEnvironment | None,
    other_label: str,
    bounds: Bounds,
) -> str | None:
    """What in the window moved beyond the bounds, or None where it was clean."""
    notes = []
    share = env.other_cpu_share
    if share is not None and share - usual_share > bounds.other_share:
        notes.append(
            f"other work took {share:.0%} of the host's CPU time (its usual: "
            f"{usual_share:.0%}, the least before the run and in clean windows; bound: "
            f"{bounds.other_share:.0%} more)"
        )
    if env.steal_share is not None and env.steal_share > bounds.steal_share:
        notes.append(f"the hypervisor stole {env.steal_share:.0%} of the CPU time")
    if env.other_gpu_processes:
        others = "; ".join(env.other_gpu_processes)
        notes.append(f"another process used the server's GPUs: {others}")
    if other_arm is not None:
        new = [r for r in env.throttle if r not in other_arm.throttle]
        if new:
            notes.append(f"clocks throttled ({', '.join(new)}) where {other_label}'s did not")
    return "; ".join(notes) or None


class Watch:
    """Samples the host at a window's start, every `interval_s` through it, and at its end."""

    def __init__(self, probe: Probe, service: Service, *, interval_s: float = 2.0) -> None:
        self._probe, self._service, self._interval = probe, service, interval_s
        self._samples: list[HostSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Watch:
        self._take()
        self._thread = threading.Thread(target=self._through, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def environment(self) -> WindowEnvironment | None:
        """The window's summary: the samples so far and one at its end (None: not watched,
        this backend does not say which processes are the server's)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._take()
        return summarise(self._samples) if self._samples else None

    def _through(self) -> None:
        while not self._stop.wait(self._interval):
            self._take()

    def _take(self) -> None:
        try:
            sample = self._probe(self._service)
        except Exception as exc:  # a fact, not a precondition: never stop a run over it
            sample = HostSample(note=f"the host could not be sampled: {exc}")
        if sample is not None:
            self._samples.append(sample)


def _least(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def _most(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None
