"""Restart noise: how much a metric moves between two starts of the same configuration.

Where it comes from, for a comparison, pooled by degrees of freedom over what was measured:
1. stored runs of this host, model and vLLM version that started one configuration more than
   once (A/A runs, `--spec-repeats`), recorded in the run as `restart_noise_prior`;
2. this run's own starts of the original's configuration: the A/A arm (`--spec-config
   baseline`) and the drift check's second baseline (`--spec-aba`);
3. where nothing was measured, the documented assumption `[run] assumed_restart_noise`, and the
   report says so. It is never silently zero.

Starts of the arms being compared are not their own evidence of noise: the spread of repeated
starts of a compared arm enters its interval directly (`stats.nested_interval`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from ..record.schema import BASELINE, BASELINE_AFTER, RunRecord
from .compare import METRICS, starts
from .stats import RestartNoise, restart_noise_from_starts

AA_ARM = "baseline-again"  # the original's configuration started again, as a candidate
ORIGINAL_ARMS = (BASELINE, AA_ARM, BASELINE_AFTER)  # every start of the original configuration


def pooled(estimates: Iterable[RestartNoise | None], *, source: str) -> RestartNoise | None:
    """Several measured estimates as one, weighted by their degrees of freedom."""
    found = [e for e in estimates if e is not None and e.measured and e.df > 0]
    if not found:
        return None
    df = sum(e.df for e in found)
    variance = sum(e.df * e.sd**2 for e in found) / df
    return RestartNoise(math.sqrt(variance), df, source)


def measured_in(record: RunRecord, arms: Sequence[str]) -> dict[str, RestartNoise]:
    """What these arms of a run measured of restart noise, per metric: each configuration
    started more than once, per prompt type. The original's arms are one configuration."""
    original = [a for a in arms if a in ORIGINAL_ARMS]
    configurations = [original] + [[a] for a in arms if a not in ORIGINAL_ARMS]
    count = sum(len(record.arm_phases(a)) for a in arms)
    out = {}
    for metric, (values, _) in METRICS.items():
        sets = [
            [s for arm in config for s in starts(record.arm_phases(arm), name, values)]
            for config in configurations
            for name in record.keys
        ]
        found = restart_noise_from_starts(sets, source=f"{count} server starts of this run")
        if found is not None:
            out[metric] = found
    return out


def of_run(record: RunRecord) -> dict[str, RestartNoise]:
    """Everything a run measured of restart noise: stored, it informs the next runs."""
    return measured_in(record, list(dict.fromkeys(p.arm for p in record.phases.values())))


def for_comparison(record: RunRecord, *, excluding: Sequence[str] = ()) -> dict[str, RestartNoise]:
    """The restart noise a comparison uses, per metric: measured where it can be, else assumed."""
    prior = {
        metric: RestartNoise.from_dict(data)
        for metric, data in (record.restart_noise_prior or {}).items()
    }
    own = measured_in(record, [a for a in ORIGINAL_ARMS if a not in excluding])  # not candidates
    out = {}
    for metric in METRICS:
        sources = [
            text
            for text, found in (
                (prior[metric].source if metric in prior else "", prior.get(metric)),
                ("this run's starts of the original", own.get(metric)),
            )
            if found is not None
        ]
        found = pooled([prior.get(metric), own.get(metric)], source="; ".join(sources))
        out[metric] = found or assumed(record.run.assumed_restart_noise)
    return out


def assumed(sd: float) -> RestartNoise:
    return RestartNoise(
        sd,
        math.inf,
        f"unmeasured: assumed {sd:.0%} (measure it with --spec-config baseline)",
    )


def from_stored(records: Sequence[RunRecord], *, version: str | None) -> dict[str, RestartNoise]:
    """The restart noise stored runs measured, pooled per metric (this vLLM version only, when
    it is known)."""
    chosen = [r for r in records if version is None or _version(r) == version]
    found = [of_run(r) for r in chosen]
    out = {}
    for metric in METRICS:
        estimates = [f[metric] for f in found if metric in f]
        runs = len(estimates)
        text = f"{runs} stored run{'s' if runs != 1 else ''} of this host and model"
        if version:
            text += f" (vLLM {version})"
        pooled_noise = pooled(estimates, source=text)
        if pooled_noise is not None:
            out[metric] = pooled_noise
    return out


def _version(record: RunRecord) -> str | None:
    phases = record.arm_phases(BASELINE)
    return phases[0].server_version if phases else None


def between_runs(a: RunRecord, b: RunRecord) -> dict[str, RestartNoise]:
    """For comparing two stored runs: what either run measured, else the first's assumption."""
    found = [of_run(a), of_run(b)]
    out = {}
    for metric in METRICS:
        both = pooled([f.get(metric) for f in found], source="the two runs' repeated starts")
        out[metric] = both or assumed(a.run.assumed_restart_noise)
    return out
