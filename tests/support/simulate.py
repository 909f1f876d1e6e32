"""Simulated runs through the real analysis code: calibration by Monte Carlo (no tests here).

A run's per-request throughput is drawn on the log scale:

    log tok/s = log(base) + effect·[candidate] + start shift + prompt + request noise

Every prompt type of one server start shares its shift (the start moved the whole server), and
each request of the start has its own noise. TPOT follows from the same request (a fixed TTFT),
as on a real server. The analysis is told the restart noise as a real run would know it. With a
prompt set, each prompt has its own level, the same in every start (`Scenario.prompts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pytest_specdecode.analysis.compare import PromptTypeVerdict, compare_arms
from pytest_specdecode.analysis.stats import RestartNoise, Verdict
from pytest_specdecode.measure.experiment import pinned, target_se
from pytest_specdecode.measure.loadgen import RequestSample
from pytest_specdecode.record.schema import Measurement, Phase

PROMPT_TYPES = ("coding", "math", "structured", "explanatory")
TOKENS = 64
TTFT_S = 0.05


KNOWN_2 = RestartNoise(0.02, 20.0, "simulated A/A runs")


@dataclass(frozen=True)
class Scenario:
    effect: float = 0.0  # true relative change of the candidate's throughput, e.g. -0.10
    start_sd: float = 0.0  # true restart noise (log scale)
    request_sd: float | tuple[float, ...] = 0.04  # within-start noise of a request (log scale);
    # one per prompt type, or one for all
    samples: int = 6  # requests per prompt type and start (the least, with max_samples)
    max_samples: int | None = None  # adaptive, as the experiment does it
    repeats: int = 1  # starts per arm
    shared_shift: bool = True  # one shift per start for every prompt type, or one each
    noise: RestartNoise = KNOWN_2  # what the analysis is told
    alpha: float = 0.05
    min_effect: float = 0.03
    prompt_types: tuple[str, ...] = PROMPT_TYPES
    # Prompt sets: each prompt type holds `prompts` prompts whose own levels spread by
    # `prompt_sd` (log scale); request i of every start sends prompt i mod `prompts`.
    prompts: int = 0  # 0: one prompt, repeated (the seed's design)
    prompt_sd: float = 0.0
    # "paired": the analysis is told each request's prompt; "ignored": the same requests, but
    # not told; "unpaired": every request a new prompt from a large pool (nothing to pair)
    pairing: str = "paired"


def _request(
    prompt_type: str, phase: str, index: int, rate: float, prompt: int | None = None
) -> RequestSample:
    return RequestSample(
        prompt_index=prompt,
        prompt_type=prompt_type,
        phase=phase,
        index=index,
        warmup=False,
        started_at=0.0,
        ttft_s=TTFT_S,
        e2e_s=TTFT_S + (TOKENS - 1) / rate,
        output_tokens=TOKENS,
        prompt_tokens=40,
        chunks=TOKENS,
    )


def _send(
    m: Measurement,
    count: int,
    phase: str,
    level: float,
    sd: float,
    rng: np.random.Generator,
    s: Scenario,
    prompt_levels: np.ndarray,
) -> None:
    for _ in range(count):
        i = len(m.samples)
        prompt: int | None = None
        if s.pairing == "unpaired" and s.prompts:
            own = rng.normal(0.0, s.prompt_sd)  # a prompt never sent before
        elif s.prompts:
            prompt = i % s.prompts
            own = float(prompt_levels[prompt])
        else:
            own = 0.0
        rate = 30.0 * math.exp(level + own + rng.normal(0.0, sd))
        told = prompt if s.pairing == "paired" else None
        m.samples.append(_request(m.prompt_type, phase, i, rate, told))


def _start(
    s: Scenario,
    name: str,
    arm: str,
    effect: float,
    rng: np.random.Generator,
    prompt_levels: dict[str, np.ndarray],
) -> Phase:
    """One server start: each prompt type's requests, as many as the design sends."""
    phase = Phase(name=name, arm=arm, spec=None)
    target = target_se(s.noise.sd, s.min_effect)
    shared = rng.normal(0.0, s.start_sd) if s.start_sd else 0.0
    sds = s.request_sd if isinstance(s.request_sd, tuple) else (s.request_sd,) * len(s.prompt_types)
    for prompt_type, sd in zip(s.prompt_types, sds, strict=True):
        own = rng.normal(0.0, s.start_sd) if s.start_sd and not s.shared_shift else shared
        level = effect + own
        m = Measurement(prompt_type=prompt_type)
        levels = prompt_levels[prompt_type]
        _send(m, s.samples, name, level, sd, rng, s, levels)
        while len(m.samples) < (s.max_samples or 0) and not pinned(m, target=target):
            _send(m, 1, name, level, sd, rng, s, levels)
        phase.measurements[prompt_type] = m
    return phase


def simulate_run(s: Scenario, rng: np.random.Generator) -> dict[str, PromptTypeVerdict]:
    """One run: every start of each arm, then the verdicts as the tool computes them."""
    arms: dict[str, list[Phase]] = {"baseline": [], "candidate": []}
    prompt_levels = {  # drawn once a run: every start sends the same prompts
        t: rng.normal(0.0, s.prompt_sd, s.prompts) if s.prompts else np.zeros(1)
        for t in s.prompt_types
    }
    for arm, effect in (("baseline", 0.0), ("candidate", math.log1p(s.effect))):
        for start in range(s.repeats):
            arms[arm].append(_start(s, f"{arm}#{start}", arm, effect, rng, prompt_levels))
    return compare_arms(
        arms["baseline"],
        arms["candidate"],
        alpha=s.alpha,
        min_effect=s.min_effect,
        noise={"throughput": s.noise, "tpot": s.noise},
    )


@dataclass(frozen=True)
class Rates:
    runs: int
    regressed: float  # share of runs with any prompt type called regressed
    improved: float
    decided_all: float  # share of runs where every prompt type got a verdict
    requests: float  # mean requests per prompt type and start

    def mc_error(self, p: float) -> float:
        """Two standard errors of a Monte Carlo share near p."""
        return 2 * math.sqrt(p * (1 - p) / self.runs)


def rates(s: Scenario, *, runs: int, seed: int) -> Rates:
    rng = np.random.default_rng(seed)
    regressed = improved = decided = requests = 0
    for _ in range(runs):
        verdicts = simulate_run(s, rng).values()
        regressed += any(v.verdict is Verdict.REGRESSED for v in verdicts)
        improved += any(v.verdict is Verdict.IMPROVED for v in verdicts)
        decided += all(not v.undecided for v in verdicts)
        requests += sum(v.throughput.n_baseline + v.throughput.n_candidate for v in verdicts)
    per_start = requests / (runs * len(s.prompt_types) * 2 * s.repeats)
    return Rates(runs, regressed / runs, improved / runs, decided / runs, per_start)
