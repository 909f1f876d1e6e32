"""Several replicas served at once, for the crossover across replicas (docs/replicas.md).

Each replica keeps its own `Switchboard` from `experiment_services` (targets/lifecycle.py):
its teardown is that replica's restore, and its host's watchdog takes the restore over on a
signal, as for one host. `replica_services` enters them all, and on any exit (an exception,
Ctrl-C, SIGTERM, one host's connection gone) leaves them all at once, one thread each, so one
slow or unreachable host does not hold up the other's restore. Each replica's switches and its
restore run in a thread of its own that lives as long as the run holds it: a local server dies
with the thread that started it (PR_SET_PDEATHSIG). Each replica's `drain` command
(argv, run on this controller without a shell, with a timeout) runs before it is restarted into
a candidate, and its `undrain` once its original serves again, or after its restore, whatever
happens.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from ..config.specconfig import SpecConfig
from ..errors import HostError, ServiceError
from ..record.ending import RestoreReport, RunEnding
from .base import Progress, Service, Target
from .lifecycle import Switchboard, experiment_services

Runner = Callable[[Sequence[str], float], None]  # argv, timeout: raises HostError on failure
COMMAND_TIMEOUT_S = 120.0
JOIN_AFTER_INTERRUPT_S = 5.0  # how long the exit waits for a start still under way
WAKE_S = 0.2  # how often a wait for the replicas' threads lets a signal's handler run


def run_command(argv: Sequence[str], timeout_s: float) -> None:
    """One drain / undrain command on this controller: argv, no shell, bounded in time."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise HostError(f"{argv[0]} did not end within {timeout_s:g}s") from None
    except OSError as exc:
        raise HostError(f"{argv[0]} could not be run: {exc}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise HostError(
            f"{argv[0]} exited with {done.returncode}" + (f": {' | '.join(tail)}" if tail else "")
        )


@dataclass
class Replica:
    """One replica while the run holds it: its target, its board, what it was, what it ran."""

    name: str
    target: Target
    drain: tuple[str, ...] = ()
    undrain: tuple[str, ...] = ()
    unit: str | None = None
    board: Switchboard | None = None
    starts: int = 0  # servers this run started on it: candidates, and its original back
    drained: bool = False
    was: str = "unknown"
    left: str = "not reached"
    serving: str = "its original"  # what it serves now, in words
    notes: list[str] = field(default_factory=list)
    restore: RestoreReport | None = None

    @property
    def where(self) -> str:
        """`replica b (unit vllm.service on gpu-b)`: every error message names it so."""
        unit = f"unit {self.unit} on " if self.unit else ""
        return f"replica {self.name} ({unit}{self.target.host_name})"

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "host": self.target.host_name,
            "unit": self.unit,
            "api_base": self.target.api_base,
            "starts": self.starts,
            "was": self.was,
            "left": self.left,
            "drain": list(self.drain),
            "undrain": list(self.undrain),
            "notes": list(self.notes),
            "restore": self.restore.describe() if self.restore is not None else None,
        }


def all_of(futures: Sequence[Future[Any]]) -> list[BaseException | None]:
    """Wait for every future; each one's exception (or None), in order. A KeyboardInterrupt
    while waiting is raised, and the work goes on in its thread. The wait wakes every
    `WAKE_S`: a signal that another thread received (or this one, just as it fell asleep) is
    handled in this one only once it runs, and a start can take an hour."""
    while wait(futures, timeout=WAKE_S).not_done:
        pass
    return [f.exception() for f in futures]


class ReplicaSet:
    """The replicas while they are held: which arm each serves, switched in parallel."""

    def __init__(
        self,
        replicas: Sequence[Replica],
        *,
        progress: Progress,
        runner: Runner,
        command_timeout_s: float,
    ) -> None:
        self.replicas = list(replicas)
        self._progress = progress
        self._runner = runner
        self._timeout_s = command_timeout_s
        # One thread per replica for the whole run, which starts all its servers: a local
        # server dies with the thread that started it (PR_SET_PDEATHSIG), not with the run.
        self.workers = {
            r.name: ThreadPoolExecutor(1, thread_name_prefix=f"specdecode-{r.name}")
            for r in replicas
        }
        self.switching: dict[str, Future[Any]] = {}  # each replica's last switch

    def close(self) -> None:
        """The replicas' threads end once their work is done (after the restore)."""
        for worker in self.workers.values():
            worker.shutdown(wait=False)

    def serve(self, wanted: Mapping[str, SpecConfig | None]) -> dict[str, Service]:
        """Each named replica serving its original (None) or a candidate, all switched at once;
        a replica that serves it already is not restarted. Raises the first failure, naming the
        replica, its host and unit, and what it was doing."""
        by_name = {r.name: r for r in self.replicas}
        order = [by_name[name] for name in wanted]

        for replica in order:
            spec = wanted[replica.name]
            self.switching[replica.name] = self.workers[replica.name].submit(
                self._switch, replica, spec
            )
        futures = [self.switching[r.name] for r in order]
        errors = all_of(futures)
        served = {
            r.name: f.result() for r, f in zip(order, futures, strict=True) if not f.exception()
        }
        failed = [e for e in errors if e is not None]
        if failed:
            raise failed[0]
        return served

    def _switch(self, replica: Replica, spec: SpecConfig | None) -> Service:
        board = replica.board
        assert board is not None
        arm = "its original" if spec is None else f"candidate {spec.name}"
        state = replica.serving
        if spec is not None and not replica.drained and replica.drain:
            self.command(replica, replica.drain, "drain")
            replica.drained = True
        changes = board.active is None or board.active_spec != spec
        if changes:
            replica.starts += 1
            self._progress(f"[crossover] {replica.where}: from {state} to {arm}")
        try:
            service = board.activate(spec)
        except HostError as exc:
            raise HostError(f"{replica.where}: starting {arm} (it served {state}): {exc}") from exc
        except ServiceError as exc:
            raise ServiceError(
                f"{replica.where}: starting {arm} (it served {state}): {exc}"
            ) from exc
        replica.serving = arm
        if spec is None and replica.drained and replica.undrain:
            self.command(replica, replica.undrain, "undrain")
            replica.drained = False
        return service

    def command(self, replica: Replica, argv: Sequence[str], what: str) -> None:
        """A drain or undrain command, named in the log; a failure names the replica."""
        self._progress(f"[crossover] {replica.where}: {what}: {' '.join(argv)}")
        try:
            self._runner(argv, self._timeout_s)
        except HostError as exc:
            raise HostError(
                f"{replica.where}: {what} command failed while it served {replica.serving}: {exc}"
            ) from None


