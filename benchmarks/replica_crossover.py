"""The crossover across replicas on simulated slots: docs/statistics.md's "Across replicas".

Two replicas, one faster than the other by its own speed; period 1 serves the baseline on
replica A and the candidate on B, period 2 the other way round. Each slot's prompt goes to both
at once: its log value is the prompt's level, the moment's (shared by both replicas), the
period's shift (both replicas), the replica's own speed, the arm's change (with each prompt's
own speed-up about it), the start's effect (one per replica and period) and the request's own
noise. TPOT is the inverse throughput with noise of its own. Each run is analysed by the
crossover (`analysis/replicas/crossover.py` → `crossover_of`) and by period 1 alone, the
candidate on B against the baseline on A as one pair side by side (`analysis/verdict/stats.py`
→ `compare_family`). The restart noise the analysis is told is measured, as an A/A run measures
it: the true start effect scaled by a chi-square draw on its degrees of freedom. Run from the
repository root:

    .venv/bin/python -m benchmarks.replica_crossover [--runs 400]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from pytest_specdecode.analysis.replicas.crossover import CrossoverSlot, crossover_of, rotation
from pytest_specdecode.analysis.verdict.interval import Question
from pytest_specdecode.analysis.verdict.stats import RestartNoise, Verdict, compare_family

METRICS = ("throughput", "tpot")


@dataclass(frozen=True)
class Replicas:
    """The simulated host: every figure on the log scale."""

    change: float = 0.0  # the candidate's true change of throughput
    replica: float = math.log(1.10)  # replica B's own speed against A's
    period: float = -0.03  # a shift of both replicas between the periods
    restart_sd: float = 0.02  # one start's effect
    request_sd: float = 0.08  # one request's own noise, each replica
    moment_sd: float = 0.05  # the moment's, shared by both replicas
    prompt_sd: float = 0.3  # the prompts' own levels
    speedup_sd: float = 0.1  # each prompt's own change about the change
    tpot_sd: float = 0.03  # TPOT's own noise beside the inverse throughput
    prompts: int = 12
    repeats: int = 4  # each prompt's slots per period
    noise_df: float = 8.0  # the degrees of freedom the restart noise was measured on


def simulate(rng: np.random.Generator, model: Replicas) -> tuple[list[CrossoverSlot], dict]:
    """One crossover's slots, and the restart noise the analysis is told (per metric)."""
    levels = rng.normal(0.0, model.prompt_sd, model.prompts)
    speedups = rng.normal(0.0, model.speedup_sd, model.prompts)
    speedups -= speedups.mean()  # the change is the prompt set's mean change
    schedule = rotation(2, 2)
    starts = rng.normal(0.0, model.restart_sd, (2, 2))  # per replica, per period
    slots = []
    for period, arms in enumerate(schedule):
        order = rng.permutation(np.repeat(np.arange(model.prompts), model.repeats))
        for j in order:
            moment = rng.normal(0.0, model.moment_sd)
            logs = [
                levels[j] + moment + period * model.period + r * model.replica
                + arms[r] * (model.change + speedups[j]) + starts[r, period]
                + rng.normal(0.0, model.request_sd)
                for r in range(2)
            ]  # fmt: skip
            tpot = [math.exp(-x + rng.normal(0.0, model.tpot_sd)) for x in logs]
            slots.append(
                CrossoverSlot(period, int(j), arms, tuple(math.exp(x) for x in logs), tuple(tpot))
            )
    measured = model.restart_sd * math.sqrt(rng.chisquare(model.noise_df) / model.noise_df)
    noise = RestartNoise(measured, model.noise_df, "simulated A/A run", True)
    return slots, {m: noise for m in METRICS}


def period_one(
    slots: list[CrossoverSlot], noise: dict, *, alpha: float, margin: float
) -> dict[str, Verdict]:
    """Period 1 alone: the candidate on replica B against the baseline on A, as one pair side
    by side, through the project's own `compare_family`."""
    first = [s for s in slots if s.period == 0]
    prompts = [[s.prompt for s in first]]
    questions = []
    for metric in METRICS:
        a = [s.values(metric)[0] for s in first]  # type: ignore[index]
        b = [s.values(metric)[1] for s in first]  # type: ignore[index]
        questions.append(
            Question(
                "simulated",
                metric,
                metric == "throughput",
                [a],
                [b],
                prompts,
                prompts,
                pairs=[np.log(np.array(b) / np.array(a)).tolist()],
                pair_prompts=prompts,
            )
        )
    found = compare_family(questions, alpha=alpha, min_effect=margin, noise=noise)
    return {c.metric: c.verdict for c in found}


def rates(model: Replicas, runs: int, *, alpha: float, margin: float, seed: int = 43) -> dict:
    """Over `runs` simulated crossovers: per analysis, the share of runs with any metric called
    regressed, called improved; the crossover's mean estimates and its intervals' coverage."""
    rng = np.random.default_rng(seed)
    calls: dict[str, Counter] = {"crossover": Counter(), "period 1 alone": Counter()}
    covered = Counter()
    estimates = []
    for _ in range(runs):
        slots, noise = simulate(rng, model)
        result = crossover_of(slots, alpha=alpha, margin=margin, restart_noise=noise)
        alone = period_one(slots, noise, alpha=alpha, margin=margin)
        for name, verdicts in (
            ("crossover", {m.metric: m.verdict for m in result.metrics}),
            ("period 1 alone", alone),
        ):
            for verdict in (Verdict.REGRESSED, Verdict.IMPROVED):
                calls[name][verdict] += verdict in verdicts.values()
        got = result.of("throughput")
        covered["change"] += got.change.low <= model.change <= got.change.high
        covered["replica"] += got.replicas[0].low <= model.replica <= got.replicas[0].high
        if got.periods:
            covered["period"] += got.periods[0].low <= model.period <= got.periods[0].high
        estimates.append((got.change.estimate, got.replicas[0].estimate, got.change.df))
    mean = np.mean(np.array(estimates), axis=0)
    return {
        "calls": {
            k: {v: c[v] / runs for v in (Verdict.REGRESSED, Verdict.IMPROVED)}
            for k, c in calls.items()
        },
        "coverage": {k: v / runs for k, v in covered.items()},
        "mean": {"change": float(mean[0]), "replica": float(mean[1]), "df": float(mean[2])},
    }


