"""The design: whether it can reach a verdict at all (checked before anything starts), and what
it can call on this host (the plan, the dry run, `--spec-detect`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from ...config.settings import RunConfig, Settings
from ...errors import ConfigError
from ..variance.pairs import design_slot_df, expected_pair_variance
from ..variance.power import ASSUMED_RESIDUAL_SD, MAX_STARTS, DesignPower, design_power
from ..variance.restarts import RestartNoise, t_quantile
from ..variance.spending import boundaries, fractions_of, look_slots, look_times, nominal_level
from ..variance.time_drift import TimeDrift, block_sd
from .adaptive import target_se
from .compare import METRICS
from .stats import minimum_requests


def family_size(settings: Settings) -> int:
    """Comparisons in a candidate's family: every prompt type at every level, on every metric."""
    return len(settings.prompt_types) * len(settings.run.levels) * len(METRICS)


def check_design(settings: Settings) -> None:
    """Refuse a design whose requests could never show a difference: every verdict would be
    inconclusive, and the run a waste of reloads."""
    if not settings.candidates and not settings.run.search:
        return
    run = settings.run
    family = family_size(settings)
    need = minimum_requests(family, run.alpha)
    least = min(run.requests_at(level)[0] for level in run.levels)
    if least * run.repeats >= need:
        return
    repeats = math.ceil(need / least)
    levels = len(run.levels)
    what = f"{len(settings.prompt_types)} prompt types" + (
        f" x {levels} load levels" if levels > 1 else ""
    )
    raise ConfigError(
        f"with {least} requests per prompt type{', level' if levels > 1 else ''} and server "
        f"start, and {run.repeats} start{'s' if run.repeats != 1 else ''} per arm, no verdict "
        f"can be reached: {family} comparisons ({what} x throughput and TPOT) at alpha "
        f"{run.alpha:g} need at least {need} requests per comparison and arm. Take "
        f"--spec-samples {need} (or --spec-repeats {repeats}); nothing was started"
    )


# --------------------------------------------------------------------------- what it can call


@dataclass(frozen=True)
class LookWidth:
    """Under the stop rule, one look: its slots, the half-width (log) the run prints where a
    cell stops there, and the look's boundary (z) that half-width is taken at."""

    slots: int
    half_width: float
    boundary: float


@dataclass(frozen=True)
class Reach:
    """What a design can call on one metric, from what is known of this host."""

    metric: str
    power: DesignPower
    noise: RestartNoise
    residual_sd: float
    residual_measured: bool
    drift_counted: bool = False  # the drift within a start counted in each start's mean
    # The half-width of the interval the run will print about its estimate (log scale), by
    # the analysis's own formula (`expected_half_width`), and its degrees of freedom
    half_width: float = math.inf
    half_df: float = 0.0
    # Side by side under the stop rule: per look, the half-width printed where a cell stops
    # there, at that look's boundary (`looks_half_width`)
    at_looks: tuple[LookWidth, ...] = ()
    speedup_sd: float = 0.0  # the prompts' own speed-ups about the change, as assumed

    @property
    def detectable(self) -> float:
        return self.power.detectable

    @property
    def printed(self) -> float:
        """The half-width the run prints with every slot sent: the last look's, else the
        fixed design's."""
        return self.at_looks[-1].half_width if self.at_looks else self.half_width

    def half_text(self) -> str:
        """`±22.7% (4.7 df)`: the interval the run will print; under the stop rule, where a
        cell stops at each look, with the look's boundary."""
        if not math.isfinite(self.half_width):
            return "none"
        if self.at_looks:
            n = len(self.at_looks)
            return ", ".join(
                f"{_width(look.half_width)} at {look.slots} slots (look {i} of {n}, boundary "
                f"{look.boundary:.2f})"
                if i == 1
                else f"{_width(look.half_width)} at {look.slots} ({look.boundary:.2f})"
                for i, look in enumerate(self.at_looks, start=1)
            )
        return f"±{self.half_width:.1%} ({self.half_df:.1f} df)"


UNBOUNDED = math.log(10.0)  # past 10x a look bounds nothing (an H100 plan's 2 slots: ±18658%)


def _width(half_width: float) -> str:
    return f"±{half_width:.1%}" if half_width <= UNBOUNDED else "no bound (too few slots)"


