"""The dry run of a target of several replicas: each replica's facts read through its own
target (reads only), the alike check (analysis/replicas/alike.py), the plan's lines
(report/replicas/lines.py). The run itself: run/crossover/, which reads and checks each
replica through `replica_facts` again before anything is touched."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable, Sequence

import pytest

from ..analysis.replicas.alike import ReplicaFacts, alike
from ..config.arms import BASELINE
from ..config.replicas import ReplicaConfig
from ..config.settings import Settings
from ..config.specconfig import SpecConfig
from ..errors import ConfigError, SpecDecodeError
from ..progress import write_line
from ..record.profile import profiles_dir
from ..report.replicas.lines import replicas_plan
from ..targets.base import Target
from ..targets.facts.gpu import Gpu, gpus_and_driver, read_gpus
from ..targets.facts.model_config import read_model_config
from ..targets.facts.vllm import check_candidates, facts_or_offline
from .crossover_known import crossover_plan

Progress = Callable[[str], None]


def replicas_dry_run(config: pytest.Config, settings: Settings, progress: Progress) -> int:
    """Read every replica, check they are alike, print the plan (with the crossovers a
    decision needs, run/crossover_known.py); nothing is touched. Exit code: OK, or
    USAGE_ERROR where a replica cannot be read or the replicas are refused."""
    facts: list[ReplicaFacts] = []
    opened: list[Target] = []
    try:
        for replica in settings.replicas:
            try:
                target = config.hook.pytest_specdecode_open_target(
                    config=config,
                    settings=dataclasses.replace(settings, target=replica.target),
                    log_dir=settings.reports_dir,
                    progress=progress,
                )
                opened.append(target)
                facts.append(replica_facts(replica, target, progress, settings.candidates))
            except SpecDecodeError as exc:
                write_line(f"pytest-specdecode dry run: replica {replica.name}: {exc}")
                return pytest.ExitCode.USAGE_ERROR
        found = alike(facts)
        lines = replicas_plan(
            settings.replicas,
            facts,
            found,
            baseline=BASELINE,
            candidates=[c.name for c in settings.candidates],
            crossovers=None
            if found.refused
            else crossover_plan(
                settings,
                list(zip(settings.replicas, opened, facts, strict=True)),
                detect=config.getoption("spec_detect"),
                profiles=profiles_dir(
                    config.getoption("spec_host_profiles"), settings.host_profiles
                ),
                run_dir=None,
                progress=progress,
            ),
        )
    finally:
        for target in opened:
            target.close()  # touches the host only to undo what this run did: nothing
    write_line("\n".join(lines), stream=sys.stdout)
    return pytest.ExitCode.USAGE_ERROR if found.refused else pytest.ExitCode.OK


def replica_facts(
    replica: ReplicaConfig,
    target: Target,
    progress: Progress,
    candidates: Sequence[SpecConfig] = (),
) -> ReplicaFacts:
    """What one replica runs, read through its target before anything is touched: its vLLM
    (targets/facts/vllm.py), against which each candidate is checked, its model where the
    backend says where it loads it, its GPUs (those its servers see, where the backend says:
    `_gpus`)."""
    vllm = facts_or_offline(target, progress=progress)
    check_candidates(candidates, vllm)
    gpus, devices = _gpus(replica, target)
    names, driver = gpus_and_driver(gpus) if gpus is not None else (None, None)
    path, fingerprint = _model(target, progress)
    return ReplicaFacts(
        name=replica.name,
        model=replica.target.model,
        model_path=path,
        model_config=fingerprint,
        vllm_version=None if vllm.offline else vllm.version,
        gpus=names,
        driver=driver,
        host=target.host_name,
        devices=devices,
    )


def _gpus(
    replica: ReplicaConfig, target: Target
) -> tuple[list[Gpu] | None, tuple[int | None, ...] | None]:
    """The GPUs the replica's servers see, and their indices: read with its own
    CUDA_VISIBLE_DEVICES where the backend runs the servers itself (a local one's
    `server_gpus`); else every GPU of its host, its servers' own not known (None). ConfigError
    where they cannot serve there (a GPU the host lacks, a tensor parallel size larger than
    the GPUs it sees)."""
    seen = getattr(target, "server_gpus", None)
    if seen is None:
        return read_gpus(target.host), None
    found = seen()
    why = found.refusal()
    if why is None and replica.devices and not found.listed:
        why = (
            f"devices = {list(replica.devices)}, and nvidia-smi lists no GPU on {target.host_name}"
        )
    if why:
        raise ConfigError(f"{why}; nothing was touched")
    return list(found.seen), tuple(g.index for g in found.seen)


def _model(target: Target, progress: Progress) -> tuple[str | None, str | None]:
    """The model the server command loads, and a fingerprint of its config.json; None for
    what could not be read (said so)."""
    site_of = getattr(target, "model_site", None)
    if site_of is None:
        return None, None
    try:
        site = site_of()
    except SpecDecodeError as exc:
        progress(f"where the model is loaded could not be read: {exc}")
        return None, None
    if site.model is None:
        return None, None
    try:
        files = read_model_config(
            site.host,
            site.on_host(site.model),
            where=site.where,
            what="the model",
            hub_cache=site.hub_cache,
        )
    except SpecDecodeError as exc:
        progress(f"the model's config.json could not be read: {exc}")
        return site.model, None
    body = json.dumps(files.config, sort_keys=True)
    return site.model, hashlib.sha256(body.encode()).hexdigest()[:12]
