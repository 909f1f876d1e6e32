"""What the session does around a run, for the simulated chain (tests/support/chain.py): the
same functions, in the same order, on the same files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from pytest_specdecode.analysis.verdict import noise
from pytest_specdecode.analysis.verdict.adaptive import pinned, target_se
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.profile import add_entry, lookup, with_held_version
from pytest_specdecode.record.schema import Phase, RunRecord
from pytest_specdecode.record.store import RunStore, stored_runs


def known(
    reports: Path, profiles: Path, record: RunRecord, *, version: str | None, run_dir: Path
) -> dict[str, noise.RestartNoise]:
    """As `HostNoise.known` (run/host_noise.py): the host profile, and stored runs but this one."""
    key = dataclasses.replace(noise.key_of(record), vllm_version=version)
    key = with_held_version(profiles, key)
    stored = [
        (folder.name, r)
        for folder, r in stored_runs(reports, host=key.host, model=key.model)
        if folder != run_dir
    ]
    return noise.known(lookup(profiles, key), stored)


def stop_rule_for(
    reports: Path, profiles: Path, record: RunRecord, run_dir: Path
) -> Callable[[RunRecord, Phase, Measurement], bool]:
    """As the experiment's: the outside knowledge at the start, the run's earlier starts."""
    outside = known(reports, profiles, record, version=None, run_dir=run_dir)
    throughput = outside.get("throughput")
    sd = throughput.sd if throughput else record.run.assumed_restart_noise
    target = target_se(sd, record.run.min_effect)
    residual = {metric: n.residual for metric, n in outside.items()}

    def stop(rec: RunRecord, phase: Phase, m: Measurement) -> bool:
        earlier = [
            p.measurements[m.key]
            for p in rec.phases.values()
            if p is not phase and m.key in p.measurements
        ]
        return pinned(earlier, m, target=target, residual=residual)

    return stop


def finish(record: RunRecord, reports: Path, profiles: Path, run_dir: Path) -> None:
    """As the session's end: the outside knowledge recorded, results.json written, an A/A
    run's measurement added to the host's profile."""
    version = record.arm_phases(BASELINE)[0].server_version
    known_now = known(reports, profiles, record, version=version, run_dir=run_dir)
    record.restart_noise_prior = {m: n.to_dict() for m, n in known_now.items()}
    RunStore(run_dir, record)  # writes results.json
    if noise.is_aa_run(record):
        entry = noise.profile_entry(record, run=run_dir.name, date="2026-12-01")
        if entry is not None:
            key = noise.key_of(record)
            add_entry(profiles, key.host, key.accelerator, key.model, entry)
