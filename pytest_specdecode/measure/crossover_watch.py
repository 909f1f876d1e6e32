"""Other clients and other work on each replica through each crossover slot (docs/replicas.md).

As on one host (measure/experiment/rounds.py): each replica's /metrics counters are read before
and after each slot and told apart from the run's own request by `foreign` (measure/traffic.py);
each replica's host is sampled through the slot (`Watch`) and judged by `judge`
(measure/host_load.py) against its usual (the least of its host before the run and of its clean
slots). A contaminated slot is sent again once, after `QuietWatch` waited for the replica or its
host to fall quiet, where the single-host run would send again (`slot_action`); else it is kept,
marked. Each replica's `Seen` goes to results.json's `replicas[i]` and to one summary line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config.settings import RunConfig, Settings
from ..record.requests.samples import RequestSample
from ..record.store import RunStore
from ..targets.base import Progress, Service, Transports
from .experiment.context import RunContext
from .experiment.watch import Action, QuietWatch, after_contamination
from .host_load import Bounds, Probe, Watch, judge
from .server_metrics import ServerCounters, traffic_between
from .traffic import foreign

BEFORE_S = 3.0  # each replica's host watched this long before the run: its usual other work


def slot_action(
    other: Mapping[str, str | None],
    busy: Mapping[str, str | None],
    *,
    attempt: int,
    run: RunConfig,
) -> Action:
    """What becomes of a slot, per replica what was seen: as the single-host run decides a
    round (`after_contamination`), sent again once at most."""
    return after_contamination(
        any(other.values()),
        any(busy.values()),
        attempt=attempt,
        attempts=min(2, run.traffic_attempts),
        run=run,
    )


@dataclass
class Seen:
    """What one replica showed through the measured slots: other clients, other work."""

    name: str
    host_watched: bool = False  # its host read through a slot (a probe of the server's processes)
    traffic: list[str] = field(default_factory=list)  # "period 2, slot 1: ..."
    other_work: list[str] = field(default_factory=list)
    sent_again: list[str] = field(default_factory=list)
    marked: list[str] = field(default_factory=list)
    host_before: str | None = None  # its host before the run, as a user reads it

    def to_json(self) -> dict[str, Any]:
        """results.json's `replicas[i]["traffic"]` and `["other_work"]`."""
        return {
            "traffic": {"seen": list(self.traffic), "quiet": not self.traffic},
            "other_work": {
                "watched": self.host_watched,
                "before_run": self.host_before,
                "seen": list(self.other_work),
                "quiet": not self.other_work,
            },
            "slots_sent_again": list(self.sent_again),
            "slots_marked": list(self.marked),
        }


def watch_lines(seen: Sequence[Seen]) -> list[str]:
    """Per replica, one line of what was seen (and its slots, indented, where any was)."""
    lines = []
    for s in seen:
        host = (
            ""
            if s.host_watched
            else " (other work on its host not read: its backend does not say which processes "
            "are the server's)"
        )
        if not s.traffic and not s.other_work:
            lines.append(f"replica {s.name}: other clients and other work: none seen{host}")
            continue
        counts = [
            f"other clients in {len(s.traffic)} slot(s)" if s.traffic else "",
            f"other work on its host in {len(s.other_work)} slot(s)" if s.other_work else "",
        ]
        lines.append(
            f"replica {s.name}: {' and '.join(c for c in counts if c)}; "
            f"{len(s.sent_again)} sent again, {len(s.marked)} kept marked contaminated"
        )
        lines += [f"  {note}" for note in [*s.traffic, *s.other_work]]
    return lines


