"""Which predictions bound, and the one reload recommended from those alone.

A band that bounds (:func:`bounded`, :func:`withheld_reason`): a prediction is printed as one only
where its tok/s band spans at most a factor of `MAX_BAND_RATIO` (2: a band whose high end is more
than twice its low end cannot tell a 30% loss from a 30% gain) and its config lies within the
tokens per step that the fit's observations measured (:class:`Support`: the map's points, or the
measured candidates), give or take `STEP_SLACK`. Outside either, the model extrapolates what it
never saw: the prediction is withheld, says why, and is never recommended (:func:`recommend`:
the unmeasured config with the best mean predicted speedup, among those that bound).

The predictions themselves come from analysis/prediction/cost_model.py → `predict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..cost_model import CandidateTiming, Prediction
from ..ngram_types import NgramSettings

MAX_BAND_RATIO = 2.0  # a tok/s band whose high end exceeds twice its low end is no prediction
STEP_SLACK = 0.05  # tokens per step past the measured range that still count as inside it


@dataclass(frozen=True)
class Support:
    """The tokens per step the cost fit's observations measured: where the model has seen a
    step's cost. `name` says whose ("the map": its points; else the measured candidates)."""

    low: float
    high: float
    name: str = "the map"
    points: str = "its points"

    def holds(self, tokens_per_step: float) -> bool:
        return self.low - STEP_SLACK <= tokens_per_step <= self.high + STEP_SLACK

    def text(self, tokens_per_step: float) -> str:
        beyond = "" if self.holds(tokens_per_step) else ", beyond them"
        return (
            f"{self.points} span {self.low:.2f} to {self.high:.2f} tokens per step; this config "
            f"would lie at {tokens_per_step:.2f}{beyond}"
        )

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "name": self.name}


def support_of(
    observations: Sequence[CandidateTiming], *, name: str, points: str
) -> Support | None:
    """The range of tokens per step over the observations, each (prompt type, config) by its
    mean: what the fit has seen. None without any."""
    groups: dict[tuple[str, str], list[float]] = {}
    for o in observations:
        if math.isfinite(o.decode_tokens_per_step):
            groups.setdefault((o.prompt_type, o.label), []).append(o.decode_tokens_per_step)
    means = [sum(v) / len(v) for v in groups.values()]
    return Support(min(means), max(means), name, points) if means else None


def withheld_reason(
    band: tuple[float, float],
    tokens_per_step: float | None,
    support: Support | None,
    *,
    max_ratio: float = MAX_BAND_RATIO,
) -> str | None:
    """Why a tok/s band at this many tokens per step is no prediction; None where it bounds:
    at most `max_ratio` from end to end, and within what the observations measured (where
    both the support and the config's tokens per step are known)."""
    low, high = band
    ratio = high / low if low > 0 else math.inf
    wide = ratio > max_ratio
    place, outside = None, False
    if support is not None and tokens_per_step is not None:
        place, outside = support.text(tokens_per_step), not support.holds(tokens_per_step)
    if not wide and not outside:
        return None
    whose = support.name if support is not None else "the measurements"
    reasons = [f"a factor of {ratio:.2f} from end to end, above {max_ratio:g}"] if wide else []
    reasons += [place] if place else []
    return (
        f"no prediction: the band [{low:.0f}, {high:.0f}] tok/s is wider than {whose} can support "
        f"({'; '.join(reasons)})"
    )


def bounded(
    predictions: Mapping[str, Mapping[NgramSettings, Prediction]],
    support: Support | None,
    *,
    max_ratio: float = MAX_BAND_RATIO,
) -> dict[str, dict[NgramSettings, Prediction]]:
    """The predictions, each whose band does not bound marked `withheld` with its reason."""
    out: dict[str, dict[NgramSettings, Prediction]] = {}
    for name, by_config in predictions.items():
        out[name] = {}
        for settings, p in by_config.items():
            why = (
                withheld_reason(
                    p.tokens_per_s_band, p.decode_tokens_per_step, support, max_ratio=max_ratio
                )
                if p.tokens_per_s_band is not None
                else None
            )
            out[name][settings] = dataclasses.replace(p, withheld=why) if why else p
    return out


@dataclass(frozen=True)
class Recommendation:
    """The config most worth the next reload, or why none is."""

    settings: NgramSettings | None
    mean_speedup: float | None
    mean_p_faster: float | None
    reason: str


def recommend(
    predictions: Mapping[str, Mapping[NgramSettings, Prediction]],
    *,
    measured: Sequence[NgramSettings] = (),
) -> Recommendation:
    """The unmeasured config with the best mean predicted speedup over the prompt types."""
    names = list(predictions)
    if not names:
        return Recommendation(None, None, None, "nothing was predicted")
    common = sorted(set.intersection(*(set(predictions[n]) for n in names)) - set(measured))
    if not common:
        return Recommendation(None, None, None, "every predicted config was measured already")
    withheld = [s for s in common if any(predictions[n][s].withheld for n in names)]
    if withheld and len(withheld) == len(common):
        first = withheld[0]
        name = next(n for n in names if predictions[n][first].withheld)
        return Recommendation(
            None,
            None,
            None,
            f"none: no unmeasured config has a prediction that bounds on every prompt type "
            f"(e.g. {first.label} on {name}: {predictions[name][first].withheld}); a reload "
            "chosen on this evidence would rest on an extrapolation",
        )
    common = [s for s in common if s not in withheld]
    if any(predictions[n][s].speedup is None for n in names for s in common):
        best = max(
            common, key=lambda s: np.mean([predictions[n][s].ceiling_speedup for n in names])
        )
        ceiling = float(np.mean([predictions[n][best].ceiling_speedup for n in names]))
        return Recommendation(
            None,
            None,
            None,
            f"the cost of a speculative step is unknown until one candidate is measured; the "
            f"highest ceiling is {best.label} ({ceiling:.2f}x if a step cost nothing extra), "
            "so measure it first",
        )

    def mean_of(s: NgramSettings, attr: str) -> float:
        return float(np.mean([getattr(predictions[n][s], attr) for n in names]))

    best = max(common, key=lambda s: (mean_of(s, "speedup"), mean_of(s, "p_faster")))
    speed, p = mean_of(best, "speedup"), mean_of(best, "p_faster")
    by = {v: [n for n in names if predictions[n][best].verdict == v] for v in ("faster", "slower")}
    split = "; ".join(
        f"{v} on {len(found)} of {len(names)} ({', '.join(found)})"
        for v, found in by.items()
        if found
    )
    change = f"{speed - 1:+.1%} on average over {len(names)} prompt type(s)" + (
        f", {split}" if split else ""
    )
    if p >= 0.5 and speed > 1.0:
        reason = f"{best.label}: predicted {change}, mean P(faster) {p:.2f}: worth a reload"
        return Recommendation(best, speed, p, reason)
    reason = (
        f"no config is predicted to beat the baseline: the best, {best.label}, is predicted "
        f"{change} (mean P(faster) {p:.2f}); a reload is not worth it on this evidence"
    )
    return Recommendation(None, speed, p, reason)
