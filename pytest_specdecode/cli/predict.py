"""specdecode-predict: the n-gram grid from a stored run, on any machine (no vLLM needed)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from ..analysis.prediction import RunPrediction, predict_run
from ..errors import ConfigError
from ..record.schema import RunRecord
from ..record.store import load_run
from ..report.prediction import grid_lines, notes, prediction_rows


def prediction_lines(record: RunRecord, prediction: RunPrediction, *, top: int) -> list[str]:
    """What specdecode-predict prints: the source, the candidates, predicted against measured,
    the grid per prompt type, the cost model and the recommendation."""
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
    found = prediction_rows(record, prediction)
    if found:
        lines.append("predicted / measured (server counters), per prompt type:")
        for r in found:
            cells = r.cells()
            lines.append(
                f"  {cells[0]:<12} {cells[1]:<26} length {cells[2]}, draft acceptance "
                f"{cells[3]}, {cells[4]} tokens/step, tok/s {cells[5]} / {cells[6]}: {cells[7]}"
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
        "acceptance and tokens per step for every config of the grid (k 1..8, "
        "prompt_lookup_min/max 1..6), checked against the measured candidates, with predicted "
        "tok/s from a cost model fitted to them. Needs no vLLM.",
    )
    parser.add_argument("run", help="a stored run: results.json or its run folder")
    parser.add_argument("--top", type=int, default=5, help="best configs listed per prompt type")
    parser.add_argument("--json", action="store_true", help="print the prediction as JSON")
    args = parser.parse_args(argv)
    try:
        record = load_run(args.run)
    except ConfigError as exc:
        print(f"specdecode-predict: {exc}", file=sys.stderr)
        return 2
    prediction = predict_run(record)
    if args.json:
        print(json.dumps(prediction.to_json(), indent=1, default=str))
    else:
        print("\n".join(prediction_lines(record, prediction, top=args.top)))
    return 0 if prediction.available else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
