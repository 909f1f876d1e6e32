"""What a crossover run across replicas knows before it starts (report/replicas/crossovers.py plans
by it), read on each replica and from stored runs; and the slots as results.json keeps them.

- the restart noise, per metric: each replica's host profile and stored runs of its key, as a
  run on one host reads them (run/host_noise.py → `HostNoise.known`), the measured ones pooled
  over the replicas by degrees of freedom; then what stored crossover runs of these same
  replicas measured by their repeated crossovers (analysis/replicas/model.py → `StartSpread`),
  pooled with them; else another machine's prior, else `[run] assumed_restart_noise`;
- a request's spread within its slot: the newest stored crossover run of these replicas (its
  slots' residual), else the profiles' residual, else the accelerator's assumption
  (analysis/verdict/design.py → `assumed_residual`);
- the pace: the first replica's, as a plan on one host reads it (`HostNoise.timing`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..analysis.replicas.alike import ReplicaFacts
from ..analysis.replicas.crossover import METRICS, CrossoverSlot
from ..analysis.replicas.model import measured_of
from ..analysis.variance.restarts import RestartNoise, pooled
from ..analysis.verdict.design import assumed_residual
from ..config.replicas import ReplicaConfig
from ..config.settings import Settings
from ..measure.crossover import crossover_slots
from ..record.store import RESULTS_FILE
from ..report.replicas.crossovers import CrossoverKnown, CrossoverPlan, plan_of
from ..targets.base import Target
from .host_noise import HostNoise

__all__ = ["crossover_known", "crossover_plan", "identity_of", "slots_of", "stored_crossovers"]


def slots_of(stored: Sequence[Mapping[str, Any]], arms: Sequence[str]) -> list[CrossoverSlot]:
    """results.json's `crossover_slots` as the analysis takes them: a slot without a TPOT on
    some replica (a one-token output) has none."""
    index = {arm: i for i, arm in enumerate(arms)}
    out = []
    for s in stored:
        tpot = s["tpot"]
        out.append(
            CrossoverSlot(
                period=s["period"] - 1,
                prompt=s["prompt"],
                arms=tuple(index[a] for a in s["arms"]),
                throughput=tuple(s["throughput"]),
                tpot=None if any(t is None or t <= 0 for t in tpot) else tuple(tpot),
            )
        )
    return out


Identity = tuple[str, str, "str | None"]  # a replica's name, host and unit


def identity_of(config: ReplicaConfig, target: Target) -> Identity:
    unit = config.target.unit if config.target.backend == "systemd" else None
    return config.name, target.host_name, unit


def _same_replicas(data: Mapping[str, Any], replicas: Sequence[Identity]) -> bool:
    stored = [
        (r.get("name"), r.get("host"), r.get("unit"))
        for r in data.get("replicas") or []
        if isinstance(r, Mapping)
    ]
    return stored == [tuple(r) for r in replicas]


def stored_crossovers(
    settings: Settings, replicas: Sequence[Identity], *, exclude: Path | None = None
) -> list[tuple[str, list[CrossoverSlot]]]:
    """The stored crossover runs of these replicas (name, host and unit each), model and
    output length, newest first: each folder's name and its slots."""
    reports = settings.reports_dir
    if not reports.is_dir():
        return []
    out = []
    for folder in sorted((p for p in reports.iterdir() if p.is_dir()), reverse=True):
        path = folder / RESULTS_FILE
        if folder == exclude or not path.is_file():
            continue
        try:
            data = json.loads(path.read_text())
            if not data.get("crossover_slots") or not _same_replicas(data, replicas):
                continue
            if (data.get("target") or {}).get("model") != settings.target.model:
                continue
            if (data.get("run") or {}).get("max_tokens") != settings.run.max_tokens:
                continue
            slots = data["crossover_slots"]
            arms = list(dict.fromkeys(a for s in slots for a in s["arms"]))
            arms.sort(key=lambda a: (a != "baseline", a))
            out.append((folder.name, slots_of(slots, arms)))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return out


def crossover_known(
    settings: Settings,
    replicas: Sequence[tuple[ReplicaConfig, Target, ReplicaFacts]],
    *,
    profiles: Path,
    run_dir: Path | None,
    progress: Any,
) -> CrossoverKnown:
    """What the plan plans by (the module's docstring); reads only."""
    measured: dict[str, list[RestartNoise]] = {m: [] for m in METRICS}
    priors: dict[str, RestartNoise] = {}
    residuals: dict[str, list[float]] = {m: [] for m in METRICS}
    timing = None
    accelerator = None
    for config, target, facts in replicas:
        noise = HostNoise(
            dataclasses.replace(settings, target=config.target),
            profiles=profiles, run_dir=run_dir or settings.reports_dir, progress=progress,
            facts=lambda: None,
        )  # fmt: skip
        key = noise.plan_key(target)
        if facts.vllm_version and key.vllm_version != facts.vllm_version:
            key = dataclasses.replace(key, vllm_version=facts.vllm_version)
        accelerator = accelerator or (key.accelerator.kind if key.accelerator else None)
        for metric, found in noise.known(key).items():
            if found.measured:
                measured[metric].append(found)
            else:
                priors.setdefault(metric, found)
            if found.residual:
                residuals[metric].append(found.residual)
        if timing is None:
            timing = noise.timing(target, settings)
    identities = [identity_of(config, target) for config, target, _ in replicas]
    stored = stored_crossovers(settings, identities, exclude=run_dir)
    slot_var: dict[str, float] = {}
    slot_source = ""
    for name, slots in stored:
        for metric in METRICS:
            try:
                resid_var, _, starts = measured_of(slots, metric)
            except ValueError:
                continue
            if starts is not None:
                measured[metric].append(
                    starts.noise(f"the stored crossover run {name}'s repeated crossovers")
                )
            if metric not in slot_var:
                slot_var[metric] = resid_var
                slot_source = f"measured by the stored crossover run {name}"
    noises = {}
    for metric in METRICS:
        sources = "; ".join(dict.fromkeys(n.source for n in measured[metric]))
        noises[metric] = (
            pooled(measured[metric], source=sources)
            or priors.get(metric)
            or RestartNoise.assumed(settings.run.assumed_restart_noise)
        )
    if len(slot_var) < len(METRICS):
        for metric in METRICS:
            if metric in slot_var:
                continue
            if residuals[metric]:
                slot_var[metric] = sum(residuals[metric]) / len(residuals[metric])
                slot_source = slot_source or "the replicas' host profiles' residual"
            else:
                slot_var[metric] = assumed_residual(accelerator)
                slot_source = slot_source or (
                    "assumed: no stored crossover run of these replicas nor host profile holds one"
                )
    return CrossoverKnown(noises, slot_var, slot_source, timing)


def crossover_plan(
    settings: Settings,
    replicas: Sequence[tuple[ReplicaConfig, Target, ReplicaFacts]],
    *,
    detect: float | None,
    profiles: Path,
    run_dir: Path | None,
    progress: Any,
) -> CrossoverPlan:
    """The crossovers' plan from what is known of these replicas (reads only)."""
    known = crossover_known(
        settings, replicas, profiles=profiles, run_dir=run_dir, progress=progress
    )
    warm, slots = crossover_slots(settings)
    return plan_of(settings, known, slots=len(slots), warmup=len(warm), detect=detect)
