"""The analysis of a whole run: verdicts per candidate, the drift check, outputs, warnings.

`analyze(record)` is the one entry: the live session, the reports and the stored-run tools call
it, so a live run and its results.json give the same analysis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config.arms import BASELINE, BASELINE_AFTER, ORIGINAL_ARMS, cell_key
from ..config.break_even import depth_of_arm, is_map_arm
from ..config.vllm_argv import option_value
from ..record.drafter_check import TOO_FEW
from ..record.schema import RunRecord
from .map.break_even import BreakEvenMap, map_of_run
from .map.dynamic_k import DynamicK, recommend_dynamic_k
from .map.paying_load import LevelPoint, PayingLoad, paying_load
from .map.regime import Regime, regime_of
from .map.shape import MapOnShape, map_on_shape
from .prediction.candidates import CandidatePrediction, candidate_predictions
from .prediction.level_acceptance import AcceptanceByLevel, acceptance_by_level
from .prediction.predict import RunPrediction, predict_run
from .search.answer import SearchAnswer, search_answer
from .variance.pairs import PositionBias
from .variance.time_drift import TimeDrift
from .verdict import noise
from .verdict.checks import Equivalence, differences, equivalences, facts
from .verdict.compare import (
    METRICS,
    PromptTypeVerdict,
    compare_arms,
    original_kin,
    own_figure,
    worst,
)
from .verdict.control import ControlSplit, control_splits
from .verdict.side_changes import CandidateSideChanges, run_side_changes
from .verdict.stats import RestartNoise, Verdict

Figures = dict[str, dict[str, dict[str, float]]]  # arm -> key -> metric -> figure


@dataclass(frozen=True)
class Drift:
    """ABA: the original measured before the candidates against the original measured after.

    The same comparison as a candidate's, against the restart noise known from elsewhere: the
    baseline drifted where the change lies wholly beyond the margin.
    """

    verdicts: Mapping[str, PromptTypeVerdict]

    @property
    def drifted(self) -> list[str]:
        return [
            name
            for name, v in self.verdicts.items()
            if any(c.verdict in (Verdict.IMPROVED, Verdict.REGRESSED) for c in v.comparisons)
        ]

    @property
    def status(self) -> str:
        if self.drifted:
            return "drifted"
        if all(v.undecided for v in self.verdicts.values()):
            return "undecided"
        return "consistent"

    @property
    def unreliable(self) -> bool:
        return self.status == "drifted"

    def text(self) -> str:
        moves = ", ".join(
            f"{name} {v.throughput.baseline_center:.1f} → {v.throughput.candidate_center:.1f} "
            f"tok/s ({v.throughput.change:+.1%})"
            for name, v in self.verdicts.items()
        )
        if self.status == "drifted":
            head = (
                f"the baseline drifted on {', '.join(self.drifted)}: the experiment is unreliable"
            )
        elif self.status == "undecided":
            reason = next(iter(self.verdicts.values())).reason
            head = f"it cannot be told whether the baseline drifted ({reason})"
        else:
            head = "no significant drift: the baseline before and after agree"
        return f"{head}. Before → after: {moves}"

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "unreliable": self.unreliable,
            "drifted": self.drifted,
            "text": self.text(),
            "verdicts": {k: v.to_json() for k, v in self.verdicts.items()},
        }


@dataclass(frozen=True)
class RunAnalysis:
    verdicts: dict[str, dict[str, PromptTypeVerdict]]  # candidate -> prompt type -> verdict
    drift: Drift | None
    equivalence: dict[str, dict[str, Equivalence]]
    noise: dict[str, RestartNoise]  # what the candidates' verdicts assumed, per metric
    measured_noise: dict[str, RestartNoise]  # what this run measured, for the next runs
    warnings: list[str] = field(default_factory=list)
    prediction: RunPrediction | None = None  # the n-gram replay; beside the verdicts, not in them
    # Several load levels: per candidate and prompt type, the paying load (where the speedup
    # crosses 1.0); several k of one method: vLLM's num_speculative_tokens_per_batch_size table
    paying_loads: dict[str, dict[str, PayingLoad]] = field(default_factory=dict)
    dynamic_k: list[DynamicK] = field(default_factory=list)
    # acceptance per request, prompt and level; the replay checked step by step at each level
    acceptance: AcceptanceByLevel = field(default_factory=AcceptanceByLevel)
    search: SearchAnswer | None = None  # --spec-search: the answer in one paragraph
    # arm -> key -> metric -> its one figure, as the results table gives it (run_figures)
    figures: Figures = field(default_factory=dict)
    # what each candidate changed besides speculation; --spec-control: its change in three
    side_changes: dict[str, CandidateSideChanges] = field(default_factory=dict)
    splits: dict[str, ControlSplit] = field(default_factory=dict)
    # per metric, the drift within this run's starts beside their restart noise (time_drift.py)
    time_drift: dict[str, TimeDrift] = field(default_factory=dict)
    # side by side, an A/A run: per metric, the second place's speed beside the first
    position_bias: dict[str, PositionBias] = field(default_factory=dict)
    # --spec-break-even: the map's servers against the baseline (never a gate), and the map
    map_verdicts: dict[str, dict[str, PromptTypeVerdict]] = field(default_factory=dict)
    break_even: BreakEvenMap | None = None
    # per measured candidate, prompt type and level: its one prediction beside the measured
    candidate_predictions: list[CandidatePrediction] = field(default_factory=list)
    # beside two or more: the baseline beside them all against beside one (analysis/map/regime.py)
    regime: Regime | None = None
    map_on_shape: MapOnShape | None = None  # carried to the full depth; drafters' pay-offs

    @property
    def outcome(self) -> str:
        """The run's verdict: the worst of its prompt types', or "not measured"."""
        found = {v.verdict for per in self.verdicts.values() for v in per.values()}
        return worst(found).value if found else "not measured"

    @property
    def unreliable(self) -> bool:
        return self.drift is not None and self.drift.unreliable

    @property
    def passed(self) -> bool:
        """The gate, as the suite's tests decide it: every verdict passes (PromptTypeVerdict.
        passes), and the baseline did not drift."""
        found = [v for per in self.verdicts.values() for v in per.values()]
        return bool(found) and all(v.passes for v in found) and not self.unreliable

    def to_json(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "verdicts": {
                c: {name: v.to_json() for name, v in per.items()}
                for c, per in self.verdicts.items()
            },
            "passed": self.passed,
            "drift": self.drift.to_json() if self.drift else None,
            "restart_noise": {m: n.to_dict() for m, n in self.noise.items()},
            "measured_restart_noise": {m: n.to_dict() for m, n in self.measured_noise.items()},
            "time_drift": {m: d.to_dict() for m, d in self.time_drift.items()},
            "position_bias": {m: b.to_dict() for m, b in self.position_bias.items()},
            "equivalence": {
                c: {name: e.to_json() for name, e in per.items()}
                for c, per in self.equivalence.items()
            },
            "warnings": self.warnings,
            "prediction": self.prediction.to_json() if self.prediction else None,
            "paying_loads": {
                c: {name: x.to_dict() for name, x in per.items()}
                for c, per in self.paying_loads.items()
            },
            "dynamic_k": [d.to_dict() for d in self.dynamic_k],
            "acceptance_by_level": self.acceptance.to_json(),
            "search": self.search.to_json() if self.search else None,
            "side_changes": {c: x.to_dict() for c, x in self.side_changes.items()},
            "control_splits": {c: x.to_json() for c, x in self.splits.items()},
            "break_even": self.break_even.to_json() if self.break_even else None,
            "candidate_predictions": [c.to_dict() for c in self.candidate_predictions],
            "regime": self.regime.to_json() if self.regime else None,
            "map_on_shape": self.map_on_shape.to_json() if self.map_on_shape else None,
        }


def candidate_verdicts(record: RunRecord, candidate: str) -> dict[str, PromptTypeVerdict]:
    """One candidate against the baseline, per prompt type."""
    spec = record.candidates.get(candidate) or {}
    k = spec.get("num_speculative_tokens")
    same = candidate in ORIGINAL_ARMS
    return compare_arms(
        record.arm_phases(BASELINE),
        record.arm_phases(candidate),
        alpha=record.run.alpha,
        min_effect=record.run.min_effect,
        noise=noise.outside(record),
        num_speculative_tokens=int(k) if isinstance(k, int) else None,
        kin=original_kin(record, (BASELINE, candidate)),
        same_configuration=same,
    )


def drift(record: RunRecord) -> Drift | None:
    verdicts = compare_arms(
        record.arm_phases(BASELINE),
        record.arm_phases(BASELINE_AFTER),
        alpha=record.run.alpha,
        min_effect=record.run.min_effect,
        noise=noise.outside(record),
        kin=original_kin(record, (BASELINE, BASELINE_AFTER)),
        same_configuration=True,
    )
    return Drift(verdicts) if verdicts else None


Verdicts = dict[str, dict[str, PromptTypeVerdict]]  # candidate -> key -> verdict


def verdicts_and_map(record: RunRecord) -> tuple[Verdicts, Verdicts]:
    """The candidates' verdicts, and the break-even map's servers' apart (never a gate)."""
    kept = [c for c in record.measured_candidates if depth_of_arm(c) is None]  # map/shape.py
    both = {c: candidate_verdicts(record, c) for c in kept} if record.arm_phases(BASELINE) else {}
    on_map = {c for c in both if is_map_arm(c, record.candidates.get(c) or {})}
    return (
        {c: v for c, v in both.items() if c not in on_map},
        {c: v for c, v in both.items() if c in on_map},
    )


