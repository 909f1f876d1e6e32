"""The whole chain, simulated: runs written as results.json, read back, analysed as the plugin does.

A simulated host draws each request's throughput on the log scale:

    log tok/s = log(base) + effect·[candidate] + start shift + prompt + request noise

Every prompt type of one server start shares its shift (or, with `shared_shift=False`, each has
its own); each prompt of a prompt type has its own level, the same in every start; each request
has its own noise. TPOT follows from the same request (a fixed TTFT), as on a real server.
With `drift_sd`, throughput also drifts within a start: an AR(1) over the requests in time order
(`drift_phi` from one request to the next, stationary SD `drift_sd`), one request every
`SECONDS_PER_REQUEST` (docs/statistics.md, "Drift within a start", has the mapping to the H200's
figures).

The route's design says how a start sends its requests (`Route.design`): "blocked", each
prompt type's requests one block after another (as the experiment did before interleaving);
"interleaved", in rounds of one request per prompt type, each round shuffled (seeded); or
"together", the baseline's and the candidate's starts served side by side, their requests
interleaved and sent A then B per slot, so both see the same drift (their start shifts stay
their own).

A route is what a user does: `aa_runs` A/A runs of `aa_repeats` starts per arm, each written to
the reports folder as the plugin writes it, then the run itself (`repeats` starts per arm). The run
reads the stored runs, takes the restart noise they measured, and is analysed from its own
results.json by `candidate_verdicts`: the path of the pytest verdict tests. The adaptive stop rule
is the experiment's own. Nothing is handed to the analysis beside the files.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from pytest_specdecode.analysis.run import candidate_verdicts
from pytest_specdecode.analysis.variance.restarts import RestartNoise
from pytest_specdecode.analysis.verdict.compare import PromptTypeVerdict
from pytest_specdecode.analysis.verdict.stats import Verdict
from pytest_specdecode.config.arms import AA_ARM, BASELINE, design_order
from pytest_specdecode.config.prompts import Prompt, request_plan
from pytest_specdecode.config.settings import PromptType, RunConfig
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.profile import ProfileEntry, read_profile
from pytest_specdecode.record.requests.samples import RequestSample
from pytest_specdecode.record.schema import Phase, RunRecord, TargetInfo

from . import chain_rules

PROMPT_TYPES = ("coding", "math", "structured", "explanatory")
TOKENS = 64
TTFT_S = 0.05
HOST, MODEL, VERSION = "sim-host", "sim-model", "0.32.0"
CANDIDATE = "ngram"
SECONDS_PER_REQUEST = 0.4  # a 256-token request on the H200: a 3-s block is ~8 requests
DESIGNS = ("blocked", "interleaved", "together")


@dataclass(frozen=True)
class SimHost:
    """What the simulated host does: its true noise, and its prompts' own spread."""

    start_sd: float = 0.046  # restart noise (log scale): the shift of a server start
    shared_shift: bool = True  # one shift per start for all prompt types, or one each
    request_sd: float = 0.04  # each request's own noise (log scale)
    prompts: int = 12  # prompts per prompt type (0: one prompt, repeated)
    prompt_sd: float = 0.10  # the prompts' own levels' spread (log scale)
    prompt_types: tuple[str, ...] = PROMPT_TYPES
    # "paired": every start sends the same prompts, each request records its prompt;
    # "ignored": the same requests, their prompts not recorded; "unpaired": every request a
    # new prompt from a large pool (nothing to pair)
    pairing: str = "paired"
    drift_sd: float = 0.0  # stationary SD of the drift within a start (log scale)
    drift_phi: float = 0.75  # its AR(1) coefficient from one request to the next


@dataclass(frozen=True)
class Route:
    """What the user runs: stored A/A runs first (maybe none), then the run."""

    aa_runs: int = 1
    aa_repeats: int = 1  # starts per arm of each A/A run
    repeats: int = 1  # starts per arm of the run
    run: RunConfig = field(default_factory=RunConfig)  # the design: samples, margin, alpha, ...
    design: str = "blocked"  # how a start sends its requests: one of DESIGNS


def _prompt_types(host: SimHost) -> dict[str, PromptType]:
    n = max(1, host.prompts)
    return {
        t: PromptType(
            name=t,
            prompt=f"{t} prompt 0",
            max_tokens=TOKENS,
            min_tokens_per_s=None,
            max_tpot_ms=None,
            prompts=tuple(Prompt(f"{t} prompt {i}") for i in range(n)),
        )
        for t in host.prompt_types
    }


def _record(route: Route, host: SimHost, candidate: str, repeats: int) -> RunRecord:
    return RunRecord(
        plugin_version="sim",
        config_file="simulated.toml",
        target=TargetInfo(backend="local", host=HOST, api_base="http://sim", model=MODEL),
        run=replace(route.run, repeats=repeats),
        candidates={candidate: {} if candidate == AA_ARM else {"method": "ngram"}},
        prompt_types=_prompt_types(host),
    )


