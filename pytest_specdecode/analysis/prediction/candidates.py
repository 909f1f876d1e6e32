"""One prediction per measured candidate, prompt type and load level, beside what it measured.

Every renderer reads this one figure (the prediction's table, the break-even map's lines and
plot, the terminal, summary.md, report.html, results.json's `analysis.candidate_predictions`):

- an n-gram candidate at the run's first level: its config's prediction (predict.py →
  `predict_run`), read from the map where the map measured its k (from_map/read.py: the
  baseline's tok/s times the map's ratio at the replayed tokens per step, plus the proposer's own
  cost measured on the other prompt types), else the cost model's fit;
- a suffix candidate at the first level: the map at the tokens per step its replay gives;
- any other candidate with a k, or at another level: the map at the tokens per step its
  server counted, read at the map's nearest k where its own was not mapped.

A band wider than a factor of 2, or beyond the tokens per step the line's points measured, is
no prediction, with its reason (bands/bounded.py → `withheld_reason`). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...config.arms import cell_key
from ...record.schema import RunRecord
from ..map.break_even import BreakEvenMap, measured_steps
from ..verdict.compare import PromptTypeVerdict
from .bands.bounded import withheld_reason
from .from_map.read import line_support
from .predict import RunPrediction

__all__ = ["CandidatePrediction", "candidate_predictions"]

COST_MODEL = "the cost model"


@dataclass(frozen=True)
class CandidatePrediction:
    """A measured candidate on one prompt type and level: the one prediction, and the measured."""

    candidate: str
    prompt_type: str
    level: str
    k: int | None
    tokens_per_step: float
    source: str  # "replayed" (the baseline's ids, or the suffix replay) or "counted"
    basis: str  # what predicted it: the map (with the proposer's cost), or the cost model
    predicted: float  # throughput over the baseline's
    low: float
    high: float
    tokens_per_s: float | None  # the baseline's tok/s times the predicted ratio
    tokens_per_s_band: tuple[float, float] | None
    measured: float  # the verdict's ratio, with its interval
    measured_low: float
    measured_high: float
    measured_tokens_per_s: float | None  # the candidate's figure in the results table
    withheld: str | None = None  # "no prediction: ..." where the band does not bound
    map_k: int | None = None  # the map's k read; None: not read from the map

    @property
    def on_map(self) -> bool:
        return self.map_k is not None

    @property
    def inside(self) -> bool | None:
        """The measured ratio within the predicted band; None where nothing was predicted."""
        if self.withheld is not None:
            return None
        return self.low <= self.measured <= self.high

    def text(self) -> str:
        k = f"k={self.k}" if self.k is not None else "no k"
        if self.map_k is not None and self.map_k != self.k:
            k += f" (read at the map's k={self.map_k})"
        head = (
            f"{self.candidate}/{self.prompt_type} at {self.level}, {k}, "
            f"{self.tokens_per_step:.2f} tokens per step ({self.source})"
        )
        measured = (
            f"measured {self.measured:.2f}x [{self.measured_low:.2f}, {self.measured_high:.2f}]"
        )
        if self.withheld is not None:
            return f"{head}: {measured}; {self.withheld} (by {self.basis})"
        where = "inside" if self.inside else "outside"
        return (
            f"{head}: predicted {self.predicted:.2f}x [{self.low:.2f}, {self.high:.2f}] by "
            f"{self.basis}; {measured}: {where} the band"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "on_map": self.on_map, "inside": self.inside}


def candidate_predictions(
    record: RunRecord,
    verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]],
    prediction: RunPrediction | None,
    found: BreakEvenMap | None,
) -> list[CandidatePrediction]:
    """Each measured candidate, per prompt type and level, with its one prediction (module
    docstring); a cell with nothing to predict from is left out."""
    out = []
    levels = record.run.levels
    for candidate, per in verdicts.items():
        k = (record.candidates.get(candidate) or {}).get("num_speculative_tokens")
        k = k if isinstance(k, int) and not isinstance(k, bool) else None
        note = prediction.candidates.get(candidate) if prediction else None
        settings = note.settings if note is not None else None
        for name in record.prompt_types:
            for i, level in enumerate(levels):
                v = per.get(cell_key(name, level, several=len(levels) > 1))
                if v is None:
                    continue
                measured = (v.throughput.ratio, *v.throughput.ratio_ci)
                head = (candidate, name, level.label, k)
                tail = (*measured, v.throughput.candidate_center)
                p = (
                    prediction.predictions.get(name, {}).get(settings)
                    if i == 0 and prediction is not None and settings is not None
                    else None
                )
                base = v.throughput.baseline_center
                if p is not None and p.speedup is not None and p.speedup_band is not None:
                    low, high = p.speedup_band
                    out.append(
                        CandidatePrediction(
                            *head,
                            p.decode_tokens_per_step,
                            "replayed",
                            p.basis or COST_MODEL,
                            p.speedup,
                            low,
                            high,
                            base * p.speedup,  # the results table's baseline, as below
                            (base * low, base * high),
                            *tail,
                            p.withheld,
                            k if p.basis else None,
                        )
                    )
                    continue
                if found is None or k is None:
                    continue
                tau, source = _tokens_per_step(record, prediction, candidate, name, level, i)
                method = str((record.candidates.get(candidate) or {}).get("method"))
                line = found.near(k, level.label, name, method) if tau is not None else None
                if tau is None or line is None:
                    continue
                ratio, low, high = line.at(tau)
                band = (base * low, base * high)
                basis = f"the map (k={line.k}, {line.level})"
                out.append(
                    CandidatePrediction(
                        *head,
                        tau,
                        source,
                        basis,
                        ratio,
                        low,
                        high,
                        base * ratio,
                        band,
                        *tail,
                        withheld_reason(band, tau, line_support(line)),
                        line.k,
                    )
                )
    return out


def _tokens_per_step(
    record: RunRecord,
    prediction: RunPrediction | None,
    candidate: str,
    prompt_type: str,
    level: Any,
    index: int,
) -> tuple[float | None, str]:
    """A suffix candidate's replayed tokens per step at the first level; else its server's
    count (output tokens over decode steps, never the accepted per draft)."""
    suffix = (prediction.suffix.get(candidate) or {}).get(prompt_type) if prediction else None
    if suffix is not None and index == 0:
        return suffix.tokens_per_step, "replayed"
    key = cell_key(prompt_type, level, several=len(record.run.levels) > 1)
    cells = [m for p in record.arm_phases(candidate) if (m := p.measurements.get(key))]
    return measured_steps(cells).tokens_per_step, "counted"
