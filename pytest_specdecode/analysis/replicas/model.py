"""The crossover's model: one linear model within slots, each estimate's variance with the
starts' part in it, and what repeated crossovers measure of the starts themselves. Pure.

Each slot's log values (one per replica) less their mean: `log value = replica + arm + e`, with
each prompt's own replica and arm effects (sum-to-zero coding) where they leave the residual
degrees of freedom (each prompt sent more than once a period, or over repeated crossovers); at
one slot per prompt and period they have none, and each prompt's own change and replica effect
land in the residual (the safe side).

**The starts.** Every period starts each replica again (period 1's first replica serves its
original, started once too), and each start shifts all its requests: with `Z` the starts'
indicators, an estimate `c'beta` has variance `sigma_b^2 g + sigma_e^2 h`, `h = c'(X'X)^-1 c`,
`g = |c'(X'X)^-1 X'Z|^2`.

**What repeated crossovers measure.** One crossover (AB/BA) has as many starts as its periods'
differences: they cannot be told from the change and the replica effect. From the second
crossover on they can: with `M = I - X(X'X)^-1 X'`, the starts' columns add `SS_Z = |P_{MZ}
y|^2` on `df_Z = rank(MZ)` degrees of freedom (`2N - 2` for N AB/BA crossovers, `(k-1)(k-2)`
for one rotation of k), whose expectation is `sigma_e^2 df_Z + sigma_b^2 tr(Z'MZ)`. So
`SS_Z / tr(Z'MZ)` is one start's variance as these starts show it, `sigma_e^2 df_Z / tr(Z'MZ)`
its within-start part, `df_Z` its degrees of freedom: a `RestartNoise` measured by this run
(`StartSpread.noise`), read as an A/A run's is (analysis/variance/restarts.py). For N balanced
AB/BA crossovers the change's variance it gives is the spread of the periods' mean differences
over `2N`, on `2N - 2` degrees of freedom: exact, whatever the starts do.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..variance.restarts import RestartNoise, _between, pooled

__all__ = [
    "Design",
    "Fit",
    "StartSpread",
    "design_of",
    "fit",
    "known_noise",
    "measured_of",
    "parts_of",
    "rotation",
    "variance",
]


class Slot(Protocol):
    """What the model reads of a slot (crossover.py → CrossoverSlot)."""

    period: int
    prompt: object
    arms: tuple[int, ...]

    def values(self, metric: str) -> tuple[float, ...] | None: ...


def rotation(replicas: int, arms: int) -> tuple[tuple[int, ...], ...]:
    """Per period, the arm each replica serves: replica `r` serves `(r + p) mod arms` in period
    `p`, over `arms` periods, so each replica serves each arm once, replica 0 keeps the baseline
    (arm 0) in period 0, and with as many replicas as arms each period serves each arm once."""
    if replicas < 2 or arms < 2:
        raise ValueError(f"a rotation needs two replicas and two arms, got {replicas} and {arms}")
    return tuple(tuple((r + p) % arms for r in range(replicas)) for p in range(arms))


@dataclass(frozen=True)
class Design:
    x: np.ndarray  # within-slot centred columns: replicas 1.., arms 1.., prompt terms
    z: np.ndarray  # each observation's start (replica, period) indicator
    y: np.ndarray  # within-slot centred log values
    df: float  # residual df: observations - slots - columns
    replicas: int
    arms: int
    prompt_terms: int  # columns of each prompt's own effects (0: not fitted)


def _columns(slots: Sequence[Slot], replicas: int, arms: int, prompts: bool) -> list:
    """Per observation (slot, replica), the uncentred row of the within-slot model."""
    labels = sorted({s.prompt for s in slots}, key=repr) if prompts else []
    code = {label: j for j, label in enumerate(labels[:-1])}
    rows = []
    for s in slots:
        dev = np.zeros(max(0, len(labels) - 1))
        if labels:
            if s.prompt in code:
                dev[code[s.prompt]] = 1.0
            else:
                dev[:] = -1.0  # the last prompt: sum-to-zero coding
        for r in range(replicas):
            rep = np.zeros(replicas - 1)
            arm = np.zeros(arms - 1)
            if r:
                rep[r - 1] = 1.0
            if s.arms[r]:
                arm[s.arms[r] - 1] = 1.0
            parts = [rep, arm]
            if labels:
                parts += [np.outer(rep, dev).ravel(), np.outer(arm, dev).ravel()]
            rows.append(np.concatenate(parts))
    return rows


def design_of(slots: Sequence[Slot], metric: str, replicas: int, arms: int, periods: int) -> Design:
    """The within-slot model of one metric: with each prompt's own effects where the slots
    leave them residual degrees of freedom, else without."""
    logs = np.log(np.array([s.values(metric) for s in slots], dtype=float))
    n = len(slots)
    y = (logs - logs.mean(axis=1, keepdims=True)).ravel()
    z = np.zeros((n * replicas, replicas * periods))
    for i, s in enumerate(slots):
        for r in range(replicas):
            z[i * replicas + r, r * periods + s.period] = 1.0
    base = (replicas - 1) + (arms - 1)
    for prompts in (True, False):
        raw = np.array(_columns(slots, replicas, arms, prompts)).reshape(n, replicas, -1)
        x = (raw - raw.mean(axis=1, keepdims=True)).reshape(n * replicas, -1)
        rank = int(np.linalg.matrix_rank(x)) if x.size else 0
        df = n * replicas - n - rank
        if rank == x.shape[1] and df > 0:
            return Design(x, z, y, float(df), replicas, arms, x.shape[1] - base)
    raise ValueError(
        f"{metric}: the crossover's slots do not separate the replicas from the arms "
        f"({n} slots over {periods} periods); each replica must serve more than one arm"
    )


@dataclass(frozen=True)
class StartSpread:
    """What the starts' own columns add to the fit (the module's docstring)."""

    ss: float  # SS_Z
    df: float  # df_Z
    trace: float  # tr(Z'MZ)
    resid_var: float  # sigma_e^2 with the starts' columns in the model
    resid_df: float

    def noise(self, source: str) -> RestartNoise:
        """One start's effect as these starts show it: measured, with its within-start part."""
        spread = self.ss / self.trace
        within = self.resid_var * self.df / self.trace
        between = max(0.0, spread - within)
        return RestartNoise(
            math.sqrt(between), self.df, source, True, spread, within, self.resid_var
        )


