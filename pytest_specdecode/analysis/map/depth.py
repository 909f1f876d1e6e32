"""The break-even map carried to the full depth: step cost measured at two or three served depths,
fitted per layer, extrapolated with its interval. Pure.

A shape target serves the model's architecture with random weights, its depth cut to fit
(`--hf-overrides '{"num_hidden_layers": n}'`). At each served depth n the baseline and every map
server (k drafts a step, accepted at a stated L) are measured; each request's time per decode
step is its TPOT times the tokens per step its server's counters measured (1 for the baseline).
Per server and load, the step time is a line in the layers, T(n) = a + b·n: the layers are
alike (for a MoE shape, every served depth above its dense first layers), and what the step
costs besides them (the embeddings, the sampler, the proposer, the scheduler) is `a`. Each line
is carried to the full depth N, and there a map server's throughput over the baseline's is

    r = x · T_baseline(N) / T_server(N)      (x: its tokens per step; the baseline emits one)

which, per carrier, k and load, is fitted as the map's line in x (analysis/map/break_even.py),
giving the break-even tokens per step (r = 1) and the ceiling (r at k + 1).

The interval: every cell's requests redrawn (a bootstrap within each prompt type), each server
start's mean moved by the restart noise given (log scale; one start per depth and server, so
this run cannot measure it), everything fitted again, `DRAWS` times, seeded. With three depths
the fit's residuals say whether the layers are alike; with two it is exact and cannot.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...config.arms import BASELINE
from ...errors import ConfigError

__all__ = [
    "Band",
    "DepthLine",
    "DepthMap",
    "LayerFit",
    "StepCell",
    "fit_depths",
]

DRAWS = 2000
SEED = 20261207


@dataclass(frozen=True)
class Band:
    """An estimate and its central interval."""

    estimate: float
    low: float
    high: float

    def to_dict(self) -> dict[str, float | None]:
        return {"estimate": _finite(self.estimate), "low": _finite(self.low),
                "high": _finite(self.high)}  # fmt: skip

    def text(self, fmt: str = ".2f", unit: str = "") -> str:
        return f"{_num(self.estimate, fmt)}{unit} [{_num(self.low, fmt)}, {_num(self.high, fmt)}]"


@dataclass(frozen=True)
class StepCell:
    """One server at one served depth and load: its requests' time per decode step (ms), by
    prompt type, and the tokens per step its counters measured (1 for the baseline)."""

    server: str  # BASELINE, or a map server's name
    level: str
    depth: int
    strata: tuple[tuple[float, ...], ...]
    tokens_per_step: float = 1.0
    carrier: str = ""  # the map server's drafter: ngram, eagle3, draft_model:NAME
    k: int | None = None
    length: float | None = None  # the asked accepted per draft

    @property
    def mean_ms(self) -> float:
        """The mean of the prompt types' means: each type weighs alike, whatever its count."""
        return float(np.mean([np.mean(s) for s in self.strata]))


@dataclass(frozen=True)
class LayerFit:
    """One server's step time at one load: T(n) = intercept + per_layer · n, from its depths."""

    server: str
    level: str
    depths: tuple[int, ...]
    measured_ms: tuple[float, ...]  # the mean step at each depth
    intercept_ms: Band
    per_layer_ms: Band
    full_ms: Band  # carried to the full depth
    tokens_per_step: float
    carrier: str = ""
    k: int | None = None
    length: float | None = None

    @property
    def worst_residual(self) -> float | None:
        """The largest miss of the line at a measured depth, as a share of the step there;
        None with two depths (the line meets both)."""
        if len(set(self.depths)) < 3:
            return None
        a, b = self.intercept_ms.estimate, self.per_layer_ms.estimate
        pairs = zip(self.depths, self.measured_ms, strict=True)
        return max(abs(m - (a + b * d)) / m for d, m in pairs)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "level": self.level,
            "carrier": self.carrier,
            "k": self.k,
            "asked_accepted_per_draft": self.length,
            "tokens_per_step": self.tokens_per_step,
            "depths": list(self.depths),
            "measured_ms": list(self.measured_ms),
            "intercept_ms": self.intercept_ms.to_dict(),
            "per_layer_ms": self.per_layer_ms.to_dict(),
            "full_depth_ms": self.full_ms.to_dict(),
            "worst_residual": self.worst_residual,
        }