def expected_requests(
    run: RunConfig, noise: RestartNoise, residual_var: float, *, fixed: bool
) -> int:
    """Requests per prompt type and start the adaptive rule should stop at, on this host."""
    least, most = run.requests_at(run.levels[0], fixed=fixed)
    target = target_se(noise.sd, run.min_effect)
    wanted = math.ceil(residual_var / target**2) if target > 0 else most
    return min(most, max(least, wanted))


# One slot's difference (log, both sides) where no profile holds a residual, per kind of
# accelerator: on the H200 the main job's slots differed by ~8% (issue 41); elsewhere two
# requests of the assumed spread
SLOT_SD = {"gpu": 0.08}


def assumed_residual(accelerator: str | None) -> float:
    """A request's variance (one side) where none is known: half the accelerator's slot
    difference's, else ASSUMED_RESIDUAL_SD's."""
    slot = SLOT_SD.get(accelerator or "")
    return slot**2 / 2.0 if slot is not None else ASSUMED_RESIDUAL_SD**2


def _host(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    metric: str,
    accelerator: str | None = None,
) -> tuple[RestartNoise, float, bool]:
    """What is known of this host for a metric: the restart noise (measured, else assumed), a
    request's residual variance (the profile's, a prior's too: the analysis's slots will
    measure it, and a prior's is the nearest guess; else per accelerator), and whether that
    was measured here."""
    run = settings.run
    noise = outside.get(metric) or RestartNoise.assumed(run.assumed_restart_noise)
    measured = bool(noise.measured and noise.residual)
    residual = noise.residual if noise.residual else assumed_residual(accelerator)
    return noise, residual, measured


def _power(
    settings: Settings,
    noise: RestartNoise,
    residual_var: float,
    starts: int,
    k: int,
    *,
    pairs: bool | None = None,
    residual_df: float = 100.0,
):
    """`pairs`: side by side, analysed by pairs (None: as the run's design says)."""
    run = settings.run
    return design_power(
        noise,
        residual_var=residual_var,
        starts=starts,
        requests=k,
        family=family_size(settings),
        alpha=run.alpha,
        margin=run.min_effect,
        pairs=run.arms == "together" if pairs is None else pairs,
        residual_df=residual_df,
    )


def _prompts(settings: Settings) -> int:
    """Prompts a prompt type cycles through (the fewest of any type; 1 where none is set)."""
    return min((len(t.prompts) or 1 for t in settings.prompt_types.values()), default=1)


def expected_half_width(
    settings: Settings, noise: RestartNoise, residual_var: float, requests: int, *, twins: int = 0
) -> tuple[float, float]:
    """The half-width (log) of the interval the analysis will print for one comparison of
    this design, and its degrees of freedom: `t(1 - alpha/m, df) * SE` with the variance and
    df pooled as interval.py → `nested_interval` pools them after the run. Side by side, the
    pairs' (pairs.py: the outside offsets pooled with this run's own pairs and their slots'
    noise, two requests' residual a slot) or the starts', whichever is narrower, as the
    analysis takes; else the starts' (power.py's pooling, the same as restarts.py's).
    `twins`: side by side, a twin baseline beside each pair (pairs.py → `pair_variance`)."""
    run = settings.run
    n, family = run.repeats, family_size(settings)
    t_at = 1 - run.alpha / family
    by_starts = _power(
        settings, noise, residual_var, n, requests, pairs=False, residual_df=_residual_df(
            settings, n, requests
        )
    )  # fmt: skip
    found = [(t_quantile(t_at, by_starts.df) * by_starts.se, by_starts.df)]
    if run.arms == "together":
        slot_df = design_slot_df(n, requests, _prompts(settings))
        var, df = expected_pair_variance(
            noise, slot_var=2.0 * residual_var, slots=requests, slot_df=slot_df, pairs=n,
            twins=twins,
        )  # fmt: skip
        if df > 0 and math.isfinite(var):
            found.append((t_quantile(t_at, df) * math.sqrt(var), df))
    found = [f for f in found if f[1] > 0 and math.isfinite(f[0])]
    return min(found) if found else (math.inf, 0.0)


