"""The search policy (`--spec-search ngram`): what to reload next and why, or why to stop. Pure.

A plain object over the run record. Each call to `SearchPolicy.next` reads what the run has
measured so far (the baseline, and the candidates already reloaded, with their verdicts) and
says what the next reload should be:

1. **Nothing measured, no prior**: the cost of a speculative step is unknown, so the first reload
   is chosen to teach the cost model the most. The configs that could be best under *some* step
   cost are the Pareto front of tokens per step (more is better) against draft tokens per step
   (fewer is cheaper), from the replay. Measured at m draft tokens per step, a config pins the
   cost there; a config at m' is then predicted within a gap that grows with |m'/m - 1|. The
   front's config nearest the middle of its draft range keeps the worst such gap smallest.
2. **A cost model** (fitted to the measured candidates per level, or this host's stored runs'
   prior): per load level, the best untried config's predicted speedup is put against the best
   measured one (or against speculation off, 1.0, where nothing measured beats it). The gain is
   worth a reload when its point estimate reaches the margin (`[run] min_effect`). Where none
   does while the cost model at a level rests on one k, the best untried config with another
   k is worth a reload if its band reaches the margin: it teaches the model what one k cannot.
   Where several levels are worth a reload, the largest gain is reloaded first.
3. **Nothing worth a reload**: where the best measured config differs between load levels, a
   `num_speculative_tokens_per_batch_size` schedule (search_answer.schedule) is measured as one
   more candidate, once; otherwise the search stops, saying why.

It always stops when `max_reloads` are spent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...record.schema import RunRecord
from ...record.search import PredictedBand
from ..prediction.bands.coverage import Coverage, band_coverage
from ..prediction.cost_model import CostPrior, Prediction
from ..prediction.level_prediction import LevelPredictions, cost_prior, ngram_arms, predict_levels
from ..prediction.ngram_types import NgramSettings, grid_settings
from ..verdict.compare import PromptTypeVerdict
from .answer import Schedule, level_winners, schedule

__all__ = ["Gain", "Reload", "SearchPlan", "SearchPolicy", "Stop", "plan_search", "predicted_bands"]

Verdicts = Mapping[str, Mapping[str, PromptTypeVerdict]]  # arm -> key -> verdict
_USELESS = 1.0 + 1e-9  # tokens per decode step: a config that never gains a token


@dataclass(frozen=True)
class Reload:
    """The next reload: a candidate's values, what kind of choice it is, and why."""

    values: dict[str, Any]
    label: str
    kind: str  # "teach", "predicted best" or "schedule"
    why: str
    predicted: dict[str, PredictedBand] = field(default_factory=dict)  # by measurement key
    settings: NgramSettings | None = None  # None for a schedule


@dataclass(frozen=True)
class Stop:
    """Why the search stops."""

    why: str


@dataclass(frozen=True)
class Gain:
    """The best untried config at one level against the best measured there."""

    level: str
    settings: NgramSettings
    gain: float  # predicted speedup over the best measured, minus 1
    low: float
    high: float
    against: str  # "speculation off", or the best measured config
    separated: bool  # the cost model at this level told fixed from per-token cost

    @property
    def text(self) -> str:
        return (
            f"{self.settings.label} is predicted {self.gain:+.1%} [{self.low:+.1%}, "
            f"{self.high:+.1%}] over {self.against} at {self.level}"
        )