@dataclass(frozen=True)
class DepthLine:
    """The map's line at the full depth for one carrier, k and load: its points' ratios (x,
    the ratio and its band), the break-even tokens per step and the ceiling."""

    carrier: str
    k: int
    level: str
    points: tuple[tuple[float, Band], ...]
    break_even: Band  # tokens per step where the ratio is 1 (inf: never)
    ceiling: Band  # the ratio with every draft accepted, x = k + 1
    line: tuple[float, float] = (math.nan, math.nan)  # (intercept, slope) of r(x)
    confidence: float = 0.95
    draws: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)), repr=False)

    @property
    def pays(self) -> bool:
        return self.break_even.estimate <= self.k + 1

    def at(self, tokens_per_step: float) -> Band:
        """The ratio over the baseline's at `tokens_per_step`, at the full depth, with its band."""
        a, b = self.line
        values = self.draws[:, 0] + self.draws[:, 1] * tokens_per_step
        return _band(a + b * tokens_per_step, values, self.confidence)

    def to_dict(self) -> dict[str, Any]:
        return {
            "carrier": self.carrier,
            "k": self.k,
            "level": self.level,
            "points": [{"tokens_per_step": x, "ratio": r.to_dict()} for x, r in self.points],
            "break_even": self.break_even.to_dict(),
            "ceiling": self.ceiling.to_dict(),
        }


@dataclass(frozen=True)
class DepthMap:
    """The map carried from the served depths to the full depth, with every server's fit; its
    draws give a band at any depth (`step_ms`, `step_cost`)."""

    full_depth: int
    depths: tuple[int, ...]
    confidence: float
    restart_noise: float
    fits: tuple[LayerFit, ...]
    lines: tuple[DepthLine, ...]
    draws: Mapping[tuple[str, str], np.ndarray] = field(default_factory=dict, repr=False)

    def fit(self, server: str, level: str) -> LayerFit | None:
        return next((f for f in self.fits if (f.server, f.level) == (server, level)), None)

    def line(self, k: int, level: str, carrier: str | None = None) -> DepthLine | None:
        return next(
            (ln for ln in self.lines
             if (ln.k, ln.level) == (k, level) and carrier in (None, ln.carrier)), None,
        )  # fmt: skip

    @property
    def carried(self) -> bool:
        """Fitted per layer over two depths or more (else measured at the full depth alone)."""
        return len(self.depths) >= 2

    def reaches(self, depth: int) -> bool:
        """Whether a step at `depth` can be read: any depth where carried, else the one."""
        return self.carried or depth in self.depths

    def step_ms(self, server: str, level: str, depth: int) -> Band | None:
        """A server's time per decode step (ms) at `depth` layers, with its band; BASELINE for
        the baseline. None where it was not measured at this load, or at a depth the map
        cannot reach (`reaches`)."""
        fit, ab = self.fit(server, level), self.draws.get((server, level))
        if fit is None or ab is None or not self.reaches(depth):
            return None
        values = ab[:, 0] + ab[:, 1] * depth
        point = fit.intercept_ms.estimate + fit.per_layer_ms.estimate * depth
        return _band(point, values, self.confidence)

    def ratio_at(
        self, k: int, tokens_per_step: float, level: str, carrier: str | None = None
    ) -> tuple[float, float, float] | None:
        """The map's ratio at the full depth for k at `tokens_per_step` and this load
        (estimate, low, high): the prediction's `ratio_at` (analysis/prediction/from_map/
        proposer.py → `predict_on_shape`). `carrier` picks whose lines (default: the first
        measured); None off the map."""
        line = self.line(k, level, carrier)
        if line is None:
            return None
        found = line.at(tokens_per_step)
        return found.estimate, found.low, found.high

    def step_cost(
        self,
        k: int,
        level: str,
        depth: int,
        *,
        carrier: str | None = None,
        tokens_per_step: float | None = None,
    ) -> Band | None:
        """What a step of k drafts costs over the baseline's step at `depth` layers and this
        load (1.0: the same), with its band: over the map's servers of this k (the first
        carrier measured, unless named), at `tokens_per_step` where given (the line through
        them in x), else their mean. None off the map, or at a depth it cannot reach."""
        servers = [f for f in self.fits if f.k == k and f.level == level and f.carrier
                   and carrier in (None, f.carrier)]  # fmt: skip
        servers = [f for f in servers if f.carrier == servers[0].carrier] if servers else []
        base = self.draws.get((BASELINE, level))
        base_fit = self.fit(BASELINE, level)
        if not servers or base is None or base_fit is None or not self.reaches(depth):
            return None
        t_base = base[:, 0] + base[:, 1] * depth
        point_base = base_fit.intercept_ms.estimate + base_fit.per_layer_ms.estimate * depth
        xs = np.array([f.tokens_per_step for f in servers])
        costs = np.stack([(ab[:, 0] + ab[:, 1] * depth) / t_base for f in servers
                          for ab in [self.draws[(f.server, level)]]], axis=1)  # fmt: skip
        points = np.array([(f.intercept_ms.estimate + f.per_layer_ms.estimate * depth)
                           / point_base for f in servers])  # fmt: skip
        if tokens_per_step is None or len(set(xs.tolist())) < 2:
            return _band(float(points.mean()), costs.mean(axis=1), self.confidence)
        a, b = _ols(xs, points[None, :])
        a_d, b_d = _ols(xs, costs)
        return _band(float(a[0] + b[0] * tokens_per_step), a_d + b_d * tokens_per_step,
                     self.confidence)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "full_depth": self.full_depth,
            "depths": list(self.depths),
            "confidence": self.confidence,
            "restart_noise": self.restart_noise,
            "fits": [f.to_dict() for f in self.fits],
            "lines": [ln.to_dict() for ln in self.lines],
        }


