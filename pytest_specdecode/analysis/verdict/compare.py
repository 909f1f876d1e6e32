"""One path from measurements to verdicts. Every consumer compares two arms here.

The pytest verdict tests, the terminal table, summary.md, the HTML report, the drift check, a
reused baseline and `specdecode-compare` all call `compare_arms`, on a live record or a stored
one alike, so the same samples always give the same verdict.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...config.arms import AA_ARM, BASELINE, ORIGINAL_ARMS
from ...record.counters import Acceptance, combine
from ...record.measurement import Measurement, SequentialLooks
from ...record.schema import Phase, RunRecord
from .checks import acceptance_cross_check
from .interval import Question, arm_figures
from .stats import Comparison, RestartNoise, Verdict, compare_family

# Worst first, the one order: a prompt type's verdict from its two metrics (regressed on either
# wins, then no verdict possible, then improved on either with the other not worse, equivalent
# only when both are), and a run's outcome from its prompt types' (contaminated first).
PRECEDENCE = (
    Verdict.CONTAMINATED,
    Verdict.REGRESSED,
    Verdict.INSUFFICIENT,
    Verdict.INCONCLUSIVE,
    Verdict.IMPROVED,
    Verdict.EQUIVALENT,
)


@dataclass(frozen=True)
class PromptTypeVerdict:
    """One prompt type: the candidate arm against the baseline arm, on throughput and TPOT."""

    prompt_type: str
    baseline: str  # arm names, as shown in tables
    candidate: str
    throughput: Comparison
    tpot: Comparison | None  # None when a side has no TPOT (one-token outputs)
    # the candidate's over this prompt type: its requests' own figures (every window), else the
    # counters (clean windows only)
    acceptance: Acceptance
    acceptance_note: str | None  # where the server's and the client's counts disagree
    contaminated: str | None = None  # other clients' traffic in a window of either side

    @property
    def comparisons(self) -> list[Comparison]:
        return [self.throughput] + ([self.tpot] if self.tpot is not None else [])

    @property
    def verdict(self) -> Verdict:
        if self.contaminated:
            return Verdict.CONTAMINATED  # never a pass or a fail as if it were clean
        found = {c.verdict for c in self.comparisons}
        return worst(found)

    @property
    def regressed(self) -> bool:
        return self.verdict is Verdict.REGRESSED

    @property
    def undecided(self) -> bool:
        """No verdict: the gate must not pass on it."""
        return self.verdict in (Verdict.INCONCLUSIVE, Verdict.INSUFFICIENT, Verdict.CONTAMINATED)

    @property
    def passes(self) -> bool:
        """The gate's one rule: improved or equivalent. An A/A comparison (the original against
        itself) passes unless it calls a difference, which is then a false alarm."""
        if self.candidate == AA_ARM:
            return self.verdict not in (Verdict.REGRESSED, Verdict.IMPROVED)
        return self.verdict in (Verdict.IMPROVED, Verdict.EQUIVALENT)

    @property
    def deciding(self) -> list[Comparison]:
        """The comparisons that decided the verdict: the first metric with the verdict's own
        (e.g. TPOT for a run regressed on TPOT alone), or every metric for equivalent (both
        must be); none when other clients' traffic decided it."""
        if self.contaminated:
            return []
        if self.verdict is Verdict.EQUIVALENT:
            return self.comparisons
        found = next((c for c in self.comparisons if c.verdict is self.verdict), None)
        return [found or self.throughput]

    @property
    def reason(self) -> str:
        """Why: the reason of the comparison that decided the verdict."""
        if self.contaminated and self.contaminated.startswith(HOST_BUSY):
            return f"the host was not quiet while it was measured: {self.contaminated}"
        if self.contaminated:
            return f"other clients used the server while it was measured: {self.contaminated}"
        return self.deciding[0].reason

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_type": self.prompt_type,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "throughput": self.throughput.to_dict(),
            "tpot": self.tpot.to_dict() if self.tpot is not None else None,
            "acceptance": self.acceptance.to_dict(),
            "acceptance_note": self.acceptance_note,
            "contaminated": self.contaminated,
        }


METRICS = {"throughput": ("tokens_per_s", True), "tpot": ("tpot_ms", False)}
HOST_BUSY = "host busy in "  # a window contaminated by other work on the host, not its clients


def arm_measurements(phases: Sequence[Phase], prompt_type: str) -> list[Measurement]:
    return [p.measurements[prompt_type] for p in phases if prompt_type in p.measurements]


def starts(phases: Sequence[Phase], prompt_type: str, values: str) -> list[list[float]]:
    """Per server start of an arm, the values that enter the statistics (starts without any
    are left out)."""
    return [[v for v, _ in start] for start in _starts(phases, prompt_type, values)]


