"""`[run] arms = "auto"` (the default): side by side where the host holds both servers, one at
a time elsewhere; the plan says which was chosen, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..analysis.map.regime import Regime, fallback_beside
from ..config.settings import Settings
from ..record.profile import HostProfile
from ..targets.base import Target, room_beside

AA_SIDE_BY_SIDE = "--spec-config baseline --spec-arms together --spec-repeats 4"


def choose_arms(
    settings: Settings,
    target: Target,
    *,
    machine: dict[str, Any],
    profile: HostProfile | None,
    version: str | None,
) -> tuple[str, str]:
    """The arms' mode for this run and why: as asked, else side by side where every candidate
    fits beside the original (a GPU with memory for both, free GPUs, or on a CPU, free cores
    once an A/A run side by side measured the places' own speeds on this machine)."""
    run = settings.run
    if run.arms != "auto":
        return run.arms, "as asked ([run] arms, --spec-arms)"
    if run.search:
        return "one-at-a-time", "the search reloads one candidate at a time"
    if not settings.candidates:
        return "one-at-a-time", "no candidate to serve beside the baseline"
    at_once = min(run.beside, len(settings.candidates))
    for spec in settings.candidates:
        why = room_beside(target, spec, of=at_once)
        if why:
            return "one-at-a-time", f"{spec.name} does not fit beside the original: {why}"
    if machine.get("gpus"):
        return "together", "the host holds both servers (--spec-arms one-at-a-time: one)"
    here = machine.get("machine")
    measured = [
        e
        for e in (profile.matching(version) if profile else [])
        if e.design == "together" and e.position_bias and (here is None or e.machine == here)
    ]
    if measured:
        return "together", (
            f"a CPU with cores for both, its places' own speeds measured by the A/A run "
            f"{measured[-1].run} side by side (--spec-arms one-at-a-time: one)"
        )
    return "one-at-a-time", (
        "side by side on a CPU waits until an A/A run side by side has measured how the two "
        f"places' cores differ on this machine ({AA_SIDE_BY_SIDE})"
    )


def with_regime(
    settings: Settings, measured: Callable[[], Sequence[tuple[str, Regime]]]
) -> tuple[Settings, str | None]:
    """Side by side beside two or more: no more beside than stored runs on this machine
    measured the baseline within their tolerance (`measured`: their regimes, newest first;
    analysis/map/regime.py `fallback_beside`), and why; else the settings as they are."""
    run = settings.run
    if run.arms != "together" or run.beside < 2:
        return settings, None
    beside, why = fallback_beside(run.beside, measured())
    if why is None:
        return settings, None
    return dataclasses.replace(settings, run=dataclasses.replace(run, beside=beside)), why


def with_arms(settings: Settings, arms: str) -> Settings:
    return dataclasses.replace(settings, run=dataclasses.replace(settings.run, arms=arms))
