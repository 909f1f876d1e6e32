"""The drafter check before anything restarts: each drafter's config, read where it is loaded,
against the target's (analysis/drafters/check.py), for every candidate whose method loads a
model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..analysis.drafters.check import (
    Drafter,
    DrafterCheck,
    check_drafter,
    describe_drafter,
    drafter_kind,
)
from ..config.specconfig import SpecConfig
from ..errors import ConfigError
from ..targets.base import Target
from ..targets.facts.model_config import (
    ModelFiles,
    ModelSite,
    check_path,
    read_model_config,
)

Progress = Callable[[str], None]


def drafter_specs(specs: Sequence[SpecConfig]) -> list[SpecConfig]:
    """The candidates whose speculative method loads a model."""
    return [s for s in specs if not s.is_original and drafter_kind(s.method) is not None]


def check_drafters(
    target: Target, specs: Sequence[SpecConfig], *, progress: Progress | None = None
) -> list[Drafter]:
    """Read and check each drafter on the host where it is loaded; reads only.

    Raises a ConfigError naming the host, the candidate and every mismatch, before anything is
    touched. A backend that cannot say where its models live is not checked (said so).
    """
    wanted = drafter_specs(specs)
    if not wanted:
        return []
    say = progress or (lambda _line: None)
    site_of = getattr(target, "model_site", None)
    if site_of is None:
        say(
            f"the {type(target).__name__} backend on {target.host_name} cannot read a drafter's "
            "config where it is loaded: the drafters are not checked"
        )
        return []
    site: ModelSite = site_of()
    target_files = _target_files(site, say)
    found: list[Drafter] = []
    for spec in wanted:
        found.append(_one(spec, site, target_files))
    refused = [d.check.error_text() for d in found if not d.check.ok]
    if refused:
        raise ConfigError(f"{site.where}: " + " | ".join(refused))
    return found


def _target_files(site: ModelSite, say: Progress) -> ModelFiles | None:
    if site.model is None:
        say(f"{site.where}: the server command names no model path; drafters checked alone")
        return None
    try:
        return read_model_config(
            site.host,
            site.on_host(site.model),
            where=site.where,
            what="the target's model",
            hub_cache=site.hub_cache,
        )
    except ConfigError as exc:  # it serves: where it is read from is what this cannot tell
        say(f"the target's config could not be read ({exc}); drafters checked alone")
        return None


def _one(spec: SpecConfig, site: ModelSite, target_files: ModelFiles | None) -> Drafter:
    method = spec.method
    path = spec.values.get("model")
    target_config: Mapping[str, Any] = target_files.config if target_files else {}
    if path is None and drafter_kind(method) == "mtp":
        if target_files is None:  # said already: the target's config could not be read
            return Drafter(DrafterCheck(spec.name, method, "the target"), "mtp: not checked")
        files = target_files  # the target drafts with its own MTP layers
    elif path is None:
        raise ConfigError(
            f"candidate {spec.name}: method {method} loads a drafter, and its speculative config "
            "has no `model`; nothing was touched"
        )
    else:
        where = f"candidate {spec.name} on {site.where}"
        checked = check_path(path, where=where, what="the drafter's `model`")
        head = method in ("eagle", "eagle3")  # its fc and d2t: the weights' header
        files = read_model_config(
            site.host,
            site.on_host(checked),
            where=where,
            what="the drafter",
            weights=head,
            hub_cache=site.hub_cache,
        )
    check = check_drafter(
        method,
        files.config,
        target_config,
        candidate=spec.name,
        path=files.path,
        tensors=files.tensors,
    )
    line = describe_drafter(method, files.path, files.config, size_bytes=files.size_bytes)
    return Drafter(check, line)


def drafters_environment(drafters: Sequence[Drafter]) -> dict[str, dict[str, list[str]]]:
    """results.json's environment `drafters`: each candidate's drafter named, with its warnings
    (docs/drafters.md); nothing where no candidate drafts with a model."""
    if not drafters:
        return {}
    return {"drafters": {d.check.candidate: [d.description, *d.check.warnings] for d in drafters}}
