"""The stop rule's calibration on simulated pairs: docs/statistics.md's "Stop when decided".

One cell served side by side (one pair of starts), 48 slots of 12 prompts sent four times;
each slot's log difference is the change, the pair's offset (two start effects), each
prompt's own speed-up about the change (centred: the change is the prompt set's mean), and
each side's request noise (analysis/verdict/sequential.py → `simulate_cell`). Each cell is
decided by `decide` through the stop rule (looks at 12, 24, 36, 48), by the fixed design's
quantile at every look (naive), or once at 48 (fixed). Run from the repository root:

    .venv/bin/python -m benchmarks.sequential_stop [--cells 1000]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from dataclasses import replace

import numpy as np

from pytest_specdecode.analysis.verdict.sequential import Simulated, simulate_cell
from pytest_specdecode.analysis.verdict.stats import Verdict

MODELS = {
    "many slots, little offset (0.5%, 10% a request)": Simulated(
        offset_sd=0.005, slot_sd=0.1, speedup_sd=0.05
    ),
    "the H200's (offset 3.6%, 3 df; 8% a request; speed-ups 30%)": Simulated(
        offset_sd=0.036, slot_sd=0.08, speedup_sd=0.3
    ),
}
RULES = {
    "stop rule": {"sequential": True},
    "fixed quantile at every look": {"naive": True},
    "fixed design (48)": {"sequential": False},
}


def run(model: Simulated, cells: int, how: dict[str, bool], **design: float) -> tuple:
    rng = np.random.default_rng(2026)
    found = [simulate_cell(rng, model, **design, **how) for _ in range(cells)]  # type: ignore[arg-type]
    calls = Counter(v for v, _ in found)
    return calls, float(np.mean([n for _, n in found])), max(n for _, n in found)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=1000)
    cells = parser.parse_args().cells
    print(f"No change, margin 0, alpha 0.2 over a family of 2: each direction may err at 0.1 "
          f"({cells} cells)\n")  # fmt: skip
    print("| pairs | rule | false regressed | false improved | slots, mean |")
    print("|---|---|---|---|---|")
    for name, model in MODELS.items():
        for rule, how in RULES.items():
            calls, mean, _ = run(model, cells, how, alpha=0.2, min_effect=0.0, family=2)
            print(f"| {name} | {rule} | {calls[Verdict.REGRESSED] / cells:.3f} | "
                  f"{calls[Verdict.IMPROVED] / cells:.3f} | {mean:.1f} |")  # fmt: skip
    print("\nThe main job's design: alpha 0.05 over 4 prompt types x 2 metrics, margin 3%\n")
    print("| pairs | true change | regressed | improved | equivalent | slots, mean | most |")
    print("|---|---|---|---|---|---|---|")
    for name, model in MODELS.items():
        for change in (0.0, -0.10, -0.45):
            calls, mean, most = run(
                replace(model, change=math.log1p(change)), cells, RULES["stop rule"],
                alpha=0.05, min_effect=0.03, family=8,
            )  # fmt: skip
            share = {v: calls[v] / cells for v in Verdict}
            print(f"| {name} | {change:+.0%} | {share[Verdict.REGRESSED]:.3f} | "
                  f"{share[Verdict.IMPROVED]:.3f} | {share[Verdict.EQUIVALENT]:.3f} | "
                  f"{mean:.1f} | {most} |")  # fmt: skip


if __name__ == "__main__":
    main()