def start_prompts(phases: Sequence[Phase], prompt_type: str, values: str) -> list[list[int | None]]:
    """The prompt each value of `starts` was measured on, aligned with it."""
    return [[i for _, i in start] for start in _starts(phases, prompt_type, values)]


def _starts(
    phases: Sequence[Phase], prompt_type: str, values: str
) -> list[list[tuple[float, int | None]]]:
    groups = [m.by_prompt(values) for m in arm_measurements(phases, prompt_type)]
    return [g for g in groups if g]


def pair_differences(
    baseline: Sequence[Phase], candidate: Sequence[Phase], prompt_type: str, values: str
) -> list[list[float]] | None:
    """Side by side (`--spec-arms together`): per pair, a baseline start and the candidate's
    start served beside it, each shared slot's `log(candidate) - log(baseline)` (the mean of
    each side's requests in the slot). None where no start of either arm had a partner."""
    found = pair_slots(baseline, candidate, prompt_type, values)
    return [[d for d, _ in pair] for pair in found] if found else None


def pair_slots(
    baseline: Sequence[Phase], candidate: Sequence[Phase], prompt_type: str, values: str
) -> list[list[tuple[float, object]]]:
    """Per pair, each shared slot's log difference (as `pair_differences`) and its prompt(s)."""
    out = []
    for base in baseline:  # a candidate's start names the baseline start it was served beside
        cand = next((c for c in candidate if c.together_with == base.name), None)
        if cand is None or base.together_with is None:
            continue
        if prompt_type not in base.measurements or prompt_type not in cand.measurements:
            continue
        b = base.measurements[prompt_type].by_slot(values)
        c = cand.measurements[prompt_type].by_slot(values)
        told = base.measurements[prompt_type].slot_prompts()
        shared = sorted(b.keys() & c.keys())
        if shared:
            out.append([(_mean_log(c[s]) - _mean_log(b[s]), told.get(s)) for s in shared])
    return out


def _mean_log(values: Sequence[float]) -> float:
    return sum(math.log(v) for v in values) / len(values)


def compared_prompt_types(baseline: Sequence[Phase], candidate: Sequence[Phase]) -> list[str]:
    """Prompt types with measured requests on both sides, in the candidate's order."""
    names: list[str] = []
    for phase in candidate:
        for name in phase.measurements:
            if name not in names and all(
                starts(side, name, "tokens_per_s") for side in (baseline, candidate)
            ):
                names.append(name)
    return names


def compare_arms(
    baseline: Sequence[Phase],
    candidate: Sequence[Phase],
    *,
    alpha: float,
    min_effect: float,
    noise: dict[str, RestartNoise],
    num_speculative_tokens: int | None = None,
    labels: tuple[str, str] | None = None,
    kin: Sequence[Phase] = (),
    same_configuration: bool = False,
) -> dict[str, PromptTypeVerdict]:
    """Per prompt type, throughput and TPOT, as one family of comparisons.

    `noise` is the outside knowledge of the restart noise per metric; `kin` are other starts of
    the baseline's configuration in this run (not compared; they tell the restart noise);
    `labels` name the two sides in tables (default: their arms).
    """
    if not baseline or not candidate:
        return {}
    base_label, cand_label = labels or (baseline[0].arm, candidate[0].arm)
    names = compared_prompt_types(baseline, candidate)
    questions = [
        _question(baseline, candidate, name, metric, kin, same_configuration)
        for name in names
        for metric, (values, _) in METRICS.items()
        if starts(baseline, name, values) and starts(candidate, name, values)
    ]
    answers = {
        (c.key, c.metric): c
        for c in compare_family(questions, alpha=alpha, min_effect=min_effect, noise=noise)
    }
    out = {}
    for name in names:
        measured = arm_measurements(candidate, name)
        clean = [m for m in measured if m.foreign is None]
        sides = ((base_label, baseline), (cand_label, candidate))
        dirty = [
            f"{HOST_BUSY}{side}'s window: {m.environment.contaminated}"
            for side, arm in sides
            for m in arm_measurements(arm, name)
            if m.environment is not None and m.environment.contaminated
        ] + [f"{side} {m.foreign}" for side, arm in sides for m in arm_measurements(arm, name)
             if m.foreign]  # fmt: skip
        own = [m.request_acceptance for m in measured]
        out[name] = PromptTypeVerdict(
            prompt_type=name,
            baseline=base_label,
            candidate=cand_label,
            throughput=answers[(name, "throughput")],
            tpot=answers.get((name, "tpot")),
            acceptance=(
                combine([a for a in own if a is not None])  # exact, whatever else was served
                if own and None not in own
                else combine([m.acceptance for m in clean])
            ),
            acceptance_note=_cross_check(clean, num_speculative_tokens),
            contaminated="; ".join(dirty) or None,
        )
    return out