def analyze(record: RunRecord) -> RunAnalysis:
    """Everything derived from the record: nothing here measures or starts anything."""
    verdicts, map_verdicts = verdicts_and_map(record)
    checks = drift(record)
    outputs = equivalences(record)
    assumed = noise.outside(record)
    found = map_of_run(record, map_verdicts)
    prediction = (
        predict_run(record, found=found, verdicts=verdicts) if record.arm_phases(BASELINE) else None
    )
    points = level_points(record, verdicts) if len(record.run.levels) > 1 else {}
    by_level = acceptance_by_level(record)
    return RunAnalysis(
        verdicts=verdicts,
        drift=checks,
        equivalence=outputs,
        noise=assumed,
        measured_noise=noise.of_run(record),
        warnings=_warnings(record, verdicts, checks, outputs, assumed)
        + (prediction.warnings if prediction else [])
        + by_level.warnings,
        prediction=prediction,
        paying_loads=_paying_loads(points),
        dynamic_k=recommend_dynamic_k(
            {c: record.candidates[c] for c in points}, points, max_num_seqs=max_num_seqs(record)
        )
        if points
        else [],
        acceptance=by_level,
        search=search_answer(record, verdicts, max_num_seqs=max_num_seqs(record)),
        figures=run_figures(record, verdicts, checks),
        side_changes=run_side_changes(record),
        splits=control_splits(
            record, verdicts, noise=assumed, kin=original_kin(record, (BASELINE,))
        ),
        time_drift=noise.drifts_of_run(record),
        position_bias=noise.position_bias(record),
        map_verdicts=map_verdicts,
        break_even=found,
        candidate_predictions=candidate_predictions(record, verdicts, prediction, found),
        regime=regime_of(record),
        map_on_shape=map_on_shape(record, found),
    )


