"""The map read for a run's prediction: each n-gram config at a k the map measured, and each
measured n-gram candidate's own cost per step beyond the map's. Pure.

Where a map was measured (analysis/map/break_even.py), a config's prediction reads it
(`read_map`): the baseline's tok/s times the map's ratio at the config's replayed tokens per
step, on the line of its k at the run's first load level (the prompt type's own, else the line
over all), with that line's band. Where a measured n-gram candidate's cost per step beyond the
map's is known (`proposer_costs`, proposer.py), it is added, measured on the other prompt types
only: a prompt type's prediction never reads its own measurement. The cost model
(cost_model.py) predicts only the configs at a k the map did not measure. A band wider than a
factor of 2, or at tokens per step beyond the line's points, is no prediction
(bands/bounded.py → `withheld_reason`), as the cost model's is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from ....record.schema import RunRecord
from ...map.break_even import BreakEvenMap, MapLine, measured_steps
from ...verdict.compare import PromptTypeVerdict
from ..bands.bounded import Support, withheld_reason
from ..cost_model import BaselineTiming, Prediction
from ..inputs import first_key
from ..level_prediction import config_settings
from ..ngram_types import NgramSettings
from .proposer import ProposerCost, StepEvidence, central, proposer_cost, with_proposer

__all__ = ["line_for", "line_support", "proposer_costs", "read_map"]


def line_for(found: BreakEvenMap, k: int, level: str, prompt_type: str) -> MapLine | None:
    """The map's line at exactly this k and level: the prompt type's own, else over all; n-gram's
    own lines where the map has them beside another carrier's (an EAGLE-3 head's)."""
    carrier = "ngram" if "ngram" in found.carriers else None
    return found.line(k, level, prompt_type, carrier) or found.line(k, level, carrier=carrier)


def line_support(line: MapLine) -> Support:
    """The tokens per step the line's points measured: where it is not an extrapolation."""
    xs = [p.x for p in line.points]
    return Support(min(xs), max(xs), "the map", f"its points at k={line.k}")


def proposer_costs(
    record: RunRecord,
    verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]],
    found: BreakEvenMap,
    bases: Mapping[str, BaselineTiming],
) -> dict[str, ProposerCost]:
    """Per measured n-gram candidate whose k the map measured at the first load level: its cost
    per step beyond the map's, per prompt type (its ratio from the verdict, its tokens per step
    counted by its server, the baseline's TPOT) and pooled."""
    if not record.run.levels or not found.lines:
        return {}
    level = record.run.levels[0].label
    out: dict[str, ProposerCost] = {}
    for candidate, per in verdicts.items():
        settings = config_settings(record.candidates.get(candidate) or {})
        if settings is None:
            continue
        k = settings.num_speculative_tokens
        evidence = []
        for name in record.prompt_types:
            key = first_key(record, name)
            line, v, base = line_for(found, k, level, name), per.get(key), bases.get(name)
            if line is None or v is None or base is None:
                continue
            cells = [m for p in record.arm_phases(candidate) if (m := p.measurements.get(key))]
            tau = measured_steps(cells).tokens_per_step
            if tau is None:
                continue
            iv = v.throughput.interval
            evidence.append(
                StepEvidence(
                    name,
                    tau,
                    iv.estimate,
                    iv.se,
                    iv.df,
                    base.tpot_s * 1000.0,
                    line.intercept + line.slope * tau,
                    tuple(a + b * tau for a, b in line.draws),
                )
            )
        cost = proposer_cost(
            evidence,
            candidate=candidate,
            label=settings.label,
            k=k,
            level=level,
            confidence=found.lines[0].confidence,
        )
        if cost is not None:
            out[candidate] = cost
    return out


def read_map(
    predictions: Mapping[str, Mapping[NgramSettings, Prediction]],
    bases: Mapping[str, BaselineTiming],
    found: BreakEvenMap,
    level: str,
    costs: Mapping[str, ProposerCost],
) -> dict[str, dict[NgramSettings, Prediction]]:
    """The predictions, each config at a k the map measured read from the map (module
    docstring); the others as the cost model gave them."""
    out: dict[str, dict[NgramSettings, Prediction]] = {}
    for name, by_config in predictions.items():
        base = bases.get(name)
        out[name] = {}
        for s, p in by_config.items():
            line = line_for(found, s.num_speculative_tokens, level, name)
            out[name][s] = p if line is None or base is None else _on_line(p, line, base, costs)
    return out


def _on_line(
    p: Prediction, line: MapLine, base: BaselineTiming, costs: Mapping[str, ProposerCost]
) -> Prediction:
    tau = p.decode_tokens_per_step
    maps = np.array([a + b * tau for a, b in line.draws], dtype=float)
    basis = f"the map (k={line.k}, {line.level}"
    basis += ")" if line.prompt_type == p.prompt_type else ", its line over all prompt types)"
    chosen = _cost_for(costs, p.settings, p.prompt_type)
    if chosen is None:
        ratio, low, high = line.at(tau)
        draws = maps
        basis += (
            "; the proposer's own cost not counted: measured on no other prompt type"
            if costs
            else "; the proposer's own cost not counted: no n-gram candidate measured on the map"
        )
    else:
        cost, (ms, cost_draws, others) = chosen
        ratio, low, high, draws = with_proposer(
            tau,
            base.tpot_s * 1000.0,
            line.intercept + line.slope * tau,
            maps,
            ms,
            cost_draws,
            confidence=line.confidence,
        )
        ms_low, ms_high = central(cost_draws, line.confidence)
        basis += (
            f" + {cost.candidate}'s proposer, {ms:+.2f} ms a step [{ms_low:+.2f}, {ms_high:+.2f}] "
            f"(measured on {', '.join(others)})"
        )
    rate = base.tokens_per_s
    band = (rate * low, rate * high)
    return dataclasses.replace(
        p,
        tokens_per_s=rate * ratio,
        tokens_per_s_band=band,
        speedup=ratio,
        speedup_band=(low, high),
        p_faster=float(np.mean(draws[np.isfinite(draws)] > 1.0))
        if np.isfinite(draws).any()
        else None,
        withheld=withheld_reason(band, tau, line_support(line)),
        basis=basis,
    )


def _cost_for(
    costs: Mapping[str, ProposerCost], settings: NgramSettings, prompt_type: str
) -> tuple[ProposerCost, tuple[float, np.ndarray, list[str]]] | None:
    """The proposer cost to add: the candidate of these settings, else of the nearest k, each
    from the prompt types other than this one; None where none was measured there."""
    k = settings.num_speculative_tokens
    ranked = sorted(
        costs.values(),
        key=lambda c: (c.label != settings.label, abs(c.k - k), c.k, c.candidate),
    )
    for cost in ranked:
        found = cost.without(prompt_type)
        if found is not None:
            return cost, found
    return None