class CrossoverWatch:
    """Every replica's counters and host through each slot; judged, recorded per replica."""

    def __init__(
        self,
        settings: Settings,
        store: RunStore,
        *,
        names: Sequence[str],
        transports: Sequence[Transports],
        probes: Sequence[Probe | None],
        progress: Progress,
        headers: dict[str, str] | None,
    ) -> None:
        self._run = settings.run
        self._progress = progress
        self._ctx = {
            name: RunContext(settings, store, progress, dict(headers or {}), t)
            for name, t in zip(names, transports, strict=True)
        }
        self._probe = dict(zip(names, probes, strict=True))
        self._quiet = {n: QuietWatch(self._ctx[n], self._probe[n]) for n in names}
        self._bounds = Bounds(other_share=settings.run.busy_host_share)
        self._usual = dict.fromkeys(names, 1.0)
        self.seen = {n: Seen(n) for n in names}
        self._open: list[tuple[str, Service, ServerCounters]] = []
        self._stack = contextlib.ExitStack()
        self._watches: dict[str, Watch] = {}

    def before_run(self, services: Mapping[str, Service]) -> None:
        """Each replica's host before the run: its usual other work, read as on one host
        (`QuietWatch.host_before`, which also bounds its wait for a quiet host); kept per
        replica, not as one host's `host_before_run`."""
        for name, service in services.items():
            env = self._quiet[name].host_before(service, BEFORE_S)
            self._ctx[name].record.environment.pop("host_before_run", None)
            if env is not None:
                self.seen[name].host_before = env.describe()
                if env.other_cpu_share is not None:
                    self._usual[name] = env.other_cpu_share

    def begin(self, services: Sequence[tuple[str, Service]]) -> None:
        """A slot is about to be sent: every replica's counters read, its host watched."""
        self._stack.close()
        self._stack = contextlib.ExitStack()
        self._watches = {}
        for name, service in services:
            probe = self._probe[name]
            if probe is not None:
                self._watches[name] = self._stack.enter_context(Watch(probe, service))
        self._open = [(n, s, self._ctx[n].counters(s)) for n, s in services]

    def end(
        self, samples: Sequence[RequestSample]
    ) -> tuple[dict[str, str | None], dict[str, str | None]]:
        """The slot is back: per replica, other clients' traffic and other work beyond bounds."""
        other: dict[str, str | None] = {}
        busy: dict[str, str | None] = {}
        for (name, service, before), sample in zip(self._open, samples, strict=True):
            after = self._ctx[name].counters(service)
            other[name] = foreign(traffic_between(before, after), [sample])
            watch = self._watches.get(name)
            env = watch.environment() if watch is not None else None
            busy[name] = None
            if env is not None and env.missing is None:
                self.seen[name].host_watched = True
                busy[name] = judge(
                    env,
                    usual_share=self._usual[name],
                    other_arm=None,
                    other_label="",
                    bounds=self._bounds,
                )
                share = env.other_cpu_share
                if busy[name] is None and share is not None:
                    self._usual[name] = min(self._usual[name], share)
        self._stack.close()
        return other, busy

    def settle(
        self,
        where: str,
        other: Mapping[str, str | None],
        busy: Mapping[str, str | None],
        *,
        attempt: int,
    ) -> Action:
        """What becomes of the slot (`slot_action`), said and recorded per replica; before it
        is sent again, each replica that showed something is waited on until it is quiet."""
        action = slot_action(other, busy, attempt=attempt, run=self._run)
        if action == "keep" and not any(other.values()) and not any(busy.values()):
            return action
        services = {name: service for name, service, _ in self._open}
        for name in services:
            seen = self.seen[name]
            if other.get(name):
                _once(seen.traffic, f"{where}: {other[name]}", where)
                self._progress(f"{where}: other clients used replica {name} ({other[name]})")
            if busy.get(name):
                _once(seen.other_work, f"{where}: {busy[name]}", where)
                self._progress(f"{where}: the host of replica {name} was not quiet ({busy[name]})")
            if (other.get(name) or busy.get(name)) and action != "keep":
                (seen.sent_again if action == "again" else seen.marked).append(where)
        if action == "again":
            self._progress(f"{where}: sending it again, once each replica is quiet")
            for name, service in services.items():
                if other.get(name):
                    self._quiet[name].wait_for_quiet(service)
                if busy.get(name):
                    self._quiet[name].wait_for_quiet_host(service)
        else:
            done = "kept, marked contaminated" if action == "mark" else "kept"
            self._progress(f"{where}: {done}")
        return action

    def close(self) -> None:
        self._stack.close()


def _once(notes: list[str], note: str, where: str) -> None:
    """A slot's note, once however often it was sent (its first try's)."""
    if not any(n.startswith(f"{where}: ") for n in notes):
        notes.append(note)