@contextmanager
def replica_services(
    replicas: Sequence[Replica],
    *,
    ready_timeout_s: float,
    restore_timeout_s: float,
    progress: Progress,
    headers: dict[str, str] | None = None,
    runner: Runner = run_command,
    command_timeout_s: float = COMMAND_TIMEOUT_S,
    retry_failed_start: bool = False,
    record_ending: Callable[[RunEnding], None] | None = None,
) -> Iterator[ReplicaSet]:
    """Every replica's `experiment_services`, entered in order; on any exit, every replica's
    restore at once (each its own thread), then its undrain where it was drained. A failed
    restore raises `ServiceError` naming each replica left otherwise; call each target's
    `preflight()` first."""
    held = ReplicaSet(
        replicas, progress=progress, runner=runner, command_timeout_s=command_timeout_s
    )
    entered: list[tuple[Replica, AbstractContextManager[Switchboard]]] = []
    info: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]
    info = (None, None, None)
    try:
        for replica in replicas:
            transports = replica.target.transports()
            services = experiment_services(
                replica.target,
                ready_timeout_s=ready_timeout_s,
                restore_timeout_s=restore_timeout_s,
                progress=_named(progress, replica.name),
                headers=headers,
                transport=transports.sync,
                clock=transports.clock,
                retry_failed_start=retry_failed_start,
                record_ending=record_ending,
            )
            replica.board = services.__enter__()
            entered.append((replica, services))
            replica.was = "active" if replica.board.was_active else "inactive"
            if not replica.board.was_active:
                replica.serving = "nothing (its original was stopped)"
        yield held
    except BaseException:
        info = sys.exc_info()
        raise
    finally:
        failures = _leave_all(entered, info, held, progress)
        if failures and info[0] is None:
            raise ServiceError("; ".join(failures))
        for failure in failures:
            progress(f"[crossover] restore: {failure}")


def _leave_all(
    entered: Sequence[tuple[Replica, AbstractContextManager[Switchboard]]],
    info: tuple[type[BaseException] | None, BaseException | None, TracebackType | None],
    held: ReplicaSet,
    progress: Progress,
) -> list[str]:
    """Every replica's restore (its context's teardown) at once, then its undrain."""
    busy = []  # a replica whose start is still under way (an interrupt cut the wait)
    for name, switch in held.switching.items():
        if not switch.done():
            progress(f"[crossover] restore: waiting for replica {name}'s start to return")
            wait([switch], timeout=JOIN_AFTER_INTERRUPT_S)
        if not switch.done():
            busy.append(name)
    if entered:
        names = ", ".join(r.where for r, _ in entered)
        progress(f"[crossover] restoring {names}, in parallel")

    def leave(replica: Replica, services: AbstractContextManager[Switchboard]) -> None:
        board = replica.board
        assert board is not None
        back = board.was_active and board.active is not board.original
        try:
            services.__exit__(*info)
        finally:
            report = board.restore_report
            replica.restore = report
            if back and report is not None and report.observed:
                replica.starts += 1
            replica.starts += len(board.died_starts)  # a died start, started once more
            replica.left = _left(report)
            replica.serving = "its original" if report and not report.failed else replica.left
            if replica.drained and replica.undrain:
                held.command(replica, replica.undrain, "undrain")
                replica.drained = False

    futures = []  # each restore in its replica's own thread, or a new one where it is busy
    spare = []
    for replica, services in entered:
        worker = held.workers[replica.name]
        if replica.name in busy:
            worker = ThreadPoolExecutor(1, thread_name_prefix=f"specdecode-restore-{replica.name}")
            spare.append(worker)
        futures.append(worker.submit(leave, replica, services))
    errors = all_of(futures)
    held.close()
    for worker in spare:
        worker.shutdown(wait=False)
    return [
        f"{replica.where}: {error}"
        for (replica, _), error in zip(entered, errors, strict=True)
        if error is not None and error is not info[1]
    ]


def _left(report: RestoreReport | None) -> str:
    """How a replica was left, in the report's words: `active, serving`."""
    if report is None:
        return "unknown: its restore did not run"
    if not report.observed:
        return "handed to its host's watchdog; not watched to the end"
    if report.is_active:
        state = "active, serving" if report.serving else "active, NOT serving"
    else:
        state = "inactive" if report.is_active is False else "unknown"
    return state + (f" (errors: {'; '.join(report.errors)})" if report.errors else "")


def _named(progress: Progress, name: str) -> Progress:
    return lambda line: progress(f"[{name}] {line}")