@dataclass(frozen=True)
class SearchPolicy:
    """What a search may do: its margin and budget, and what it knows from stored runs."""

    margin: float
    max_reloads: int = 3
    prior: Mapping[str, CostPrior] = field(default_factory=dict)  # per level label
    coverage: Coverage | None = None
    max_num_seqs: int | None = None
    configs: tuple[NgramSettings, ...] = field(default_factory=lambda: tuple(grid_settings()))

    def predictions(self, record: RunRecord) -> LevelPredictions:
        """Every config of the grid (and every measured one) at every level, as of now."""
        measured = set(ngram_arms(record).values())
        return predict_levels(
            record,
            sorted(set(self.configs) | measured),
            prior=self.prior,
            widen=self.coverage.widen if self.coverage else None,
        )

    def next(
        self, record: RunRecord, verdicts: Verdicts, *, used: int | None = None
    ) -> Reload | Stop:
        """The next reload, or why the search stops (see the module docstring)."""
        done = used if used is not None else (record.search.used if record.search else 0)
        if done >= self.max_reloads:
            return Stop(f"the reload budget is spent: {done} of {self.max_reloads}")
        found = self.predictions(record)
        if not found.predictions:
            why = "; ".join(f"{k}: {v}" for k, v in found.missing.items()) or "no baseline"
            return Stop(f"nothing can be predicted ({why})")
        if all(found.fits.get(level) is None for level in found.levels):
            return self._teach(found)
        gains = self.gains(record, verdicts, found)
        worth = [
            (g, why) for g in gains if g.gain >= self.margin and (why := self._worth(g, record))
        ]
        if not worth:  # the best with a k not yet measured, where one k leaves the cost unsplit
            worth = [
                (g, why)
                for g in self.gains(record, verdicts, found, new_k=True)
                if (why := self._worth(g, record)) is not None
            ]
        if worth:
            gain, why = max(worth, key=lambda w: w[0].gain)
            fit = found.fits[gain.level]
            assert fit is not None
            return Reload(
                values=gain.settings.to_values(),
                label=gain.settings.label,
                kind="predicted best",
                why=f"{why}; cost model at {gain.level}: {fit.describe()}",
                predicted=predicted_bands(found, gain.settings),
                settings=gain.settings,
            )
        plan = self._schedule(record, verdicts, found)
        if plan is not None:
            return plan
        if not gains:
            return Stop("every config the replay predicts was measured already")
        best = max(gains, key=lambda g: g.gain)
        return Stop(
            f"no untried config is predicted to beat the best measured by the margin "
            f"({self.margin:+.0%}): the most promising untried, {best.text}"
        )

    def gains(
        self, record: RunRecord, verdicts: Verdicts, found: LevelPredictions, *, new_k: bool = False
    ) -> list[Gain]:
        """Per level with a cost model, the best untried config against the best measured
        (`new_k`: the best of those whose k was not measured yet)."""
        measured = set(ngram_arms(record).values())
        ks = {s.num_speculative_tokens for s in measured}
        winners = level_winners(record, verdicts, margin=0.0)
        out = []
        for level in found.levels:
            fit = found.fits.get(level)
            keys = found.keys_at(level)
            if fit is None or not keys or level in found.withheld:
                continue
            winner = winners.get(level)
            base = winner.ratio if winner is not None and winner.ratio > 1.0 else 1.0
            against = (
                f"{winner.arm} ({winner.label}, measured {winner.ratio - 1:+.1%})"
                if winner is not None and winner.ratio > 1.0
                else "speculation off"
            )
            best: tuple[float, float, float, NgramSettings] | None = None
            for s in self.configs:
                if s in measured or (new_k and s.num_speculative_tokens in ks):
                    continue
                found_at = [found.prediction(k, s) for k in keys]
                if any(p is None or p.speedup is None or not p.speedup_band for p in found_at):
                    continue
                point, low, high = _geomean_bands(found_at)  # type: ignore[arg-type]
                if best is None or point > best[0]:
                    best = (point, low, high, s)
            if best is None:
                continue
            point, low, high, s = best
            out.append(
                Gain(
                    level,
                    s,
                    point / base - 1,
                    low / base - 1,
                    high / base - 1,
                    against,
                    fit.separated,
                )
            )
        return out

    def _worth(self, gain: Gain, record: RunRecord) -> str | None:
        """Why this gain is worth a reload, or None."""
        if gain.gain >= self.margin:
            return f"{gain.text}: at least the margin ({self.margin:+.0%})"
        ks = {s.num_speculative_tokens for s in ngram_arms(record).values()}
        teaches = gain.settings.num_speculative_tokens not in ks
        if gain.high >= self.margin and not gain.separated and teaches:
            rests = (
                f"rests on one k ({', '.join(f'k={k}' for k in sorted(ks))})"
                if ks
                else "rests on the stored runs' prior alone (no k measured in this run)"
            )
            return (
                f"{gain.text}: below the margin ({self.margin:+.0%}) at its estimate, but its "
                f"band reaches it, and the cost model at {gain.level} {rests}: k="
                f"{gain.settings.num_speculative_tokens} separates fixed from per-token cost"
            )
        return None

    def _teach(self, found: LevelPredictions) -> Reload | Stop:
        """The first reload without any cost model: the middle of the Pareto front."""
        shapes = _shapes(found, self.configs)
        useful = {s: v for s, v in shapes.items() if v[0] > _USELESS}
        if not useful:
            return Stop(
                "no config of the grid would draft and have a token accepted on these prompts: "
                "speculation cannot help"
            )
        front = [
            s
            for s, (tau, m, _) in useful.items()
            if not any(
                (t2 >= tau and m2 <= m) and (t2 > tau or m2 < m)
                for s2, (t2, m2, _) in useful.items()
                if s2 != s
            )
        ]
        ms = [useful[s][1] for s in front]
        middle = (min(ms) + max(ms)) / 2
        pick = min(front, key=lambda s: (abs(useful[s][1] - middle), -useful[s][2]))
        tau, m, ceiling = useful[pick]
        why = (
            f"the cost of a speculative step is unknown here (no n-gram config measured, no "
            f"stored run of this host, model, vLLM version and GPUs to learn it from). "
            f"{len(front)} configs could each be best under some step cost (the most tokens per "
            f"step for their draft tokens, {min(ms):.2f}..{max(ms):.2f} draft tokens per step); "
            f"{pick.label} ({tau:.2f} tokens per step, {m:.2f} draft tokens per step, ceiling "
            f"{ceiling - 1:+.1%}) lies mid-way, so its measured cost narrows the prediction of "
            "every one of them the most"
        )
        return Reload(
            pick.to_values(), pick.label, "teach", why, predicted_bands(found, pick), pick
        )

    def _schedule(
        self, record: RunRecord, verdicts: Verdicts, found: LevelPredictions
    ) -> Reload | None:
        """The per-level schedule, once, when the best measured config changes with load."""
        plan = schedule(record, verdicts, margin=self.margin, max_num_seqs=self.max_num_seqs)
        if plan is None or plan.values is None:
            return None
        if any(_same_values(v, plan.values) for v in record.candidates.values()):
            return None
        return Reload(
            values=plan.values,
            label=plan.label,
            kind="schedule",
            why=f"{plan.why}; measured as one more candidate",
            predicted=_schedule_bands(found, plan),
        )


