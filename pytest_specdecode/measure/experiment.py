"""The experiment: measure each phase once, on demand, into the run record as it goes."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx

from ..analysis.adaptive import pinned, target_se
from ..analysis.restarts import RestartNoise
from ..analysis.side_changes import control_name, control_plan
from ..config.arms import BASELINE, BASELINE_AFTER, cell_key, design_order
from ..config.prompts import request_plan
from ..config.settings import PromptType, Settings
from ..config.specconfig import SpecConfig
from ..config.vllm_argv import REQUEST_METRICS_FLAG
from ..errors import ServiceError
from ..record.counters import Acceptance, Traffic, combine
from ..record.engine_settings import EngineSettings, from_server_info, parse_engine_log
from ..record.host_env import WindowEnvironment
from ..record.samples import RequestSample
from ..record.schema import ClientLoad, Measurement, Phase, RunRecord
from ..record.store import RunStore
from ..targets.base import Progress, Service, Transports
from ..targets.lifecycle import Switchboard
from .host_load import Bounds, Probe, Watch, judge
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
        probe: Probe | None = None,
    ) -> None:
        self.settings = settings
        self._probe = probe  # samples the serving host through each window (None: not watched)
        self._bounds = Bounds(other_share=settings.run.busy_host_share)
        self._usual_share = 1.0  # other work on the host before the run (host_before)
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
        self._plan_ids_recorded: set[str] = set()  # ... for every prompt of the plan
        reused = {p.arm for p in store.record.phases.values()}  # a stored baseline
        # --spec-control: after each candidate, the original with the candidate's side changes
        self.controls = (
            {control_name(c.name): c for c in settings.candidates if not c.is_original}
            if settings.run.control
            else {}
        )
        arms = [c.name for c in settings.candidates]
        for name, spec in self.controls.items():
            arms.insert(arms.index(spec.name) + 1, name)
        self.order = [
            entry for entry in design_order(arms, settings.run.repeats) if entry[1] not in reused
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
        if name in self.controls and name not in self._chosen:
            self._chosen[name] = self._control(name)
        return self._chosen[name]

    def _control(self, name: str) -> SpecConfig:
        """The original's configuration with what its candidate's start changed besides
        speculation (measured), or what the known rules foresee (where the logs told nothing)."""
        spec = self.controls[name]
        if spec.name in self._errors:
            raise ServiceError(
                f"control {name!r} not started: candidate {spec.name!r} failed, so its side "
                "changes are unknown"
            )
        found = control_plan(self.record, spec, version=self._known_version())
        self.progress(f"[{name}] {found.text}")
        return SpecConfig(
            name=name,
            values={},
            extra_args=found.reproduction.args,
            env=dict(found.reproduction.env),
            control_of=spec.name,
        )

    def _known_version(self) -> str | None:
        versions = [p.server_version for p in self.record.phases.values() if p.server_version]
        return versions[0] if versions else None

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
            control_of=spec.control_of if spec else None,
            env=dict(spec.env) if spec else {},
        )
        phase.engine = self._engine(service)
        self.progress(f"[{name}] the engine ran with: {phase.engine.describe()}")
        self.record.phases[name] = phase
        self.store.flush()
        for prompt_type in self.settings.prompt_types.values():
            self._measure_prompt_type(phase, prompt_type, service)
        self.store.flush()

    def _engine(self, service: Service) -> EngineSettings:
        """What this start ran with: its whole log, and /server_info where vLLM's dev mode
        offers it."""
        read = getattr(service, "settings_log", None)  # a conftest's own service may lack it
        try:
            lines = read() if read else []
        except Exception:  # a fact, not a precondition: never fail a start over it
            lines = []
        settings = parse_engine_log(lines)
        text = self._get(service, "/server_info?config_format=json")
        if text is not None:
            with contextlib.suppress(ValueError):
                info = httpx.Response(200, text=text).json()
                if isinstance(info, dict):
                    settings = from_server_info(settings, info)
        return settings

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
        windows: list[Measurement] = []
        for level, indices in zip(levels, plan.levels, strict=True):
            key = cell_key(prompt_type.name, level, several=len(levels) > 1)
            m = Measurement(
                prompt_type=prompt_type.name,
                level=level,
                key=key,
                slo=self.settings.slo.for_level(level),
            )
            phase.measurements[key] = m
            windows.append(m)
            window = _Window(phase, m, base, prompt_type)
            if first is None:
                first = window
                if plan.warmup:
                    self._send(window, plan.warmup, warmup=True)
            self._measure_level(window, indices, service)
        if first is None or phase.arm == BASELINE_AFTER or phase.control_of:
            return  # a control's outputs are the original's: nothing to replay
        if not self.settings.run.record_token_ids:
            first.m.token_ids = TokenIds(missing="not recorded: [run] record_token_ids = false")
            return
        if self.settings.aa_only and prompt_type.name in self._ids_recorded:
            # An A/A run starts one configuration again and again: its ids, at temperature 0,
            # are the first start's: recording them again would only repeat them.
            first.m.token_ids = TokenIds(missing="an A/A run records them at its first start")
            return
        # The first baseline start also records every prompt a longer window may send: an
        # adaptive candidate can be timed on prompts this start stopped short of.
        whole_plan = phase.arm == BASELINE and prompt_type.name not in self._plan_ids_recorded
        self._record_token_ids(first, windows[1:], plan.levels if whole_plan else ())
        self._ids_recorded.add(prompt_type.name)
        if whole_plan:
            self._plan_ids_recorded.add(prompt_type.name)

    def _measure_level(self, window: _Window, indices: Sequence[int], service: Service) -> None:
        """One level's window: sent, checked for other clients' traffic, measured again."""
        run, m, where = self.settings.run, window.m, window.where
        least, most = run.requests_at(m.level, fixed=self.settings.aa_only)
        self.progress(
            f"{where}: {least}{f'..{most}' if most > least else ''} requests at {m.level.label} "
            f"of up to {window.prompt_type.max_tokens} tokens"
        )
        step = m.level.concurrency or 1
        set_aside: list[str] = []  # why each earlier window was measured again (the host)
        for attempt in range(1, run.traffic_attempts + 1):
            with self._watch(service) as watch:
                before = self._counters(service)
                wall = self._send(window, indices[:least])
                while len(m.samples) < most and not self._pinned(window):
                    # adaptive: only the spread decides, never the values themselves
                    sent = len(m.samples)
                    wall += self._send(window, indices[sent : sent + step])
                after = self._counters(service)
                m.environment = watch.environment() if watch else None
            if m.environment is not None:
                m.environment.remeasured = list(set_aside)
            m.wall_s = wall
            m.acceptance = acceptance_between(before, after)
            m.traffic = traffic_between(before, after)
            m.foreign = foreign(m.traffic, m.samples)
            busy = self._judge_host(window)
            self.store.flush()
            if m.foreign is None and busy is None:
                break
            if m.foreign is not None:
                self.progress(
                    f"{where}: other clients used the server during the window ({m.foreign})"
                )
            if busy is not None:
                self.progress(f"{where}: the host was not quiet during the window ({busy})")
            keep_busy = busy is None or run.allow_busy_host
            keep_foreign = m.foreign is None or run.on_traffic == "mark"
            if (keep_busy and keep_foreign) or attempt == run.traffic_attempts:
                if busy is not None and m.environment is not None and not run.allow_busy_host:
                    m.environment.contaminated = busy
                if m.foreign is not None or not run.allow_busy_host:
                    self.progress(f"{where}: kept, marked contaminated")
                else:
                    self.progress(f"{where}: kept (--spec-allow-busy-host)")
                self.store.flush()
                break
            m.discarded += m.samples  # kept in the record, not analysed
            m.samples = []
            m.client = ClientLoad()
            self.progress(
                f"{where}: measuring again (attempt {attempt + 1} of {run.traffic_attempts}) once "
                f"the {'server' if busy is None else 'host'} is quiet"
            )
            if m.foreign is not None:
                self.wait_for_quiet(service)
            if busy is not None:
                set_aside.append(busy)
                self.wait_for_quiet_host(service)
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

    def _record_token_ids(
        self,
        window: _Window,
        later: Sequence[Measurement] = (),
        plan: Sequence[Sequence[int]] = (),
    ) -> None:
        """The n-gram replay's input (analysis/prediction.py), after the timed windows: each
        distinct prompt measured at the first level, from its first timed request.

        `plan`: every prompt the plan's windows may send (a baseline's, so that a candidate that
        sends more requests than it did is predicted too). A prompt timed at a later level gives
        its own streamed ids there (only the look-ahead is asked); one never timed, an untimed
        request, one at a time. At most the prompt set's size, over all levels.
        """
        m, prompts = window.m, window.prompt_type.prompts
        timed: dict[str, RequestSample | None] = {}
        for sample in m.samples:
            timed.setdefault(prompts[sample.prompt_index or 0].text, sample)
        if plan:
            for sample in (s for other in later for s in other.samples):
                timed.setdefault(prompts[sample.prompt_index or 0].text, sample)
            for index in (i for indices in plan for i in indices):
                timed.setdefault(prompts[index].text, None)
        untimed = sum(sample is None for sample in timed.values())
        start = self._clock.now()
        m.token_ids = record_token_ids(
            window.base, timed, headers=self.headers, transport=self._transports.sync
        )
        ids = m.token_ids
        ids.recorded_s = self._clock.now() - start
        self.store.flush()
        share = f" ({ids.recorded_s / m.wall_s:.0%} of the timed window)" if m.wall_s > 0 else ""
        beyond = f" ({untimed} not timed here: a candidate may send more)" if untimed else ""
        self.progress(
            f"{window.where}: token ids of {len(ids.prompts)} prompt(s){beyond} recorded in "
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

    def _watch(self, service: Service) -> contextlib.AbstractContextManager[Watch | None]:
        if self._probe is None:
            return contextlib.nullcontext()
        return Watch(self._probe, service)

    def _judge_host(self, window: _Window) -> str | None:
        """What moved beyond the bounds in this window's environment (None where clean)."""
        env = window.m.environment
        if env is None:
            return None
        other = None
        for phase in self.record.phases.values():
            m = phase.measurements.get(window.m.key)
            if phase.arm != window.phase.arm and m is not None and m.environment is not None:
                other = (phase.name, m.environment)
                break
        env.off = judge(
            env,
            usual_share=self._usual(window.m),
            other_arm=other[1] if other else None,
            other_label=f"{other[0] if other else 'the other arm'}'s window",
            bounds=self._bounds,
        )
        return env.off

    def _usual(self, current: Measurement | None = None) -> float:
        """The host's usual other work: the least of the run's clean windows so far and of the
        host before the run (taken before the server ran, so often more than during a window)."""
        shares = [
            m.environment.other_cpu_share
            for p in self.record.phases.values()
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
            self._clock.sleep(seconds)
            env = watch.environment()
        if env is None:
            return None
        if env.other_cpu_share is not None:
            self._usual_share = env.other_cpu_share
        self.record.environment["host_before_run"] = env.to_json()
        self.store.flush()
        return env

    def wait_for_quiet_host(self, service: Service) -> None:
        """Until a stretch passes with the host's other work within the bound; bounded."""
        if self._probe is None:
            return
        limit_s, step_s = self.settings.run.quiet_wait_s, 3.0
        start = self._clock.now()
        while self._clock.now() - start < limit_s:
            with Watch(self._probe, service, interval_s=step_s) as watch:
                self._clock.sleep(step_s)
                env = watch.environment()
            if (
                env is None
                or env.other_cpu_share is None
                or (
                    env.other_cpu_share - self._usual() <= self._bounds.other_share
                    and not env.other_gpu_processes
                )
            ):
                return
            self.progress(
                f"  … {self._clock.now() - start:.0f}s waiting for the host to be quiet: "
                f"{env.describe()}"
            )
        self.progress(f"the host did not fall quiet within {limit_s:.0f}s: measuring anyway")

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