@dataclass(frozen=True)
class Fit:
    beta: np.ndarray
    inverse: np.ndarray
    resid_var: float  # sigma_e^2, with the starts' columns where they have df
    resid_df: float
    design: Design
    starts: StartSpread | None  # what repeated crossovers measured; None: one crossover

    def parts(self, c: np.ndarray) -> tuple[float, float]:
        """An estimate's `g` (the starts' weight) and `h` (the residual's)."""
        a = c @ self.inverse
        return float(np.sum((a @ self.design.x.T @ self.design.z) ** 2)), float(a @ c)

    def contrast(self, c: np.ndarray, noise: RestartNoise) -> tuple[float, float, float]:
        """An estimate `c'beta`, its variance and df."""
        g, h = self.parts(c)
        var, df = variance(g, h, self.resid_var, self.resid_df, noise)
        return float(c @ self.beta), var, df

    def starts_share(self, c: np.ndarray, noise: RestartNoise) -> float:
        """The starts' share of an estimate's variance (the rest: the slots')."""
        g, h = self.parts(c)
        starts = max(0.0, g * _between(noise))
        slots = h * self.resid_var
        return starts / (starts + slots) if starts + slots > 0 else 0.0


def fit(design: Design) -> Fit:
    """Least squares on the within-slot model; with repeated crossovers, what the starts'
    columns add (the module's docstring)."""
    x, y = design.x, design.y
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ (x.T @ y)
    resid = y - x @ beta
    rss = float(resid @ resid)
    n, k = y.size // design.replicas, design.replicas
    zc = design.z.reshape(n, k, -1)
    zc = (zc - zc.mean(axis=1, keepdims=True)).reshape(n * k, -1)
    mz = zc - x @ (inverse @ (x.T @ zc))
    u, sv, _ = np.linalg.svd(mz, full_matrices=False)
    kept = sv > sv.max(initial=0.0) * 1e-9 if sv.size else sv.astype(bool)
    df_z = float(np.count_nonzero(kept))
    starts = None
    if df_z and design.df - df_z > 0:
        ss = float(np.sum((u[:, kept].T @ resid) ** 2))
        resid_df = design.df - df_z
        resid_var = (rss - ss) / resid_df
        starts = StartSpread(ss, df_z, float(np.sum(mz**2)), resid_var, resid_df)
        return Fit(beta, inverse, resid_var, resid_df, design, starts)
    return Fit(beta, inverse, rss / design.df, design.df, design, None)