def predicted_bands(found: LevelPredictions, s: NgramSettings) -> dict[str, PredictedBand]:
    """What a config is predicted to do at every key where it has a band."""
    out = {}
    for key in found.predictions:
        band = _band(found.prediction(key, s))
        if band is not None:
            out[key] = band
    return out


def _band(p: Prediction | None) -> PredictedBand | None:
    if p is None or p.tokens_per_s is None or not p.tokens_per_s_band or not p.speedup_band:
        return None
    assert p.speedup is not None
    return PredictedBand(
        tokens_per_s=p.tokens_per_s,
        low=p.tokens_per_s_band[0],
        high=p.tokens_per_s_band[1],
        speedup=p.speedup,
        speedup_low=p.speedup_band[0],
        speedup_high=p.speedup_band[1],
    )


def _schedule_bands(found: LevelPredictions, plan: Schedule) -> dict[str, PredictedBand]:
    """A schedule runs, at each level, its k there (k=0: no drafts, as the baseline)."""
    out = {}
    for key, model in found.keys.items():
        k = plan.k_at.get(model.level)
        if not k:
            continue
        band = _band(found.prediction(key, plan.settings_at(k)))
        if band is not None:
            out[key] = band
    return out


def _shapes(
    found: LevelPredictions, configs: Sequence[NgramSettings]
) -> dict[NgramSettings, tuple[float, float, float]]:
    """Per config, over the predicted keys: mean tokens and draft tokens per decode step, and
    the geometric mean of its ceiling speedup."""
    out = {}
    keys = [k for k in found.predictions if found.keys[k].level not in found.withheld]
    for s in configs:
        preds = [found.prediction(k, s) for k in keys]
        if not preds or any(p is None for p in preds):
            continue
        tau = sum(p.decode_tokens_per_step for p in preds if p) / len(preds)
        m = sum(p.draft_tokens_per_step for p in preds if p) / len(preds)
        ceiling = math.exp(sum(math.log(p.ceiling_speedup) for p in preds if p) / len(preds))
        out[s] = (tau, m, ceiling)
    return out


def _geomean_bands(preds: Sequence[Prediction]) -> tuple[float, float, float]:
    """Geometric means over prompt types of a config's speedup and its band's ends."""

    def mean(values: Sequence[float]) -> float:
        return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))

    return (
        mean([p.speedup for p in preds if p.speedup is not None]),
        mean([p.speedup_band[0] for p in preds if p.speedup_band]),
        mean([p.speedup_band[1] for p in preds if p.speedup_band]),
    )


def _same_values(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return dict(a) == dict(b)


@dataclass(frozen=True)
class SearchPlan:
    """What a search would do next from a run, with what it knows from stored runs."""

    coverage: Coverage
    prior: dict[str, CostPrior]
    step: Reload | Stop
    margin: float


def plan_search(
    record: RunRecord,
    verdicts: Verdicts,
    stored: Sequence[tuple[str, RunRecord]],
    *,
    name: str | None = None,
    max_num_seqs: int | None = None,
) -> SearchPlan:
    """The next reload a search would make from this run (`specdecode-predict`, the dry run).

    `stored`: this host's and model's stored runs by folder name (the band's coverage reads
    them all; the cost prior every one but `name`, the run itself).
    """
    coverage = band_coverage(stored)
    prior = cost_prior([(n, r) for n, r in stored if n != name], record)
    policy = SearchPolicy(
        margin=record.run.min_effect, prior=prior, coverage=coverage, max_num_seqs=max_num_seqs
    )
    return SearchPlan(coverage, prior, policy.next(record, verdicts, used=0), policy.margin)
