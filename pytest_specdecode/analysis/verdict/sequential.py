"""Stop when decided: side by side, a cell stops sending slots once its verdict is decided.

A cell served side by side (one pair of starts) is looked at after `LOOKS` of its planned
slots (variance/spending.py: 1/4, 1/2, 3/4 and all). At a look, each metric's interval is
taken at the look's group-sequential boundary instead of the fixed design's quantile
(interval.py → `sequential_confidence`: Lan-DeMets spending of the family's per-comparison
share, alpha/m one-sided, as `alpha s^3` on the look's share of the planned slots), the
narrower of the pairs' and the starts' analyses as in the fixed design, and `decide` judges it
as the analysis will. The cell stops only where the prompt type's verdict is decided
(regressed on a metric, or every metric regressed, improved or equivalent), with the
requests' ranks agreeing at the Bonferroni bound of the family (`m · p < alpha`, never looser
than the analysis's Holm). There is no futility stop: "looks like no effect" never stops a
cell (one with no change stops only where its interval lies inside the margin).

The analysis afterwards takes the boundary of the look where the cell stopped (or of its last
slot), recorded as `Measurement.sequential`; so the repeated intervals' joint coverage, and
with it the false-call rate, holds whenever the cell stopped. A call stopped before the last
look says how far an early stop overstates a change of its size (interval.py →
`stop_overstated`). docs/statistics.md has the calibration on simulated pairs (`simulate_stop`,
`python -m benchmarks.sequential_stop`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ...config.settings import RunConfig
from ..variance.spending import look_slots
from .compare import worst
from .interval import Question, nested_interval, stop_overstated
from .stats import RestartNoise, Verdict, _rank_p, decide

__all__ = [
    "DECIDED",
    "Simulated",
    "Stopped",
    "decided",
    "expected_slots",
    "simulate_cell",
    "simulate_stop",
    "stop_plan",
]

DECIDED = (Verdict.REGRESSED, Verdict.IMPROVED, Verdict.EQUIVALENT)


def decided(
    questions: Sequence[Question],
    *,
    alpha: float,
    min_effect: float,
    noise: Mapping[str, RestartNoise],
    family: int,
) -> Verdict | None:
    """The cell's verdict where it is decided at this look (each question's `looks` ending at
    it), else None: keep sending. `family`: the comparisons the run's verdicts are adjusted for
    (prompt types times metrics)."""
    if not questions:
        return None
    family = max(family, len(questions))
    confidence = 1.0 - 2.0 * alpha / family
    found = []
    for q in questions:
        interval = nested_interval(q, noise=noise[q.metric], confidence=confidence)
        verdict, _ = decide(
            interval,
            higher_is_better=q.higher_is_better,
            min_effect=min_effect,
            p_adjusted=min(1.0, family * _rank_p(q)),
            alpha=alpha,
            noise=noise[q.metric],
            family=family,
        )
        found.append(verdict)
    verdict = worst(set(found))
    return verdict if verdict in DECIDED else None


# --------------------------------------------------------------------------- simulated pairs


@dataclass(frozen=True)
class Simulated:
    """Simulated pairs of one cell: the model the calibration draws from (log scale)."""

    change: float = 0.0  # the candidate's true change
    offset_sd: float = 0.036  # one start's effect (the pair's offset is two of them)
    slot_sd: float = 0.05  # one request's own noise, each side
    prompt_sd: float = 0.3  # the prompts' own levels, shared by both sides
    speedup_sd: float = 0.1  # each prompt's own change about the mean change
    prompts: int = 12
    planned: int = 48
    noise_df: float = 3.0  # the degrees of freedom the outside knowledge of the offset has

    @property
    def noise(self) -> RestartNoise:
        return RestartNoise(self.offset_sd, self.noise_df, "simulated", True)


@dataclass(frozen=True)
class Stopped:
    """One simulated cell: its verdict, the slots it sent, and the throughput change (log) the
    analysis prints at the look it stopped (or its last), with what its reason says an early
    stop overstates (interval.py → `stop_overstated`; None where it did not stop early)."""

    verdict: Verdict
    slots: int
    estimate: float
    # what the reason says: the overstatement at the printed change, and at the interval's end
    # nearer no change (log)
    overstated: tuple[float, float] | None = None
    near: float = math.nan  # the interval's end nearer no change (log)


def simulate_cell(
    rng: np.random.Generator,
    model: Simulated,
    *,
    alpha: float,
    min_effect: float,
    family: int,
    sequential: bool = True,
    naive: bool = False,
) -> tuple[Verdict, int]:
    """One cell's verdict and the slots it sent, under the stop rule (`sequential`), the fixed
    design (not), or the fixed design's interval looked at every look (`naive`: the error the
    boundary prevents)."""
    found = simulate_stop(
        rng, model, alpha=alpha, min_effect=min_effect, family=family,
        sequential=sequential, naive=naive, estimate=False,
    )  # fmt: skip
    return found.verdict, found.slots


def simulate_stop(
    rng: np.random.Generator,
    model: Simulated,
    *,
    alpha: float,
    min_effect: float,
    family: int,
    sequential: bool = True,
    naive: bool = False,
    estimate: bool = True,
) -> Stopped:
    """`simulate_cell`, with what the analysis prints (`estimate`: its change, and what an early
    stop overstates; else nan)."""
    levels = rng.normal(0.0, model.prompt_sd, model.prompts)
    speedups = rng.normal(0.0, model.speedup_sd, model.prompts)
    speedups -= speedups.mean()  # the change is the prompt set's mean change
    offset = rng.normal(0.0, math.sqrt(2.0) * model.offset_sd)
    prompt = np.arange(model.planned) % model.prompts
    base = np.exp(levels[prompt] + rng.normal(0.0, model.slot_sd, model.planned))
    cand = np.exp(
        levels[prompt]
        + model.change
        + speedups[prompt]
        + offset
        + rng.normal(0.0, model.slot_sd, model.planned)
    )
    looks = look_slots(model.planned) if sequential or naive else (model.planned,)
    noise = {"throughput": model.noise}
    verdict, q = Verdict.INCONCLUSIVE, None
    for k, n in enumerate(looks):
        q = Question(
            "simulated",
            "throughput",
            True,
            [base[:n].tolist()],
            [cand[:n].tolist()],
            [prompt[:n].tolist()],
            [prompt[:n].tolist()],
            pairs=[np.log(cand[:n] / base[:n]).tolist()],
            pair_prompts=[prompt[:n].tolist()],
        )
        if sequential and not naive:
            q = replace(q, looks=looks[: k + 1], planned_slots=model.planned)
        found = decided([q], alpha=alpha, min_effect=min_effect, noise=noise, family=family)
        if found is not None:
            verdict = found
            break
    if not estimate or q is None:
        return Stopped(verdict, len(q.baseline[0]) if q else 0, math.nan)
    interval = nested_interval(q, noise=model.noise, confidence=1.0 - 2.0 * alpha / family)
    over = None
    if verdict in (Verdict.REGRESSED, Verdict.IMPROVED):
        over = stop_overstated(
            q, interval, noise=model.noise, one_sided=alpha / family, min_effect=min_effect
        )
    near = interval.high if interval.estimate < 0 else interval.low
    return Stopped(verdict, len(q.baseline[0]), interval.estimate, over, near)


def expected_slots(
    model: Simulated, *, alpha: float, min_effect: float, family: int, draws: int = 100
) -> float:
    """The mean slots a cell sends under the stop rule, over simulated pairs (a fixed seed)."""
    rng = np.random.default_rng(41)
    sent = [
        simulate_cell(rng, model, alpha=alpha, min_effect=min_effect, family=family)[1]
        for _ in range(draws)
    ]
    return float(np.mean(sent))


def stop_plan(
    run: RunConfig,
    *,
    cells: int,
    prompts: int,
    noise: RestartNoise,
    residual_sd: float,
    change: float,
    speedup_sd: float = 0.0,
    draws: int = 20,
) -> tuple[tuple[int, ...], float, float]:
    """What the plan says of the stop rule: the looks (slots of a cell), and the slots a cell
    is expected to send at this relative change and at none, on simulated pairs of this
    host's noise (`noise`: one start's effect; `residual_sd`: one request's own, log;
    `speedup_sd`: the prompts' own speed-ups about the change)."""
    least, most = run.requests_at(run.levels[0])
    level = run.levels[0]  # a slot: a burst of its concurrency, or an open loop's least
    step = max(1, least) if level.open_loop else level.concurrency or 1
    planned = max(1, -(-most // step))
    model = Simulated(
        offset_sd=noise.sd,
        slot_sd=residual_sd / math.sqrt(step),
        speedup_sd=speedup_sd,
        prompts=max(1, min(prompts, planned)),
        planned=planned,
        noise_df=noise.df,
    )
    how = {"alpha": run.alpha, "min_effect": run.min_effect, "family": 2 * cells, "draws": draws}
    at = expected_slots(replace(model, change=math.log1p(max(change, -0.99))), **how)
    return look_slots(planned), at, expected_slots(model, **how)
