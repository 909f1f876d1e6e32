"""The time a run reads and waits on: the machine's clocks, unless a test's seam says otherwise.

Every timing and every wait of the experiment (the requests, the readiness waits, the restore's
retries, the traffic watch) goes through a `Clock`. A real run uses `MACHINE`; the fast tests
run scripted services on a virtual clock (tests/support/virtual_clock.py), so that no unit test
depends on the machine's speed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Clock:
    """Where the time is read, how a wait is waited, and the event loop that keeps that time."""

    now: Callable[[], float] = time.perf_counter  # monotonic seconds, for intervals
    sleep: Callable[[float], None] = time.sleep
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None  # None: asyncio's own

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine to its end on an event loop that keeps this clock's time."""
        with asyncio.Runner(loop_factory=self.loop_factory) as runner:
            return runner.run(main)


MACHINE = Clock()