def run_figures(
    record: RunRecord, verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]], checks: Drift | None
) -> Figures:
    """Each arm's figure per key and metric, as the results table gives it (docs/statistics.md,
    "One figure per arm"): a candidate's and the baseline's from the verdicts, the baseline
    measured after from the drift check, any other arm (one not compared) its own."""
    out: Figures = {}

    def put(arm: str, key: str, metric: str, value: float) -> None:
        out.setdefault(arm, {}).setdefault(key, {})[metric] = value

    compared = {**verdicts, **({BASELINE_AFTER: checks.verdicts} if checks else {})}
    for arm, per in compared.items():
        for key, v in per.items():
            for c in v.comparisons:
                put(arm, key, c.metric, c.candidate_center)
                put(BASELINE, key, c.metric, c.baseline_center)
    for phase in record.phases.values():
        for key in phase.measurements:
            for metric in METRICS:
                if metric in out.get(phase.arm, {}).get(key, {}):
                    continue
                value = own_figure(record, phase.arm, key, metric)
                if value is not None:
                    put(phase.arm, key, metric, value)
    return out


def level_points(
    record: RunRecord, verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]]
) -> dict[str, dict[str, list[LevelPoint]]]:
    """Per candidate and prompt type, the throughput speedup at each load level, in order."""
    levels = record.run.levels
    out: dict[str, dict[str, list[LevelPoint]]] = {}
    for candidate, per in verdicts.items():
        for name in record.prompt_types:
            for level in levels:
                v = per.get(cell_key(name, level, several=len(levels) > 1))
                if v is None:
                    continue
                low, high = v.throughput.ratio_ci
                point = LevelPoint(
                    level=level.label,
                    load=float(level.rate if level.rate is not None else level.concurrency or 1),
                    ratio=v.throughput.ratio,
                    low=low,
                    high=high,
                    verdict=v.verdict.value,
                )
                out.setdefault(candidate, {}).setdefault(name, []).append(point)
    return out


def _paying_loads(
    points: Mapping[str, Mapping[str, list[LevelPoint]]],
) -> dict[str, dict[str, PayingLoad]]:
    return {
        candidate: {
            name: paying_load(series, prompt_type=name, candidate=candidate)
            for name, series in per.items()
        }
        for candidate, per in points.items()
    }


