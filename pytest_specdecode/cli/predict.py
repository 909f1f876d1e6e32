"""specdecode-predict: the n-gram grid from a stored run, on any machine (no vLLM needed)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..analysis.prediction.predict import RunPrediction, predict_run
from ..analysis.run import RunAnalysis, analyze, candidate_verdicts, max_num_seqs
from ..analysis.search.policy import SearchPlan, plan_search
from ..config.arms import BASELINE
from ..errors import ConfigError
from ..record.schema import RunRecord
from ..record.store import RESULTS_FILE, load_run, stored_runs
from ..report.sections.prediction import grid_lines, notes, prediction_rows
from ..report.sections.search import plan_lines


def prediction_lines(
    record: RunRecord, prediction: RunPrediction, *, top: int, analysis: RunAnalysis | None = None
) -> list[str]:
    """What specdecode-predict prints: the source, the candidates, predicted against measured
    (the run's one prediction per candidate and prompt type, as its report gives it), the grid
    per prompt type, the cost model and the recommendation."""
    versions = sorted({p.server_version for p in record.phases.values() if p.server_version})
    lines = [
        f"{record.target.model} on {record.target.host}, vLLM {', '.join(versions) or 'unknown'}",
        *(f"token ids, {name}: {how}" for name, how in prediction.token_ids.items()),
    ]
    if prediction.candidates:
        lines.append("candidates:")
        lines += [
            f"  {n.name} {json.dumps(dict(n.values), sort_keys=True)}: "
            + (f"effective {n.settings.label}" if n.settings else str(n.reason))
            for n in prediction.candidates.values()
        ]
    figures = analysis.figures if analysis is not None else {}
    ones = analysis.candidate_predictions if analysis is not None else []
    found = prediction_rows(record, prediction, figures, ones)
    if found:
        lines.append("predicted / measured (server counters), per prompt type:")
        for r in found:
            cells = r.cells()
            lines.append(
                f"  {cells[0]:<12} {cells[1]:<26} accepted per draft {cells[2]}, draft "
                f"acceptance {cells[3]}, {cells[4]} tokens per step, tok/s {cells[5]} / "
                f"{cells[6]}, in band {cells[7]}: {cells[8]}"
            )
            if r.status not in ("exact", "within bound"):
                lines.append(f"    {r.detail}")
    lines += grid_lines(prediction, top=top)
    lines += notes(prediction)
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdecode-predict",
        description="Replay vLLM's n-gram proposer over a stored run's baseline token ids: "
        "accepted per draft and tokens per step for every config of the grid (k 1..8, "
        "prompt_lookup_min/max 1..6), checked against the measured candidates, with predicted "
        "tok/s from a cost model fitted to them. Needs no vLLM.",
    )
    parser.add_argument("run", help="a stored run: results.json or its run folder")
    parser.add_argument("--top", type=int, default=5, help="best configs listed per prompt type")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    parser.add_argument(
        "--stored",
        metavar="DIR",
        default=None,
        help="where this host's stored runs are, for the band's coverage and the cost prior "
        "(default: the folder that holds the run's folder)",
    )
    args = parser.parse_args(argv)
    try:
        record = load_run(args.run)
    except ConfigError as exc:
        print(f"specdecode-predict: {exc}", file=sys.stderr)
        return 2
    # the run's own analysis: the same prediction, read from its map where it measured one
    analysis = analyze(record) if record.arm_phases(BASELINE) else None
    prediction = analysis.prediction if analysis and analysis.prediction else predict_run(record)
    plan = search_plan(record, Path(args.run), args.stored) if prediction.available else None
    if args.json:
        data = prediction.to_json()
        if plan is not None:
            data["search_plan"] = plan_json(plan)
        print(json.dumps(data, indent=1, default=str))
    else:
        lines = prediction_lines(record, prediction, top=args.top, analysis=analysis)
        if plan is not None:
            lines += plan_lines(plan)
        print("\n".join(lines))
    return 0 if prediction.available else 1


def search_plan(record: RunRecord, run: Path, stored: str | None) -> SearchPlan | None:
    """What `--spec-search ngram` would reload next from this run: coverage and prior from the
    stored runs of its host and model."""
    if not record.arm_phases(BASELINE):
        return None
    folder = (run.parent if run.name == RESULTS_FILE else run).resolve()
    where = Path(stored) if stored else folder.parent
    found = [
        (path.name, r)
        for path, r in stored_runs(where, host=record.target.host, model=record.target.model)
    ]
    verdicts = {c: candidate_verdicts(record, c) for c in record.measured_candidates}
    return plan_search(record, verdicts, found, name=folder.name, max_num_seqs=max_num_seqs(record))


def plan_json(plan: SearchPlan) -> dict[str, object]:
    step = plan.step
    return {
        "coverage": plan.coverage.to_json(),
        "prior": {
            level: {"runs": list(p.runs), "observations": len(p.points), "text": p.text}
            for level, p in plan.prior.items()
        },
        "next": (
            {
                "reload": step.values,
                "label": step.label,
                "kind": step.kind,
                "why": step.why,
                "predicted": {k: b.to_json() for k, b in step.predicted.items()},
            }
            if hasattr(step, "values")
            else {"stop": step.why}
        ),
    }


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