def known_noise(
    spread: StartSpread | None, outside: RestartNoise, *, crossovers: int
) -> RestartNoise:
    """The restart noise an estimate takes: what this run's crossovers measured, pooled by
    degrees of freedom with a measured outside (the replicas' host profiles, a stored run's
    crossovers); an outside that was only assumed, or measured on another machine, is set
    aside once this run measures its own (docs/statistics.md: pooled, it let a 10% host call
    twice alpha); the outside alone after one crossover."""
    if spread is None:
        return outside
    own = spread.noise(f"measured by this run's {crossovers} crossovers ({spread.df:g} df)")
    if outside.measured:
        both = pooled([own, outside], source=f"{own.source}; {outside.source}")
        return both if both is not None else own
    what = "assumption" if outside.source.startswith("unmeasured") else "prior"
    return RestartNoise(
        own.sd, own.df, f"{own.source}; the {what} set aside", True, own.spread, own.within,
        own.residual,
    )  # fmt: skip


def variance(
    part_starts: float, part_resid: float, resid_var: float, resid_df: float, noise: RestartNoise
) -> tuple[float, float]:
    """`sigma_b^2 g + sigma_e^2 h` and its Satterthwaite df over the two parts, never below the
    fewer of the two parts' own, nor below 1."""
    starts = part_starts * max(0.0, _between(noise))
    slots = part_resid * resid_var
    value = starts + slots
    if value <= 0:
        return 0.0, resid_df
    if starts > 0 and noise.df <= 0:  # a restart noise of no weight: one df, the least
        return value, 1.0
    start_term = (part_starts * noise.start_variance) ** 2 / noise.df if noise.df > 0 else 0.0
    slot_term = slots**2 / resid_df if resid_df else math.inf
    found = value**2 / (start_term + slot_term) if start_term + slot_term else math.inf
    parts = [d for d, v in ((noise.df, starts), (resid_df, slots)) if v > 0 and d > 0]
    return value, max(1.0, min(parts) if parts else 1.0, found)


@dataclass(frozen=True)
class _Planned:
    period: int
    prompt: object
    arms: tuple[int, ...]

    def values(self, metric: str) -> tuple[float, ...]:
        return (1.0,) * len(self.arms)


@functools.lru_cache(maxsize=256)
def parts_of(
    replicas: int, arms: int, slots: int, crossovers: int
) -> tuple[float, float, float, float]:
    """For the plan: the first candidate's change after `crossovers` rotations of `slots` slots a
    period (no prompt terms): its `g`, its `h`, the starts' df (`df_Z`) and `tr(Z'MZ)`."""
    schedule = rotation(replicas, arms)
    planned = [
        _Planned(c * arms + p, 0, served)
        for c in range(crossovers)
        for p, served in enumerate(schedule)
        for i in range(slots)
    ]
    design = design_of(planned, "throughput", replicas, arms, crossovers * arms)
    found = fit(design)
    c = np.zeros(found.beta.size)
    c[replicas - 1] = 1.0
    g, h = found.parts(c)
    if found.starts is None:
        return g, h, 0.0, 0.0
    return g, h, found.starts.df, found.starts.trace


def measured_of(slots: Sequence[Slot], metric: str) -> tuple[float, float, StartSpread | None]:
    """What a crossover's slots measured of one metric: a request's residual variance within
    its slot, its df, and (repeated crossovers) what the starts' columns add."""
    if not slots:
        raise ValueError("no slot")
    replicas = len(slots[0].arms)
    arms = max(a for s in slots for a in s.arms) + 1
    periods = max(s.period for s in slots) + 1
    if any(s.values(metric) is None for s in slots):
        raise ValueError(f"a slot has no {metric}")
    found = fit(design_of(slots, metric, replicas, arms, periods))
    return found.resid_var, found.resid_df, found.starts
