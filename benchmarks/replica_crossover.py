"""The crossover across replicas on simulated slots: docs/statistics.md's "Across replicas".

Two replicas, one faster than the other by its own speed; period 1 serves the baseline on
replica A and the candidate on B, period 2 the other way round, and a run may repeat the pair.
Each slot's prompt goes to both at once: its log value is the prompt's level, the moment's
(shared by both replicas), the period's shift (both replicas), the replica's own speed, the
arm's change (with each prompt's own speed-up about it), the start's effect (one per replica
and period), the slot's share between the two (one's gain, the other's loss: two servers on one
machine's cores) and the request's own noise. TPOT is the inverse throughput with noise of its
own. Every run goes through the project's own analysis (`analysis/replicas/crossover.py` →
`crossover_of`), and a run of several crossovers as `run/crossover/periods.py` makes it: the plan's
number of crossovers (`analysis/replicas/looks.py` → `crossovers_needed`, as
report/replicas/crossovers.py plans), a look after each, no more once `CrossoverResult.stops`.

    .venv/bin/python -m benchmarks.replica_crossover            # the run as planned
    .venv/bin/python -m benchmarks.replica_crossover --one      # one crossover, two analyses
    .venv/bin/python -m benchmarks.replica_crossover --rotation # three replicas, three arms
    .venv/bin/python -m benchmarks.replica_crossover --carry    # carry-over and the guard
    .venv/bin/python -m benchmarks.replica_crossover --looks    # the looks' spend

`rates` (one crossover) is what tests/unit/analysis/replicas/test_crossover.py runs.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, before numpy loads: a shared
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # machine's BLAS threads cost 100 times

import argparse
import dataclasses
import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import stats as _st

from pytest_specdecode.analysis.replicas.crossover import (
    CrossoverResult,
    CrossoverSlot,
    crossover_of,
    rotation,
)
from pytest_specdecode.analysis.replicas.guard import ranks_p
from pytest_specdecode.analysis.replicas.looks import LOOK_SPEND, crossovers_needed
from pytest_specdecode.analysis.replicas.model import Table
from pytest_specdecode.analysis.variance.spending import nominal_level
from pytest_specdecode.analysis.verdict.interval import Question
from pytest_specdecode.analysis.verdict.stats import (
    RestartNoise,
    Verdict,
    compare_family,
)

METRICS = ("throughput", "tpot")
DETECT = math.log(0.9)  # the change the plan sizes the crossovers for: a true -10%


@dataclass(frozen=True)
class Replicas:
    """The simulated host: every figure on the log scale."""

    change: float = 0.0  # the candidate's true change of throughput
    replica: float = math.log(1.10)  # replica B's own speed against A's
    period: float = -0.03  # a shift of both replicas between the periods (each period's)
    restart_sd: float = 0.02  # one start's effect
    request_sd: float = 0.08  # one request's own noise, each replica
    moment_sd: float = 0.05  # the moment's, shared by both replicas
    prompt_sd: float = 0.3  # the prompts' own levels
    speedup_sd: float = 0.1  # each prompt's own change about the change
    tpot_sd: float = 0.03  # TPOT's own noise beside the inverse throughput
    prompts: int = 12
    repeats: int = 4  # each prompt's slots per period
    noise_df: float = 8.0  # the degrees of freedom the restart noise was measured on
    contention_sd: float = 0.0  # a slot's share between the replicas: B gains what A loses
    period_sd: float = 0.0  # each period's own shift of both replicas, beside `period`
    carry: float = 0.0  # a baseline after the candidate on its replica runs this much faster

    @property
    def slot_var(self) -> float:
        """A request's variance within its slot, as the fit's residual measures it (a stored
        crossover run's: the plan's figure)."""
        return (2 * self.request_sd**2 + self.contention_sd**2) / 2 + self.speedup_sd**2 / 2


def simulate(
    rng: np.random.Generator, model: Replicas, crossovers: int = 1
) -> tuple[list[CrossoverSlot], dict]:
    """`crossovers` crossovers' slots, and the restart noise an A/A run of `noise_df` would
    have measured (per metric)."""
    levels = rng.normal(0.0, model.prompt_sd, model.prompts)
    speedups = rng.normal(0.0, model.speedup_sd, model.prompts)
    speedups -= speedups.mean()  # the change is the prompt set's mean change
    schedule = rotation(2, 2)
    n = model.prompts * model.repeats
    slots = []
    for c in range(crossovers):
        for half, arms in enumerate(schedule):
            period = 2 * c + half
            starts = rng.normal(0.0, model.restart_sd, 2)
            shift = period * model.period + rng.normal(0.0, model.period_sd)
            carried = [model.carry if period and arms[r] == 0 else 0.0 for r in range(2)]
            order = rng.permutation(np.repeat(np.arange(model.prompts), model.repeats))
            own = rng.normal(0.0, model.request_sd, (n, 2))
            moment = rng.normal(0.0, model.moment_sd, n)
            share = rng.normal(0.0, model.contention_sd, n) / 2
            tpot_noise = rng.normal(0.0, model.tpot_sd, (n, 2))
            arm = np.array(arms, dtype=float)
            for i, j in enumerate(order):
                logs = (
                    levels[j] + moment[i] + shift + np.array([0.0, model.replica])
                    + arm * (model.change + speedups[j]) + starts + carried + own[i]
                    + np.array([-share[i], share[i]])
                )  # fmt: skip
                slots.append(
                    CrossoverSlot(
                        period,
                        int(j),
                        arms,
                        (math.exp(logs[0]), math.exp(logs[1])),
                        (
                            math.exp(-logs[0] + tpot_noise[i, 0]),
                            math.exp(-logs[1] + tpot_noise[i, 1]),
                        ),
                    )
                )
    measured = model.restart_sd * math.sqrt(rng.chisquare(model.noise_df) / model.noise_df)
    noise = RestartNoise(measured, model.noise_df, "simulated A/A run", True)
    return slots, {m: noise for m in METRICS}


# --------------------------------------------------------------------------- one crossover


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
    """Over `runs` simulated crossovers (one each): per analysis, the share of runs with any
    metric called regressed, called improved; the crossover's mean estimates and coverage."""
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