def looks_half_width(
    settings: Settings,
    noise: RestartNoise,
    residual_var: float,
    requests: int,
    *,
    speedup_var: float = 0.0,
    twins: int = 0,
) -> tuple[LookWidth, ...]:
    """Side by side, one pair, under the stop rule (sequential.py): at each look, the slots, the
    half-width (log) the run prints where a cell stops there, the pairs' interval at that look's
    boundary (interval.py → `sequential_confidence`: the looks' information fractions from the
    pair's variance, offsets plus slot noise over the slots), and the boundary. Empty where no
    rule runs. `speedup_var`: the variance of the candidate's own change from prompt to prompt;
    at a look before the prompts repeat, `fit_pairs` cannot fit it and it counts as slot noise
    (the boundary of the first of four looks is then about 4.3, against about 2.5 at the last).
    `twins`: a twin baseline beside the pair (pairs.py → `pair_variance`)."""
    run = settings.run
    if not (run.arms == "together" and run.sequential and run.repeats == 1) or settings.aa_only:
        return ()
    level = run.levels[0]  # a slot: a burst of its concurrency, or an open loop's least
    step = max(1, run.requests_at(level)[0]) if level.open_loop else level.concurrency or 1
    planned = max(1, -(-requests // step))
    slot_var, prompts = 2.0 * residual_var / step, _prompts(settings)
    looks = look_slots(planned)
    one_sided = run.alpha / family_size(settings)
    out = []
    for k, n in enumerate(looks):
        # the slot noise a look measures: the candidate's own speed-ups until prompts repeat
        var_n = slot_var + (speedup_var if n <= prompts else 0.0)
        df_n = design_slot_df(1, n, prompts)
        tau2, df = expected_pair_variance(
            noise, slot_var=var_n, slots=n, slot_df=df_n, pairs=1, twins=twins
        )
        if not (df > 0 and math.isfinite(tau2)):
            continue
        offsets = max(0.0, tau2 - var_n / n)  # as sequential_confidence: this look's fit

        def variance(m: int, offsets: float = offsets, var_n: float = var_n) -> float:
            return offsets + var_n / m

        fractions = fractions_of([variance(m) for m in looks[: k + 1]], variance(planned))
        times = look_times(looks[: k + 1], planned)
        level_k = nominal_level(fractions, one_sided, times)
        bound = boundaries(fractions, one_sided, times)[-1]
        out.append(LookWidth(n, t_quantile(1.0 - level_k, df) * math.sqrt(tau2), bound))
    return tuple(out)


# The prompts' own speed-ups about a candidate's change, where none was measured: n-gram's ran
# from 0.3x to 2x over one prompt set on the H200 (issue 41), about 30% apart (log SD). Until
# the prompts repeat in a cell, the pairs' fit cannot take it out, and it widens the interval
# printed at an early look (issue 50: ±59% at the first of four looks, ±28% at the second).
ASSUMED_SPEEDUP_SD = 0.3


def assumed_speedup_sd(settings: Settings) -> float:
    """The prompts' speed-ups' spread the plan assumes: none for an A/A run (the original's own
    configuration), else ASSUMED_SPEEDUP_SD."""
    return 0.0 if settings.aa_only else ASSUMED_SPEEDUP_SD


def _residual_df(settings: Settings, starts: int, requests: int) -> float:
    """The starts' fit's residual df: every request of both arms less each start's effect and
    each prompt's level (interval.py → `_fit` over both arms' starts)."""
    prompts = _prompts(settings)
    fitted = 2 * starts + (prompts - 1 if 1 < prompts < 2 * starts * requests else 0)
    return float(max(1, 2 * starts * requests - fitted))


def reach(
    settings: Settings, outside: Mapping[str, RestartNoise], *, accelerator: str | None = None
) -> dict[str, Reach]:
    """Per metric, the smallest change the configured design calls with 80% power, and the
    half-width of the interval it will print (`expected_half_width`). `accelerator`: its
    kind ("gpu", "cpu"), for the slot noise where no profile holds one."""
    out = {}
    for metric in METRICS:
        noise, residual_var, measured = _host(settings, outside, metric, accelerator)
        k = expected_requests(settings.run, noise, residual_var, fixed=settings.aa_only)
        power = _power(settings, noise, residual_var, settings.run.repeats, k)
        half, half_df = expected_half_width(settings, noise, residual_var, k)
        speedup = assumed_speedup_sd(settings)
        looks = looks_half_width(settings, noise, residual_var, k, speedup_var=speedup**2)
        out[metric] = Reach(
            metric, power, noise, math.sqrt(residual_var), measured,
            half_width=half, half_df=half_df, at_looks=looks, speedup_sd=speedup,
        )  # fmt: skip
    return out


TWIN_GAIN = 0.20  # `twin = "auto"`: a twin where it narrows the plan's reach by this much


@dataclass(frozen=True)
class TwinPlan:
    """What a twin baseline beside each pair would give: the throughput interval's half-width
    (log) the run would print without and with it (with every slot sent: under the stop rule,
    at its last look, the plan's own figure there), and whether `auto` takes it."""

    without: float
    with_twin: float
    chosen: bool

    @property
    def gain(self) -> float:
        """How much narrower with the twin (0.25: a quarter)."""
        if not math.isfinite(self.without) or self.without <= 0:
            return 1.0 if math.isfinite(self.with_twin) else 0.0
        return 1.0 - self.with_twin / self.without

    def text(self) -> str:
        """The plan's line: what a twin would give, for what it costs."""
        worth = "worth it" if self.gain >= TWIN_GAIN else "not worth it"
        return (
            f"a twin baseline beside each pair (the original again beside the baseline start: "
            f"--spec-config baseline,<candidate>, beside one more) would print throughput "
            f"±{self.with_twin:.1%} with every slot sent, where this design prints "
            f"±{self.without:.1%} "
            f"({self.gain:.0%} narrower, for one more start and one more request a slot): "
            f"{worth} at {TWIN_GAIN:.0%}"
        )


def twin_plan(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    *,
    room: bool,
    accelerator: str | None = None,
    twin: bool | str = "auto",
) -> TwinPlan | None:
    """Side by side: the reach without and with a twin beside each pair, and whether to serve
    one (`twin`: True, False, or "auto": where it narrows the reach by TWIN_GAIN and the host
    has `room` for one more server). None where the arms are not side by side. NOT wired into
    the run yet: docs/statistics.md, "A twin baseline"."""
    if settings.run.arms != "together":
        return None
    noise, residual_var, _ = _host(settings, outside, "throughput", accelerator)
    k = expected_requests(settings.run, noise, residual_var, fixed=settings.aa_only)
    without, _ = expected_half_width(settings, noise, residual_var, k)
    with_twin, _ = expected_half_width(settings, noise, residual_var, k, twins=settings.run.repeats)
    speedup = assumed_speedup_sd(settings) ** 2
    alone = looks_half_width(settings, noise, residual_var, k, speedup_var=speedup)
    if alone:  # under the stop rule the plan prints its looks: the last look's, both ways
        beside = looks_half_width(settings, noise, residual_var, k, speedup_var=speedup, twins=1)
        without, with_twin = alone[-1].half_width, beside[-1].half_width
    plan = TwinPlan(without, with_twin, chosen=False)
    chosen = room and (twin is True or (twin == "auto" and plan.gain >= TWIN_GAIN))
    return replace(plan, chosen=bool(chosen))


def design_to_detect(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    change: float,
    *,
    seconds: Callable[[int, int], float],
) -> tuple[DesignPower, float] | None:
    """The quickest design (starts per arm, requests per start) that calls a change of this
    size on every metric with 80% power, and its estimated seconds; None if none can."""
    least, most = settings.run.requests_at(settings.run.levels[0])
    counts = sorted({least, most, max(least, min(most, 2 * least))})
    hosts = [_host(settings, outside, metric) for metric in METRICS]
    for starts in range(1, MAX_STARTS + 1):
        found = []
        for k in counts:
            powers = [_power(settings, noise, var, starts, k) for noise, var, _ in hosts]
            if max(p.detectable for p in powers) <= change:
                found.append((max(powers, key=lambda p: p.detectable), seconds(starts, k)))
        if found:
            return min(found, key=lambda f: f[1])
    return None


# --------------------------------------------------------------------------- drift and levers

DECIDE_AT = 0.20  # the change the plan's lever is chosen for where --spec-detect names none
LONGER = (2, 4)  # a longer window: this many times the configured requests per start


@dataclass(frozen=True)
class Lever:
    """One way to make a design decide: what it changes, the design, what it calls, its cost."""

    what: str  # "more starts", "a longer window", "interleaved", "arms side by side"
    options: str  # the options that run it
    starts: int
    requests: int
    detectable: float
    seconds: float


def drift_variance(drift: TimeDrift, requests: int, *, order: str, keys: int) -> float:
    """What the drift adds to the variance of one key's start effect at `requests` per start:
    blocked, the mean of that many consecutive requests; interleaved over `keys` prompt types,
    of that many requests `keys` apart. Side by side ("together") the two arms see the same
    drift at each slot, and the analysis by pairs takes it out of each slot's difference: none."""
    if drift.sd <= 0 or order == "together":
        return 0.0
    phi = drift.phi if order == "blocked" else drift.phi ** max(1, keys)
    return block_sd(drift.sd, phi, requests) ** 2


def start_only(noise: RestartNoise, drift: TimeDrift, *, keys: int) -> float:
    """The restart noise's variance without the drift a blocked A/A run counted in it: the
    drift's mean over one key's block of the A/A's requests (its requests per start and key)."""
    per_key = max(1, round(drift.requests / max(1, drift.starts) / max(1, keys)))
    counted = drift_variance(drift, per_key, order="blocked", keys=keys) if drift.blocked else 0.0
    return max(0.0, noise.sd**2 - counted)


def _drifted(
    noise: RestartNoise, drift: TimeDrift, requests: int, order: str, keys: int
) -> RestartNoise:
    """The restart noise a start's mean sees at this design: the start effect alone, plus the
    drift's share of `requests` per key sent in this order."""
    base = start_only(noise, drift, keys=keys)
    sd = math.sqrt(base + drift_variance(drift, requests, order=order, keys=keys))
    return RestartNoise(sd, noise.df, noise.source, noise.measured)


def drift_reach(settings: Settings, found: Reach, drift: TimeDrift) -> Reach:
    """`reach` on throughput with the drift counted: what the configured design calls once
    each start's mean carries the drift of its window (the figure to plan by)."""
    run = settings.run
    keys = len(settings.prompt_types) * len(run.levels)
    order = "together" if run.arms == "together" else run.order
    k = found.power.requests
    noise = _drifted(found.noise, drift, k, order, keys)
    residual = drift.noise_sd**2 or ASSUMED_RESIDUAL_SD**2
    power = _power(settings, noise, residual, run.repeats, k)
    return replace(found, power=power, residual_sd=math.sqrt(residual), drift_counted=True)


def levers(
    settings: Settings,
    outside: Mapping[str, RestartNoise],
    drift: TimeDrift,
    change: float,
    *,
    seconds: Callable[[int, int, bool], float],
) -> list[Lever]:
    """Each lever's cheapest design that calls a change of this size on throughput with 80%
    power, where drift is known: more starts (the order as it is), a longer window, the
    prompt types interleaved, the arms side by side. `seconds(starts, requests, together)`."""
    run = settings.run
    keys = len(settings.prompt_types) * len(run.levels)
    noise, _, _ = _host(settings, outside, "throughput")
    residual = drift.noise_sd**2 or ASSUMED_RESIDUAL_SD**2
    most = run.requests_at(run.levels[0])[1]
    longer = [most * f for f in LONGER]
    now = "together" if run.arms == "together" else run.order
    plans = {
        "more starts": (now, [most], range(run.repeats, MAX_STARTS + 1), ""),
        "a longer window": (now, longer, [run.repeats], ""),
    }
    if now == "blocked":
        flag = ' ([run] order = "interleaved")'
        plans["the prompt types interleaved"] = (
            "interleaved", [most, *longer], range(1, MAX_STARTS + 1), flag
        )  # fmt: skip
    if now != "together":
        plans["arms side by side (where the host holds both servers)"] = (
            "together", [most, *longer], range(1, MAX_STARTS + 1), " --spec-arms together"
        )  # fmt: skip
    out = []
    for what, (kind, counts, starts_range, flag) in plans.items():
        found = []
        for n in starts_range:
            for k in counts:
                drifted = _drifted(noise, drift, k, kind, keys)
                power = _power(settings, drifted, residual, n, k, pairs=kind == "together")
                if power.detectable <= change:
                    found.append((seconds(n, k, kind == "together"), n, k, power.detectable))
            if found:
                break
        if found:
            cost, n, k, detectable = min(found)
            options = f"--spec-repeats {n} --spec-samples {k} --spec-max-samples {k}{flag}"
            out.append(Lever(what, options, n, k, detectable, cost))
    return sorted(out, key=lambda lever: lever.seconds)