def _sample(
    prompt_type: str,
    phase: str,
    index: int,
    rate: float,
    prompt: int | None,
    at: float = 0.0,
    slot: int | None = None,
) -> RequestSample:
    return RequestSample(
        prompt_type=prompt_type,
        phase=phase,
        index=index,
        warmup=False,
        started_at=at,
        ttft_s=TTFT_S,
        e2e_s=TTFT_S + (TOKENS - 1) / rate,
        output_tokens=TOKENS,
        prompt_tokens=40,
        chunks=TOKENS,
        prompt_index=prompt,
        slot=slot,
    )


def _drift(host: SimHost, n: int, rng: np.random.Generator) -> np.ndarray:
    """One start's drift over its `n` request slots: a stationary AR(1); zeros without drift."""
    out = np.zeros(n)
    if host.drift_sd <= 0 or n == 0:
        return out
    innovation = host.drift_sd * math.sqrt(1.0 - host.drift_phi**2)
    steps = rng.normal(0.0, innovation, n)
    out[0] = rng.normal(0.0, host.drift_sd)
    for i in range(1, n):
        out[i] = host.drift_phi * out[i - 1] + steps[i]
    return out


def _slots(host: SimHost, plan: tuple[int, ...], design: str, rng: np.random.Generator):
    """The (prompt type, prompt) of each request slot of a start, in time order."""
    if design == "blocked":
        return [(t, i) for t in host.prompt_types for i in plan]
    out = []
    for i in plan:
        order = list(host.prompt_types)
        rng.shuffle(order)
        out += [(t, i) for t in order]
    return out


def _measure_run(
    record: RunRecord,
    host: SimHost,
    levels: dict[str, np.ndarray],
    effect: float,
    rng: np.random.Generator,
    stop: Callable[[RunRecord, Phase, Measurement], bool],
    design: str = "blocked",
) -> None:
    """Every start of the run's design, in the experiment's order; side by side ("together"),
    each block's baseline and candidate starts at once."""
    (candidate,) = record.candidates
    run = record.run
    least, most = run.requests_at(run.levels[0], fixed=candidate == AA_ARM)
    n = max(1, host.prompts)
    plan = request_plan(n, samples=most).levels[0]
    order = design_order([candidate], run.repeats)
    groups = (
        [order[i : i + 2] for i in range(0, len(order), 2)]
        if design == "together"
        else [[entry] for entry in order]
    )
    clock = 0.0
    for group in groups:
        slots = _slots(host, plan, design, rng)
        drift = _drift(host, len(slots), rng)
        started = []
        for name, arm in group:
            phase = Phase(
                name=name, arm=arm, spec=record.candidates.get(arm), server_version=VERSION
            )
            record.phases[name] = phase
            true = 0.0 if arm in (BASELINE, AA_ARM) else math.log1p(effect)
            shared = rng.normal(0.0, host.start_sd)
            shifts = {
                t: shared if host.shared_shift else rng.normal(0.0, host.start_sd)
                for t in host.prompt_types
            }
            for t in host.prompt_types:
                phase.measurements[t] = Measurement(prompt_type=t)
            started.append((phase, true, shifts))
        if design == "together":  # served side by side: each the other's partner
            first, second = started[0][0], started[-1][0]
            first.together_with, second.together_with = second.name, first.name
        position = 0  # the slot in time: a stopped prompt type's slots are not spent
        for t, i in slots:
            sent = False
            for k, (phase, true, shifts) in enumerate(started):
                m = phase.measurements[t]
                if len(m.samples) >= least and (len(m.samples) >= most or stop(record, phase, m)):
                    continue
                own = (
                    rng.normal(0.0, host.prompt_sd)
                    if host.pairing == "unpaired"
                    else float(levels[t][i])
                )
                rate = math.exp(
                    math.log(30.0) + true + shifts[t] + own + drift[position]
                    + rng.normal(0, host.request_sd)
                )  # fmt: skip
                told = int(i) if host.pairing == "paired" else None
                at = clock + (position * len(started) + k) * SECONDS_PER_REQUEST
                sample = _sample(t, phase.name, len(m.samples), rate, told, at, position)
                m.samples.append(sample)
                sent = True
            position += sent
        clock += (len(slots) * len(started) + 100) * SECONDS_PER_REQUEST
        for phase, _, _ in started:
            for m in phase.measurements.values():
                m.wall_s = sum(s.e2e_s for s in m.samples)


