"""The end of pytest's output: the results table (a row per candidate and prompt type), then
what to check."""

from __future__ import annotations

from pathlib import Path

from ..analysis.run import RunAnalysis
from ..config.arms import BASELINE
from ..record.counters import ACCEPTED_PER_DRAFT, ACCEPTED_PER_DRAFT_MEANS
from ..record.schema import RunRecord
from .rows import checks, headline, rows, undecided
from .sections import (
    acceptance,
    break_even,
    cut,
    levels,
    prediction,
    regime,
    search,
    shape,
    side_changes,
)
from .text import fmt_num, fmt_p, fmt_pct


def header(prompt_width: int = 12, candidate_width: int = 14) -> str:
    """The table's header, its first two columns as wide as their longest label."""
    return (
        f"{'prompt':<{prompt_width}} {'candidate':<{candidate_width}} {'base tok/s':>10} "
        f"{'cand tok/s':>10} {'change':>8} {'TPOT base→cand ms':>19} {'p_adj':>7} "
        f"{ACCEPTED_PER_DRAFT:>18}  verdict"
    )


HEADER = header()


def lines(record: RunRecord, analysis: RunAnalysis, *, files: dict[str, Path]) -> list[str]:
    """Empty when nothing was measured, unless the run was cut: then its banner first."""
    baseline = record.arm_phases(BASELINE)
    if not baseline and not record.failures:
        banner = cut.terminal_lines(record.cut)
        return [*banner, *(f"{name}: {path}" for name, path in files.items())] if banner else []
    out: list[str] = [*cut.terminal_lines(record.cut), *shape.terminal_lines(record)]
    out += search.answer_lines(analysis.search)
    found = rows(analysis)
    wide = max([12, *(len(r.prompt_type) for r in found)])  # e.g. structured@c32
    cand = max([14, *(len(name) for name in analysis.verdicts)])
    if baseline and not analysis.verdicts:
        width = max([12, *(len(name) for name in baseline[0].measurements)])
        out.append(f"{'prompt':<{width}} {'median tok/s':>12} {'median TPOT ms':>15}")
        for name, m in baseline[0].measurements.items():
            out.append(
                f"{name:<{width}} {fmt_num(m.median_tokens_per_s):>12} "
                f"{fmt_num(m.median_tpot_ms):>15}"
            )
    elif analysis.verdicts:
        out.append(header(wide, cand))
    for candidate in analysis.verdicts:
        for r in rows(analysis, candidate):
            tpot = f"{fmt_num(r.tpot_baseline):>8} → {fmt_num(r.tpot_candidate):<8}"
            out.append(
                f"{r.prompt_type:<{wide}} {candidate:<{cand}} {fmt_num(r.baseline_tps):>10} "
                f"{fmt_num(r.candidate_tps):>10} {fmt_pct(r.change):>8} {tpot} "
                f"{fmt_p(r.p):>7} {fmt_num(r.accepted_per_draft, '.2f'):>18}  {r.verdict_text}"
            )
        acc = record.arm_phases(candidate)[0].acceptance
        if acc.present and acc.per_position_rates:
            rates = ", ".join(f"{x:.2f}" for x in acc.per_position_rates)
            out.append(
                f"  {candidate}: per-position acceptance [{rates}], draft acceptance "
                f"{fmt_pct(acc.draft_acceptance_rate, sign=False)}"
            )
        out += side_changes.terminal_lines(analysis, candidate)
        if slowed := regime.mark(analysis, candidate):
            out.append(f"  {candidate}: {slowed}")
    if any(r.accepted_per_draft is not None for r in found):
        out.append(f"  {ACCEPTED_PER_DRAFT_MEANS}")
    if analysis.verdicts:
        out += [f"{cut.result_label(record)}: {headline(analysis)}", *undecided(analysis, record)]
    out += regime.terminal_lines(analysis)
    out += levels.terminal_lines(record, analysis)
    out += break_even.terminal_lines(analysis)
    out += search.terminal_lines(record, analysis.search)
    out += search.coverage_lines(analysis.search)
    out += prediction.terminal_lines(record, analysis)
    out += acceptance.terminal_lines(record, analysis)
    if record.restore:
        out.append(record.restore.describe())
    out += [
        f"warning: {c.text}" if c.warn else c.text
        for c in checks(record, analysis)
        if c.warn or c.text.startswith(("Drift", "Restart noise"))
    ]
    out += [f"{name}: {path}" for name, path in files.items()]
    return out
