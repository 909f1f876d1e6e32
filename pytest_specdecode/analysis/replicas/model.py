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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..variance.restarts import RestartNoise, _between, pooled

__all__ = [
    "Design",
    "Fit",
    "StartSpread",
    "Table",
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


@dataclass(frozen=True)
class Table:
    """The slots as arrays, read once: what every part of the analysis reads of them."""

    period: np.ndarray  # (slots,): 0-based, over every crossover
    prompt: np.ndarray  # (slots,): each slot's prompt, as an index into `labels`
    labels: tuple[object, ...]
    arms: np.ndarray  # (slots, replicas): the arm each replica served
    logs: Mapping[str, np.ndarray]  # per metric: (slots, replicas) log values

    @property
    def replicas(self) -> int:
        return int(self.arms.shape[1])

    @property
    def periods(self) -> int:
        return int(self.period.max()) + 1

    @property
    def arm_count(self) -> int:
        return int(self.arms.max()) + 1

    @classmethod
    def of(cls, slots: Sequence[Slot], metrics: Iterable[str]) -> Table:
        """ValueError naming the first slot whose value is not finite and > 0."""
        labels = tuple(sorted({s.prompt for s in slots}, key=repr))
        code = {label: j for j, label in enumerate(labels)}
        logs = {}
        for metric in metrics:
            values = np.array([s.values(metric) for s in slots], dtype=float)
            bad = ~(np.isfinite(values) & (values > 0)).all(axis=1)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise ValueError(
                    f"slot {i} (period {slots[i].period}): {metric} must be finite and > 0"
                )
            logs[metric] = np.log(values)
        return cls(
            np.array([s.period for s in slots], dtype=int),
            np.array([code[s.prompt] for s in slots], dtype=int),
            labels,
            np.array([s.arms for s in slots], dtype=int),
            logs,
        )


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
    cell: np.ndarray  # each observation's start: replica * periods + period (Z's column)
    cells: int  # Z's columns: replicas x periods
    y: np.ndarray  # within-slot centred log values
    df: float  # residual df: observations - slots - columns
    replicas: int
    arms: int
    prompt_terms: int  # columns of each prompt's own effects (0: not fitted)


def _columns(table: Table, arms: int, prompts: bool) -> np.ndarray:
    """Per slot and replica, the uncentred row of the within-slot model: (slots, replicas,
    columns)."""
    n, replicas = table.arms.shape
    rep = np.zeros((n, replicas, replicas - 1))
    rep[:, np.arange(1, replicas), np.arange(replicas - 1)] = 1.0
    arm = np.zeros((n, replicas, arms))
    np.put_along_axis(arm, table.arms[:, :, None], 1.0, axis=2)
    parts = [rep, arm[:, :, 1:]]
    if prompts and len(table.labels) > 1:
        dev = np.zeros((n, len(table.labels)))
        dev[np.arange(n), table.prompt] = 1.0
        dev = dev[:, :-1] - dev[:, -1:]  # the last prompt: sum-to-zero coding
        for main in (rep, arm[:, :, 1:]):
            parts.append((main[:, :, :, None] * dev[:, None, None, :]).reshape(n, replicas, -1))
    return np.concatenate(parts, axis=2)


def full_rank(x: np.ndarray) -> bool:
    """Whether the columns are independent (by the Gram matrix's eigenvalues: cheap for a
    tall design)."""
    if not x.size:
        return True
    found = np.linalg.eigvalsh(x.T @ x)
    return bool(found.min() > max(found.max(), 1.0) * 1e-10)


def design_of(table: Table, metric: str, arms: int, periods: int) -> Design:
    """The within-slot model of one metric: with each prompt's own effects where the slots
    leave them residual degrees of freedom, else without."""
    logs = table.logs[metric]
    n, replicas = logs.shape
    y = (logs - logs.mean(axis=1, keepdims=True)).ravel()
    cell = np.tile(np.arange(replicas), n) * periods + np.repeat(table.period, replicas)
    base = (replicas - 1) + (arms - 1)
    for prompts in (True, False):
        raw = _columns(table, arms, prompts)
        x = (raw - raw.mean(axis=1, keepdims=True)).reshape(n * replicas, -1)
        df = n * replicas - n - x.shape[1]
        if df > 0 and full_rank(x):
            return Design(
                x, cell, replicas * periods, y, float(df), replicas, arms, x.shape[1] - base
            )
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
    xz: np.ndarray  # X'Z

    def parts(self, c: np.ndarray) -> tuple[float, float]:
        """An estimate's `g` (the starts' weight) and `h` (the residual's)."""
        a = c @ self.inverse
        return float(np.sum((a @ self.xz) ** 2)), float(a @ c)

    def contrast(self, c: np.ndarray, outside: RestartNoise) -> tuple[float, float, float]:
        """An estimate `c'beta`, its variance and df. One crossover: `sigma_b^2` is the
        outside's. Repeated: the run's own estimate of the variance, `g SS_Z / tr(Z'MZ) +
        sigma_e^2 (h - g df_Z / tr(Z'MZ))` (unbiased, never clipped: for balanced crossovers its
        second term is 0 and it is the periods' spread on `df_Z`), pooled by degrees of freedom
        with a measured outside's; never below the slots' own part `h sigma_e^2`."""
        g, h = self.parts(c)
        estimate = float(c @ self.beta)
        if self.starts is None:
            return estimate, *variance(g, h, self.resid_var, self.resid_df, outside)
        s = self.starts
        starts = g * s.ss / s.trace
        rest = self.resid_var * (h - g * s.df / s.trace)
        var = starts + rest
        terms = starts**2 / s.df + (rest**2 / s.resid_df if s.resid_df else 0.0)
        df = var**2 / terms if terms > 0 and var > 0 else s.df
        if outside.measured:
            out, out_df = variance(g, h, self.resid_var, self.resid_df, outside)
            var, df = (df * var + out_df * out) / (df + out_df), df + out_df
        return estimate, max(var, h * self.resid_var), max(1.0, df)

    def starts_share(self, c: np.ndarray, noise: RestartNoise) -> float:
        """The starts' share of an estimate's variance (the rest: the slots')."""
        g, h = self.parts(c)
        starts = max(0.0, g * _between(noise))
        slots = h * self.resid_var
        return starts / (starts + slots) if starts + slots > 0 else 0.0


def by_cell(design: Design, values: np.ndarray) -> np.ndarray:
    """`Z'v` for each column of `values` (or one vector): sums over each start's observations."""
    if values.ndim == 1:
        return np.bincount(design.cell, weights=values, minlength=design.cells)
    return np.stack([by_cell(design, values[:, j]) for j in range(values.shape[1])])


def fit(design: Design) -> Fit:
    """Least squares on the within-slot model; with repeated crossovers, what the starts'
    columns add (the module's docstring). `Z` centred within slots (`Zc`) is never built:
    `Zc'Zc` is, per period, its slots times `I - J/k` over its replicas' starts; `X'Zc = X'Z`
    and `Zc'r = Z'r` (X and r are centred within slots)."""
    x, y = design.x, design.y
    inverse = np.linalg.inv(x.T @ x)
    beta = inverse @ (x.T @ y)
    resid = y - x @ beta
    rss = float(resid @ resid)
    xz = by_cell(design, x)
    counts = np.bincount(design.cell, minlength=design.cells).astype(float)
    periods = design.cells // design.replicas
    period = np.arange(design.cells) % periods
    same = period[:, None] == period[None, :]
    gram = np.diag(counts) - same * counts[:, None] / design.replicas - xz.T @ inverse @ xz
    found, vectors = np.linalg.eigh(gram)  # MZ's column space, from its Gram matrix
    kept = found > max(found.max(initial=0.0), 1.0) * 1e-10
    df_z = float(np.count_nonzero(kept))
    if df_z and design.df - df_z > 0:
        ss = float(np.sum((vectors[:, kept].T @ by_cell(design, resid)) ** 2 / found[kept]))
        resid_df = design.df - df_z
        resid_var = (rss - ss) / resid_df
        starts = StartSpread(ss, df_z, float(np.trace(gram)), resid_var, resid_df)
        return Fit(beta, inverse, resid_var, resid_df, design, starts, xz)
    return Fit(beta, inverse, rss / design.df, design.df, design, None, xz)


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
    made = f"{crossovers} crossover{'s' if crossovers != 1 else ''}"
    own = spread.noise(f"measured by this run's starts ({made}, {spread.df:g} df)")
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


def parts_of(
    replicas: int, arms: int, slots: int, crossovers: int
) -> tuple[float, float, float, float]:
    """For the plan: the first candidate's change after `crossovers` rotations of `slots` slots a
    period (no prompt terms): its `g`, its `h`, the starts' df (`df_Z`) and `tr(Z'MZ)`. Each
    period's slots alike, `X'X`, `X'Z` and `Z'Z` grow with them: `g` and `df_Z` stay, `h` falls
    and the trace grows in proportion (computed at two slots a period)."""
    g, h, df_z, trace = _parts_of(replicas, arms, crossovers)
    return g, h * 2.0 / slots, df_z, trace * slots / 2.0


@functools.lru_cache(maxsize=256)
def _parts_of(replicas: int, arms: int, crossovers: int) -> tuple[float, float, float, float]:
    schedule = np.array(rotation(replicas, arms), dtype=int)
    periods = crossovers * arms
    period = np.repeat(np.arange(periods), 2)  # two slots a period, one prompt
    served = schedule[period % arms]
    table = Table(period, np.zeros(period.size, dtype=int), (0,), served,
                  {"throughput": np.zeros(served.shape)})  # fmt: skip
    design = design_of(table, "throughput", arms, periods)
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
    if any(s.values(metric) is None for s in slots):
        raise ValueError(f"a slot has no {metric}")
    table = Table.of(slots, [metric])
    found = fit(design_of(table, metric, table.arm_count, table.periods))
    return found.resid_var, found.resid_df, found.starts
