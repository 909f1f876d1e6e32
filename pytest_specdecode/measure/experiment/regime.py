"""The regime window (issue 41): beside two or more, the baseline start with only the first
server beside it, a few slots per cell (`[run] regime_slots`, as the plan sized it: issue 50,
analysis/map/regime.py `regime_size`), sent before the others start
(`Switchboard.together_all`'s `first_beside`). Its requests are kept in `RunRecord.regime`,
never in a phase, so no verdict reads them; analysis/map/regime.py compares them with the same
start beside all N."""

from __future__ import annotations

from collections.abc import Callable

from ...config.arms import BASELINE
from ...record.schema import Phase, RegimeWindow, regime_phase_name
from ...targets.base import Service
from .context import RunContext
from .order import RoundOrder, order_seed
from .rounds import Rounds, Start


def regime_window(
    ctx: RunContext, rounds: Rounds, base_name: str, group: list[tuple[str, str]]
) -> Callable[[Service, Service], None] | None:
    """What together_all calls once the first of `group` serves beside the baseline start
    `base_name`; None where no window is sent (fewer than two beside, none asked, or the run
    has one already)."""
    run = ctx.settings.run
    slots = run.regime_window_slots
    if len(group) < 2 or not slots or ctx.record.regime is not None:
        return None
    neighbour, arm = group[0]

    def measure(original: Service, first: Service) -> None:
        base = Phase(regime_phase_name(base_name), BASELINE, None, service=original.label)
        near = Phase(regime_phase_name(neighbour), arm, None, service=first.label)
        ctx.record.regime = RegimeWindow(
            phase=base_name,
            beside=len(group),
            neighbour=neighbour,
            tolerance=run.regime_tolerance,
            measurements=base.measurements,  # filled as it is measured: flushed with it
        )
        ctx.progress(
            f"[{base_name}] the regime window: the baseline beside {neighbour} alone, "
            f"{slots} slot(s) per cell, before the other {len(group) - 1} start; "
            "its requests enter no verdict"
        )
        order = RoundOrder(order_seed(run.seed, base.name))
        rounds.measure([Start(base, original), Start(near, first)], order, slots=slots)
        ctx.store.flush()

    return measure
