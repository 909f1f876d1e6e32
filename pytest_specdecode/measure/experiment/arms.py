"""The experiment: the design's server starts, each measured once, on demand, into the run
record as it goes. This module starts the arms and opens their phases; a start's requests are
sent by rounds.py (interleaved) or windows.py (blocked), watched by watch.py."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence

import httpx

from ...analysis.variance.restarts import RestartNoise
from ...analysis.verdict.adaptive import target_se
from ...analysis.verdict.side_changes import control_name, control_plan
from ...config.arms import BASELINE, BASELINE_AFTER, planned_order, together_groups
from ...config.settings import Settings
from ...config.specconfig import SpecConfig, VllmFacts
from ...config.vllm_argv import REQUEST_METRICS_FLAG
from ...errors import ServiceError
from ...record.counters import Traffic, combine
from ...record.engine_settings import EngineSettings, from_server_info, parse_engine_log
from ...record.host_env import WindowEnvironment
from ...record.measurement import Measurement
from ...record.schema import Phase, RunRecord
from ...record.store import RunStore
from ...targets.base import Progress, Service, Transports
from ...targets.lifecycle import Switchboard
from ..host_load import Probe
from .context import RunContext
from .drafter_check import check_beside, check_drafter
from .order import RoundOrder, order_seed
from .regime import regime_window
from .rounds import Rounds, Start
from .token_record import TokenIdRecorder
from .watch import QuietWatch
from .windows import WindowSender


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
        facts: VllmFacts | None = None,
        probe: Probe | None = None,
        step: Progress | None = None,
        first_round: Callable[[float], None] | None = None,
    ) -> None:
        self.settings = settings
        self.request_metrics_note = request_metrics_note  # why candidates do not ask, if so
        self.facts = facts  # the serving vLLM's, where it was asked: its side-change rules
        self.board = board
        self.store = store
        self.progress = progress
        self.headers = dict(headers or {})
        self._ctx = RunContext(settings, store, progress, self.headers, transports or Transports())
        if step is not None:  # what the run is doing now, for a cut run's report
            self._ctx.step = step
        self._ctx.first_round = first_round  # after the first round: the run's own estimate
        # What the adaptive stop rule knows of the host: the restart noise, a request's residual
        known = dict(outside or {})
        throughput = known.get("throughput")
        noise_sd = throughput.sd if throughput else settings.run.assumed_restart_noise
        self.quiet = QuietWatch(self._ctx, probe)
        self._sender = WindowSender(
            self._ctx,
            self.quiet,
            target=target_se(noise_sd, settings.run.min_effect),
            residual={metric: n.residual for metric, n in known.items()},
            noise=known,
        )
        self._ids = TokenIdRecorder(self._ctx)
        self._rounds = Rounds(self._ctx, self._sender, self.quiet, self._ids)
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
        planned = planned_order(
            arms, settings.run.repeats, together=self.together, at_once=settings.run.beside
        )
        self.order = [entry for entry in planned if entry[1] not in reused]
        # --spec-arms together: each baseline start's entry, then its candidates', served at once
        self._partners = together_groups(self.order) if self.together else {}
        self._next = 0
        self._pairs = 0  # pairs of starts served side by side so far
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
        found = control_plan(self.record, spec, version=self._known_version(), facts=self.facts)
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
            group = self._partners.get(phase)
            if group and self.order[self._next : self._next + len(group)] == group:
                self._next += len(group)
                if arm not in self._errors and all(a not in self._errors for _, a in group):
                    self._start_group(phase, group)
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
        self._ctx.step(f"starting {name}")
        service = self.board.activate(spec, restart=restart)
        if spec is not None:  # a drafter with a model: its first requests, before any window
            check_drafter(self._ctx, name, spec, service)
        phase = self._new_phase(name, arm, spec, service, startup_s=self.board.last_startup_s)
        if self.settings.run.order == "blocked":
            for prompt_type in self.settings.prompt_types.values():
                plan, windows = self._sender.measure_blocked(phase, prompt_type, service)
                self._ids.after_start(phase, prompt_type, windows, plan)
        else:
            self._rounds.measure([Start(phase, service)], RoundOrder(phase.order_seed or 0))
        self.store.flush()

    def _start_group(self, base_name: str, group: list[tuple[str, str]]) -> None:
        """`--spec-arms together`: a baseline start and one or more candidates' starts served at
        once (the Switchboard's `together_all`), each slot sent to every one in turn, never two
        at once, recorded as a phase each. One candidate: a pair, whose places alternate."""
        specs = [self.candidate(arm) for _, arm in group]
        # a repeat restarts a local original; a systemd original keeps serving as it is
        restart = self.settings.target.backend == "local" and bool(self.record.arm_phases(BASELINE))
        # the places turn between groups, so that a place's own speed (seen: one core 8.9%
        # faster than the other) weighs on every arm alike
        swap = self._pairs % 2 == 1
        self._pairs += 1
        self._ctx.step(f"starting {', '.join(n for n, _ in group)} beside {base_name}")
        regime = regime_window(self._ctx, self._rounds, base_name, group)
        try:
            with self._served(specs, restart=restart, swap=swap, first=regime) as (
                original,
                seconds,
            ):
                live, broken = check_beside(self._ctx, group, specs, seconds)  # before windows
                for arm, exc in broken.items():  # a broken drafter fails its own arm only
                    self._errors[arm], self.record.failures[arm] = exc, _first_line(exc)
                if not live:
                    raise next(iter(broken.values()))
                base = self._new_phase(base_name, BASELINE, None, original, startup_s=None)
                cands = [
                    self._new_phase(name, arm, spec, second, startup_s=self.board.last_startup_s)
                    for _, (name, arm), spec, second in live
                ]
                base.together_with = cands[0].name
                seed = order_seed(self.settings.run.seed, cands[0].name)
                base.order_seed = seed
                base.position = 1 if self.board.swapped else 0
                for (place, _, _, _), cand in zip(live, cands, strict=True):
                    cand.together_with, cand.order_seed = base.name, seed
                    cand.position = (place + 1) % (len(group) + 1) if self.board.swapped else place
                where = " and ".join(
                    f"[{p.name}] on {_where(s)}"
                    for p, s in zip([base, *cands], [original, *(x[3] for x in live)], strict=True)
                )
                self.progress(
                    f"arms side by side: {where}, each slot sent to one after the other, never "
                    "two at once"
                )
                starts = [Start(base, original)]
                starts += [Start(c, live[i][3]) for i, c in enumerate(cands)]
                self._rounds.measure(starts, RoundOrder(seed))
                self.store.flush()
        except Exception as exc:
            for _, arm in group:
                self._errors.setdefault(arm, exc)  # a broken drafter's own error stays
                self.record.failures.setdefault(arm, _first_line(exc))
            self.store.flush()
            if not self.record.arm_phases(BASELINE):  # the baseline alone, as one at a time
                names = ", ".join(arm for _, arm in group)
                self.progress(
                    f"[{base_name}] measured alone: {names} could not be served beside it"
                )
                self._start_and_measure(base_name, BASELINE)

    @contextlib.contextmanager
    def _served(
        self,
        specs: list[SpecConfig],
        *,
        restart: bool,
        swap: bool,
        first: Callable[[Service, Service], None] | None = None,
    ) -> Iterator[tuple[Service, list[Service]]]:
        """The original and the candidates beside it: a pair through `together`, more through
        `together_all` (`first`: the regime window, once the first of them serves)."""
        if len(specs) == 1:
            with self.board.together(specs[0], restart_original=restart, swap=swap) as (o, s):
                yield o, [s]
        else:
            with self.board.together_all(
                specs, restart_original=restart, swap=swap, first_beside=first
            ) as found:
                yield found

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
            server_version=self._ctx.version(service),
            extra_args=list(spec.extra_args) if spec else [],
            request_metrics=self._request_metrics(spec),
            startup_s=startup_s,
            control_of=spec.control_of if spec else None,
            env=dict(spec.env) if spec else {},
            order=run.order,
            order_seed=order_seed(run.seed, name) if run.order == "interleaved" else None,
            # its first start died before serving, and this is the second (Switchboard._serve)
            died_start=self.board.died_starts.pop(spec.name, None) if spec else None,
        )
        phase.engine = self._engine(service)
        self.progress(f"[{name}] the engine ran with: {phase.engine.describe()}")
        self.record.phases[name] = phase
        self.store.flush()
        return phase

    def watch(self, service: Service, seconds: float) -> Traffic:
        """The server's traffic over a while, with nothing sent by this run."""
        return self.quiet.watch(service, seconds)

    def host_before(self, service: Service, seconds: float = 3.0) -> WindowEnvironment | None:
        """The host before the run, against which each window is judged (watch.py)."""
        return self.quiet.host_before(service, seconds)

    def _engine(self, service: Service) -> EngineSettings:
        """What this start ran with: its whole log, and /server_info where vLLM's dev mode
        offers it."""
        read = getattr(service, "settings_log", None)  # a conftest's own service may lack it
        try:
            lines = read() if read else []
        except Exception:  # a fact, not a precondition: never fail a start over it
            lines = []
        settings = parse_engine_log(lines)
        text = self._ctx.get(service, "/server_info?config_format=json")
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


def _where(service: Service) -> str:
    """A service with its place, where it has one (its cores or GPU share)."""
    placement = getattr(service, "placement", "")
    return f"{service.label} ({placement})" if placement else service.label


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
