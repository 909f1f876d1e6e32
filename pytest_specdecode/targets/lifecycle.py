"""Swapping services for an experiment. The context manager's teardown is the restore.

On the first interrupt of any kind (Ctrl-C, SIGTERM, SIGHUP), the restore is handed over at once,
from the signal handler, before anything unwinds (interrupts.py); from then on the restore only
observes the host's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import httpx

from ..clock import MACHINE, Clock
from ..config.specconfig import SpecConfig
from ..errors import ConfigError, HostError, ServiceError, StartDied
from ..record.ending import DiedStart, RestoreReport, RunEnding
from .base import Progress, Service, Target, room_beside, wait_until_ready
from .interrupts import INTERRUPTS, Interrupts


def beside_kwargs(*, swapped: bool, place: int, of: int) -> dict[str, object]:
    """What a target's `beside` (and the plan's `beside_servers`) is asked for one server of a
    group: `swap` where the places turn, `place` and `of` where several serve beside at once."""
    kwargs: dict[str, object] = {"swap": True} if swapped else {}
    if of > 1:
        kwargs.update(place=place, of=of)
    return kwargs


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
        interrupts: Interrupts | None = None,
        clock: Clock = MACHINE,
        retry_failed_start: bool = False,
    ) -> None:
        self.target = target
        self.original = target.original()  # the baseline
        # What the restore puts back as it was found: the original, or the service that the
        # baseline serves in place of (the shape on a unit: the unit, stopped for the window)
        found = getattr(target, "found_original", None)
        self.found: Service = found() if found is not None else self.original
        self.was_active = self.found.is_active()
        adopted = self.was_active and self.found is self.original
        self.active: Service | None = self.original if adopted else None
        self.last_startup_s: float | None = None  # the last activate's start, to serving
        self.startups: list[float] = []  # every start's seconds to serving, in order (the pace)
        self.active_spec: SpecConfig | None = None
        self.besides: list[Service] = []  # the servers beside the original, while they serve
        self.swapped = False  # the last pair: the two in each other's places
        self.original_stopped = False  # whether this run ever stopped the original
        self._stopped: list[str] = []  # what the restore stopped besides the candidate
        self._beside_errors: list[str] = []
        self.restore_report: RestoreReport | None = None
        self.ending = RunEnding()
        self.interrupts = interrupts or INTERRUPTS
        self._ready_timeout_s = ready_timeout_s
        self._restore_timeout_s = restore_timeout_s
        self._checked_running_original = False
        self._serving = False
        self._headers = headers
        self._transport = transport
        self._progress = progress
        self._clock = clock
        # a candidate whose engine died before it ever served (not by its config): once more
        self.retry_failed_start = retry_failed_start
        self.died_starts: dict[str, DiedStart] = {}  # by candidate: its first start, which died

    def activate(self, spec: SpecConfig | None, *, restart: bool = False) -> Service:
        """Make the original (spec None) or the candidate for `spec` the one serving.

        `restart`: a fresh start even if that one serves already (a repeated start).
        """
        self.last_startup_s = None
        if self.active is not None and self.active_spec == spec and not restart:
            if not self._checked_running_original:
                # Found running: it must serve the configured model before it is measured.
                self._wait(self.active, self._ready_timeout_s)
                self._checked_running_original = True
            return self.active
        self.target.before_swap()
        if self.active is not None:
            self._progress(f"stopping {self.active.label}")
            self.original_stopped = self.original_stopped or self.active is self.original
            self.active.stop()
            self.active = None
        if self.found is not self.original and self.was_active:
            self.original_stopped = True  # the baseline's first start stops the found one
        wanted = self.original if spec is None else self.target.candidate(spec)
        self._progress(f"starting {wanted.label}")
        wanted.start()
        self.active, self.active_spec = wanted, spec
        if spec is None:
            self.last_startup_s = self._wait(wanted, self._ready_timeout_s)
            self.startups.append(self.last_startup_s)
            return wanted

        def again(spec: SpecConfig = spec) -> Service:
            self.active = None
            self.target.before_swap()
            self.active = self.target.candidate(spec)
            return self.active

        self.active, self.last_startup_s = self._serve(spec, wanted, again)
        self.startups.append(self.last_startup_s)
        return self.active

    def _serve(
        self, spec: SpecConfig, service: Service, again: Callable[[], Service]
    ) -> tuple[Service, float]:
        """A started candidate, once it serves, and the seconds it took. One whose engine died
        before it ever served, for a reason other than its configuration, is stopped and started
        once more (`again` makes it anew), where the run allows it (`retry_failed_start`);
        `died_starts` keeps the first start for the record."""
        try:
            return service, self._wait(service, self._ready_timeout_s)
        except StartDied as died:
            if not self.retry_failed_start or died.refused is not None or self.interrupts.signals:
                raise
            first = DiedStart(service.label, died.after_s, died.cause, text=str(died))
        self._progress(
            f"{first.service} died {first.after_s:.0f}s into its start, before it ever served "
            f"({first.cause}); not a configuration vLLM refused: starting it once more"
        )
        service.stop()  # what is left of it: its other processes, a unit's drop-in
        second = again()
        self._progress(f"starting {second.label} again")
        second.start()
        self.died_starts[spec.name] = first
        try:
            return second, self._wait(second, self._ready_timeout_s)
        except ServiceError as exc:
            raise ServiceError(
                f"{exc}\n(started twice: the first start died too, {first.after_s:.0f}s into it: "
                f"{first.cause})"
            ) from exc

    @property
    def beside(self) -> Service | None:
        """The (first) server beside the original, while any serves there."""
        return self.besides[0] if self.besides else None

    @contextmanager
    def together(
        self, spec: SpecConfig, *, restart_original: bool, swap: bool = False
    ) -> Iterator[tuple[Service, Service]]:
        """The original serving (as it is; started or restarted where asked and allowed) and a
        second server with `spec`'s configuration beside it, both ready: `together_all` of one.
        `swap`: the two take each other's places, where the target can swap them
        (`swaps_places`); `self.swapped` says whether."""
        with self.together_all([spec], restart_original=restart_original, swap=swap) as (
            original,
            seconds,
        ):
            yield original, seconds[0]

    @contextmanager
    def together_all(
        self,
        specs: Sequence[SpecConfig],
        *,
        restart_original: bool,
        swap: bool = False,
        first_beside: Callable[[Service, Service], None] | None = None,
    ) -> Iterator[tuple[Service, list[Service]]]:
        """The original serving and one server per spec beside it, all ready. They are stopped
        on exit, and by restore() on any interrupt (Ctrl-C, SIGTERM, the first-signal handover).

        They start one after the other, never at once: on a GPU, vLLM's memory profiling would
        count the others' allocations as its own (two at once on an H200: `No available memory
        for the cache blocks`). The original is restarted where its place changed (the local
        target's part of the cores). `swap`: the places turn by one, where the target can.
        `first_beside`: called with the original and the first server once that one serves,
        before the others start (the regime window: the original beside one server).
        """
        several = len(specs)
        for spec in specs:
            why = room_beside(self.target, spec, of=several)
            if why:
                raise ConfigError(f"--spec-arms together refused on {self.target.host_name}: {why}")
        self.swapped = swap and bool(getattr(self.target, "swaps_places", False))
        seconds = [self._beside_of(spec, i + 1, several) for i, spec in enumerate(specs)]
        restart = restart_original or bool(getattr(self.original, "stale", False))
        original = self.activate(None, restart=restart)
        try:
            for place, (spec, second) in enumerate(zip(specs, list(seconds), strict=True)):
                self.besides.append(second)
                self._progress(f"starting {second.label} beside {original.label}")
                second.start()

                def again(place: int = place, spec: SpecConfig = spec) -> Service:
                    self.besides.remove(seconds[place])
                    seconds[place] = self._beside_of(spec, place + 1, several)
                    self.besides.append(seconds[place])
                    return seconds[place]

                _, self.last_startup_s = self._serve(spec, second, again)
                self.startups.append(self.last_startup_s)
                if first_beside is not None and place == 0:
                    first_beside(original, seconds[0])
            yield original, seconds
        except BaseException:  # stopped at once, and told in the restore's report
            if not self.interrupts.signals:  # else the handover stops them; restore() watches
                deadline = self._clock.now() + self._restore_timeout_s
                self._stop_beside(self._beside_errors, deadline)
            raise
        for second in seconds:
            if second in self.besides:
                self._progress(f"stopping {second.label}")
                second.stop()
                self.besides.remove(second)

    def _beside_of(self, spec: SpecConfig, place: int, of: int) -> Service:
        kwargs = beside_kwargs(swapped=self.swapped, place=place, of=of)
        return self.target.beside(spec, **kwargs)  # type: ignore[call-arg]

    def _wait(self, service: Service, timeout_s: float) -> float:
        return wait_until_ready(
            service,
            timeout_s=timeout_s,
            progress=self._progress,
            headers=self._headers,
            transport=self._transport,
            clock=self._clock,
        )

    def restore(self, record: Callable[[RunEnding], None] | None = None) -> RestoreReport:
        """Put the original back as it was found: here, or by watching the host do it."""
        start = self._clock.now()
        errors: list[str] = list(self._beside_errors)
        observed = True
        self._serving = False
        while True:
            try:
                handed = self.interrupts.handover(self.target)
                self._note_ending(handed, record)
                if handed:
                    self._watch_host_restore(errors)
                else:
                    self._restore_here(errors, deadline=start + self._restore_timeout_s)
                break
            except KeyboardInterrupt:
                if self.interrupts.handover(self.target) and not self.ending.handed_over:
                    continue  # the first signal came during our own restore: watch the host's
                observed = False
                again = self.interrupts.signals[-1] if self.interrupts.signals else "an interrupt"
                self._progress(
                    f"stopped watching the restore on {again}; the host goes on by itself"
                    if self.ending.handed_over
                    else f"the restore was interrupted by {again} before it ended"
                )
                break
        is_active: bool | None = None
        notes: list[str] = []
        if observed:
            try:
                is_active = self.found.is_active()
                if is_active and self.was_active:
                    notes = self.target.after_restore()
                elif is_active is False and not self.was_active:
                    # a backend that started the original itself: its GPUs' memory, let go
                    check = getattr(self.target, "gpus_after_restore", None)
                    notes = check() if check is not None else []
            except Exception as exc:
                errors.append(str(exc))
            self.active = self.found if is_active else None
        notes = [*self._stopped, *notes]
        untouched = observed and self.was_active and not self.original_stopped and bool(is_active)
        self.ending.original_never_stopped = untouched
        self.restore_report = RestoreReport(
            original=self.found.label,
            was_active=self.was_active,
            is_active=is_active,
            seconds=self._clock.now() - start,
            errors=errors,
            serving=self._serving,
            observed=observed,
            notes=notes,
            never_stopped=untouched,
        )
        self.ending.signals = list(self.interrupts.signals)  # a second one may have come
        self.ending.restore_observed = observed
        if observed and is_active == self.was_active:
            first = self.interrupts.first_at
            self.ending.restore_s = (
                time.monotonic() - first  # a signal's time is the machine's
                if self.ending.signals and first is not None
                else self._clock.now() - start
            )
        self._progress(f"run ending: {self.ending.describe()}")
        if record is not None:
            record(self.ending)
        return self.restore_report

    def _note_ending(self, handed: str | None, record: Callable[[RunEnding], None] | None) -> None:
        """What is known before the restore: written at once, in case nothing more is."""
        self.ending.signals = list(self.interrupts.signals)
        if self.ending.signals:
            self.ending.how = "interrupted"
        if handed and not self.ending.handed_over:
            self.ending.handed_over = handed
            self.ending.handover_s = self.interrupts.handover_s
            if record is not None:
                record(self.ending)

    def _watch_host_restore(self, errors: list[str]) -> None:
        """The host restores by itself; wait until it is done and the original serves."""
        self._progress(f"restore: handed over ({self.ending.handed_over}); watching it finish")
        try:
            # labelled before the host's restore ends them and drops their pids
            seconds = [(second, second.label, second.api_base) for second in self.besides]
            self.target.await_host_restore(self._restore_timeout_s, self._progress)
            for second, label, where in seconds:
                if second.is_active():
                    second.stop()
                self._stopped.append(f"stopped the second server {label} at {where}")
            self.besides.clear()
            if self.was_active:
                self._wait(self.found, self._restore_timeout_s)
                self._serving = True
        except (HostError, ServiceError) as exc:
            errors.append(str(exc))
        self.active = None

    def _restore_here(self, errors: list[str], *, deadline: float) -> None:
        """Stop any candidate (and a baseline in the found one's place) and put the original
        back as found, waiting out an unreachable host."""
        self._stop_beside(errors, deadline)
        if self.active is not None and self.active is not self.found:
            active = self.active
            self._progress(f"restore: stopping {active.label}")
            self._step(f"stopping {active.label}", active.stop, errors, deadline)
            self.active = None
        if self.was_active:
            self._step("starting the original", self._ensure_original, errors, deadline)
        else:
            self._step("stopping the original", self._stop_original, errors, deadline)

    def _stop_beside(self, errors: list[str], deadline: float) -> None:
        """The servers beside the original, first: the original matters more, but needs room."""
        while self.besides:
            second = self.besides.pop()
            label, where = second.label, second.api_base
            self._progress(f"restore: stopping {label} (beside the original)")
            self._step(f"stopping {label}", second.stop, errors, deadline)
            self._stopped.append(f"stopped the second server {label} at {where}")

    def _ensure_original(self) -> None:
        if not self.found.is_active():
            self._progress(f"restore: starting {self.found.label}")
            self.found.start()
        self._wait(self.found, self._restore_timeout_s)
        self._serving = True

    def _stop_original(self) -> None:
        if self.found.is_active():
            self._progress(
                f"restore: stopping {self.found.label} (it was not running before the run)"
            )
            self.original_stopped = True
            self.found.stop()

    def _step(
        self, what: str, action: Callable[[], None], errors: list[str], deadline: float
    ) -> None:
        """Run one restore step. A host that is away (a reboot, a dropped link) is waited for
        until the deadline; a step that fails on a reachable host is retried twice."""
        failures = 0
        while True:
            try:
                action()
                return
            except HostError as exc:
                failures += 1
                away = not self.target.reachable()
                if self._clock.now() < deadline and (away or failures < 3):
                    why = "the host is unreachable" if away else "trying again"
                    self._progress(f"restore: {what}: {exc}; {why}, retrying")
                    self._clock.sleep(5)
                    continue
                errors.append(f"{what}: {exc}")
                return
            except Exception as exc:  # keep going: the original matters more
                errors.append(f"{what}: {exc}")
                return


@contextmanager
def experiment_services(
    target: Target,
    *,
    ready_timeout_s: float,
    restore_timeout_s: float,
    progress: Progress,
    headers: dict[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
    record_ending: Callable[[RunEnding], None] | None = None,
    clock: Clock = MACHINE,
    retry_failed_start: bool = False,
) -> Iterator[Switchboard]:
    """Yield a Switchboard; on any exit, restore the original service and check it.

    Call `target.preflight()` first: it refuses, before anything is touched, what is unsafe.
    `record_ending` receives how the run ended, as soon as each part of it is known; `clock`
    times the waits and the restore's retries; `retry_failed_start`: a candidate whose engine
    died before it ever served, not by its configuration, is started once more.
    """
    board = Switchboard(
        target,
        ready_timeout_s=ready_timeout_s,
        restore_timeout_s=restore_timeout_s,
        progress=progress,
        headers=headers,
        transport=transport,
        clock=clock,
        retry_failed_start=retry_failed_start,
    )
    board.interrupts.watch(target, progress)
    try:
        yield board
    finally:
        try:
            report = board.restore(record_ending)
            progress(report.describe())
            target.close()
        finally:
            board.interrupts.unwatch(target)
        if report.failed:
            raise ServiceError(
                f"restore failed on {target.host_name}: {report.describe()}. "
                f"The original was {'active' if report.was_active else 'stopped'} before the run"
            )
