"""Before anything is touched: the run's plan, made on its target, and what the target is doing.

`Planning` holds what the session learns of its target before it changes anything: the
candidates checked against the target's own vLLM (`vllm_facts`, and whether each candidate asks
for per-request metrics), the drafters checked (`drafters`), the arms chosen for this host
(`[run] arms = "auto"`, run/arms.py), and the settings as they resolved there. It says the plan:
the whole of it for --spec-dry-run (`dry_run`), or into run.log as a run starts (`log`). Once the
services are held, before the first start, it watches the host's other work (`watch_host`) and
the service's other clients (`watch_traffic`, which refuses the run unless allowed).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from ..analysis.drafters.check import Drafter
from ..config.settings import Settings
from ..config.shape.served import ServedShape
from ..config.specconfig import VllmFacts
from ..errors import ConfigError, HostError, SpecDecodeError
from ..measure.experiment.arms import Experiment
from ..measure.traffic import quiet, rate_text
from ..progress import ProgressLog, write_line
from ..record.counters import TrafficWatch
from ..record.profile import lookup
from ..report.plan import (
    Timing,
    drafter_plan,
    dry_run_lines,
    search_text,
    service_plan,
    side_change_plan,
)
from ..report.plan_reach import estimate_line, time_lines
from ..report.schedule import PlanTime
from ..report.sections.shape import plan_lines as shape_plan_lines
from ..report.stored_plan import stored_prediction, stored_search_plan
from ..targets.base import Service, Target
from ..targets.facts.vllm import (
    request_metrics_args,
    request_metrics_plan,
    validated_against_target,
    with_request_metrics,
)
from ..targets.host_env import busiest
from ..targets.shaped import SHAPE_FOLDER, resolve_shape
from .arms import choose_arms, with_arms, with_regime, with_regime_window
from .drafters import check_drafters
from .host_noise import HostNoise
from .map_on_shape import map_plan, with_map_on_shape
from .replicas import replicas_dry_run


class Planning:
    """What the session learns of its target before anything is touched, and the plan it says."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        host_noise: HostNoise,
        progress: ProgressLog,
        open_target: Callable[[Path], Target],
        *,
        run_dir: Path | None = None,
    ) -> None:
        self.config = config
        self.settings = settings  # as configured; then as resolved on the target
        self.host_noise = host_noise
        self.progress = progress
        self.open_target = open_target  # the target, its servers' logs in this folder
        self.vllm_facts: VllmFacts | None = None  # what the candidates were validated against
        self.drafters: list[Drafter] = []  # each drafter's config, checked where it is loaded
        self.request_metrics_note: str | None = None  # why no per-request metrics, if so
        self.planned_s: float | None = None  # the plan's estimate of what follows the plan
        self.methods_s: float | None = None  # asking the target's vLLM for its methods, as timed
        self.time: PlanTime | None = None  # the run's whole time as the plan said it
        self.timing: Timing | None = None  # the pace it rests on
        self.regime_line: str | None = None  # the regime window, sized or left out, and why
        # --spec-shape: the architecture served with dummy weights; its config.json goes into
        # the run's folder (targets/shaped.py); `open_target` serves it once it is resolved
        self.shape: ServedShape | None = None
        self.shape_folder = (run_dir or settings.reports_dir) / SHAPE_FOLDER

    def validate(self) -> None:
        """The candidates checked against the target's own vLLM (read-only), and the drafters;
        a host that cannot be reached refuses the run, nothing touched."""
        target = self.open_target(self.settings.reports_dir)
        try:
            began = time.monotonic()
            facts = validated_against_target(
                target, self.settings.candidates, progress=self.progress
            )
            self.methods_s = time.monotonic() - began
            self.drafters = check_drafters(target, self.settings.candidates, progress=self.progress)
            self.resolve_shape(target, facts)
        except HostError as exc:  # the host cannot be reached: nothing was touched
            raise ConfigError(str(exc)) from None
        finally:
            target.close()  # touches the host only to undo what this run did: nothing
        self._use_facts(facts)

    def _use_facts(self, facts: VllmFacts) -> None:
        """The facts the candidates were checked against; each speculative candidate then asks
        for per-request metrics where that vLLM knows the option."""
        self.vllm_facts = facts
        _, self.request_metrics_note = request_metrics_args(facts)
        candidates = with_request_metrics(self.settings.candidates, facts)
        self.settings = dataclasses.replace(self.settings, candidates=candidates)

    def resolve_shape(self, target: Target, facts: VllmFacts) -> None:
        """--spec-shape: the shape read, its depth fitted to the room and checked against the
        serving vLLM, or refused (ShapeRefused); reads only (targets/shaped.py)."""
        asked, run = self.settings.shape, self.settings.run
        if asked is None or self.shape is not None:
            return
        # side by side (or auto, which may choose it): the depth must fit each server's part
        several = min(run.beside, len(self.settings.candidates))
        beside = 0 if run.arms == "one-at-a-time" else several
        self.shape = resolve_shape(
            target,
            self.settings.target,
            asked,
            facts,
            folder=self.shape_folder,
            beside=beside,
            progress=self.progress,
        )
        # --spec-break-even on the shape: its carrier, drafters and depths (run/map_on_shape.py)
        self.settings, self.shape = with_map_on_shape(self.settings, self.shape)
        self._use_facts(facts)

    # -- the dry run ----------------------------------------------------------------------------
    def dry_run(self) -> int:
        """Print the plan. Nothing is started, written or locked; only reads on a host."""
        settings = self.settings
        if settings.replicas:  # a target of several replicas: its own plan
            return replicas_dry_run(self.config, settings, self.progress)
        target = self.open_target(settings.reports_dir)
        try:
            checked = []
            if settings.candidates or settings.shape is not None:
                began = time.monotonic()
                facts = validated_against_target(
                    target, settings.candidates, progress=self.progress
                )
                self.methods_s = time.monotonic() - began
                self._use_facts(facts)
                settings = self.settings
                self.drafters = check_drafters(target, settings.candidates, progress=self.progress)
                checked = [
                    f"validated the candidates against {facts.describe()}"
                    + (f" ({facts.note})" if facts.note else ""),
                    request_metrics_plan(facts),
                ]
                if self.drafters:
                    checked.append(
                        "\n".join(["checked the drafters:", *drafter_plan(self.drafters)])
                    )
                target = self._shaped(target, facts)
            arms = self.choose_arms(target)
            settings = self.settings
            steps = [*checked, *service_plan(settings, target)]
        except SpecDecodeError as exc:
            write_line(f"pytest-specdecode dry run: {exc}")
            return pytest.ExitCode.USAGE_ERROR
        finally:
            target.close()  # touches the host only to undo what this run did: nothing
        lines = dry_run_lines(
            settings,
            steps,
            host=target.host_name,
            aba=self.config.getoption("spec_aba"),
            baseline_from=self.config.getoption("spec_baseline_from"),
            adopts_original=target.adopts_running_original,
            noise=self.host_noise.noise_plan(target),
            predicted=(
                stored_search_plan(settings, host=target.host_name)
                if settings.run.search
                else stored_prediction(settings, host=target.host_name)
            ),
            design=[*filter(None, [self.regime_line]), *self.design_lines(target)],
            side_changes=side_change_plan(settings, self._target_version(), self.vllm_facts),
            arms=arms,
            duration=self.time_lines(target),
        )
        at = next((i + 1 for i, line in enumerate(lines) if line.startswith("model:")), 1)
        timing = self.host_noise.timing(target, settings)
        shaped = shape_plan_lines(self.shape, unit=self._shape_unit())
        lines[at:at] = [*shaped, *map_plan(settings, self.shape, timing)]
        write_line("\n".join(lines), stream=sys.stdout)
        return pytest.ExitCode.OK

    def _shape_unit(self) -> str | None:
        """The unit whose window the shape is served in; None for a local command."""
        t = self.settings.target
        return t.unit if t.backend == "systemd" else None

    def _shaped(self, target: Target, facts: VllmFacts) -> Target:
        """--spec-shape: the target opened again, serving the shape (its plan, its servers)."""
        if self.settings.shape is None:
            return target
        self.resolve_shape(target, facts)
        target.close()
        return self.open_target(self.settings.reports_dir)

    # -- the run's plan -------------------------------------------------------------------------
    def log(self, target: Target) -> None:
        """The plan into run.log as a run starts, its arms chosen on this host; the estimate
        the run records as its plan's (`planned_s`)."""
        self.progress(f"plan: {self.choose_arms(target)}")
        if self.regime_line:
            self.progress(f"plan: {self.regime_line}")
        settings = self.settings
        duration = self.time_lines(target)
        timing = self.timing or self.host_noise.timing(target, settings)
        shaped = shape_plan_lines(self.shape, unit=self._shape_unit())
        for line in [*shaped, *map_plan(settings, self.shape, timing)]:
            self.progress(f"plan: {line}")
        for step in service_plan(settings, target):
            self.progress(f"plan: {step}")
        if settings.run.search:
            self.progress(f"plan: candidates {search_text(settings.run)}")
        self.progress(f"plan: restart noise: {self.host_noise.noise_plan(target)}")
        for line in self.design_lines(target):
            self.progress(f"plan: {line}")
        for line in duration:
            self.progress(f"plan: {line}")
        for line in side_change_plan(settings, self._target_version(), self.vllm_facts):
            self.progress(f"plan: {line}")
        for line in drafter_plan(self.drafters):
            self.progress(f"plan: drafter: {line}")

    def time_lines(self, target: Target) -> list[str]:
        """The run's whole time, every part in it, at this host's pace and with the range it
        leaves open (report/plan_reach.py → `time_lines`); kept for the run's own estimate
        after its first start and round, and as the estimate a stored run is paced against
        (`planned_s`: what follows the plan)."""
        settings = self.settings
        self.timing = self.host_noise.timing(target, settings)
        self.time, stop = self.host_noise.plan_time(
            target,
            settings,
            self.timing,
            baseline=self.config.getoption("spec_baseline_from") is None,
            aba=self.config.getoption("spec_aba"),
            methods_s=self.methods_s,
        )
        self.planned_s = self.time.ahead
        return time_lines(self.time, self.timing, stop)

    def estimate_now(
        self, target: Target, startups: Sequence[float], slot_s: float, elapsed_s: float
    ) -> str | None:
        """After the first start and round: the whole time again, at the starts and the slot
        this run measured (`elapsed_s`: since the run began, after the methods query)."""
        if self.time is None or self.timing is None:
            return None
        tokens = [t.max_tokens for t in self.settings.prompt_types.values()] or [1]
        start_s = sum(startups) / len(startups) if startups else self.timing.start_s
        timing = Timing(start_s, slot_s * len(tokens) / max(1, sum(tokens)), "measured")
        found, _ = self.host_noise.plan_time(
            target,
            self.settings,
            timing,
            baseline=self.config.getoption("spec_baseline_from") is None,
            aba=self.config.getoption("spec_aba"),
            methods_s=self.methods_s,
        )
        done = (self.methods_s or 0.0) + elapsed_s
        return estimate_line(found, self.time, startups, slot_s, done)

    def _target_version(self) -> str | None:
        """The target's vLLM version where it was asked (not the offline list's)."""
        facts = self.vllm_facts
        return facts.version if facts is not None and not facts.offline else None

    def choose_arms(self, target: Target) -> str:
        """`[run] arms = "auto"` resolved on this host (run/arms.py): the settings from here on
        serve the arms side by side or one at a time; the plan's line says which, and why."""
        key = self.host_noise.plan_key(target)
        mode, why = choose_arms(
            self.settings,
            target,
            machine=self.host_noise.machine_of(target),
            profile=lookup(self.host_noise.profiles, key).profile,
            version=key.vllm_version,
        )
        settings, fewer = with_regime(
            with_arms(self.settings, mode), lambda: self.host_noise.regimes(target)
        )
        settings, self.regime_line = with_regime_window(
            settings, lambda: self.host_noise.regime_spread(target)
        )
        self.settings = self.host_noise.settings = settings
        how = f"arms: {'side by side' if mode == 'together' else 'one at a time'}: {why}"
        return how + (f"; servers beside: {fewer}" if fewer else "")

    def design_lines(self, target: Target) -> list[str]:
        """What the design can call on this host, and what would call --spec-detect's change."""
        return self.host_noise.design_lines(
            target,
            self.settings,
            detect=self.config.getoption("spec_detect"),
            baseline=self.config.getoption("spec_baseline_from") is None,
            aba=self.config.getoption("spec_aba"),
        )

    # -- what the target is doing, before the first start ----------------------------------------
    def watch_host(self, experiment: Experiment, target: Target, original: Service) -> None:
        """Before the run: the host's other work, against which each window is judged; a busy
        host is named in the plan with what is using it."""
        run = self.settings.run
        env = experiment.host_before(original)
        if env is None:
            return
        self.progress(f"the host before the run: {env.describe()}")
        share = env.other_cpu_share or 0.0
        if share <= run.busy_host_share and not env.other_gpu_processes:
            return
        using = "; ".join(busiest(target.host)) or "unknown"
        after = (
            "measured anyway, its environment beside every verdict (--spec-allow-busy-host)"
            if run.allow_busy_host
            else f"each window is measured again where other work moves by more than "
            f"{run.busy_host_share:.0%} of the host beyond its usual"
        )
        self.progress(f"plan: a busy host: {env.describe()}; using it: {using}; {after}")

    def watch_traffic(self, experiment: Experiment, original: Service) -> None:
        """Before anything is touched: is anyone else using the service? Refuse if so, unless
        allowed (their requests are then told apart per window)."""
        run = self.settings.run
        self.progress.step(f"watching {original.label} for other clients' traffic")
        self.progress(
            f"watching {original.label} for {run.traffic_watch_s:g}s for other clients' traffic"
        )
        seen = experiment.watch(original, run.traffic_watch_s)
        text = rate_text(seen, run.traffic_watch_s)
        experiment.record.traffic_watch = TrafficWatch(
            seconds=run.traffic_watch_s, traffic=seen, text=text, quiet=quiet(seen)
        )
        experiment.store.flush()
        self.progress(f"traffic before the run: {text}")
        if quiet(seen) or run.allow_traffic:
            return
        message = (
            f"{original.label} is serving other clients ({text}): their requests would move "
            "the timings and the acceptance counters. Refusing to touch it; nothing was "
            "touched. Pass --spec-allow-traffic to measure it anyway (each window is then "
            "checked, and measured again where others' requests show)"
        )
        self.progress(message)
        pytest.exit(f"pytest-specdecode: {message}", returncode=pytest.ExitCode.USAGE_ERROR)