def rotation_rates(runs: int, *, alpha: float, margin: float, seed: int = 5) -> dict:
    """Three replicas (0, +10%, -5% their own speeds), three arms (two candidates, no true
    change), a Latin square over three periods (shifts 0, -3%, +2%), starts of 2% measured on 8
    df; throughput only. Per comparison: the shares called regressed and improved, and the
    intervals' coverage of each effect."""
    rng = np.random.default_rng(seed)
    k, model = 3, Replicas()
    own, shift = np.array([0.0, 0.1, -0.05]), np.array([0.0, -0.03, 0.02])
    calls: Counter = Counter()
    covered: Counter = Counter()
    for _ in range(runs):
        levels = rng.normal(0.0, model.prompt_sd, model.prompts)
        starts = rng.normal(0.0, model.restart_sd, (k, k))
        slots = []
        for period, arms in enumerate(rotation(k, k)):
            for j in rng.permutation(np.repeat(np.arange(model.prompts), model.repeats)):
                moment = rng.normal(0.0, model.moment_sd)
                values = tuple(
                    math.exp(levels[j] + moment + shift[period] + own[r] + starts[r, period]
                             + rng.normal(0.0, model.request_sd))
                    for r in range(k)
                )  # fmt: skip
                slots.append(CrossoverSlot(period, int(j), arms, values))
        measured = model.restart_sd * math.sqrt(rng.chisquare(model.noise_df) / model.noise_df)
        noise = {"throughput": RestartNoise(measured, model.noise_df, "simulated A/A run", True)}
        result = crossover_of(slots, alpha=alpha, margin=margin, restart_noise=noise)
        for m in result.metrics:
            calls[m.verdict] += 1
            covered["change"] += m.change.low <= 0.0 <= m.change.high
        first = result.metrics[0]
        for e, truth in zip(first.replicas, own[1:], strict=True):
            covered["replica"] += e.low <= truth <= e.high
        for e, truth in zip(first.periods, shift[1:], strict=True):
            covered["period"] += e.low <= truth <= e.high
    n = 2 * runs  # comparisons; and two replica, two period effects a run
    return {
        "regressed": calls[Verdict.REGRESSED] / n,
        "improved": calls[Verdict.IMPROVED] / n,
        "coverage": {key: v / n for key, v in covered.items()},
    }


ROWS = {
    "B 10% faster, no change, starts 2%": Replicas(),
    "B 10% faster, no change, starts 3%": Replicas(restart_sd=0.03),
    "B 10% faster, no change, starts 1%": Replicas(restart_sd=0.01),
    "B 10% faster, no change, starts 0.5%": Replicas(restart_sd=0.005),
    "B 10% faster, true -10%, starts 2%": Replicas(change=math.log(0.9)),
    "B 10% faster, true -10%, starts 3%": Replicas(change=math.log(0.9), restart_sd=0.03),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=0.03)
    parser.add_argument("--rotation", action="store_true", help="three replicas, three arms")
    args = parser.parse_args()
    if args.rotation:
        found = rotation_rates(args.runs, alpha=args.alpha, margin=args.margin)
        cover = found["coverage"]
        print(f"3 replicas x 3 arms, no true change, alpha {args.alpha} over two candidates, "
              f"margin {args.margin:.0%}, {args.runs} runs, seed 5\n")  # fmt: skip
        print("| regressed | improved | coverage: change | replica | period |")
        print("|---|---|---|---|---|")
        print(f"| {found['regressed']:.3f} | {found['improved']:.3f} | {cover['change']:.3f} | "
              f"{cover['replica']:.3f} | {cover['period']:.3f} |")  # fmt: skip
        return
    print(
        f"alpha {args.alpha} over throughput and TPOT, margin {args.margin:.0%}, "
        f"12 prompts x 4 per period, {args.runs} runs a row, seed 43\n"
    )
    print(
        "| host | analysis | regressed | improved | change, mean | replica, mean | "
        "coverage (change, replica, period) | df, mean |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, model in ROWS.items():
        found = rates(model, args.runs, alpha=args.alpha, margin=args.margin)
        cover, mean = found["coverage"], found["mean"]
        for analysis, share in found["calls"].items():
            extra = (
                f"{math.expm1(mean['change']):+.1%} | {math.expm1(mean['replica']):+.1%} | "
                f"{cover['change']:.3f}, {cover['replica']:.3f}, {cover.get('period', 0):.3f} | "
                f"{mean['df']:.0f}"
                if analysis == "crossover"
                else "| | |"
            )
            print(
                f"| {name} | {analysis} | {share[Verdict.REGRESSED]:.3f} | "
                f"{share[Verdict.IMPROVED]:.3f} | {extra} |"
            )


if __name__ == "__main__":
    main()