def max_num_seqs(record: RunRecord) -> int | None:
    """The server's --max-num-seqs, where its command says it."""
    value = option_value(record.target.command, "--max-num-seqs")
    return int(value) if value and value.isdigit() and int(value) > 0 else None


def _assumed_noise_warning(record: RunRecord, prior: RestartNoise) -> str:
    """The restart noise outside this run is assumed: said so, and what this run's own starts
    measured of it (an A/A run measures it; it is not "unmeasured" there)."""
    own = noise.of_run(record)
    if not own:
        return "restart noise " + prior.source
    starts = sum(1 for p in record.phases.values() if not p.reused_from)
    _, unused, note = prior.source.partition("; not used")
    kind = "a prior from another machine" if prior.is_prior else "assumed"
    before = (
        f"no restart noise was measured on this machine before this run (its prior: {kind}, "
        f"{prior.sd:.1%}, weighted as {prior.df:g} degrees of freedom"
        f"{'; not used' + note if unused else ''})"
    )
    if noise.is_aa_run(record):
        return (
            f"{before}; this A/A run's {starts} starts measured it (below), and the intervals "
            "pool the two"
        )
    return (
        f"{before}; this run's own repeated starts measured it too (below), pooled with the "
        "prior; an A/A run (--spec-config baseline --spec-repeats 4) measures it for the host"
    )


def _warnings(
    record: RunRecord,
    verdicts: dict[str, dict[str, PromptTypeVerdict]],
    checks: Drift | None,
    outputs: dict[str, dict[str, Equivalence]],
    assumed: dict[str, RestartNoise],
) -> list[str]:
    """What a reviewer should not miss, one sentence each."""
    out = [f"{arm} failed: {why}" for arm, why in record.failures.items()]
    out += [
        f"{c.start}: the drafter check before its timed windows could not judge: {c.text}"
        for c in record.drafter_checks.values()
        if c.verdict == TOO_FEW
    ]
    if record.environment.get("speed_against_profile"):
        out.append(str(record.environment["speed_against_profile"]))
    watch = record.traffic_watch
    if watch is not None and not watch.quiet:
        out.append(f"other clients used the service before the run: {watch.text}")
    for phase in record.phases.values():
        for name, m in phase.measurements.items():
            out += [f"{phase.name}/{name}: {w}" for w in m.stats.warnings() if m.samples]
            env = m.environment
            where = f"{phase.name}/{name}"
            host_again = len(env.remeasured) if env is not None else 0
            if env is not None and env.contaminated:
                out.append(f"{where} contaminated, the host was busy: {env.contaminated}")
            elif env is not None and env.off:
                out.append(f"{where}: the host was not quiet, kept: {env.off}")
            elif env is not None and host_again and phase.order == "interleaved":
                out.append(
                    f"{where}: measured again after the host was busy ("
                    + "; ".join(dict.fromkeys(env.remeasured))
                    + f"); {host_again} round(s) of it sent again, each kept once clean"
                )
            elif env is not None and host_again:
                out.append(
                    f"{where}: measured again after the host was busy ("
                    + "; then ".join(env.remeasured)
                    + f"); its figures are from window {host_again + 1}, which was clean"
                )
            # a round set aside holds one slot of the cell: the host's rounds are counted above
            slot = (m.level.concurrency or 1) if phase.order == "interleaved" else len(m.samples)
            by_host = host_again * slot
            if m.foreign:
                out.append(f"{where} contaminated by other clients: {m.foreign}")
            elif m.discarded and len(m.discarded) > by_host:
                out.append(
                    f"{where}: measured again after other clients' traffic "
                    f"({len(m.discarded)} requests set aside)"
                )
    unmeasured = [n for n in assumed.values() if not n.measured]
    if verdicts and unmeasured:
        out.append(_assumed_noise_warning(record, unmeasured[0]))
    if record.baseline_from:
        stored = record.baseline_from.facts
        out += [
            f"the stored baseline differs: {d}"
            for d in differences(stored, facts(record), only_prompts=list(record.prompt_types))
        ]
    for candidate, per in outputs.items():
        for name, entry in per.items():
            if entry.status != "identical":
                out.append(f"{candidate}/{name} output {entry.text()}")
    if checks is not None and checks.unreliable:
        out.append(f"drift check (ABA): {checks.text()}")
    for candidate, per in verdicts.items():
        for name, v in per.items():
            if v.acceptance_note:
                out.append(f"{candidate}/{name} acceptance: {v.acceptance_note}")
    return out
