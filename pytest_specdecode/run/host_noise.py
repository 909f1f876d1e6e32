"""What a run knows of its host's noise and speed, and what an A/A run adds to it.

Before the run: the host profile and stored runs of its key (host, accelerator, model, vLLM
version) give the restart noise, the drift and the engine's speed that the plan states. After an
A/A run: its entry is added to the profile. The session asks; this object reads and writes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..analysis.map.regime import Regime, regime_of, regime_spread
from ..analysis.variance.restarts import RestartNoise
from ..analysis.variance.time_drift import TimeDrift, drift_text
from ..analysis.verdict import noise
from ..analysis.verdict.compare import METRICS
from ..analysis.verdict.design import assumed_residual
from ..config.arms import BASELINE
from ..config.settings import Settings
from ..config.specconfig import VllmFacts
from ..errors import ConfigError
from ..measure.environment import machine
from ..measure.served_speed import served_speed
from ..progress import ProgressLog
from ..record.profile import (
    ProfileKey,
    accelerator_of,
    add_entry,
    design_of,
    lookup,
    profiles_dir,
    recorded_accelerator,
    speed_of,
    with_held_version,
)
from ..record.schema import RunRecord
from ..record.store import stored_runs
from ..report.plan import Timing, previous_timing
from ..report.plan_reach import StopSlots, design_lines, plan_time
from ..report.schedule import PlanTime
from ..report.text import noise_text
from ..targets.base import Target
from .folder import api_headers

SPEED_GAP = 0.2  # a baseline this much faster or slower than its profile's is named


class HostNoise:
    """The restart noise, drift and speed this host's profile and stored runs hold."""

    def __init__(
        self,
        settings: Settings,
        *,
        profiles: Path,
        run_dir: Path,
        progress: ProgressLog,
        facts: Callable[[], VllmFacts | None],
    ) -> None:
        self.settings = settings
        self.profiles = profiles
        self._run_dir = run_dir
        self._progress = progress
        self._facts = facts  # what the candidates were validated against, once known
        self._machine: dict[str, Any] | None = None  # the serving host's GPUs and CPU, once read
        self._served: tuple[float | None] | None = None  # a running server's speed, once read

    @classmethod
    def of_option(cls, option: str | None, settings: Settings, **kwargs: Any) -> HostNoise:
        return cls(settings, profiles=profiles_dir(option, settings.host_profiles), **kwargs)

    # -- before the run: the plan -------------------------------------------------------------
    def timing(self, target: Target, settings: Settings) -> Timing:
        """From this host's stored runs of its accelerator, else its profile's engine speed."""
        key = self.plan_key(target)
        if self._served is None:  # read once: a server already answering (nothing changes)
            try:
                headers = api_headers(settings)
            except ConfigError:
                headers = None  # the run refuses it elsewhere; the dry run says so
            found = (
                served_speed(target.api_base, headers, target.transports().sync)
                if headers is not None
                else None
            )
            self._served = (found,)
        return previous_timing(
            settings,
            host=target.host_name,
            default_start_s=target.typical_start_s,
            accelerator=key.accelerator,
            profile=lookup(self.profiles, key),
            served=self._served[0],
            machine=self.machine_of(target).get("machine"),
        )

    def design_lines(
        self,
        target: Target,
        settings: Settings,
        *,
        detect: float | None,
        baseline: bool,
        aba: bool,
    ) -> list[str]:
        """What the design can call on this host, and what would call --spec-detect's change."""
        return design_lines(
            settings,
            self.known(self.plan_key(target)),
            detect=detect,
            timing=self.timing(target, settings),
            baseline=baseline,
            aba=aba,
            adopts_original=target.adopts_running_original,
            drift=self._drift(self.plan_key(target)),
            accelerator=getattr(self.plan_key(target).accelerator, "kind", None),
        )

    def plan_time(
        self,
        target: Target,
        settings: Settings,
        timing: Timing,
        *,
        baseline: bool,
        aba: bool,
        methods_s: float | None,
    ) -> tuple[PlanTime, StopSlots | None]:
        """The run's whole time at this pace (report/plan_reach.py → `plan_time`), its cells
        stopping where this host's noise lets the stop rule stop them."""
        key = self.plan_key(target)
        return plan_time(
            settings,
            self.known(key),
            timing,
            baseline=baseline,
            aba=aba,
            adopts_original=target.adopts_running_original,
            methods_s=methods_s,
            accelerator=getattr(key.accelerator, "kind", None),
        )

    def noise_plan(self, target: Target) -> str:
        """What the verdicts will know of restart noise, as far as it can be told beforehand:
        the same key's profile and stored runs they will read, named with the key."""
        key = self.plan_key(target)
        found = lookup(self.profiles, key)
        measured = self.known(key).get("throughput")
        facts = self._facts()
        asked = facts is not None and not facts.offline and facts.version == key.vllm_version
        told = (
            ""
            if asked or key.vllm_version is None
            else (
                f"; if the server runs vLLM {key.vllm_version}, as this profile's runs did (its "
                "version is read when it starts)"
            )
        )
        if measured is not None:
            return f"{noise_text(measured)} for {key.describe()}{told}"
        text = noise.assumed(self.settings.run.assumed_restart_noise).source
        unused = noise.not_used(found, self._stored(key))
        return f"{text}, for {key.describe()}" + (f"; {unused}" if unused else "")

    def machine_of(self, target: Target) -> dict[str, Any]:
        """The serving host's GPUs, CPU and accelerator: read once, on the host."""
        if self._machine is None:
            self._machine = machine(target.host)
        return self._machine

    def plan_key(self, target: Target) -> ProfileKey:
        """The key this run's restart noise will have, as far as known before it starts: the
        vLLM version the candidates were validated against on the host; where none was asked
        (or only the offline list answered), the one version this key's profile holds."""
        facts = self._facts()
        found = self.machine_of(target)
        key = ProfileKey(
            target.host_name,
            accelerator_of(found.get("gpus"), found.get("cpu")),
            self.settings.target.model,
            facts.version if facts is not None and not facts.offline else None,
        )
        return with_held_version(self.profiles, key)

    def known(self, key: ProfileKey, machine: str | None = None) -> dict[str, RestartNoise]:
        """What this key's profile and stored runs (those the profile does not already hold)
        measured of restart noise, per metric; another machine's only as a prior (`machine`:
        this one's, else the serving host's as read for the plan)."""
        here = machine or (self._machine or {}).get("machine")
        return noise.known(
            lookup(self.profiles, key), self._stored(key), design=self._design(), machine=here
        )

    # -- during and after the run -------------------------------------------------------------
    def record_prior(self, record: RunRecord) -> bool:
        """Once the baseline's vLLM version is known: the restart noise the profile and stored
        runs of this key (host, accelerator, model, version) measured, recorded in the run.
        False where there was nothing to record (already done, or no baseline yet)."""
        baseline = record.arm_phases(BASELINE)
        if record.restart_noise_prior is not None or not baseline:
            return False
        key = noise.key_of(record)
        known = self.known(key, record.environment.get("machine"))
        prior = {m: n.to_dict() for m, n in known.items()}
        unused = noise.not_used(lookup(self.profiles, key), self._stored(key))
        sd = record.run.assumed_restart_noise
        for metric in METRICS:
            if metric in known:
                self._progress(f"restart noise of {metric}: {noise_text(known[metric])}")
                continue
            prior[metric] = noise.assumed(sd, note=unused).to_dict()
            own = "; this A/A run's starts measure it" if noise.is_aa_run(record) else ""
            self._progress(
                f"restart noise of {metric} before this run: none measured for "
                f"{key.describe()}; the prior is assumed {sd:.0%}{own}"
                + (f"; {unused}" if unused else "")
            )
        record.restart_noise_prior = prior
        slower = self._speed_note(record, key)
        if slower:
            record.environment["speed_against_profile"] = slower
            self._progress(slower)
        return True

    def _speed_note(self, record: RunRecord, key: ProfileKey) -> str | None:
        """Where this run's baseline ran far from the speed its profile stored (another lease
        of "the same" GPU, another CPU of one name): one sentence, else None."""
        found = lookup(self.profiles, key).profile
        timed = [e for e in found.matching(key.vllm_version) if e.speed] if found else []
        base = [p for p in record.arm_phases(BASELINE) if not p.reused_from]
        now = speed_of(dataclasses.replace(record, phases={p.name: p for p in base}))
        if not timed or now is None:
            return None
        stored = statistics.median(e.speed.s_per_token for e in timed if e.speed)
        ratio = now.s_per_token / stored
        if abs(math.log(ratio)) < math.log(1 + SPEED_GAP):
            return None
        how = (
            f"{ratio:.1f} times slower"
            if ratio >= 2
            else (f"{ratio - 1:.0%} slower" if ratio > 1 else f"{1 / ratio - 1:.0%} faster")
        )
        machines = {e.machine for e in timed}
        here = record.environment.get("machine")
        other = "" if machines == {here} else " (measured on another machine, or one not recorded)"
        return (
            f"this machine's baseline ran {how} than the host profile's stored runs of "
            f"{key.describe()}{other}: {now.s_per_token * 1000:.1f} against "
            f"{stored * 1000:.1f} ms per output token"
        )

    def update_profile(self, record: RunRecord) -> None:
        """An A/A run adds the restart noise it measured to its host's profile."""
        if not noise.is_aa_run(record):
            return
        entry = noise.profile_entry(
            record, run=self._run_dir.name, date=datetime.now(UTC).isoformat(timespec="seconds")
        )
        if entry is None:
            self._progress("host profile: this A/A run measured no restart noise (one start)")
            return
        key = noise.key_of(record)
        try:
            path = add_entry(self.profiles, key.host, key.accelerator, key.model, entry)
        except (OSError, ConfigError) as exc:
            self._progress(f"host profile: not written ({exc})")
            return
        measured = "; ".join(
            f"{metric} {noise_text(RestartNoise.from_dict(dict(d)))}"
            + (
                f", {drift_text(TimeDrift.from_dict(dict(entry.drift[metric])))}"
                if entry.drift and metric in entry.drift
                else ""
            )
            for metric, d in entry.noise.items()
        )
        self._progress(
            f"host profile {path}: this run's restart noise added ({measured}); later runs of "
            f"{key.describe()} use it. Inside a repository, commit it"
        )

    def regimes(self, target: Target) -> list[tuple[str, Regime]]:
        """What serving N beside the baseline cost it in this host's stored runs of its
        accelerator and model (analysis/map/regime.py), newest first, each with its run's name,
        judged against this run's `[run] regime_tolerance`."""
        key = self.plan_key(target)
        tolerance = self.settings.run.regime_tolerance
        return [
            (name, dataclasses.replace(found, tolerance=tolerance))
            for name, record in self._stored(key)
            if record.regime is not None
            and recorded_accelerator(record.environment) == key.accelerator
            and (found := regime_of(record)) is not None
        ]

    def regime_spread(self, target: Target) -> tuple[float, str]:
        """A request's spread (log) the regime window is sized by: what the newest stored run's
        regime window showed on this accelerator, else this host's measured residual, else the
        one assumed for its kind of accelerator (analysis/verdict/design.py)."""
        for name, found in self.regimes(target):
            if (spread := regime_spread(found)) is not None:
                return spread, f"the stored run {name}'s regime window"
        key = self.plan_key(target)
        known = self.known(key).get("throughput")
        if known is not None and known.residual:
            return math.sqrt(known.residual), f"this host's A/A runs: {known.source}"
        kind = getattr(key.accelerator, "kind", None)
        return math.sqrt(assumed_residual(kind)), f"assumed for a {kind or 'host'}, none stored"

    # -- what the key reads ---------------------------------------------------------------------
    def _drift(self, key: ProfileKey) -> TimeDrift | None:
        """The drift within a start this key's profile measured (throughput), if any."""
        profile = lookup(self.profiles, key).profile
        found = (
            noise.drift_from_profile(profile, version=key.vllm_version, design=self._design())
            if profile
            else {}
        )
        return found.get("throughput")

    def _stored(self, key: ProfileKey) -> list[tuple[str, RunRecord]]:
        """This host's stored runs of the model, but this run (the key is checked later)."""
        found = stored_runs(self.settings.reports_dir, host=key.host, model=key.model)
        return [(folder.name, r) for folder, r in found if folder != self._run_dir]

    def _design(self) -> str:
        """How this run's starts send their requests (record/profile.py DESIGNS)."""
        run = self.settings.run
        return design_of(run.order, together=run.arms == "together")
