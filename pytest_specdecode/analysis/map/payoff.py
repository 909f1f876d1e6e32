"""What a drafter must accept to pay, before it is trained: its break-even and its ceiling. Pure.

The map's servers of a drafter with a model (an EAGLE-3 head of the target's shape, a draft
model of a named smaller shape) propose k tokens at every step, at the drafter's own cost, and
vLLM accepts them at a stated rate. Their line (analysis/map/break_even.py at the depth served,
analysis/map/depth.py carried to the full depth) gives, per k and load:

- the break-even: the tokens per step where the throughput equals the baseline's. A drafter
  that proposes at every step emits 1 + its accepted tokens per step, so this is also the
  accepted per draft it must reach (vLLM's mean acceptance length), and (L - 1) / k the draft
  acceptance rate (vLLM's accepted / draft tokens);
- the ceiling: the ratio with every draft accepted (L = k + 1), the most it could give.

n-gram is no drafter to train: its servers tell the engine's step, not a pay-off.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .break_even import ALL_PROMPTS, MapLine
from .depth import Band, DepthLine

__all__ = ["Payoff", "drafter_name", "payoffs_at_depth", "payoffs_of_map"]

MODEL_FREE = ("", "ngram", "ngram_gpu", "suffix")


def drafter_name(carrier: str) -> str:
    """`an EAGLE-3 head of the target's shape`, `a draft model of llama-3.2-1b's shape`."""
    if carrier == "eagle3":
        return "an EAGLE-3 head of the target's shape"
    if carrier.startswith("draft_model:"):
        return f"a draft model of {carrier.split(':', 1)[1]}'s shape"
    return carrier


@dataclass(frozen=True)
class Payoff:
    """One drafter at one k and load: the accepted per draft it must reach, and its ceiling."""

    carrier: str
    k: int
    level: str
    where: str  # "4 of 32 layers served", "carried to 32 layers from 4 and 8"
    break_even: Band  # accepted per draft (= tokens per step: it drafts at every step)
    ceiling: Band  # the ratio with every draft accepted
    drafted: float | None = None  # the share of k its servers proposed a step, where counted

    @property
    def pays(self) -> bool:
        """Whether some acceptance pays: the break-even within k + 1."""
        return self.break_even.estimate <= self.k + 1

    @property
    def acceptance_rate(self) -> Band:
        """The break-even as vLLM's draft acceptance rate: (L - 1) / k, clipped to [0, 1]."""
        b = self.break_even
        return Band(_rate(b.estimate, self.k), _rate(b.low, self.k), _rate(b.high, self.k))

    def text(self) -> str:
        name = f"{drafter_name(self.carrier)}, k={self.k} at {self.level} ({self.where})"
        top = f"every draft accepted: {self.ceiling.text(unit='x')}"
        if not self.pays:
            return (
                f"{name}: never pays, even accepting everything (the line reaches 1 at "
                f"{_num(self.break_even.estimate)} tokens per step, beyond {self.k + 1}); {top}"
            )
        rate = self.acceptance_rate
        short = (
            f"; its servers proposed {self.drafted:.0%} of k a step (below 100%, the figures "
            "read low)"
            if self.drafted is not None and self.drafted < 0.95
            else ""
        )
        return (
            f"{name}: pays above {self.break_even.text()} accepted per draft, a draft "
            f"acceptance rate of {rate.estimate:.0%} [{rate.low:.0%}, {rate.high:.0%}]; {top}"
            f"{short}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "drafter": self.carrier,
            "k": self.k,
            "level": self.level,
            "where": self.where,
            "break_even_accepted_per_draft": self.break_even.to_dict(),
            "break_even_acceptance_rate": self.acceptance_rate.to_dict(),
            "ceiling": self.ceiling.to_dict(),
            "pays": self.pays,
            "drafted_share": self.drafted,
        }


def payoffs_of_map(lines: Iterable[MapLine], where: str) -> list[Payoff]:
    """Each drafter's pay-off from the map's lines at the depth served (over all prompt types);
    `where` says which depth that is."""
    out = []
    for line in lines:
        if line.carrier in MODEL_FREE or line.prompt_type != ALL_PROMPTS:
            continue
        drafted = [p.drafts_per_step / line.k for p in line.points if p.drafts_per_step]
        out.append(Payoff(
            line.carrier, line.k, line.level, where, Band(*line.break_even), Band(*line.ceiling),
            min(drafted) if drafted else None,
        ))  # fmt: skip
    return out


def payoffs_at_depth(lines: Iterable[DepthLine], depths: Iterable[int], full: int) -> list[Payoff]:
    """Each drafter's pay-off from the map carried to the full depth."""
    served = sorted(set(depths))
    where = f"carried to {full} layers from {_and(served)} served"
    return [
        Payoff(line.carrier, line.k, line.level, where, line.break_even, line.ceiling)
        for line in lines
        if line.carrier not in MODEL_FREE
    ]


def _rate(length: float, k: int) -> float:
    if not math.isfinite(length):
        return math.inf
    return min(1.0, max(0.0, (length - 1.0) / k))


def _num(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "never"


def _and(values: list[int]) -> str:
    text = [str(v) for v in values]
    return text[0] if len(text) == 1 else ", ".join(text[:-1]) + " and " + text[-1]