# --------------------------------------------------------------------------- the run as planned


def planned_crossovers(
    model: Replicas, outside: RestartNoise, *, alpha: float, margin: float, most: int = 40
) -> int:
    """The plan's number: the fewest crossovers that call a true -10% with 80% power, at the
    noise the plan knows (the outside restart noise, a stored run's slot spread); two at
    least where the restart noise is not measured (report/replicas/crossovers.py → `plan_of`)."""
    found = crossovers_needed(
        math.expm1(DETECT), outside, slot_var=model.slot_var, slots=model.prompts * model.repeats,
        most=most, alpha=alpha, family=len(METRICS), margin=margin,
    )  # fmt: skip
    return max(1 if outside.measured else 2, found or most)


def run_once(
    rng: np.random.Generator,
    model: Replicas,
    *,
    planned: int,
    outside: RestartNoise | None,
    alpha: float,
    margin: float,
) -> tuple[CrossoverResult, int]:
    """One run as run/crossover/periods.py makes it: up to `planned` crossovers, a look after each
    but the last, no more once the result `stops`. `outside`: the restart noise known before
    the run (None: the A/A run's measurement `simulate` draws)."""
    slots, measured = simulate(rng, model, planned)
    noise = {m: outside for m in METRICS} if outside is not None else measured
    for c in range(1, planned):
        result = crossover_of(
            [s for s in slots if s.period < 2 * c], alpha=alpha, margin=margin,
            restart_noise=noise, planned=planned,
        )  # fmt: skip
        if result.stops:
            return result, c
    return crossover_of(
        slots, alpha=alpha, margin=margin, restart_noise=noise, planned=planned
    ), planned