def fit_depths(
    cells: Iterable[StepCell],
    full_depth: int,
    *,
    confidence: float = 0.95,
    restart_noise: float = 0.0,
    draws: int = DRAWS,
    seed: int = SEED,
) -> DepthMap:
    """Every server's step line over its depths, carried to `full_depth`, and the map's lines
    there; measured at the full depth alone, each step as it is (readable at that depth only).
    A ConfigError where one depth below the full one was measured, or the baseline at none."""
    by_server: dict[tuple[str, str], list[StepCell]] = {}
    for cell in cells:
        if cell.strata and all(cell.strata):
            by_server.setdefault((cell.server, cell.level), []).append(cell)
    depths = tuple(sorted({c.depth for cs in by_server.values() for c in cs}))
    whole = depths == (full_depth,)
    if len(depths) < 2 and not whole:
        raise ConfigError(
            f"the map is carried to {full_depth} layers from two served depths or more; "
            f"measured: {list(depths) or 'none'}"
        )
    if not any(server == BASELINE for server, _ in by_server):
        raise ConfigError(
            "the map is carried from the baseline's step at each depth: none measured"
        )
    rng = np.random.default_rng(seed)
    fits, ab_draws = [], {}
    for (server, level), found in sorted(by_server.items()):
        found = sorted(found, key=lambda c: c.depth)
        if len({c.depth for c in found}) < 2 and not whole:
            continue
        d = np.array([c.depth for c in found], dtype=float)
        means = np.array([c.mean_ms for c in found])
        redrawn = np.stack([_redraw(c, rng, draws) for c in found], axis=1)
        redrawn *= np.exp(restart_noise * rng.standard_normal(redrawn.shape))
        if whole:  # the step as measured, no line: nothing per layer is told
            a, b = means[:1].copy(), np.zeros(1)
            a_d, b_d = redrawn.mean(axis=1), np.zeros(draws)
        else:
            a, b = _ols(d, means[None, :])
            a_d, b_d = _ols(d, redrawn)
        ab_draws[(server, level)] = np.stack([a_d, b_d], axis=1)
        first = found[0]
        fits.append(LayerFit(
            server, level, tuple(int(x) for x in d), tuple(float(m) for m in means),
            _band(float(a[0]), a_d, confidence), _band(float(b[0]), b_d, confidence),
            _band(float(a[0] + b[0] * full_depth), a_d + b_d * full_depth, confidence),
            float(np.mean([c.tokens_per_step for c in found])), first.carrier, first.k,
            first.length,
        ))  # fmt: skip
    result = DepthMap(full_depth, depths, confidence, restart_noise, tuple(fits), (), ab_draws)
    return dataclasses.replace(result, lines=_lines(result))


