"""The experiment: measure each phase once, on demand, into the run record as it goes."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from ..analysis.adaptive import pinned, target_se
from ..analysis.restarts import RestartNoise
from ..config.arms import BASELINE, BASELINE_AFTER, cell_key, design_order
from ..config.prompts import request_plan
from ..config.settings import PromptType, Settings
from ..config.specconfig import SpecConfig
from ..config.vllm_argv import REQUEST_METRICS_FLAG
from ..record.counters import Acceptance, Traffic, combine
from ..record.samples import RequestSample
from ..record.schema import ClientLoad, Measurement, Phase, RunRecord
from ..record.store import RunStore
from ..targets.base import Progress, Service, Transports
from ..targets.lifecycle import Switchboard
from .loadgen import RequestSpec, planned_specs, run_level
from .server_metrics import ServerCounters, acceptance_between, parse_counters, traffic_between
from .token_ids import TokenIds, record_token_ids
from .traffic import foreign, quiet, rate_text


@dataclass(frozen=True)
class _Window:
    """One prompt type at one load level in one phase: what its requests are sent with."""

    phase: Phase
    m: Measurement
    base: RequestSpec  # the decoding settings; each request takes its prompt from the plan
    prompt_type: PromptType

    @property
    def where(self) -> str:
        return f"[{self.phase.name}] {self.m.key}"


class Experiment:
    """The design's server starts, measured in order on demand, each exactly once."""

    def __init__(
        self,
        settings: Settings,
        board: Switchboard,
        store: RunStore,
        *,
        progress: Progress,
        headers: Mapping[str, str] | None = None,
        transports: Transports | None = None,
        outside: Mapping[str, RestartNoise] | None = None,
        request_metrics_note: str | None = None,
    ) -> None:
        self.settings = settings
        self.request_metrics_note = request_metrics_note  # why candidates do not ask, if so
        self.board = board
        self.store = store
        self.progress = progress
        self.headers = dict(headers or {})
        self._transports = transports or Transports()
        self._clock = self._transports.clock
        # What the adaptive stop rule knows of the host: the restart noise, a request's residual
        known = dict(outside or {})
        throughput = known.get("throughput")
        noise_sd = throughput.sd if throughput else settings.run.assumed_restart_noise
        self._target = target_se(noise_sd, settings.run.min_effect)
        self._residual = {metric: n.residual for metric, n in known.items()}
        self._ids_recorded: set[str] = set()  # prompt types whose token ids this run recorded
        reused = {p.arm for p in store.record.phases.values()}  # a stored baseline
        self.order = [
            entry
            for entry in design_order([c.name for c in settings.candidates], settings.run.repeats)
            if entry[1] not in reused
        ]
        self._next = 0
        self._errors: dict[str, Exception] = {}
        self._chosen: dict[str, SpecConfig] = {}  # candidates chosen during the run (a search)

    @property
    def record(self) -> RunRecord:
        return self.store.record

    def candidate(self, name: str) -> SpecConfig:
        for spec in self.settings.candidates:
            if spec.name == name:
                return spec
        return self._chosen[name]

    def measure_new(self, spec: SpecConfig) -> Phase:
        """A candidate chosen during the run (the search's): recorded, then measured once in a
        start of its own, after every start the design has left."""
        if spec.name in self.record.candidates:
            raise ValueError(f"candidate {spec.name!r} exists already")
        self._chosen[spec.name] = spec
        self.record.candidates[spec.name] = dict(spec.values)
        self.order.append((spec.name, spec.name))
        self.store.flush()
        return self.arm(spec.name)

    def arm(self, name: str) -> Phase:
        """An arm's measurements over all its starts, measuring the design up to its last start.

        An arm that failed fails again at once: no second reload.
        """
        last = max((i for i, (_, arm) in enumerate(self.order) if arm == name), default=-1)
        while self._next <= last:
            phase, arm = self.order[self._next]
            self._next += 1
            if arm not in self._errors:
                self._start_and_measure(phase, arm)
        if name in self._errors:
            raise self._errors[name]
        return merged(self.record.arm_phases(name))

    def failed_arm(self, exc: BaseException) -> str | None:
        """The arm whose start failed with this very exception (the baseline's first, when
        every arm fails with it), or None."""
        return next((arm for arm, e in self._errors.items() if e is exc), None)

    def measure_all(self) -> None:
        """Every start of the design (the arms that fail are recorded, not raised)."""
        for _, arm in self.order:
            with contextlib.suppress(Exception):
                self.arm(arm)

    def baseline_after(self) -> Phase:
        """The original started and measured once more, after the candidates (ABA)."""
        if not self.record.arm_phases(BASELINE_AFTER):
            self._measure(BASELINE_AFTER, BASELINE_AFTER, None, restart=True)
        return self.record.phases[BASELINE_AFTER]

    def _start_and_measure(self, name: str, arm: str) -> None:
        spec = None if arm == BASELINE else self.candidate(arm)
        previous = [p for p in self.record.phases.values() if not p.reused_from]
        restart = bool(previous) and previous[-1].arm == arm  # a repeat right after itself
        try:
            self._measure(name, arm, spec, restart=restart)
        except Exception as exc:
            self._errors[arm] = exc
            self.record.failures[arm] = _first_line(exc)
            self.store.flush()
            if arm == BASELINE:  # nothing can be compared without it
                for _, other in self.order:
                    self._errors.setdefault(other, exc)

    def _measure(self, name: str, arm: str, spec: SpecConfig | None, *, restart: bool) -> None:
        service = self.board.activate(spec, restart=restart)
        phase = Phase(
            name=name,
            arm=arm,
            spec=dict(spec.values) if spec else None,
            service=service.label,
            server_version=self._version(service),
            extra_args=list(spec.extra_args) if spec else [],
            request_metrics=self._request_metrics(spec),
            startup_s=self.board.last_startup_s,
        )
        self.record.phases[name] = phase
        self.store.flush()
        for prompt_type in self.settings.prompt_types.values():
            self._measure_prompt_type(phase, prompt_type, service)
        self.store.flush()

    def _request_metrics(self, spec: SpecConfig | None) -> str | None:
        """How this phase's requests report their own acceptance: the level asked, or why none."""
        if spec is None:
            return None  # the original: nothing to accept
        if spec.is_original:
            return "none: the original's configuration, without speculation"
        if REQUEST_METRICS_FLAG in spec.extra_args:
            return spec.extra_args[spec.extra_args.index(REQUEST_METRICS_FLAG) + 1]
        return f"none: {self.request_metrics_note or 'not asked for'}"

    def _measure_prompt_type(self, phase: Phase, prompt_type: PromptType, service: Service) -> None:
        """Warm-up, then every load level in turn, each on its own prompts of the plan."""
        run = self.settings.run
        levels = run.levels
        most = max(run.requests_at(level)[1] for level in levels)
        plan = request_plan(
            len(prompt_type.prompts), samples=most, warmup=run.warmup, levels=len(levels)
        )
        base = RequestSpec(
            api_base=service.api_base,
            model=service.model,
            prompt=prompt_type.prompt,
            max_tokens=prompt_type.max_tokens,
            endpoint=run.endpoint,
            ignore_eos=run.ignore_eos,
            timeout_s=run.request_timeout_s,
            read_timeout_s=run.read_timeout_s,
            return_token_ids=True,  # every request's own ids, for the replay at every level
        )
        self.progress(f"[{phase.name}] {prompt_type.name}: {plan.describe()}")
        first: _Window | None = None
        for level, indices in zip(levels, plan.levels, strict=True):
            key = cell_key(prompt_type.name, level, several=len(levels) > 1)
            m = Measurement(
                prompt_type=prompt_type.name,
                level=level,
                key=key,
                slo=self.settings.slo.for_level(level),
            )
            phase.measurements[key] = m
            window = _Window(phase, m, base, prompt_type)
            if first is None:
                first = window
                if plan.warmup:
                    self._send(window, plan.warmup, warmup=True)
            self._measure_level(window, indices, service)
        if first is None or phase.arm == BASELINE_AFTER:
            return
        if not self.settings.run.record_token_ids:
            first.m.token_ids = TokenIds(missing="not recorded: [run] record_token_ids = false")
            return
        if self.settings.aa_only and prompt_type.name in self._ids_recorded:
            # An A/A run starts one configuration again and again: its ids, at temperature 0,
            # are the first start's: recording them again would only repeat them.
            first.m.token_ids = TokenIds(missing="an A/A run records them at its first start")
            return
        self._record_token_ids(first)
        self._ids_recorded.add(prompt_type.name)

    def _measure_level(self, window: _Window, indices: Sequence[int], service: Service) -> None:
        """One level's window: sent, checked for other clients' traffic, measured again."""
        run, m, where = self.settings.run, window.m, window.where
        least, most = run.requests_at(m.level, fixed=self.settings.aa_only)
        self.progress(
            f"{where}: {least}{f'..{most}' if most > least else ''} requests at {m.level.label} "
            f"of up to {window.prompt_type.max_tokens} tokens"
        )
        step = m.level.concurrency or 1
        for attempt in range(1, run.traffic_attempts + 1):
            before = self._counters(service)
            wall = self._send(window, indices[:least])
            while len(m.samples) < most and not self._pinned(window):
                # adaptive: only the spread decides, never the values themselves
                sent = len(m.samples)
                wall += self._send(window, indices[sent : sent + step])
            after = self._counters(service)
            m.wall_s = wall
            m.acceptance = acceptance_between(before, after)
            m.traffic = traffic_between(before, after)
            m.foreign = foreign(m.traffic, m.samples)
            self.store.flush()
            if m.foreign is None:
                break
            self.progress(f"{where}: other clients used the server during the window ({m.foreign})")
            if run.on_traffic == "mark" or attempt == run.traffic_attempts:
                self.progress(f"{where}: kept, marked contaminated")
                break
            m.discarded += m.samples  # kept in the record, not analysed
            m.samples = []
            m.client = ClientLoad()
            self.progress(
                f"{where}: measuring again (attempt {attempt + 1} of {run.traffic_attempts}) once "
                "the server is quiet"
            )
            self.wait_for_quiet(service)
        stats = m.stats
        self.progress(
            f"{where}: median {m.median_tokens_per_s:.1f} tok/s per request, "
            f"{stats.output_tokens_per_s:.1f} tok/s in all, TPOT {m.median_tpot_ms:.1f} ms "
            f"(p99 {stats.tpot_p99_ms:.1f})" + _acceptance_text(m.acceptance)
        )
        own = m.request_acceptance
        if own is not None:
            agree = ""  # the counters are the cross-check over a quiet window only
            if m.request_check:
                agree = f"; {m.request_check}"
            elif m.foreign is None and m.acceptance.present:
                agree = "; the counters agree"
            figures = _acceptance_text(own).removeprefix(";") or " no drafts"
            self.progress(f"{where}: the {len(m.samples)} requests' own figures:{figures}{agree}")
        for warning in stats.warnings():
            self.progress(f"{where}: warning: {warning}")

    def _send(self, window: _Window, indices: Sequence[int], *, warmup: bool = False) -> float:
        """Requests for these prompts at the window's level; each journalled as it ends."""
        phase, m, prompt_type = window.phase, window.m, window.prompt_type
        kept = m.warmup if warmup else m.samples
        offset = len(kept)

        def keep(sample: RequestSample) -> None:
            sample.index += offset  # the request's place in the window, over top-ups too
            kept.append(sample)
            self.store.add_sample(phase.name, sample)

        result = self._clock.run(
            run_level(
                planned_specs(window.base, prompt_type.prompts, indices),
                m.level,
                prompt_type=prompt_type.name,
                phase=phase.name,
                prompt_indices=indices,
                warmup=warmup,
                slo=m.slo,
                headers=self.headers,
                transport=self._transports.async_,
                on_sample=keep,
                clock=self._clock,
            )
        )
        if not warmup:
            m.client.add(result.stats)
        return result.stats.wall_s

    def _record_token_ids(self, window: _Window) -> None:
        """The n-gram replay's input (analysis/prediction.py), after the timed windows: each
        distinct prompt measured at the first level, from its first timed request."""
        m, prompts = window.m, window.prompt_type.prompts
        timed: dict[str, RequestSample | None] = {}
        for sample in m.samples:
            timed.setdefault(prompts[sample.prompt_index or 0].text, sample)
        start = self._clock.now()
        m.token_ids = record_token_ids(
            window.base, timed, headers=self.headers, transport=self._transports.sync
        )
        ids = m.token_ids
        ids.recorded_s = self._clock.now() - start
        self.store.flush()
        share = f" ({ids.recorded_s / m.wall_s:.0%} of the timed window)" if m.wall_s > 0 else ""
        self.progress(
            f"{window.where}: token ids of {len(ids.prompts)} prompt(s) recorded in "
            f"{ids.recorded_s:.1f}s, untimed{share}"
            if ids.missing is None
            else f"{window.where}: no token ids ({ids.missing})"
        )

    def watch(self, service: Service, seconds: float) -> Traffic:
        """The server's traffic over a while, with nothing sent by this run."""
        before = self._counters(service)
        self._clock.sleep(seconds)
        return traffic_between(before, self._counters(service))

    def wait_for_quiet(self, service: Service) -> None:
        """Until a stretch passes without other clients' traffic; bounded, with progress."""
        run = self.settings.run
        limit_s, step_s = run.quiet_wait_s, min(5.0, run.traffic_watch_s)
        start = self._clock.now()
        while self._clock.now() - start < limit_s:
            seen = self.watch(service, step_s)
            if quiet(seen):
                return
            self.progress(
                f"  … {self._clock.now() - start:.0f}s waiting for the server to be quiet: "
                f"{rate_text(seen, step_s)}"
            )
        self.progress(f"the server did not fall quiet within {limit_s:.0f}s: measuring anyway")

    def _pinned(self, window: _Window) -> bool:
        """The adaptive stop rule (analysis/adaptive.py), against this run's earlier starts."""
        earlier = [
            p.measurements[window.m.key]
            for p in self.record.phases.values()
            if p is not window.phase and window.m.key in p.measurements
        ]
        return pinned(earlier, window.m, target=self._target, residual=self._residual)

    def _counters(self, service: Service) -> ServerCounters:
        text = self._get(service, "/metrics")
        return parse_counters(text) if text is not None else ServerCounters()

    def _version(self, service: Service) -> str | None:
        text = self._get(service, "/version")
        if text is None:
            return None
        try:
            return str(httpx.Response(200, text=text).json().get("version"))
        except ValueError:
            return text.strip()[:80]

    def _get(self, service: Service, path: str) -> str | None:
        try:
            with httpx.Client(transport=self._transports.sync, headers=self.headers) as client:
                response = client.get(f"{service.api_base}{path}", timeout=10)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


def merged(phases: Sequence[Phase]) -> Phase:
    """One arm over all its starts, as one phase (for thresholds; the analysis keeps starts)."""
    first = phases[0]
    out = Phase(
        name=first.arm,
        arm=first.arm,
        spec=first.spec,
        service="; ".join(p.service for p in phases),
        server_version=first.server_version,
        reused_from=first.reused_from,
    )
    for name in first.measurements:
        parts = [p.measurements[name] for p in phases if name in p.measurements]
        out.measurements[name] = Measurement(
            prompt_type=parts[0].prompt_type,
            level=parts[0].level,
            key=name,
            slo=parts[0].slo,
            samples=[s for m in parts for s in m.samples],
            warmup=[s for m in parts for s in m.warmup],
            wall_s=sum(m.wall_s or 0.0 for m in parts) or None,
            acceptance=combine([m.acceptance for m in parts]),
        )
    return out


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _acceptance_text(acc: Acceptance) -> str:
    if not acc.present or acc.mean_acceptance_length is None:
        return ""
    rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
    return (
        f"; acceptance length {acc.mean_acceptance_length:.2f}, draft acceptance "
        f"{acc.draft_acceptance_rate:.1%}, per position [{rates}]"
    )