def run_rates(
    model: Replicas,
    runs: int,
    *,
    planned: int,
    outside: RestartNoise | None,
    alpha: float,
    margin: float,
    seed: int = 50,
) -> dict:
    """Over `runs` runs: per metric and direction the share called (the most of the metrics'),
    per candidate the share called regressed and improved (any metric), the crossovers made
    on average, and the change's coverage."""
    rng = np.random.default_rng(seed)
    per_metric: Counter = Counter()
    candidate: Counter = Counter()
    made, covered = 0, 0
    for _ in range(runs):
        result, crossovers = run_once(
            rng, model, planned=planned, outside=outside, alpha=alpha, margin=margin
        )
        made += crossovers
        verdicts = {m.metric: m.verdict for m in result.metrics}
        for metric, verdict in verdicts.items():
            per_metric[(metric, verdict)] += 1
        for verdict in (Verdict.REGRESSED, Verdict.IMPROVED):
            candidate[verdict] += verdict in verdicts.values()
        got = result.of("throughput").change
        covered += got.low <= model.change <= got.high
    return {
        "regressed": max(per_metric[(m, Verdict.REGRESSED)] for m in METRICS) / runs,
        "improved": max(per_metric[(m, Verdict.IMPROVED)] for m in METRICS) / runs,
        "candidate": {v: candidate[v] / runs for v in (Verdict.REGRESSED, Verdict.IMPROVED)},
        "made": made / runs,
        "coverage": covered / runs,
    }


# The two-host test bed as it printed (README, docs/replicas.md: 2026-12-05, 5 slots a period of
# 16 tokens, one coding prompt each): B 63.8% slower than A; the change's interval
# [-29.7%, +142.6%] on 9 df at 95% (the assumed 5% restart noise in it) puts a slot's difference
# between the replicas at 85% (its two containers share the machine's two cores: what one gains
# the other loses); the period effect's +0.3% [-11.1%, +13.2%] leaves the slots' own level 4%.
# Its starts: the 2.8% this machine's A/A measured (docs/statistics.md, "A/A on the real CPU
# vLLM, interleaved"); no host profile of the test bed, so the plan knows only the assumption.
TESTBED = Replicas(
    replica=math.log(1 - 0.638),
    period=0.0,
    period_sd=0.06,
    restart_sd=0.028,
    request_sd=0.05,
    contention_sd=0.85,
    moment_sd=0.04,
    prompts=5,
    repeats=8,  # the plan's: 40 slots a period (the soonest design at the test bed's pace)
)
ASSUMED = RestartNoise.assumed(0.05)


def run_rows() -> dict[str, tuple[Replicas, RestartNoise | None]]:
    """Each row: the host, and the restart noise the plan and the analysis know before the run
    (None: an A/A run's measurement at the true noise, `noise_df` degrees of freedom)."""
    tb, gpu = TESTBED, Replicas()
    minus = math.log(0.9)
    return {
        "test bed, true -10%, starts 2.8%": (dataclasses.replace(tb, change=minus), ASSUMED),
        "test bed, no change, starts 2.8%": (tb, ASSUMED),
        "test bed, no change, starts 10%": (dataclasses.replace(tb, restart_sd=0.10), ASSUMED),
        "B 10% faster, true -10%, starts 2%": (dataclasses.replace(gpu, change=minus), ASSUMED),
        "B 10% faster, no change, starts 2%": (gpu, ASSUMED),
        "B 10% faster, no change, starts 10%": (dataclasses.replace(gpu, restart_sd=0.1), ASSUMED),
        "B 10% faster, true -10%, starts 2%, A/A": (dataclasses.replace(gpu, change=minus), None),
        "B 10% faster, no change, starts 5%, A/A": (
            dataclasses.replace(gpu, restart_sd=0.05),
            None,
        ),
    }


