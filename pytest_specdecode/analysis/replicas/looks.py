"""Stop once decided: the crossover looked at after each crossover, and what N crossovers can
call. Pure.

A run across replicas plans `planned` crossovers (each one rotation: two periods for AB/BA,
each replica restarted into each arm once). It looks after each: the change's interval is
taken at that look's group-sequential boundary (analysis/variance/spending.py: Lan-DeMets
spending of O'Brien-Fleming type over the information fractions `k / planned`, each comparison
spending LOOK_SPEND of the family's one-sided `alpha / m`), as a side-by-side cell's stop takes
it (analysis/verdict/sequential.py), and the run stops once every candidate is decided. The
analysis afterwards takes the boundary of the look where the run stopped, so the repeated
intervals' joint coverage, and with it the false calls, hold wherever it stopped. The first
look spends almost nothing (its boundary is about 4.3 standard errors at four looks).

What N crossovers can call (`reach`): the change's variance `sigma_b^2 g + sigma_e^2 h` of the
planned design (model.py → `parts_of`), its degrees of freedom as the analysis will count them
(the run's own `2N - 2` from the second crossover on, a measured outside's beside them), the
last look's boundary; the smallest change called with 80% power (analysis/variance/power.py),
and the interval's half-width it would print.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..variance.power import detectable_change
from ..variance.restarts import RestartNoise, pooled, t_quantile
from ..variance.spending import nominal_level
from .model import parts_of, variance

__all__ = [
    "DETECT",
    "LOOK_SPEND",
    "CrossoverReach",
    "crossovers_needed",
    "look_confidence",
    "reach",
]

DETECT = 0.10  # the change the plan sizes the crossovers for, where --spec-detect gives none


# The looks spend this share of each comparison's alpha / m. Their statistics are t's on the
# starts' few degrees of freedom (2N - 2 after N crossovers): the boundaries, computed for z's
# and taken at each look's t quantile, erred at 2.6-2.9% per direction for a one-sided 2.5%
# (20,000 simulated runs a row, 2 to 26 crossovers, benchmarks/replica_crossover.py); at 80%,
# at 1.9-2.3% (docs/statistics.md, "Across replicas: the crossover").
LOOK_SPEND = 0.8


def look_confidence(done: int, planned: int, *, alpha: float, family: int) -> float:
    """The two-sided confidence of the interval after `done` of `planned` crossovers: the
    fixed design's `1 - 2 alpha / m` for one planned crossover, else the look's boundary
    (spending LOOK_SPEND of `alpha / m`)."""
    one_sided = alpha / family
    if planned <= 1 or done < 1:
        return 1.0 - 2.0 * one_sided
    planned = max(planned, done)
    fractions = [j / planned for j in range(1, done + 1)]
    # O'Brien-Fleming type (rho None), as LOOK_SPEND was calibrated: the crossovers' looks are
    # whole periods, each its own information, not a side-by-side cell's slots (spending.py)
    return 1.0 - 2.0 * nominal_level(fractions, one_sided * LOOK_SPEND, rho=None)


@dataclass(frozen=True)
class CrossoverReach:
    """What N crossovers can call, for one metric."""

    crossovers: int
    detectable: float  # the relative change called with 80% power at the last look (inf: none)
    half_width: float  # the interval's relative half-width it would print there (+ side)
    se: float
    df: float
    confidence: float


def planned_noise(
    outside: RestartNoise,
    *,
    slot_var: float,
    crossovers: int,
    slots: int,
    replicas: int = 2,
    arms: int = 2,
) -> RestartNoise:
    """The restart noise the analysis will take after `crossovers` crossovers, as planned: the
    outside alone after one; from the second on, what the run's own starts will measure (their
    expected spread, `df_Z` degrees of freedom), pooled with a measured outside, alone beside an
    assumed one (model.py → `known_noise`)."""
    _, _, df_z, trace = parts_of(replicas, arms, slots, crossovers)
    if crossovers < 2 or not df_z:
        return outside
    within = slot_var * df_z / trace
    between = max(0.0, outside.sd**2)
    own = RestartNoise(
        math.sqrt(between), df_z, "this run's crossovers", True, between + within, within, slot_var
    )
    if outside.measured:
        return pooled([own, outside], source=f"{own.source}; {outside.source}") or own
    return own  # fmt: skip


def reach(
    outside: RestartNoise,
    *,
    slot_var: float,
    slots: int,
    crossovers: int,
    alpha: float,
    family: int,
    margin: float,
    replicas: int = 2,
    arms: int = 2,
    looks: bool = True,
) -> CrossoverReach:
    """What `crossovers` crossovers of `slots` slots a period can call at the last look
    (`slot_var`: one request's residual variance within its slot, log scale); `looks=False`:
    at the fixed design's level (a quicker answer for many crossovers, a little narrower)."""
    g, h, _, _ = parts_of(replicas, arms, slots, crossovers)
    noise = planned_noise(
        outside, slot_var=slot_var, crossovers=crossovers, slots=slots, replicas=replicas,
        arms=arms,
    )  # fmt: skip
    resid_df = float(crossovers * arms * slots * (replicas - 1) - (replicas - 1) - (arms - 1))
    var, df = variance(g, h, slot_var, max(1.0, resid_df), noise)
    se = math.sqrt(var)
    confidence = look_confidence(crossovers, crossovers if looks else 1, alpha=alpha, family=family)
    one_sided = (1.0 - confidence) / 2.0
    half = t_quantile(1.0 - one_sided, df) * se
    found = detectable_change(se, df, family=1, alpha=one_sided, margin=margin)
    return CrossoverReach(crossovers, found, math.expm1(half), se, df, confidence)


def crossovers_needed(
    change: float,
    outside: RestartNoise,
    *,
    slot_var: float,
    slots: int,
    most: int,
    alpha: float,
    family: int,
    margin: float,
    replicas: int = 2,
    arms: int = 2,
    looks: bool = True,
) -> int | None:
    """The fewest crossovers (up to `most`) that call a relative `change` with 80% power
    (analysis/variance/power.py → POWER); None where `most` cannot. With looks, the search
    starts where the fixed design's ends (the looks' last boundary is never narrower)."""
    first = 1
    if looks:
        found = crossovers_needed(
            change, outside, slot_var=slot_var, slots=slots, most=most, alpha=alpha,
            family=family, margin=margin, replicas=replicas, arms=arms, looks=False,
        )  # fmt: skip
        if found is None:
            return None
        first = found
    for n in range(first, most + 1):
        found = reach(
            outside, slot_var=slot_var, slots=slots, crossovers=n, alpha=alpha, family=family,
            margin=margin, replicas=replicas, arms=arms, looks=looks,
        )  # fmt: skip
        if found.detectable <= abs(change):
            return n
    return None
