"""The one row model every renderer reads (terminal, Markdown, HTML, plots, specdecode-compare),
the run's headline, and the list of checks a reviewer should see."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ..analysis.run import RunAnalysis
from ..analysis.variance.spending import look_slots
from ..analysis.variance.time_drift import drift_text
from ..analysis.verdict.compare import PromptTypeVerdict, start_prompts
from ..analysis.verdict.stats import Verdict
from ..config.arms import BASELINE
from ..record.counters import ACCEPTED_PER_DRAFT
from ..record.drafter_check import HEALTHY
from ..record.measurement import SequentialLooks
from ..record.schema import RunRecord
from .text import finite, fmt_num, fmt_p, fmt_pct, metric_change, noise_text, verdict_text

TABLE_HEADER = (
    "Prompt",
    "Baseline tok/s",
    "Candidate tok/s",
    "Change",
    "TPOT baseline → candidate",
    "p",
    "Verdict",
)


@dataclass(frozen=True)
class Row:
    """One prompt type of one candidate, a row of the results table."""

    candidate: str
    prompt_type: str
    verdict: str
    reason: str
    baseline_tps: float
    candidate_tps: float
    change: float
    ratio_ci: tuple[float, float]
    p: float
    tpot_baseline: float | None
    tpot_candidate: float | None
    tpot_change: float | None
    tpot_p: float | None
    accepted_per_draft: float | None  # vLLM's mean acceptance length (ACCEPTED_PER_DRAFT)
    draft_acceptance: float | None
    per_position: tuple[float, ...]
    note: str | None  # the acceptance cross-check's disagreement
    verdict_text: str = ""  # the verdict and the metric that decided it, with its interval

    @classmethod
    def of(cls, v: PromptTypeVerdict) -> Row:
        t, p, acc = v.throughput, v.tpot, v.acceptance
        return cls(
            candidate=v.candidate,
            prompt_type=v.prompt_type,
            verdict=v.verdict.value,
            reason=v.reason,
            baseline_tps=t.baseline_center,
            candidate_tps=t.candidate_center,
            change=t.change,
            ratio_ci=t.ratio_ci,
            p=t.p_adjusted,
            tpot_baseline=p.baseline_center if p else None,
            tpot_candidate=p.candidate_center if p else None,
            tpot_change=p.change if p else None,
            tpot_p=p.p_adjusted if p else None,
            accepted_per_draft=acc.mean_acceptance_length if acc.present else None,
            draft_acceptance=acc.draft_acceptance_rate if acc.present else None,
            per_position=tuple(acc.per_position_rates),
            note=v.acceptance_note,
            verdict_text=verdict_text(v),
        )

    @property
    def change_text(self) -> str:
        low, high = self.ratio_ci
        ci = f" [{low - 1:+.1%}, {high - 1:+.1%}]" if finite(low) and finite(high) else ""
        return fmt_pct(self.change) + ci

    @property
    def tpot_text(self) -> str:
        return (
            f"{fmt_num(self.tpot_baseline)} → {fmt_num(self.tpot_candidate)} ms "
            f"({fmt_pct(self.tpot_change)}, p {fmt_p(self.tpot_p)})"
        )

    def cells(self) -> tuple[str, ...]:
        """The seed-style table's cells, in TABLE_HEADER's order."""
        return (
            self.prompt_type,
            fmt_num(self.baseline_tps),
            fmt_num(self.candidate_tps),
            self.change_text,
            self.tpot_text,
            fmt_p(self.p),
            self.verdict_text or self.verdict,
        )

    def sentence(self) -> str:
        """The row as a sentence, for a test's failure message."""
        return (
            f"{self.prompt_type}: {fmt_num(self.baseline_tps)} -> {fmt_num(self.candidate_tps)} "
            f"tok/s ({self.change_text}, p_adj={fmt_p(self.p)}); TPOT {self.tpot_text}; "
            f"{ACCEPTED_PER_DRAFT} {fmt_num(self.accepted_per_draft, '.2f')}; "
            f"verdict: {self.verdict_text or self.verdict}"
        )