def _question(
    baseline: Sequence[Phase],
    candidate: Sequence[Phase],
    name: str,
    metric: str,
    kin: Sequence[Phase],
    same_configuration: bool,
) -> Question:
    values, higher = METRICS[metric]
    slots = pair_slots(baseline, candidate, name, values)
    watched = _watched(candidate, name) if len(slots) == 1 else None
    # the original's configuration served beside the same baseline starts: a twin, whose slots
    # measure the pair offsets in this run (pairs.py → pair_variance), never the change
    twin = pair_slots(baseline, kin, name, values) if slots else []
    return Question(
        name,
        metric,
        higher,
        starts(baseline, name, values),
        starts(candidate, name, values),
        start_prompts(baseline, name, values),
        start_prompts(candidate, name, values),
        kin=starts(kin, name, values),
        kin_prompts=start_prompts(kin, name, values),
        same_configuration=same_configuration,
        pairs=[[d for d, _ in pair] for pair in slots] or None,
        pair_prompts=[[prompt for _, prompt in pair] for pair in slots] or None,
        looks=watched.schedule(len(slots[0])) if watched else None,
        planned_slots=watched.planned if watched else 0,
        twin=[[d for d, _ in pair] for pair in twin] or None,
        twin_prompts=[[prompt for _, prompt in pair] for pair in twin] or None,
    )


def questions_of(baseline: Phase, candidate: Phase, name: str) -> list[Question]:
    """The questions of one cell of a pair served side by side, as `compare_arms` asks them:
    what the stop rule (sequential.py) decides on while the cell is measured."""
    return [
        _question([baseline], [candidate], name, metric, (), False)
        for metric, (values, _) in METRICS.items()
        if starts([baseline], name, values) and starts([candidate], name, values)
    ]


def _watched(candidate: Sequence[Phase], name: str) -> SequentialLooks | None:
    """Where the stop rule looked at a candidate's cell served side by side (its one pair)."""
    for phase in candidate:
        m = phase.measurements.get(name)
        if phase.together_with is not None and m is not None and m.sequential is not None:
            return m.sequential
    return None


def original_kin(record: RunRecord, compared: Sequence[str]) -> list[Phase]:
    """The other starts of the original's configuration in this run (measured here, not
    reused from a stored run): `kin` of a comparison of `compared`."""
    return [
        p
        for arm in ORIGINAL_ARMS
        if arm not in compared
        for p in record.arm_phases(arm)
        if not p.reused_from
    ]


def own_figure(record: RunRecord, arm: str, key: str, metric: str = "throughput") -> float | None:
    """An arm's figure on its own (the baseline's in the results table, and any arm's that is
    not compared): the geometric mean of its starts' geometric means; None without values."""
    found = starts(record.arm_phases(arm), key, METRICS[metric][0])
    return (
        math.exp(statistics.fmean(statistics.fmean(map(math.log, g)) for g in found))
        if (found)
        else None
    )


def arm_figure(
    record: RunRecord, arms: Sequence[str], key: str, metric: str = "throughput"
) -> float | None:
    """The figure of `arms` (one configuration, their starts pooled) on `key`, as the results
    table gives a candidate's against the run's baseline (interval.arm_figures); None where
    either side has no values there."""
    baseline = record.arm_phases(BASELINE)
    candidate = [p for arm in arms for p in record.arm_phases(arm)]
    values = METRICS[metric][0]
    if not starts(baseline, key, values) or not starts(candidate, key, values):
        return None
    kin = original_kin(record, (BASELINE, *arms))
    same = all(arm in ORIGINAL_ARMS for arm in arms)
    return arm_figures(_question(baseline, candidate, key, metric, kin, same))[1]


def _cross_check(measured: Sequence[Measurement], k: int | None) -> str | None:
    """The acceptance cross-checks of each start of the arm (the counters against the tokens
    delivered, and against the requests' own figures); the first disagreement."""
    for m in measured:
        if m.request_check:
            return m.request_check
        note = acceptance_cross_check(
            m.acceptance,
            m.traffic,
            requests=len(m.samples),
            client_accepted=m.client_accepted,
            num_speculative_tokens=k,
        )
        if note:
            return note
    return None


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """The first of PRECEDENCE among them; equivalent when there are none."""
    found = set(verdicts)
    return next((v for v in PRECEDENCE if v in found), Verdict.EQUIVALENT)
