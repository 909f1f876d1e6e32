"""A window: one prompt type at one load level in one phase, its requests sent and summed up.

`WindowSender.send` hands a window's requests to the load generator (where each is timed:
measure/requests/loadgen.py) and journals each as it ends. `measure_blocked` measures a prompt
type one level after another (`[run] order = "blocked"`); rounds.py interleaves them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ...analysis.variance.restarts import RestartNoise
from ...analysis.variance.spending import look_slots
from ...analysis.verdict.adaptive import pinned
from ...analysis.verdict.compare import METRICS, questions_of
from ...analysis.verdict.sequential import decided
from ...config.arms import cell_key
from ...config.prompts import RequestPlan, request_plan
from ...config.settings import PromptType, RunConfig
from ...record.counters import Acceptance
from ...record.measurement import ClientLoad, Measurement, SequentialLooks
from ...record.requests.samples import RequestSample
from ...record.schema import Phase
from ...targets.base import Service
from ..requests.loadgen import LevelResult, RequestSpec, planned_specs, run_level
from ..server_metrics import acceptance_between, traffic_between
from ..traffic import foreign
from .context import RunContext
from .watch import QuietWatch


@dataclass(frozen=True)
class Window:
    """One prompt type at one load level in one phase: what its requests are sent with."""

    phase: Phase
    m: Measurement
    base: RequestSpec  # the decoding settings; each request takes its prompt from the plan
    prompt_type: PromptType

    @property
    def where(self) -> str:
        return f"[{self.phase.name}] {self.m.key}"


def request_base(
    run: RunConfig, service: Service, prompt_type: PromptType, *, return_token_ids: bool = False
) -> RequestSpec:
    """A prompt type's request to this server as the run sends it: its prompt, max_tokens, the
    run's endpoint and timeouts (loadgen's `planned_specs` sets each request's own prompt)."""
    return RequestSpec(
        api_base=service.api_base,
        model=service.model,
        prompt=prompt_type.prompt,
        max_tokens=prompt_type.max_tokens,
        endpoint=run.endpoint,
        ignore_eos=run.ignore_eos,
        timeout_s=run.request_timeout_s,
        read_timeout_s=run.read_timeout_s,
        return_token_ids=return_token_ids,
    )