def looks_rates(
    crossovers: int,
    *,
    spend: float,
    restart_sd: float = 0.10,
    runs: int = 20000,
    seed: int = 1,
    pooled: bool = False,
) -> tuple[float, float]:
    """The looks alone, on the statistic the analysis takes from the run's own starts (for
    balanced crossovers exactly the periods' mean differences, their spread on 2N - 2 df:
    tests/unit/analysis/replicas/test_repeated.py): no change, each period's mean difference
    `2 sigma_b^2 + sigma_d^2 / n` apart (starts `restart_sd`, 40 slots of 30%); a look after
    each crossover from the second on, at `look_confidence`'s level with `spend` of alpha / m.
    The shares of runs called regressed and improved (one-sided 2.5% each, nominally).
    `pooled`: the 5% assumption (8 df) pooled with the run's own, unless they rule it out
    (restarts.py's test), as before issue 50."""
    rng = np.random.default_rng(seed)
    one_sided = 0.05 / 2
    sd = math.sqrt(2 * restart_sd**2 + 0.3**2 / 40)
    d = rng.normal(0.0, sd, (runs, 2 * crossovers))
    alive = np.ones(runs, dtype=bool)
    calls = np.zeros(2)
    for k in range(2, crossovers + 1):
        first, second = d[:, 0 : 2 * k : 2], d[:, 1 : 2 * k : 2]
        estimate = (first.mean(axis=1) - second.mean(axis=1)) / 2
        ss = ((first - first.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) + (
            (second - second.mean(axis=1, keepdims=True)) ** 2
        ).sum(axis=1)
        df = 2 * k - 2
        own = ss / df
        if pooled:
            assumed = 2 * 0.05**2 + 0.3**2 / 40  # the assumption's period-mean variance
            aside = _st.chi2.sf(ss / assumed, df) < 0.05
            own = np.where(aside, own, (df * own + 8 * assumed) / (df + 8))
            df = np.where(aside, df, df + 8)
        se = np.sqrt(own / (2 * k))
        fractions = [j / crossovers for j in range(1, k + 1)]
        t = _st.t.isf(nominal_level(fractions, one_sided * spend), df)
        low, high = alive & (estimate + t * se < 0), alive & (estimate - t * se > 0)
        calls += (low.sum(), high.sum())
        alive &= ~(low | high)
    return float(calls[0] / runs), float(calls[1] / runs)


# --------------------------------------------------------------------------- rotation, carry-over


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


def carry_rows(runs: int, *, alpha: float, seed: int = 7) -> list[tuple[str, float, float]]:
    """A carry-over of -3% (the baseline after the candidate on its replica 3% slower), no true
    change, starts of 2% (measured): the change's mean estimate after 1 and 4 crossovers, and
    the guard's share of p < alpha with nothing in the runs (no starts, no carry-over)."""
    rng = np.random.default_rng(seed)
    out = []
    for crossovers in (1, 4):
        model = Replicas(carry=-0.03)
        found = []
        for _ in range(runs):
            slots, noise = simulate(rng, model, crossovers)
            found.append(
                crossover_of(
                    slots, alpha=alpha, margin=0.0, restart_noise=noise, planned=crossovers
                )
                .of("throughput")
                .change.estimate
            )
        null = Replicas(restart_sd=0.0, period=0.0, speedup_sd=0.0)  # nothing in it at all
        guard = np.mean(
            [
                ranks_p(Table.of(simulate(rng, null, crossovers)[0], METRICS), "throughput") < alpha
                for _ in range(runs)
            ]
        )
        out.append((f"{crossovers} crossover{'s' if crossovers > 1 else ''}", math.expm1(
            float(np.mean(found))), float(guard)))  # fmt: skip
    return out


# --------------------------------------------------------------------------- the tables


def print_run(runs: int, alpha: float, margin: float) -> None:
    print(
        f"alpha {alpha} over throughput and TPOT (alpha/m = {alpha / 2:.3f} per direction), margin "
        f"{margin:.0%}, {runs} runs a row, seed 50; planned: the plan's crossovers for a true -10%"
        "\n"
    )
    print(
        "| host | restart noise known | planned | made, mean | regressed | improved | "
        "candidate regressed | change covered | s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, (model, outside) in run_rows().items():
        known = "assumed 5%" if outside is not None else f"A/A, {model.noise_df:g} df"
        plan_noise = outside or RestartNoise(model.restart_sd, model.noise_df, "A/A", True)
        planned = planned_crossovers(model, plan_noise, alpha=alpha, margin=margin)
        started = time.monotonic()
        found = run_rates(model, runs, planned=planned, outside=outside, alpha=alpha, margin=margin)
        print(
            f"| {name} | {known} | {planned} | {found['made']:.1f} | {found['regressed']:.3f} | "
            f"{found['improved']:.3f} | {found['candidate'][Verdict.REGRESSED]:.3f} | "
            f"{found['coverage']:.3f} | {time.monotonic() - started:.0f} |",
            flush=True,
        )


def print_one(runs: int, alpha: float, margin: float) -> None:
    print(
        f"alpha {alpha} over throughput and TPOT, margin {margin:.0%}, 12 prompts x 4 per "
        f"period, {runs} runs a row, seed 43\n"
    )
    print(
        "| host | analysis | regressed | improved | change, mean | replica, mean | "
        "coverage (change, replica, period) | df, mean |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, model in ONE_ROWS.items():
        found = rates(model, runs, alpha=alpha, margin=margin)
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
                f"{share[Verdict.IMPROVED]:.3f} | {extra} |",
                flush=True,
            )


LOOK_ROWS = (2, 3, 4, 6, 8, 12, 20, 26)

ONE_ROWS = {
    "B 10% faster, no change, starts 2%": Replicas(),
    "B 10% faster, no change, starts 3%": Replicas(restart_sd=0.03),
    "B 10% faster, no change, starts 1%": Replicas(restart_sd=0.01),
    "B 10% faster, no change, starts 0.5%": Replicas(restart_sd=0.005),
    "B 10% faster, true -10%, starts 2%": Replicas(change=math.log(0.9)),
    "B 10% faster, true -10%, starts 3%": Replicas(change=math.log(0.9), restart_sd=0.03),
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=None)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument("--margin", type=float, default=0.03)
    parser.add_argument("--one", action="store_true", help="one crossover, two analyses")
    parser.add_argument("--rotation", action="store_true", help="three replicas, three arms")
    parser.add_argument("--carry", action="store_true", help="carry-over and the guard")
    parser.add_argument("--looks", action="store_true", help="the looks' spend, 20,000 runs")
    args = parser.parse_args()
    if args.rotation:
        runs = args.runs or 300
        found = rotation_rates(runs, alpha=args.alpha, margin=args.margin)
        cover = found["coverage"]
        print(f"3 replicas x 3 arms, no true change, alpha {args.alpha} over two candidates, "
              f"margin {args.margin:.0%}, {runs} runs, seed 5\n")  # fmt: skip
        print("| regressed | improved | coverage: change | replica | period |")
        print("|---|---|---|---|---|")
        print(f"| {found['regressed']:.3f} | {found['improved']:.3f} | {cover['change']:.3f} | "
              f"{cover['replica']:.3f} | {cover['period']:.3f} |")  # fmt: skip
    elif args.carry:
        runs = args.runs or 300
        print(f"B 10% faster, starts 2%, {runs} runs a row, seed 7\n")
        print("| design | change, mean, at a carry-over of -3% | guard p < alpha, nothing in it |")
        print("|---|---|---|")
        for name, change, guard in carry_rows(runs, alpha=args.alpha):
            print(f"| {name} | {change:+.2%} | {guard:.3f} |")
    elif args.looks:
        runs = args.runs or 20000
        print(f"no change, starts 10%, {runs} runs a cell, seed 1: regressed / improved\n")
        print("| spend | " + " | ".join(f"{n} crossovers" for n in LOOK_ROWS) + " |")
        print("|---|" + "---|" * len(LOOK_ROWS))
        for spend, pooled in ((1.0, False), (LOOK_SPEND, False), (LOOK_SPEND, True)):
            cells = [looks_rates(n, spend=spend, runs=runs, pooled=pooled) for n in LOOK_ROWS]
            name = f"{spend:.0%}" + (", the assumption pooled" if pooled else "")
            print(f"| {name} | " + " | ".join(f"{r:.4f} / {i:.4f}" for r, i in cells) + " |")
    elif args.one:
        print_one(args.runs or 400, args.alpha, args.margin)
    else:
        print_run(args.runs or 400, args.alpha, args.margin)


if __name__ == "__main__":
    main()
