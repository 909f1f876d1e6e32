"""How often the predicted band really holds: its coverage over stored runs. Pure.

A stored run that measured more than one n-gram config can check the band honestly: each of
its configs in turn is held out, predicted from the rest of the run (its baseline and the other
configs, with the cost prior of the other stored runs, as the search would have predicted it
before that reload), and its measured tok/s (its figure in the results table against the run's
baseline: `compare.arm_figure`, one figure per arm) is put against the predicted band. Per
prompt type, the share inside is the band's coverage.

The band is nominally a 95% interval. Where the share inside falls short of that:
- by more than chance explains (a one-sided binomial test, p < 0.05): the band is widened, for
  that prompt type, by the factor that would have brought the share inside up to 95%;
- within chance: the band is kept, and says so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scipy import stats

from ....record.schema import RunRecord
from ...verdict.compare import arm_figure
from ..level_prediction import cost_prior, ngram_arms, predict_levels, without_arms

__all__ = ["Coverage", "CoverageCase", "PromptCoverage", "band_coverage"]

NOMINAL = 0.95
_SIGNIFICANT = 0.05


@dataclass(frozen=True)
class CoverageCase:
    """One held-out config on one measurement of a stored run."""

    run: str
    arm: str
    config: str  # effective settings, e.g. "k=3 n=2..3"
    prompt_type: str
    key: str
    predicted: float
    low: float
    high: float
    measured: float

    @property
    def inside(self) -> bool:
        return self.low <= self.measured <= self.high

    @property
    def distance(self) -> float:
        """How far out the measured value lies, in band half-widths (1 at the band's edge)."""
        edge = self.high if self.measured >= self.predicted else self.low
        half = abs(math.log(edge / self.predicted))
        miss = abs(math.log(self.measured / self.predicted))
        return miss / half if half > 0 else (0.0 if miss == 0 else math.inf)

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "arm": self.arm,
            "config": self.config,
            "prompt_type": self.prompt_type,
            "key": self.key,
            "predicted": self.predicted,
            "band": [self.low, self.high],
            "measured": self.measured,
            "inside": self.inside,
        }


@dataclass(frozen=True)
class PromptCoverage:
    """The band's coverage on one prompt type, and what is done about it."""

    prompt_type: str
    cases: tuple[CoverageCase, ...]
    nominal: float = NOMINAL

    @property
    def inside(self) -> int:
        return sum(c.inside for c in self.cases)

    @property
    def total(self) -> int:
        return len(self.cases)

    @property
    def share(self) -> float:
        return self.inside / self.total if self.total else math.nan

    @property
    def p_value(self) -> float:
        """P(this few inside or fewer) if the band truly held 95% of the time."""
        return float(stats.binom.cdf(self.inside, self.total, self.nominal))

    @property
    def below(self) -> bool:
        return self.total > 0 and self.share < self.nominal

    @property
    def widen(self) -> float:
        """The band's factor: the one that brings the share inside up to nominal, where the
        shortfall is beyond chance; else 1."""
        if not self.below or self.p_value >= _SIGNIFICANT:
            return 1.0
        needed = math.ceil(self.nominal * self.total)
        distances = sorted(c.distance for c in self.cases)
        return max(1.0, distances[needed - 1])

    @property
    def text(self) -> str:
        head = (
            f"{self.prompt_type}: {self.inside} of {self.total} measured tok/s inside the "
            f"predicted band ({self.share:.0%}; nominal {self.nominal:.0%})"
        )
        if not self.below:
            return head
        if self.widen > 1.0:
            return (
                f"{head}: below it beyond chance (binomial p={self.p_value:.2g}), so this "
                f"prompt type's band is widened x{self.widen:.2f}"
            )
        return (
            f"{head}: below it, but within chance (binomial p={self.p_value:.2g}); the band "
            "is not widened, and may hold less often than it says"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_type": self.prompt_type,
            "inside": self.inside,
            "total": self.total,
            "share": self.share if self.total else None,
            "nominal": self.nominal,
            "p_value": self.p_value,
            "widen": self.widen,
            "text": self.text,
            "cases": [c.to_json() for c in self.cases],
        }


@dataclass(frozen=True)
class Coverage:
    """The band's coverage per prompt type over the stored runs that can check it."""

    per_type: dict[str, PromptCoverage] = field(default_factory=dict)
    runs: tuple[str, ...] = ()  # the stored runs checked (more than one n-gram config)
    looked_at: int = 0  # stored runs read

    @property
    def widen(self) -> dict[str, float]:
        return {n: c.widen for n, c in self.per_type.items() if c.widen > 1.0}

    def lines(self) -> list[str]:
        if not self.runs:
            return [
                f"band coverage: unknown: none of {self.looked_at} stored run(s) of this host "
                "and model measured more than one n-gram config"
            ]
        head = (
            f"band coverage over {len(self.runs)} stored run(s) with more than one measured "
            f"n-gram config ({', '.join(self.runs)}), each config held out and predicted from "
            "the rest:"
        )
        return [head, *(f"  {c.text}" for c in self.per_type.values())]

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": list(self.runs),
            "looked_at": self.looked_at,
            "per_type": {n: c.to_json() for n, c in self.per_type.items()},
            "widen": self.widen,
        }

    @classmethod
    def from_cases(
        cls, cases: Sequence[CoverageCase], runs: Sequence[str], looked_at: int
    ) -> Coverage:
        by_type: dict[str, list[CoverageCase]] = {}
        for c in cases:
            by_type.setdefault(c.prompt_type, []).append(c)
        return cls(
            {n: PromptCoverage(n, tuple(found)) for n, found in by_type.items()},
            tuple(runs),
            looked_at,
        )


def band_coverage(stored: Sequence[tuple[str, RunRecord]]) -> Coverage:
    """Each stored run with more than one measured n-gram config, each config held out."""
    cases: list[CoverageCase] = []
    runs: list[str] = []
    for name, record in stored:
        found = held_out(name, record, [(n, r) for n, r in stored if n != name])
        if found is not None:
            runs.append(name)
            cases += found
    return Coverage.from_cases(cases, runs, len(stored))


def held_out(
    name: str, record: RunRecord, others: Sequence[tuple[str, RunRecord]]
) -> list[CoverageCase] | None:
    """The cases of one run; None where it measured fewer than two n-gram configs."""
    arms = ngram_arms(record)
    configs = sorted(set(arms.values()))
    if len(configs) < 2:
        return None
    prior = cost_prior(others, record)
    out: list[CoverageCase] = []
    for config in configs:
        same = [a for a, s in arms.items() if s == config]
        rest = without_arms(record, same)
        predicted = predict_levels(rest, [config], prior=prior)
        for key in predicted.predictions:
            p = predicted.prediction(key, config)
            measured = arm_figure(record, same, key)
            if p is None or p.tokens_per_s is None or p.tokens_per_s_band is None:
                continue
            if measured is None:
                continue
            low, high = p.tokens_per_s_band
            out.append(
                CoverageCase(
                    run=name,
                    arm=same[0],
                    config=config.label,
                    prompt_type=predicted.keys[key].prompt_type,
                    key=key,
                    predicted=p.tokens_per_s,
                    low=low,
                    high=high,
                    measured=measured,
                )
            )
    return out


def widen_of(coverage: Coverage | None) -> Mapping[str, float]:
    return coverage.widen if coverage is not None else {}
