"""Restart noise: how much a metric moves between two starts of the same configuration.

What a run measured (`of_run`): every configuration it started more than once (the original's
arms are one configuration: the baseline, an A/A arm, the drift check's baseline; each candidate
is another), per metric, `starts - 1` degrees of freedom per configuration. Stored, it is
outside knowledge for the next runs of the same key (`key_of`: host, accelerator, model and
vLLM version; `from_stored`), and an A/A run writes it into the profile of that key
(record/profile.py). Runs and profiles of another key are named, never used as measured.

What a comparison uses as outside knowledge (`outside`): what stored runs and the host's profile
measured, recorded in the run as `restart_noise_prior`; where nothing was, the documented
assumption `[run] assumed_restart_noise` as a prior worth `ASSUMED_WEIGHT` degrees of freedom.
This run's own repeated starts are in-run evidence, pooled with it by the interval
(analysis/variance/restarts.py), never a replacement for it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ...config.arms import AA_ARM, BASELINE, ORIGINAL_ARMS
from ...record.profile import (
    HostProfile,
    ProfileEntry,
    ProfileKey,
    ProfileLookup,
    record_design,
    recorded_accelerator,
    speed_of,
)
from ...record.schema import RunRecord
from ..variance.pairs import PositionBias, bias_of, fit_pairs, pair_noise_of
from ..variance.restarts import (
    ASSUMED_WEIGHT,
    PRIOR,
    RestartNoise,
    StartFit,
    fit_starts,
    pooled,
    restart_noise_of,
)
from ..variance.time_drift import TimeDrift, drift_of, sent_in_blocks, start_residuals
from .compare import METRICS, pair_differences, pair_slots, start_prompts, starts


def configurations(record: RunRecord) -> list[list[str]]:
    """The run's arms by configuration: the original's arms together, each candidate alone."""
    arms = list(dict.fromkeys(p.arm for p in record.phases.values() if not p.reused_from))
    original = [a for a in arms if a in ORIGINAL_ARMS]
    return [original] + [[a] for a in arms if a not in ORIGINAL_ARMS]


def fit_of(record: RunRecord, arms: Sequence[str], key: str, values: str) -> StartFit | None:
    """The starts of these arms on one key, fitted together; None with fewer than two starts."""
    phases = [p for arm in arms for p in record.arm_phases(arm) if not p.reused_from]
    groups = starts(phases, key, values)
    if len(groups) < 2:
        return None
    prompts = start_prompts(phases, key, values)
    logs = [np.log(np.asarray(g, dtype=float)) for g in groups]
    linked = all(i is not None for p in prompts for i in p)
    return fit_starts(logs, prompts if linked else None)  # type: ignore[arg-type]


def of_run(record: RunRecord) -> dict[str, RestartNoise]:
    """Everything a run measured of restart noise, per metric: stored, it informs next runs.
    Side by side, its pairs measure it (analysis/variance/pairs.py); else only configurations
    started more than once do, and the source counts only their starts."""
    if side_by_side(record):
        return of_pairs(record)
    out = {}
    configs = configurations(record)
    count = sum(
        n
        for arms in configs
        if (n := sum(len([p for p in record.arm_phases(a) if not p.reused_from]) for a in arms)) > 1
    )
    for metric, (values, _) in METRICS.items():
        per_config = []
        for arms in configs:
            fits = [fit_of(record, arms, key, values) for key in record.keys]
            per_config.append([f for f in fits if f is not None])
        found = restart_noise_of(per_config, source=f"{count} server starts of this run")
        if found is not None:
            out[metric] = found
    return out


def side_by_side(record: RunRecord) -> bool:
    """Whether the run served its arms side by side, in pairs of starts."""
    return any(p.together_with for p in record.phases.values() if not p.reused_from)


def of_pairs(record: RunRecord) -> dict[str, RestartNoise]:
    """What a side-by-side run's pairs measured, per metric: each arm's pairs with the baseline
    (an A/A arm's about zero: one configuration), per server (pairs.py)."""
    base = [p for p in record.arm_phases(BASELINE) if not p.reused_from]
    arms = [a for a in dict.fromkeys(p.arm for p in record.phases.values()) if a != BASELINE]
    out = {}
    for metric, (values, _) in METRICS.items():
        configs, pairs = [], 0
        for arm in arms:
            phases = record.arm_phases(arm)
            fits = [
                f
                for key in record.keys
                if (slots := pair_slots(base, phases, key, values))
                and (
                    f := fit_pairs(
                        [[d for d, _ in s] for s in slots], [[p for _, p in s] for s in slots]
                    )
                )
            ]
            pairs += max((f.pairs for f in fits), default=0)
            configs.append((fits, arm == AA_ARM))
        source = f"{pairs} pair{'s' if pairs != 1 else ''} of starts side by side in this run"
        found = pair_noise_of(configs, source=source)
        if found is not None:
            out[metric] = found
    return out


def position_bias(record: RunRecord) -> dict[str, PositionBias]:
    """Side by side, an A/A run's pairs, per metric: the second place's speed beside the first
    (each pair's mean over its keys, signed by where the original again sat)."""
    base = [p for p in record.arm_phases(BASELINE) if not p.reused_from]
    again = record.arm_phases(AA_ARM)
    out = {}
    for metric, (values, _) in METRICS.items():
        partners = {p.name: p for p in again}
        signed = []
        for b in base:
            a = partners.get(b.together_with or "")
            if a is None or b.position is None:
                continue
            means = [
                float(np.mean(d[0]))
                for key in record.keys
                if (d := pair_differences([b], [a], key, values))
            ]
            if means:  # log(again / baseline): the second place's less the first's, or reversed
                signed.append(float(np.mean(means)) * (1 if b.position == 0 else -1))
        found = bias_of(
            signed, alternated=len({p.position for p in base if p.position is not None}) > 1
        )
        if found is not None:
            out[metric] = found
    return out


def drift_of_run(record: RunRecord, values: str = "tokens_per_s") -> TimeDrift | None:
    """The drift within this run's starts (analysis/drift.py): each configuration's starts,
    their effects and their prompts' levels removed, pooled; None with too few requests."""
    series: list[np.ndarray] = []
    gaps = []
    every: list = []
    for arms in configurations(record):
        phases = [p for arm in arms for p in record.arm_phases(arm) if not p.reused_from]
        found, gap = start_residuals(phases, values)
        series += found
        every += phases
        if gap:
            gaps.append(gap)
    gap = float(np.median(gaps)) if gaps else None
    return drift_of(series, seconds_per_request=gap, blocked=sent_in_blocks(every))


def drifts_of_run(record: RunRecord) -> dict[str, TimeDrift]:
    """The drift within this run's starts, per metric."""
    found = {metric: drift_of_run(record, values) for metric, (values, _) in METRICS.items()}
    return {metric: d for metric, d in found.items() if d is not None}


def outside(record: RunRecord) -> dict[str, RestartNoise]:
    """The outside knowledge a comparison of this run uses, per metric: what stored runs and
    the host's profile measured, else the stated assumption."""
    prior = {
        metric: RestartNoise.from_dict(data)
        for metric, data in (record.restart_noise_prior or {}).items()
    }
    sd = record.run.assumed_restart_noise
    return {
        metric: prior[metric]
        if metric in prior
        and (prior[metric].measured or prior[metric].sd == sd or prior[metric].is_prior)
        else assumed(sd)
        for metric in METRICS
    }


def best_estimate(record: RunRecord) -> dict[str, RestartNoise]:
    """Everything known of the restart noise at the end of a run, per metric: the outside
    knowledge and what this run measured, pooled; else the assumption."""
    own = of_run(record)
    out = {}
    for metric, known in outside(record).items():
        found = [e for e in (known, own.get(metric)) if e is not None and e.measured]
        both = pooled(found, source="; ".join(e.source for e in found))
        out[metric] = both or known
    return out


def assumed(sd: float, *, note: str | None = None) -> RestartNoise:
    """The stated assumption; `note` names what was measured of another key and not used."""
    return RestartNoise.assumed(sd, note=note)


def key_of(record: RunRecord) -> ProfileKey:
    """What a run's restart noise belongs to: its host, accelerator, model and the vLLM version
    its baseline ran (None before the baseline started)."""
    t = record.target
    return ProfileKey(t.host, recorded_accelerator(record.environment), t.model, _version(record))


def from_stored(
    records: Sequence[RunRecord],
    *,
    key: ProfileKey,
    extra: Mapping[str, RestartNoise] | None = None,
) -> dict[str, RestartNoise]:
    """The restart noise stored runs of this key measured (its accelerator and vLLM version;
    none while the version is unknown), pooled per metric by degrees of freedom, with `extra`
    (a host profile's) beside them."""
    chosen = [r for r in records if same_key(r, key)]
    found = [of_run(r) for r in chosen]
    out = {}
    for metric in METRICS:
        estimates = [f[metric] for f in found if metric in f]
        runs = len(estimates)
        text = (
            f"{runs} stored run{'s' if runs != 1 else ''} of this host, accelerator and model "
            f"(vLLM {key.vllm_version})"
        )
        sources = [text] if runs else []
        if extra and metric in extra:
            estimates.append(extra[metric])
            sources.append(extra[metric].source)
        pooled_noise = pooled(estimates, source="; ".join(sources))
        if pooled_noise is not None:
            out[metric] = pooled_noise
    return out


def same_key(record: RunRecord, key: ProfileKey) -> bool:
    """A stored run of this key: its accelerator and its baseline's vLLM version (known)."""
    return (
        key.vllm_version is not None
        and _version(record) == key.vllm_version
        and recorded_accelerator(record.environment) == key.accelerator
    )


def known(
    found: ProfileLookup,
    stored: Sequence[tuple[str, RunRecord]],
    *,
    design: str | None = None,
    machine: str | None = None,
) -> dict[str, RestartNoise]:
    """The outside knowledge for a run of this key, per metric: its profile's entries of this
    vLLM version, and the stored runs of this key (by folder name) that the profile does not
    already hold; of `design` (profile.DESIGNS) where any were measured in it.

    `machine` (measure/environment.py machine_of): this run's. Then only what this machine
    measured is measured knowledge; what another machine of the same accelerator measured (or
    one that did not record its machine) is used only as a prior, named as such (`as_prior`),
    where this machine measured nothing of the metric. None: no machine is told apart."""
    profile = found.profile
    in_profile = profile.runs if profile else set()
    records = of_design([r for name, r in stored if name not in in_profile], design)

    def of(keep: Callable[[str | None], bool]) -> dict[str, RestartNoise]:
        extra = (
            from_profile(
                profile, version=found.key.vllm_version, where=str(found.path), design=design,
                keep=keep,
            )
            if profile
            else None
        )  # fmt: skip
        mine = [r for r in records if keep(r.environment.get("machine"))]
        return from_stored(mine, key=found.key, extra=extra)

    if machine is None:
        return of(lambda _: True)
    here = of(lambda m: m == machine)
    elsewhere = of(lambda m: m != machine)
    return {
        metric: here[metric] if metric in here else as_prior(elsewhere[metric])
        for metric in METRICS
        if metric in here or metric in elsewhere
    }


def as_prior(measured: RestartNoise) -> RestartNoise:
    """Another machine's measurement as a prior for this one: its estimate, weighted as its
    degrees of freedom or the assumption's weight, whichever is fewer; set aside where this
    run's own starts rule it out (restarts.py)."""
    return RestartNoise(
        measured.sd,
        min(measured.df, ASSUMED_WEIGHT),
        f"{PRIOR} of {measured.sd:.1%}, weighted as {min(measured.df, ASSUMED_WEIGHT):g} degrees "
        f"of freedom: measured on another machine of this accelerator, or one not recorded "
        f"({measured.source})",
        measured=False,
        residual=measured.residual,
    )


def of_design(records: Sequence[RunRecord], design: str | None) -> list[RunRecord]:
    """The stored runs measured in `design`, if any; else all of them."""
    same = [r for r in records if record_design(r) == design]
    return same or list(records)


def not_used(found: ProfileLookup, stored: Sequence[tuple[str, RunRecord]]) -> str | None:
    """What was measured of this host and model and is not used, being of another key: one
    sentence naming it, or None."""
    named = found.not_used()
    others = [name for name, r in stored if of_run(r) and not same_key(r, found.key)]
    if others:
        named.append(
            f"{len(others)} stored run{'s' if len(others) != 1 else ''} of another accelerator "
            "or vLLM version"
        )
    if not named:
        return None
    key = found.key.describe()
    return f"not used, being of another accelerator or vLLM version than {key}: " + "; ".join(named)


def drift_from_profile(
    profile: HostProfile, *, version: str | None, design: str | None = None
) -> dict[str, TimeDrift]:
    """The drift a host's profile holds of this vLLM version (of `design` where any entry was
    measured in it), per metric: its entries' pooled by their requests (the SD by variance);
    entries written before drift was measured add none."""
    entries, _ = profile.of_design(version, design)
    out = {}
    for metric in METRICS:
        found = [
            TimeDrift.from_dict(dict(e.drift[metric]))
            for e in entries
            if e.drift and metric in e.drift
        ]
        if found:
            out[metric] = pooled_drift(found)
    return out


def pooled_drift(found: Sequence[TimeDrift]) -> TimeDrift:
    """Several drift estimates as one, weighted by their requests."""
    weights = np.array([d.requests for d in found], dtype=float)
    weights = weights / weights.sum()

    def mean(values: Sequence[float]) -> float:
        return float(np.dot(weights, values))

    gaps = [d.seconds_per_request for d in found if d.seconds_per_request]
    return TimeDrift(
        sd=mean([d.sd**2 for d in found]) ** 0.5,
        phi=mean([d.phi for d in found]),
        lag1=mean([d.lag1 for d in found]),
        residual_sd=mean([d.residual_sd**2 for d in found]) ** 0.5,
        requests=sum(d.requests for d in found),
        starts=sum(d.starts for d in found),
        seconds_per_request=float(np.median(gaps)) if gaps else None,
        blocked=any(d.blocked for d in found)
        if any(d.blocked is not None for d in found)
        else None,
    )


def from_profile(
    profile: HostProfile,
    *,
    version: str | None,
    where: str,
    design: str | None = None,
    keep: Callable[[str | None], bool] | None = None,
) -> dict[str, RestartNoise]:
    """What a host's profile holds of this vLLM version, pooled per metric: the entries of
    `design` where any were measured in it, else all of them, named; `keep`: of the machines
    it keeps (by fingerprint)."""
    entries, measured_in = profile.of_design(version, design)
    entries = [e for e in entries if keep is None or keep(e.machine)]
    starts = sum(e.starts for e in entries)
    text = (
        f"host profile {where}: {len(entries)} A/A run{'s' if len(entries) != 1 else ''}, "
        f"{starts} starts, vLLM {version}" + (f", {measured_in}" if measured_in else "")
    )
    out = {}
    for metric in METRICS:
        found = [
            RestartNoise.from_dict(dict(e.noise[metric])) for e in entries if metric in e.noise
        ]
        pooled_noise = pooled(found, source=text)
        if pooled_noise is not None:
            out[metric] = pooled_noise
    return out


def profile_entry(record: RunRecord, *, run: str, date: str) -> ProfileEntry | None:
    """What an A/A run adds to its key's profile; None where it measured nothing."""
    measured = of_run(record)
    if not measured:
        return None
    gpus = record.environment.get("gpus")
    cpu = record.environment.get("cpu")
    return ProfileEntry(
        run=run,
        date=date,
        vllm_version=_version(record),
        gpus=tuple(str(g) for g in gpus) if isinstance(gpus, list | tuple) else None,
        cpu=str(cpu) if cpu else None,
        starts=sum(1 for p in record.phases.values() if not p.reused_from),
        noise={metric: n.to_dict() for metric, n in measured.items()},
        speed=speed_of(record),
        drift={metric: d.to_dict() for metric, d in drifts_of_run(record).items()} or None,
        design=record_design(record),
        machine=record.environment.get("machine"),
        position_bias={m: b.to_dict() for m, b in position_bias(record).items()} or None,
    )


def is_aa_run(record: RunRecord) -> bool:
    """A run whose every candidate is the original's configuration again (A/A)."""
    return bool(record.candidates) and all(c == AA_ARM for c in record.candidates)


def _version(record: RunRecord) -> str | None:
    phases = record.arm_phases(BASELINE)
    return phases[0].server_version if phases else None


def between_runs(a: RunRecord, b: RunRecord) -> dict[str, RestartNoise]:
    """For comparing two stored runs: what either run measured, else the first's assumption."""
    found = [of_run(a), of_run(b)]
    out = {}
    for metric in METRICS:
        both = pooled(
            [f[metric] for f in found if metric in f], source="the two runs' repeated starts"
        )
        out[metric] = both or assumed(a.run.assumed_restart_noise)
    return out