def _lines(found: DepthMap) -> tuple[DepthLine, ...]:
    """Per carrier, k and load: the servers' ratios at the full depth, and their line in x."""
    groups: dict[tuple[str, int, str], list[LayerFit]] = {}
    for f in found.fits:
        if f.k is not None and f.carrier:
            groups.setdefault((f.carrier, f.k, f.level), []).append(f)
    out = []
    n = found.full_depth
    for (carrier, k, level), fits in groups.items():
        base, base_fit = found.draws.get((BASELINE, level)), found.fit(BASELINE, level)
        if base is None or base_fit is None or len({f.tokens_per_step for f in fits}) < 2:
            continue
        t_base = base[:, 0] + base[:, 1] * n
        xs = np.array([f.tokens_per_step for f in fits])
        ratio_draws = np.stack([f.tokens_per_step * t_base / (ab[:, 0] + ab[:, 1] * n)
                                for f in fits for ab in [found.draws[(f.server, level)]]],
                               axis=1)  # fmt: skip
        ratios = np.array([f.tokens_per_step * base_fit.full_ms.estimate / f.full_ms.estimate
                           for f in fits])  # fmt: skip
        a, b = _ols(xs, ratios[None, :])
        a_d, b_d = _ols(xs, ratio_draws)
        points = tuple(
            (float(x), _band(float(r), ratio_draws[:, i], found.confidence))
            for i, (x, r) in enumerate(zip(xs, ratios, strict=True))
        )
        crossing = np.array([_crossing(p, q) for p, q in zip(a_d, b_d, strict=True)])
        out.append(DepthLine(
            carrier, k, level, points,
            _band(_crossing(float(a[0]), float(b[0])), crossing, found.confidence),
            _band(float(a[0] + b[0] * (k + 1)), a_d + b_d * (k + 1), found.confidence),
            (float(a[0]), float(b[0])), found.confidence, np.stack([a_d, b_d], axis=1),
        ))  # fmt: skip
    return tuple(sorted(out, key=lambda ln: (ln.carrier, ln.k, ln.level)))


def _redraw(cell: StepCell, rng: np.random.Generator, draws: int) -> np.ndarray:
    """The cell's mean redrawn: each prompt type's requests resampled, the types' means averaged."""
    means = []
    for stratum in cell.strata:
        values = np.asarray(stratum, dtype=float)
        picks = rng.integers(0, len(values), size=(draws, len(values)))
        means.append(values[picks].mean(axis=1))
    return np.mean(means, axis=0)


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of each row of y (draws x points) on x: (intercepts, slopes)."""
    xc = x - x.mean()
    slope = (y - y.mean(axis=1, keepdims=True)) @ xc / float(xc @ xc)
    return y.mean(axis=1) - slope * x.mean(), slope


def _crossing(a: float, b: float) -> float:
    """Where a + b·x reaches 1 (inf: never, a line that does not rise)."""
    if b <= 0:
        return math.inf if a < 1 else 1.0
    return (1.0 - a) / b


def _band(point: float, values: np.ndarray, confidence: float) -> Band:
    tail = (1.0 - confidence) / 2.0
    ordered = np.sort(np.asarray(values, dtype=float))
    n = len(ordered)
    low = ordered[min(n - 1, max(0, math.floor(tail * n)))]
    high = ordered[min(n - 1, max(0, math.ceil((1.0 - tail) * n) - 1))]
    return Band(point, float(low), float(high))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "never"