def rows(analysis: RunAnalysis, candidate: str | None = None) -> list[Row]:
    names = [candidate] if candidate else list(analysis.verdicts)
    return [Row.of(v) for name in names for v in analysis.verdicts.get(name, {}).values()]


def stop_text(looks: SequentialLooks) -> str:
    """Where a cell served side by side stopped under the stop rule, and why: "decided at look
    2 of 4 (24 of 48 slots)", "all slots run (48): not decided at an earlier look", or where
    it ended before its last look (a run cut short)."""
    every = look_slots(looks.planned)
    last = looks.looks[-1] if looks.looks else 0
    if looks.stopped and last:
        k = every.index(last) + 1 if last in every else len(looks.looks)
        return f"decided at look {k} of {len(every)} ({last} of {looks.planned} slots)"
    if last >= looks.planned:
        return f"all slots run ({looks.planned}): not decided at an earlier look"
    return f"ended at look {len(looks.looks)} of {len(every)} ({last} of {looks.planned} slots)"


def stops(record: RunRecord, candidate: str) -> list[str]:
    """Per prompt type (and level), where the candidate's cells stopped under the stop rule
    (analysis/verdict/sequential.py), and why; empty where no rule watched them."""
    out = []
    for phase in record.arm_phases(candidate):
        for m in phase.measurements.values():
            if m.sequential is not None:
                levels = len({x.level for x in phase.measurements.values()})
                name = m.prompt_type if levels <= 1 else m.key
                out.append(f"{name} {stop_text(m.sequential)}")
    return out


def undecided(analysis: RunAnalysis, record: RunRecord | None = None) -> list[str]:
    """One line per comparison left undecided: where its interval lies, and what would
    decide it (the reason's last words), with its minutes at this run's pace where known."""
    out = []
    for name, per in analysis.verdicts.items():
        pace = pair_minutes(record, name) if record is not None else None
        for key, v in per.items():
            if not v.undecided:
                continue
            where = "".join(f", {metric_change(c)}" for c in v.deciding)
            why = v.reason.split("; ", 1)[1] if "; " in v.reason else v.reason
            starts = re.search(r"--spec-repeats (\d+)", why)
            if starts and pace:
                minutes = int(starts.group(1)) * pace
                why += f"; about {minutes:.0f} min at this run's pace ({pace:.1f} min a pair)"
            out.append(f"Not decided: {name} on {key} ({v.verdict.value}{where}): {why}")
    return out


def pair_minutes(record: RunRecord, candidate: str) -> float | None:
    """Minutes for one start of the original and one of `candidate`, as this run's first took:
    from start to serving, then the window (first request sent to last answered). Side by side
    the two windows overlap."""
    startups, spans, together = 0.0, [], False
    for arm in (BASELINE, candidate):
        phases = [p for p in record.arm_phases(arm) if not p.reused_from]
        samples = [s for m in phases[0].measurements.values() for s in m.samples] if phases else []
        if not samples:
            return None
        startups += phases[0].startup_s or 0.0
        spans.append(
            max(s.started_at + s.e2e_s for s in samples) - min(s.started_at for s in samples)
        )
        together = together or phases[0].together_with is not None
    return (startups + (max(spans) if together else sum(spans))) / 60


def headline(analysis: RunAnalysis) -> str:
    """One sentence: what the run found, and whether to trust it."""
    parts: list[str] = []
    for name in analysis.verdicts:
        found = rows(analysis, name)
        by: dict[str, list[str]] = {}
        for r in found:
            by.setdefault(r.verdict, []).append(r.prompt_type)
        said = [
            f"{verdict} on {_which(names, len(found))}"
            for verdict, names in by.items()
            if verdict != Verdict.EQUIVALENT.value or len(by) == 1
        ]
        if not said and found:
            common = Counter(r.verdict for r in found).most_common(1)[0][0]
            said = [f"{common} on {_which(by[common], len(found))}"]
        parts.append(f"{name}: " + "; ".join(said))
    result = {
        Verdict.REGRESSED.value: "Regression",
        Verdict.INSUFFICIENT.value: "No verdict: too few samples",
        Verdict.INCONCLUSIVE.value: "Inconclusive: no regression shown, none ruled out",
        Verdict.IMPROVED.value: "Improvement, no regression",
        Verdict.EQUIVALENT.value: "Equivalent within the margin",
        Verdict.CONTAMINATED.value: "No verdict: other clients used the server",
        "not measured": "No candidate was measured",
    }[analysis.outcome]
    if analysis.drift is not None and analysis.drift.unreliable:
        result = "UNRELIABLE (the baseline drifted during the run). " + result
    return result + (". " + ". ".join(parts) if parts else "")


