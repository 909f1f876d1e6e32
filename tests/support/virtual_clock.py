"""Virtual time for the fast tests: a `Clock` whose seconds pass only when something waits.

Its sleeps advance the time at once, and its event loop, once nothing is ready to run, jumps to
the next timer instead of blocking. A scripted service that streams a token every 10 ms is then
timed at exactly 10 ms, however busy the machine is, and a 5 s retry costs no real time.
Only for I/O that a test answers in process (`httpx.MockTransport`): a real socket's data would
arrive on real time.
"""

from __future__ import annotations

import asyncio
import selectors

from pytest_specdecode.clock import Clock


class VirtualTime:
    """The virtual seconds since the test began; `clock` reads and waits on them."""

    def __init__(self) -> None:
        self.now = 0.0

    def read(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)

    def loop(self) -> asyncio.AbstractEventLoop:
        return _VirtualLoop(self)

    @property
    def clock(self) -> Clock:
        return Clock(now=self.read, sleep=self.sleep, loop_factory=self.loop)


class _Selector(selectors.DefaultSelector):  # type: ignore[misc,valid-type]
    """Polls real I/O without waiting; where the loop would have waited, time moves on."""

    def __init__(self, time: VirtualTime) -> None:
        super().__init__()
        self._time = time

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0 if timeout is not None else None)
        if not events and timeout:
            self._time.sleep(timeout)  # nothing happened: the next timer is due
        return events


class _VirtualLoop(asyncio.SelectorEventLoop):
    def __init__(self, time: VirtualTime) -> None:
        self._virtual = time
        super().__init__(_Selector(time))

    def time(self) -> float:
        return self._virtual.now
