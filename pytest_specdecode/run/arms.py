"""`[run] arms = "auto"` (the default): side by side where the host holds both servers, one at
a time elsewhere; the plan says which was chosen, and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from ..analysis.map.regime import Regime, fallback_beside, regime_size
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


def with_regime_window(
    settings: Settings, spread: Callable[[], tuple[float, str]]
) -> tuple[Settings, str | None]:
    """Beside two or more: the regime window's slots per cell, sized to settle its tolerance
    with 80% power at a request's spread (`spread`: it and where it comes from), or left out
    where it would need more slots than a cell sends (analysis/map/regime.py `regime_size`);
    as set where `[run] regime_slots` says (then whether that settles it). The plan's line."""
    run = settings.run
    if run.arms != "together" or min(run.beside, len(settings.candidates)) < 2:
        return settings, None
    sd, source = spread()
    level = run.levels[0]
    cells = len(settings.prompt_types) * len(run.levels)
    step = level.concurrency or 1
    most = max(1, run.requests_at(level)[1] // step)
    size = regime_size(cells, most, tolerance=run.regime_tolerance, alpha=run.alpha, spread=sd)
    at = f"a request's spread of {sd:.1%} ({source})"
    if run.regime_slots is not None:
        sent = run.regime_slots * cells
        settles = "settles" if sent >= size.needed else "cannot settle"
        return settings, (
            f"the regime window: {run.regime_slots} slot(s) a cell ([run] regime_slots), "
            f"{sent} requests beside one: it {settles} its {run.regime_tolerance:.0%} tolerance "
            f"with 80% power at {at}, which needs {size.needed}"
        )
    sized = dataclasses.replace(settings, run=dataclasses.replace(run, regime_slots=size.slots))
    if size.left_out is not None:
        return sized, (
            f"{size.left_out} ({source}); left out: [run] regime_slots = "
            f"{-(-size.needed // cells)} to force it"
        )
    return sized, (
        f"the regime window: {size.slots} slot(s) a cell, {size.slots * cells} requests beside "
        f"one, to settle its {run.regime_tolerance:.0%} tolerance with 80% power at {at}"
    )


def with_arms(settings: Settings, arms: str) -> Settings:
    return dataclasses.replace(settings, run=dataclasses.replace(settings.run, arms=arms))
