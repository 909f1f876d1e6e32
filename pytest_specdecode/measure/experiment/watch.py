"""Other clients and other work, around and through each window: watched, judged, waited out."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal

from ...config.settings import RunConfig
from ...record.counters import Traffic
from ...record.host_env import WindowEnvironment
from ...record.measurement import Measurement
from ...record.schema import Phase
from ...targets.base import Service
from ..host_load import Bounds, Probe, Watch, judge, pair_probe
from ..server_metrics import traffic_between
from ..traffic import quiet, rate_text
from .context import RunContext

Action = Literal["keep", "again", "mark"]


def after_contamination(
    other: bool, busy: bool, *, attempt: int, attempts: int, run: RunConfig
) -> Action:
    """What becomes of a round (or a crossover's slot) during which other clients used a server
    (`other`) or other work kept its host busy (`busy`): kept; sent again, while `attempt` is
    below `attempts` and the settings do not keep it (`on_traffic = "mark"`, allow_busy_host);
    or kept and marked contaminated (kept unmarked where only a busy host was allowed)."""
    if not other and not busy:
        return "keep"
    allowed = (not busy or run.allow_busy_host) and (not other or run.on_traffic == "mark")
    if not allowed and attempt < attempts:
        return "again"
    return "mark" if other or not run.allow_busy_host else "keep"


class QuietWatch:
    """The server's other clients (its counters) and the host's other work (`probe`), judged
    against the host's usual and against the other arm's window of the same cell."""

    def __init__(self, ctx: RunContext, probe: Probe | None) -> None:
        self._ctx = ctx
        self._probe = probe  # samples the serving host through each window (None: not watched)
        self._bounds = Bounds(other_share=ctx.settings.run.busy_host_share)
        self._usual_share = 1.0  # other work on the host before the run (host_before)

    def watch(self, service: Service, seconds: float) -> Traffic:
        """The server's traffic over a while, with nothing sent by this run."""
        before = self._ctx.counters(service)
        self._ctx.clock.sleep(seconds)
        return traffic_between(before, self._ctx.counters(service))

    def wait_for_quiet(self, service: Service) -> None:
        """Until a stretch passes without other clients' traffic; bounded, with progress."""
        ctx, run = self._ctx, self._ctx.settings.run
        limit_s, step_s = run.quiet_wait_s, min(5.0, run.traffic_watch_s)
        start = ctx.clock.now()
        while ctx.clock.now() - start < limit_s:
            seen = self.watch(service, step_s)
            if quiet(seen):
                return
            ctx.progress(
                f"  … {ctx.clock.now() - start:.0f}s waiting for the server to be quiet: "
                f"{rate_text(seen, step_s)}"
            )
        ctx.progress(f"the server did not fall quiet within {limit_s:.0f}s: measuring anyway")

    def window(
        self, service: Service, pair: Sequence[Service] = ()
    ) -> contextlib.AbstractContextManager[Watch | None]:
        """The host through a window; with arms side by side, both servers are the run's own."""
        if self._probe is None:
            return contextlib.nullcontext()
        return Watch(pair_probe(self._probe, pair), service)

    def judge_window(self, phase: Phase, m: Measurement) -> str | None:
        """What moved beyond the bounds in this window's environment (None where clean)."""
        env = m.environment
        if env is None:
            return None
        return self.judge_env(env, phase, m.key, current=m)

    def judge_env(
        self,
        env: WindowEnvironment,
        phase: Phase,
        key: str,
        *,
        current: Measurement | None = None,
        beside: tuple[str, WindowEnvironment] | None = None,
    ) -> str | None:
        """`env` judged against the host's usual and another arm's window of `key` (`beside`:
        the arm served together with this one, through the same round)."""
        other = beside
        for earlier in self._ctx.record.phases.values():
            m = earlier.measurements.get(key)
            if other is None and earlier.arm != phase.arm and m is not None and m.environment:
                other = (earlier.name, m.environment)
        env.off = judge(
            env,
            usual_share=self.usual(current),
            other_arm=other[1] if other else None,
            other_label=f"{other[0] if other else 'the other arm'}'s window",
            bounds=self._bounds,
        )
        return env.off

    def usual(self, current: Measurement | None = None) -> float:
        """The host's usual other work: the least of the run's clean windows so far and of the
        host before the run (taken before the server ran, so often more than during a window)."""
        shares = [
            m.environment.other_cpu_share
            for p in self._ctx.record.phases.values()
            for m in p.measurements.values()
            if m is not current and m.environment is not None and not m.environment.off
        ]
        known = [x for x in shares if x is not None]
        return min([self._usual_share, *known])

    def host_before(self, service: Service, seconds: float = 3.0) -> WindowEnvironment | None:
        """The host before the run: its usual other work, against which each window is judged."""
        if self._probe is None:
            return None
        with Watch(self._probe, service, interval_s=seconds) as watch:
            self._ctx.clock.sleep(seconds)
            env = watch.environment()
        if env is None:
            return None
        if env.other_cpu_share is not None:
            self._usual_share = env.other_cpu_share
        self._ctx.record.environment["host_before_run"] = env.to_json()
        self._ctx.store.flush()
        return env

    def wait_for_quiet_host(self, service: Service, pair: Sequence[Service] = ()) -> None:
        """Until a stretch passes with the host's other work within the bound; bounded."""
        if self._probe is None:
            return
        ctx = self._ctx
        limit_s, step_s = ctx.settings.run.quiet_wait_s, 3.0
        start = ctx.clock.now()
        while ctx.clock.now() - start < limit_s:
            with Watch(pair_probe(self._probe, pair), service, interval_s=step_s) as watch:
                ctx.clock.sleep(step_s)
                env = watch.environment()
            if (
                env is None
                or env.other_cpu_share is None
                or (
                    env.other_cpu_share - self.usual() <= self._bounds.other_share
                    and not env.other_gpu_processes
                )
            ):
                return
            ctx.progress(
                f"  … {ctx.clock.now() - start:.0f}s waiting for the host to be quiet: "
                f"{env.describe()}"
            )
        ctx.progress(f"the host did not fall quiet within {limit_s:.0f}s: measuring anyway")
