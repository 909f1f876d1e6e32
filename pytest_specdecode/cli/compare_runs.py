"""specdecode-compare: run B against run A, phase by phase and prompt type by prompt type."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..analysis.verdict import noise
from ..analysis.verdict.checks import differences, facts
from ..analysis.verdict.compare import compare_arms
from ..analysis.verdict.stats import Verdict
from ..errors import ConfigError
from ..record.schema import RunRecord
from ..record.store import load_run
from ..report.rows import Row
from ..report.text import fmt_num, fmt_p, fmt_pct


def compare_runs(a: RunRecord, b: RunRecord, *, alpha: float, min_effect: float) -> list[Row]:
    """Each phase both runs measured: B's against A's, one family per phase (the intervals
    Bonferroni-adjusted, the rank guard Holm-adjusted)."""
    found: list[Row] = []
    restart_noise = noise.between_runs(a, b)  # every phase of B is another start than A's
    for name in [p for p in a.phases if p in b.phases]:
        verdicts = compare_arms(
            [a.phases[name]],
            [b.phases[name]],
            alpha=alpha,
            min_effect=min_effect,
            noise=restart_noise,
            labels=(name, name),
        )
        found += [Row.of(v) for v in verdicts.values()]
    return found


def comparison_lines(
    a: RunRecord, b: RunRecord, found: Sequence[Row], *, names: tuple[str, str], markdown: bool
) -> list[str]:
    fa, fb = facts(a), facts(b)
    diffs = differences(fa, fb, keys=("model", "host", "vllm_version", "gpus"))
    diffs += differences(fa, fb, keys=("prompts", "decoding", "git_commit", "suite_content"))
    for name in [c for c in a.candidates if c in b.candidates]:
        if a.candidates[name] != b.candidates[name]:
            diffs.append(f"the candidate {name!r} has another config")
    header = ("phase", "prompt", "A tok/s", "B tok/s", "change", "TPOT A → B ms", "p", "verdict")
    phase_w = max([14, *(len(r.candidate) for r in found)])  # as wide as the longest label
    prompt_w = max([12, *(len(r.prompt_type) for r in found)])
    if markdown:
        lines = [
            "## pytest-specdecode: run B against run A",
            "",
            f"- A: `{names[0]}`",
            f"- B: `{names[1]}`",
            *(f"- ⚠ {d}" for d in diffs),
            "",
            "| " + " | ".join(header) + " |",
            "|:--|:--|--:|--:|--:|:--|--:|:--|",
        ]
    else:
        lines = [f"A: {names[0]}", f"B: {names[1]}"]
        lines += [f"differs: {d}" for d in diffs] or ["no differences in model, host, vLLM, GPU"]
        lines.append(
            f"{'phase':<{phase_w}} {'prompt':<{prompt_w}} {'A tok/s':>8} {'B tok/s':>8} "
            f"{'change':>8} {'TPOT A → B ms':>17} {'p_adj':>7}  verdict"
        )
    for r in found:
        tpot = f"{fmt_num(r.tpot_baseline)} → {fmt_num(r.tpot_candidate)}"
        a_tps, b_tps, change = fmt_num(r.baseline_tps), fmt_num(r.candidate_tps), fmt_pct(r.change)
        if markdown:
            verdict = r.verdict_text
            cells = (r.candidate, r.prompt_type, a_tps, b_tps, change, tpot, fmt_p(r.p), verdict)
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(
                f"{r.candidate:<{phase_w}} {r.prompt_type:<{prompt_w}} {a_tps:>8} {b_tps:>8} "
                f"{change:>8} {tpot:>17} {fmt_p(r.p):>7}  {r.verdict_text}"
            )
    if not found:
        lines.append("no phase and prompt type was measured in both runs")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdecode-compare",
        description="Compare two stored pytest-specdecode runs: each phase both measured, "
        "prompt type by prompt type, run B against run A (the same analysis as a live run).",
    )
    parser.add_argument("a", help="run A: results.json or its run folder")
    parser.add_argument("b", help="run B: results.json or its run folder")
    parser.add_argument("--alpha", type=float, default=None, help="default: run A's alpha")
    parser.add_argument("--min-effect", type=float, default=None, help="default: run A's")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when run B is significantly and materially slower on any row",
    )
    parser.add_argument(
        "--fail-on-undecided",
        action="store_true",
        help="exit 1 when any row has no verdict (inconclusive, insufficient samples, "
        "contaminated) or nothing was compared: as the pytest gate, never green on nothing",
    )
    args = parser.parse_args(argv)
    try:
        a, b = load_run(args.a), load_run(args.b)
    except ConfigError as exc:
        print(f"specdecode-compare: {exc}", file=sys.stderr)
        return 2
    found = compare_runs(
        a,
        b,
        alpha=a.run.alpha if args.alpha is None else args.alpha,
        min_effect=a.run.min_effect if args.min_effect is None else args.min_effect,
    )
    for line in comparison_lines(a, b, found, names=(args.a, args.b), markdown=args.markdown):
        print(line)
    failing = gate_failures(
        found, regression=args.fail_on_regression, undecided=args.fail_on_undecided
    )
    for reason in failing:
        print(f"specdecode-compare: {reason}", file=sys.stderr)
    return 1 if failing else 0


UNDECIDED = {Verdict.INCONCLUSIVE.value, Verdict.INSUFFICIENT.value, Verdict.CONTAMINATED.value}


def gate_failures(found: Sequence[Row], *, regression: bool, undecided: bool) -> list[str]:
    """Why the comparison fails the gate asked for; [] when it passes."""
    out = []
    regressed = [r for r in found if r.verdict == Verdict.REGRESSED.value]
    if regression and regressed:
        out.append(
            "B regressed on " + ", ".join(f"{r.candidate}/{r.prompt_type}" for r in regressed)
        )
    if undecided:
        open_rows = [r for r in found if r.verdict in UNDECIDED]
        if open_rows:
            out.append(
                "no verdict on "
                + ", ".join(f"{r.candidate}/{r.prompt_type} ({r.verdict})" for r in open_rows)
            )
        elif not found:
            out.append("nothing was compared: no phase and prompt type is in both runs")
    return out


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