def simulate_route(
    host: SimHost,
    route: Route,
    *,
    effect: float,
    rng: np.random.Generator,
    reports: Path,
) -> dict[str, PromptTypeVerdict]:
    """The route on a fresh reports folder; the run's verdicts, from its results.json."""
    levels = {  # each prompt's own level: the same in every start of every run on this host
        t: rng.normal(0.0, host.prompt_sd, max(1, host.prompts)) if host.prompts else np.zeros(1)
        for t in host.prompt_types
    }
    profiles = reports / "host-profiles"
    for k in range(route.aa_runs):
        record = _record(route, host, AA_ARM, route.aa_repeats)
        run_dir = reports / f"aa-{k}"
        stop = chain_rules.stop_rule_for(reports, profiles, record, run_dir)
        _measure_run(record, host, levels, 0.0, rng, stop, route.design)
        chain_rules.finish(record, reports, profiles, run_dir)
    record = _record(route, host, CANDIDATE, route.repeats)
    run_dir = reports / "run"
    stop = chain_rules.stop_rule_for(reports, profiles, record, run_dir)
    _measure_run(record, host, levels, effect, rng, stop, route.design)
    chain_rules.finish(record, reports, profiles, run_dir)
    written = RunRecord.from_json(json.loads((reports / "run" / "results.json").read_text()))
    return candidate_verdicts(written, CANDIDATE)


def aa_estimates(
    host: SimHost, route: Route, *, runs: int, seed: int, tmp: Path
) -> list[dict[str, RestartNoise]]:
    """The restart noise each of `runs` A/A runs (the route's first) wrote into its host's
    profile, read back from the file, per metric."""
    return [
        {m: RestartNoise.from_dict(dict(d)) for m, d in entry.noise.items()}
        for entry in aa_entries(host, route, runs=runs, seed=seed, tmp=tmp)
    ]


def aa_entries(
    host: SimHost, route: Route, *, runs: int, seed: int, tmp: Path
) -> list[ProfileEntry]:
    """The host profile entry each of `runs` A/A runs (the route's first) wrote, read back
    from the file."""
    rng = np.random.default_rng(seed)
    found = []
    for i in range(runs):
        reports = tmp / f"aa{i}"
        shutil.rmtree(reports, ignore_errors=True)
        levels = {
            t: rng.normal(0.0, host.prompt_sd, max(1, host.prompts)) for t in host.prompt_types
        }
        record = _record(route, host, AA_ARM, route.aa_repeats)
        profiles = reports / "host-profiles"
        stop = chain_rules.stop_rule_for(reports, profiles, record, reports / "aa-0")
        _measure_run(record, host, levels, 0.0, rng, stop, route.design)
        chain_rules.finish(record, reports, profiles, reports / "aa-0")
        profile = read_profile(profiles, HOST, None, MODEL)
        assert profile is not None
        (entry,) = profile.entries
        found.append(entry)
        shutil.rmtree(reports, ignore_errors=True)
    return found


@dataclass(frozen=True)
class Rates:
    runs: int
    regressed: float  # share of runs with any prompt type called regressed
    improved: float
    inconclusive: float  # share of runs with any prompt type undecided
    requests: float  # mean measured requests per prompt type and start of the run
    missed: float = 0.0  # share of the comparisons whose interval misses the true change
    widest: float = 0.0  # the widest interval's half-width (log scale, as a ratio's ±)
    median_width: float = 0.0  # the median interval's half-width, likewise
    by_pairs: float = 0.0  # share of the comparisons analysed by pairs (side by side)
    regressed_per_type: float = 0.0  # share of prompt-type verdicts called regressed

    def mc_error(self, p: float) -> float:
        """Two standard errors of a Monte Carlo share near p."""
        return 2 * math.sqrt(max(p * (1 - p), 0.25 / self.runs) / self.runs)


def rates(host: SimHost, route: Route, *, effect: float, runs: int, seed: int, tmp: Path) -> Rates:
    rng = np.random.default_rng(seed)
    regressed = improved = undecided = requests = missed = comparisons = pairs = 0
    types = types_regressed = 0
    widths: list[float] = []
    truth = math.log1p(effect)
    for i in range(runs):
        reports = tmp / f"r{i}"
        shutil.rmtree(reports, ignore_errors=True)  # a fresh host: no runs, no profile
        verdicts = simulate_route(host, route, effect=effect, rng=rng, reports=reports).values()
        shutil.rmtree(reports, ignore_errors=True)
        regressed += any(v.verdict is Verdict.REGRESSED for v in verdicts)
        types += len(verdicts)
        types_regressed += sum(v.verdict is Verdict.REGRESSED for v in verdicts)
        improved += any(v.verdict is Verdict.IMPROVED for v in verdicts)
        undecided += any(v.undecided for v in verdicts)
        requests += sum(v.throughput.n_candidate + v.throughput.n_baseline for v in verdicts)
        for c in (c for v in verdicts for c in v.comparisons):
            true = truth if c.higher_is_better else -truth  # TPOT moves the other way
            comparisons += 1
            missed += not c.interval.low <= true <= c.interval.high
            # half the interval's width on the log scale, about its estimate, as a ratio's (±)
            widths.append(math.expm1((c.interval.high - c.interval.low) / 2))
            pairs += c.interval.by == "pairs"
    per_start = requests / (runs * len(host.prompt_types) * 2 * route.repeats)
    return Rates(
        runs, regressed / runs, improved / runs, undecided / runs, per_start,
        missed / max(comparisons, 1), max(widths, default=0.0),
        float(np.median(widths)) if widths else 0.0, pairs / max(comparisons, 1),
        types_regressed / max(types, 1),
    )  # fmt: skip