class WindowSender:
    """Windows built, sent and summarised; the adaptive stop rule asked after each top-up."""

    def __init__(
        self,
        ctx: RunContext,
        quiet: QuietWatch,
        *,
        target: float,
        residual: Mapping[str, float | None],
        noise: Mapping[str, RestartNoise] | None = None,
    ) -> None:
        self._ctx = ctx
        self._quiet = quiet
        self._target = target  # the standard error the adaptive stop rule aims at
        self._residual = dict(residual)  # a request's own spread, per metric, where known
        assumed = RestartNoise.assumed(ctx.settings.run.assumed_restart_noise)
        # the restart noise the stop rule (sequential.py) knows, per metric
        self._noise = {metric: (noise or {}).get(metric) or assumed for metric in METRICS}

    def plan(self, prompt_type: PromptType) -> RequestPlan:
        """Which prompt each request of a start sends, over its warm-up and load levels."""
        run = self._ctx.settings.run
        most = max(run.requests_at(level)[1] for level in run.levels)
        return request_plan(
            len(prompt_type.prompts), samples=most, warmup=run.warmup, levels=len(run.levels)
        )

    def windows(self, phase: Phase, prompt_type: PromptType, service: Service) -> list[Window]:
        """A prompt type's window at each load level, each a new measurement of the phase."""
        settings = self._ctx.settings
        levels = settings.run.levels
        # every request's own ids, for the replay at every level
        base = request_base(settings.run, service, prompt_type, return_token_ids=True)
        windows = []
        for level in levels:
            key = cell_key(prompt_type.name, level, several=len(levels) > 1)
            m = Measurement(
                prompt_type=prompt_type.name,
                level=level,
                key=key,
                slo=settings.slo.for_level(level),
            )
            phase.measurements[key] = m
            windows.append(Window(phase, m, base, prompt_type))
        return windows

    def send(
        self,
        window: Window,
        indices: Sequence[int],
        *,
        warmup: bool = False,
        slot: int | None = None,
    ) -> LevelResult:
        """Requests for these prompts at the window's level; each journalled as it ends."""
        ctx = self._ctx
        phase, m, prompt_type = window.phase, window.m, window.prompt_type
        if warmup or slot is None:  # a slot's step is set by rounds.py, with its number
            ctx.step(f"{'warming up' if warmup else 'measuring'} {window.where}")
        kept = m.warmup if warmup else m.samples
        offset = len(kept)

        def keep(sample: RequestSample) -> None:
            sample.index += offset  # the request's place in the window, over top-ups too
            sample.slot = slot
            kept.append(sample)
            ctx.store.add_sample(phase.name, sample)

        result = ctx.clock.run(
            run_level(
                planned_specs(window.base, prompt_type.prompts, indices),
                m.level,
                prompt_type=prompt_type.name,
                phase=phase.name,
                prompt_indices=indices,
                warmup=warmup,
                slo=m.slo,
                headers=ctx.headers,
                transport=ctx.transports.async_,
                on_sample=keep,
                clock=ctx.clock,
            )
        )
        if not warmup:
            m.client.add(result.stats)
        return result

    def pinned(self, window: Window) -> bool:
        """The adaptive stop rule (analysis/verdict/adaptive.py), against this run's earlier
        starts."""
        earlier = [
            p.measurements[window.m.key]
            for p in self._ctx.record.phases.values()
            if p is not window.phase and window.m.key in p.measurements
        ]
        return pinned(earlier, window.m, target=self._target, residual=self._residual)

    def decided(self, base: Window, beside: Sequence[Window], *, slots: int, planned: int,
                cells: int) -> bool:  # fmt: skip
        """Side by side, one pair: whether every candidate's cell beside the baseline's is
        decided at this look (analysis/verdict/sequential.py), recorded on each candidate's
        measurement; `slots` the cell's kept slots, `planned` its most, `cells` the run's."""
        settings = self._ctx.settings
        run = settings.run
        if not run.sequential or settings.aa_only or run.repeats != 1 or not beside:
            return False
        looks = look_slots(planned)
        if slots not in looks:
            return False
        found = []
        for window in beside:
            m = window.m
            m.sequential = m.sequential or SequentialLooks(planned)
            if slots not in m.sequential.looks:
                m.sequential.looks.append(slots)
            found.append(
                decided(
                    questions_of(base.phase, window.phase, base.m.key),
                    alpha=run.alpha,
                    min_effect=run.min_effect,
                    noise=self._noise,
                    family=cells * len(METRICS),
                )
            )
        if any(v is None for v in found):
            return False
        for window in beside:
            if window.m.sequential is not None:
                window.m.sequential.stopped = True
        verdicts = ", ".join(f"{w.phase.name} {v}" for w, v in zip(beside, found, strict=True))
        self._ctx.progress(
            f"{base.where}: decided at look {looks.index(slots) + 1} of {len(looks)} "
            f"({slots} of {planned} slots: {verdicts}); the cell stops"
        )
        return True

    def summary(self, window: Window) -> None:
        """A measured window's lines: its median, its acceptance, its warnings."""
        m, where = window.m, window.where
        stats = m.stats
        self._ctx.progress(
            f"{where}: median {m.median_tokens_per_s:.1f} tok/s per request, "
            f"{stats.output_tokens_per_s:.1f} tok/s in all, TPOT {m.median_tpot_ms:.1f} ms "
            f"(p99 {stats.tpot_p99_ms:.1f})" + acceptance_text(m.acceptance)
        )
        own = m.request_acceptance
        if own is not None:
            agree = ""  # the counters are the cross-check over a quiet window only
            if m.request_check:
                agree = f"; {m.request_check}"
            elif m.foreign is None and m.acceptance.present:
                agree = "; the counters agree"
            figures = acceptance_text(own).removeprefix(";") or " no drafts"
            self._ctx.progress(
                f"{where}: the {len(m.samples)} requests' own figures:{figures}{agree}"
            )
        for warning in stats.warnings():
            self._ctx.progress(f"{where}: warning: {warning}")

    # -- `[run] order = "blocked"`: one prompt type, one level after another ------------------

    def measure_blocked(
        self, phase: Phase, prompt_type: PromptType, service: Service
    ) -> tuple[RequestPlan, list[Window]]:
        """Warm-up, then every load level in turn, each on its own prompts of the plan."""
        plan = self.plan(prompt_type)
        self._ctx.progress(f"[{phase.name}] {prompt_type.name}: {plan.describe()}")
        windows = self.windows(phase, prompt_type, service)
        if plan.warmup:
            self.send(windows[0], plan.warmup, warmup=True)
        for window, indices in zip(windows, plan.levels, strict=True):
            self._measure_level(window, indices, service)
        return plan, windows

    def _measure_level(self, window: Window, indices: Sequence[int], service: Service) -> None:
        """One level's window: sent, checked for other clients' traffic, measured again."""
        ctx, quiet = self._ctx, self._quiet
        run, m, where = ctx.settings.run, window.m, window.where
        least, most = run.requests_at(m.level, fixed=ctx.settings.aa_only)
        ctx.progress(
            f"{where}: {least}{f'..{most}' if most > least else ''} requests at {m.level.label} "
            f"of up to {window.prompt_type.max_tokens} tokens"
        )
        step = m.level.concurrency or 1
        set_aside: list[str] = []  # why each earlier window was measured again (the host)
        for attempt in range(1, run.traffic_attempts + 1):
            with quiet.window(service) as watch:
                before = ctx.counters(service)
                wall = self.send(window, indices[:least]).stats.wall_s
                while len(m.samples) < most and not self.pinned(window):
                    # adaptive: only the spread decides, never the values themselves
                    sent = len(m.samples)
                    wall += self.send(window, indices[sent : sent + step]).stats.wall_s
                after = ctx.counters(service)
                m.environment = watch.environment() if watch else None
            if m.environment is not None:
                m.environment.remeasured = list(set_aside)
            m.wall_s = wall
            m.acceptance = acceptance_between(before, after)
            m.traffic = traffic_between(before, after)
            m.foreign = foreign(m.traffic, m.samples)
            busy = quiet.judge_window(window.phase, m)
            ctx.store.flush()
            if m.foreign is None and busy is None:
                break
            if m.foreign is not None:
                ctx.progress(
                    f"{where}: other clients used the server during the window ({m.foreign})"
                )
            if busy is not None:
                ctx.progress(f"{where}: the host was not quiet during the window ({busy})")
            keep_busy = busy is None or run.allow_busy_host
            keep_foreign = m.foreign is None or run.on_traffic == "mark"
            if (keep_busy and keep_foreign) or attempt == run.traffic_attempts:
                if busy is not None and m.environment is not None and not run.allow_busy_host:
                    m.environment.contaminated = busy
                if m.foreign is not None or not run.allow_busy_host:
                    ctx.progress(f"{where}: kept, marked contaminated")
                else:
                    ctx.progress(f"{where}: kept (--spec-allow-busy-host)")
                ctx.store.flush()
                break
            m.discarded += m.samples  # kept in the record, not analysed
            m.samples = []
            m.client = ClientLoad()
            ctx.progress(
                f"{where}: measuring again (attempt {attempt + 1} of {run.traffic_attempts}) once "
                f"the {'server' if busy is None else 'host'} is quiet"
            )
            if m.foreign is not None:
                quiet.wait_for_quiet(service)
            if busy is not None:
                set_aside.append(busy)
                quiet.wait_for_quiet_host(service)
        self.summary(window)


def acceptance_text(acc: Acceptance) -> str:
    if not acc.present or acc.mean_acceptance_length is None:
        return ""
    rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
    return (
        f"; {acc.mean_acceptance_length:.2f} accepted per draft, draft acceptance "
        f"{acc.draft_acceptance_rate:.1%}, per position [{rates}]"
    )