def _which(names: Sequence[str], total: int) -> str:
    if len(names) == 1:
        return names[0]
    if len(names) == total:
        return f"all {total} prompt types"
    return f"{len(names)} of {total} prompt types ({', '.join(names)})"


@dataclass(frozen=True)
class Check:
    text: str
    warn: bool


def checks(record: RunRecord, analysis: RunAnalysis) -> list[Check]:
    """The checks beside the verdicts, in the order a reviewer reads them."""
    out = [Check(w, True) for w in analysis.warnings]
    out += [  # a start that died before serving, and the second start measured in its place
        Check(p.died_start.describe(p.name, p.startup_s), True)
        for p in record.phases.values()
        if p.died_start is not None
    ]
    out += [  # a drafter's first requests, judged before its timed windows (a stop: a warning)
        Check(
            f"Drafter check, {c.start} ({c.requests} requests before its timed windows): "
            f"{c.verdict}: {c.text}",
            False,
        )
        for c in record.drafter_checks.values()
        if c.verdict == HEALTHY
    ]
    restore = record.restore
    if restore is not None and (restore.errors or restore.failed):
        out.append(Check(f"restore: {restore.describe()}", True))  # after the analysis: its own
    for candidate, per in analysis.equivalence.items():
        out += [
            Check(f"Output, {candidate}/{name}: {e.text()}", False)
            for name, e in per.items()
            if e.status == "identical"
        ]
    if analysis.drift is not None and not analysis.drift.unreliable:
        out.append(Check(f"Drift (ABA): {analysis.drift.text()}", False))
    out += [Check(text, False) for text in _prompt_coverage(record, analysis)]
    if analysis.verdicts:
        for metric, noise in analysis.noise.items():
            out.append(Check(f"The intervals' restart noise, {metric}: {noise_text(noise)}", False))
    for metric, noise in analysis.measured_noise.items():
        drift = analysis.time_drift.get(metric)
        beside = f" (start effects); {drift_text(drift)}" if drift else ""
        out.append(
            Check(
                f"Restart noise measured by this run, {metric}: {noise_text(noise)}{beside}",
                False,
            )
        )
    for metric, bias in analysis.position_bias.items():
        out.append(Check(f"Position bias side by side, {metric}: {bias.text()}", False))
    if record.baseline_from:
        out.append(Check(f"Baseline reused from {record.baseline_from.path}", False))
    if restore is not None and not (restore.errors or restore.failed):
        out.append(Check(f"Restore: {restore.describe()}", False))
    return out


def _prompt_coverage(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    """Where the two arms timed different prompts (an adaptive stop): which prompts the
    candidate's figure covers, for it is its level on the baseline's prompts."""
    out = []
    base = record.arm_phases(BASELINE)
    for candidate, per in analysis.verdicts.items():
        for key in per:
            prompts = [
                {i for start in start_prompts(arm, key, "tokens_per_s") for i in start}
                for arm in (base, record.arm_phases(candidate))
            ]
            if None in prompts[0] | prompts[1] or prompts[0] == prompts[1]:
                continue
            shared = prompts[0] & prompts[1]
            out.append(
                f"Figures, {candidate}/{key}: on the {len(shared)} prompts both arms timed "
                f"({candidate} timed {len(prompts[1])}, the baseline {len(prompts[0])}): the "
                "candidate's figure is its level on the baseline's prompts"
            )
    return out
