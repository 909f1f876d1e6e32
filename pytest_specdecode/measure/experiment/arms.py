"""The experiment: measure each phase once, on demand, into the run record as it goes."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import httpx

from ...analysis.variance.restarts import RestartNoise
from ...analysis.verdict.adaptive import pinned, target_se
from ...analysis.verdict.side_changes import control_name, control_plan
from ...config.arms import (
    BASELINE,
    BASELINE_AFTER,
    cell_key,
    design_order,
    together_order,
)
from ...config.prompts import RequestPlan, request_plan
from ...config.settings import PromptType, Settings
from ...config.specconfig import SpecConfig
from ...config.vllm_argv import REQUEST_METRICS_FLAG
from ...errors import ServiceError
from ...record.counters import Acceptance, Traffic, add_traffic, combine
from ...record.engine_settings import EngineSettings, from_server_info, parse_engine_log
from ...record.host_env import WindowEnvironment
from ...record.requests.level_stats import LevelStats
from ...record.requests.samples import RequestSample
from ...record.schema import ClientLoad, Measurement, Phase, RunRecord
from ...record.store import RunStore
from ...targets.base import Progress, Service, Transports
from ...targets.lifecycle import Switchboard
from ..host_load import Bounds, Probe, Watch, judge, pair_probe
from ..requests.loadgen import LevelResult, RequestSpec, planned_specs, run_level
from ..requests.token_ids import TokenIds, record_token_ids
from ..server_metrics import (
    ServerCounters,
    acceptance_between,
    parse_counters,
    traffic_between,
)
from ..traffic import foreign, quiet, rate_text
from .order import CellPlan, RoundOrder, order_seed, slot_size


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


@dataclass
class _Slot:
    """One slot as sent: its cell's requests, their aggregates, the server's counts over it."""

    cell: _Cell
    samples: list[RequestSample]
    stats: LevelStats
    traffic: Traffic
    acceptance: Acceptance


@dataclass
class _Cell:
    """One window of the interleaved order, measured slot by slot (measure/experiment/order.py)."""

    window: _Window
    plan: CellPlan
    service: Service
    kept: list[_Slot] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)  # which rounds were sent again, why


@dataclass
class _Start:
    """One server start measured in rounds: its cells, and per prompt type its plan."""

    phase: Phase
    service: Service
    cells: dict[str, _Cell] = field(default_factory=dict)
    prompt_types: list[tuple[PromptType, RequestPlan, list[_Window]]] = field(default_factory=list)


ROUNDS_PER_LINE = 5  # a progress line every this many rounds


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
        self.together = settings.run.arms == "together" and BASELINE not in reused
        design = together_order if self.together else design_order
        planned = design(arms, settings.run.repeats)
        self.order = [entry for entry in planned if entry[1] not in reused]
        # --spec-arms together: each baseline start's entry, then its candidate's, served at once
        self._partners = (
            {
                self.order[i][0]: self.order[i + 1]
                for i in range(0, len(self.order) - 1, 2)
                if self.order[i][1] == BASELINE
            }
            if self.together
            else {}
        )
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
            partner = self._partners.get(phase)
            if partner is not None and self.order[self._next] == partner:
                self._next += 1
                if partner[1] not in self._errors and arm not in self._errors:
                    self._start_pair(phase, *partner)
            elif arm not in self._errors:
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
        phase = self._new_phase(name, arm, spec, service, startup_s=self.board.last_startup_s)
        if self.settings.run.order == "blocked":
            for prompt_type in self.settings.prompt_types.values():
                self._measure_prompt_type(phase, prompt_type, service)
        else:
            self._measure_rounds([_Start(phase, service)], RoundOrder(phase.order_seed or 0))
        self.store.flush()

    def _start_pair(self, base_name: str, name: str, arm: str) -> None:
        """`--spec-arms together`: a baseline start and a candidate's start served at once (the
        Switchboard's `together`), each slot sent to both in turn, recorded as two phases."""
        spec = self.candidate(arm)
        # a repeat restarts a local original; a systemd original keeps serving as it is
        restart = self.settings.target.backend == "local" and bool(self.record.arm_phases(BASELINE))
        try:
            with self.board.together(spec, restart_original=restart) as (original, second):
                base = self._new_phase(base_name, BASELINE, None, original, startup_s=None)
                cand = self._new_phase(name, arm, spec, second, startup_s=self.board.last_startup_s)
                base.together_with, cand.together_with = cand.name, base.name
                seed = order_seed(self.settings.run.seed, name)
                base.order_seed = cand.order_seed = seed
                self.progress(
                    f"arms side by side: [{base.name}] on {original.label} and [{cand.name}] on "
                    f"{second.label}, each slot sent to one, then the other, never both at once"
                )
                starts = [_Start(base, original), _Start(cand, second)]
                self._measure_rounds(starts, RoundOrder(seed))
                self.store.flush()
        except Exception as exc:
            self._errors[arm] = exc
            self.record.failures[arm] = _first_line(exc)
            self.store.flush()
            if not self.record.arm_phases(BASELINE):  # the baseline alone, as one at a time
                self.progress(f"[{base_name}] measured alone: {arm} could not be served beside it")
                self._start_and_measure(base_name, BASELINE)

    def _new_phase(
        self,
        name: str,
        arm: str,
        spec: SpecConfig | None,
        service: Service,
        *,
        startup_s: float | None,
    ) -> Phase:
        run = self.settings.run
        phase = Phase(
            name=name,
            arm=arm,
            spec=dict(spec.values) if spec else None,
            service=service.label,
            server_version=self._version(service),
            extra_args=list(spec.extra_args) if spec else [],
            request_metrics=self._request_metrics(spec),
            startup_s=startup_s,
            control_of=spec.control_of if spec else None,
            env=dict(spec.env) if spec else {},
            order=run.order,
            order_seed=order_seed(run.seed, name) if run.order == "interleaved" else None,
        )
        phase.engine = self._engine(service)
        self.progress(f"[{name}] the engine ran with: {phase.engine.describe()}")
        self.record.phases[name] = phase
        self.store.flush()
        return phase

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
        self.progress(f"[{phase.name}] {prompt_type.name}: {plan.describe()}")
        windows = self._windows(phase, prompt_type, service)
        if plan.warmup:
            self._send(windows[0], plan.warmup, warmup=True)
        for window, indices in zip(windows, plan.levels, strict=True):
            self._measure_level(window, indices, service)
        self._token_ids_after(phase, prompt_type, windows, plan)

    def _windows(self, phase: Phase, prompt_type: PromptType, service: Service) -> list[_Window]:
        """A prompt type's window at each load level, each a new measurement of the phase."""
        run, levels = self.settings.run, self.settings.run.levels
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
        windows = []
        for level in levels:
            key = cell_key(prompt_type.name, level, several=len(levels) > 1)
            m = Measurement(
                prompt_type=prompt_type.name,
                level=level,
                key=key,
                slo=self.settings.slo.for_level(level),
            )
            phase.measurements[key] = m
            windows.append(_Window(phase, m, base, prompt_type))
        return windows

    def _token_ids_after(
        self, phase: Phase, prompt_type: PromptType, windows: Sequence[_Window], plan: RequestPlan
    ) -> None:
        """A prompt type's token ids, after the start's timed requests (none for a control)."""
        first = windows[0] if windows else None
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
        later = [w.m for w in windows[1:]]
        self._record_token_ids(first, later, plan.levels if whole_plan else ())
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
                wall = self._send(window, indices[:least]).stats.wall_s
                while len(m.samples) < most and not self._pinned(window):
                    # adaptive: only the spread decides, never the values themselves
                    sent = len(m.samples)
                    wall += self._send(window, indices[sent : sent + step]).stats.wall_s
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
        self._cell_summary(window)

    def _cell_summary(self, window: _Window) -> None:
        """A measured window's lines: its median, its acceptance, its warnings."""
        m, where = window.m, window.where
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

    def _send(
        self,
        window: _Window,
        indices: Sequence[int],
        *,
        warmup: bool = False,
        slot: int | None = None,
    ) -> LevelResult:
        """Requests for these prompts at the window's level; each journalled as it ends."""
        phase, m, prompt_type = window.phase, window.m, window.prompt_type
        kept = m.warmup if warmup else m.samples
        offset = len(kept)

        def keep(sample: RequestSample) -> None:
            sample.index += offset  # the request's place in the window, over top-ups too
            sample.slot = slot
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
        return result

    def _record_token_ids(
        self,
        window: _Window,
        later: Sequence[Measurement] = (),
        plan: Sequence[Sequence[int]] = (),
    ) -> None:
        """The n-gram replay's input (analysis/prediction/predict.py), after the timed windows: each
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

    def _watch(
        self, service: Service, pair: Sequence[Service] = ()
    ) -> contextlib.AbstractContextManager[Watch | None]:
        """The host through a window; with arms side by side, both servers are the run's own."""
        if self._probe is None:
            return contextlib.nullcontext()
        return Watch(pair_probe(self._probe, pair), service)

    def _judge_host(self, window: _Window) -> str | None:
        """What moved beyond the bounds in this window's environment (None where clean)."""
        env = window.m.environment
        if env is None:
            return None
        return self._judge_env(env, window.phase, window.m.key, current=window.m)

    def _judge_env(
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
        for earlier in self.record.phases.values():
            m = earlier.measurements.get(key)
            if other is None and earlier.arm != phase.arm and m is not None and m.environment:
                other = (earlier.name, m.environment)
        env.off = judge(
            env,
            usual_share=self._usual(current),
            other_arm=other[1] if other else None,
            other_label=f"{other[0] if other else 'the other arm'}'s window",
            bounds=self._bounds,
        )
        return env.off

    # -- the interleaved order (measure/experiment/order.py) --------------------------------------

    def _measure_rounds(self, starts: list[_Start], order: RoundOrder) -> None:
        """Warm-up, then round after round of slots, each to every start in turn; then each
        cell's figures and the token ids. `[run] order = "blocked"`: one cell after another."""
        run = self.settings.run
        for start in starts:
            self._prepare(start)
        for start in starts:  # warm-up first, one prompt type after another
            for _, plan, windows in start.prompt_types:
                if plan.warmup:
                    self._send(windows[0], plan.warmup, warmup=True)
        lead = starts[0]
        names = " and ".join(f"[{s.phase.name}]" for s in starts)
        kind = "shuffled" if run.order == "interleaved" else "one cell after another"
        self.progress(
            f"{names}: {len(lead.cells)} cells in rounds, one slot each ({kind}, seed "
            f"{order.seed}): a request at c1, a burst of N requests at cN"
        )
        slot = rounds = 0
        while keys := [k for k in lead.cells if any(self._wants(s.cells[k]) for s in starts)]:
            if run.order == "blocked":
                keys = keys[:1]
            rounds += 1
            sequence = order.round(keys)
            self._send_round(starts, sequence, slot, order, rounds)
            slot += len(sequence)
            if rounds % ROUNDS_PER_LINE == 0:
                self.progress(
                    f"{names}: {rounds} rounds, {slot} slots sent; {len(keys)} of "
                    f"{len(lead.cells)} cells still measuring"
                )
        for start in starts:
            for cell in start.cells.values():
                self._close_cell(cell)
                self._cell_summary(cell.window)
            self.store.flush()
        for start in starts:
            for prompt_type, plan, windows in start.prompt_types:
                self._token_ids_after(start.phase, prompt_type, windows, plan)

    def _prepare(self, start: _Start) -> None:
        """A start's windows and cells, prompt type by prompt type, on the request plan."""
        run = self.settings.run
        for prompt_type in self.settings.prompt_types.values():
            most = max(run.requests_at(level)[1] for level in run.levels)
            plan = request_plan(
                len(prompt_type.prompts), samples=most, warmup=run.warmup, levels=len(run.levels)
            )
            self.progress(f"[{start.phase.name}] {prompt_type.name}: {plan.describe()}")
            windows = self._windows(start.phase, prompt_type, start.service)
            start.prompt_types.append((prompt_type, plan, windows))
            for window, indices in zip(windows, plan.levels, strict=True):
                least, most = run.requests_at(window.m.level, fixed=self.settings.aa_only)
                cell = CellPlan(
                    window.m.key, tuple(indices), least, most, slot_size(window.m.level, least)
                )
                start.cells[window.m.key] = _Cell(window, cell, start.service)

    def _wants(self, cell: _Cell) -> bool:
        sent, plan = len(cell.window.m.samples), cell.plan
        # adaptive: only the spread decides, never the values themselves
        pinned = plan.least <= sent < plan.most and self._pinned(cell.window)
        return plan.wants(sent, pinned=pinned)

    def _send_round(
        self,
        starts: list[_Start],
        sequence: Sequence[str],
        first_slot: int,
        order: RoundOrder,
        number: int,
    ) -> None:
        """One round, sent again once quiet where other clients or other work contaminated it."""
        run = self.settings.run
        where = f"[{' + '.join(s.phase.name for s in starts)}] round {number}"
        set_aside: list[str] = []  # why each earlier try was set aside (the host)
        for attempt in range(1, run.traffic_attempts + 1):
            sent: list[_Slot] = []
            firsts: list[str] = []
            with contextlib.ExitStack() as stack:
                pair = [s.service for s in starts]
                watches = [stack.enter_context(self._watch(s.service, pair)) for s in starts]
                for j, key in enumerate(sequence):
                    turn = starts if len(starts) == 1 or order.a_first() else starts[::-1]
                    firsts.append(turn[0].phase.name)
                    for start in turn:  # one after the other, never both at once
                        sent.append(self._send_slot(start.cells[key], first_slot + j))
                envs = [w.environment() if w else None for w in watches]
            other = _round_foreign(starts, sent)
            busy = self._judge_round(starts, envs, sequence[0])
            if other is None and busy is None:
                self._keep(starts, sequence, sent, envs, firsts, set_aside)
                return
            if other is not None:
                self.progress(f"{where}: other clients used the server during the window ({other})")
            if busy is not None:
                self.progress(f"{where}: the host was not quiet during the window ({busy})")
            keep_busy = busy is None or run.allow_busy_host
            keep_foreign = other is None or run.on_traffic == "mark"
            if (keep_busy and keep_foreign) or attempt == run.traffic_attempts:
                if busy is not None and not run.allow_busy_host:
                    for env in envs:
                        if env is not None:
                            env.contaminated = busy
                if other is not None or not run.allow_busy_host:
                    self.progress(f"{where}: kept, marked contaminated")
                else:
                    self.progress(f"{where}: kept (--spec-allow-busy-host)")
                self._keep(starts, sequence, sent, envs, firsts, set_aside)
                return
            for slot in sent:  # kept in the record, not analysed
                m, gone = slot.cell.window.m, {id(x) for x in slot.samples}
                m.discarded += slot.samples
                m.samples = [x for x in m.samples if id(x) not in gone]
            self.store.flush()
            self.progress(
                f"{where}: measuring again (attempt {attempt + 1} of {run.traffic_attempts}) "
                f"once the {'server' if busy is None else 'host'} is quiet"
            )
            if other is not None:
                for start in starts:
                    self.wait_for_quiet(start.service)
            if busy is not None:  # one host: the pair watched as one server
                self.wait_for_quiet_host(starts[0].service, [s.service for s in starts])
                set_aside.append(f"round {number}: {busy}")  # as its progress lines name it

    def _send_slot(self, cell: _Cell, slot: int) -> _Slot:
        """One slot, between two reads of its server's counters (untimed)."""
        before = self._counters(cell.service)
        indices = cell.plan.next_slot(len(cell.window.m.samples))
        result = self._send(cell.window, indices, slot=slot)
        after = self._counters(cell.service)
        return _Slot(
            cell,
            result.samples,
            result.stats,
            traffic_between(before, after),
            acceptance_between(before, after),
        )

    def _judge_round(
        self, starts: list[_Start], envs: Sequence[WindowEnvironment | None], key: str
    ) -> str | None:
        """What moved beyond the bounds on any start's host through the round (None: clean)."""
        notes = []
        pairs = list(zip(starts, envs, strict=True))
        for start, env in pairs:
            if env is None:
                continue
            beside = next(((s.phase.name, e) for s, e in pairs if s is not start and e), None)
            off = self._judge_env(env, start.phase, key, beside=beside)
            if off:
                notes.append(off if len(starts) == 1 else f"{start.phase.name}: {off}")
        return "; ".join(notes) or None

    def _keep(
        self,
        starts: list[_Start],
        sequence: Sequence[str],
        sent: Sequence[_Slot],
        envs: Sequence[WindowEnvironment | None],
        firsts: Sequence[str],
        set_aside: Sequence[str],
    ) -> None:
        for slot in sent:
            slot.cell.kept.append(slot)
        for start, env in zip(starts, envs, strict=True):
            for key in sequence:
                cell = start.cells[key]
                cell.set_aside += set_aside
                if env is not None:
                    cell.window.m.environment = _worse(cell.window.m.environment, replace(env))
            if len(starts) > 1:
                start.phase.sent_first += firsts
        self.store.flush()

    def _close_cell(self, cell: _Cell) -> None:
        """A cell's figures over its kept slots: wall time, counters, the client's load."""
        m = cell.window.m
        m.wall_s = sum(s.stats.wall_s for s in cell.kept)
        m.acceptance = combine([s.acceptance for s in cell.kept])
        m.traffic = add_traffic([s.traffic for s in cell.kept])
        m.foreign = foreign(m.traffic, m.samples)
        m.client = ClientLoad()
        for slot in cell.kept:
            m.client.add(slot.stats)
        if m.environment is not None:
            m.environment.remeasured = list(cell.set_aside)

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

    def wait_for_quiet_host(self, service: Service, pair: Sequence[Service] = ()) -> None:
        """Until a stretch passes with the host's other work within the bound; bounded."""
        if self._probe is None:
            return
        limit_s, step_s = self.settings.run.quiet_wait_s, 3.0
        start = self._clock.now()
        while self._clock.now() - start < limit_s:
            with Watch(pair_probe(self._probe, pair), service, interval_s=step_s) as watch:
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
        """The adaptive stop rule (analysis/verdict/adaptive.py), against this run's earlier
        starts."""
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


def _round_foreign(starts: Sequence[_Start], sent: Sequence[_Slot]) -> str | None:
    """Other clients' traffic on any start's server through a round (None: only ours)."""
    notes = []
    for start in starts:
        own = [s for s in sent if s.cell.service is start.service]
        found = foreign(add_traffic([s.traffic for s in own]), [x for s in own for x in s.samples])
        if found:
            notes.append(found if len(starts) == 1 else f"{start.phase.name}: {found}")
    return "; ".join(notes) or None


def _worse(a: WindowEnvironment | None, b: WindowEnvironment) -> WindowEnvironment:
    """Of a cell's rounds' environments, the one to keep: the off one, else the busiest."""
    if a is None:
        return b

    def rank(env: WindowEnvironment) -> tuple[bool, float]:
        return (bool(env.off or env.contaminated), env.other_cpu_share or 0.0)

    return b if rank(b) > rank(a) else a


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
