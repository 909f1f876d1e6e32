"""The stop rule's calibration on simulated pairs: docs/statistics.md's "Stop when decided".

One cell served side by side (one pair of starts), 48 slots of 12 prompts sent four times;
each slot's log difference is the change, the pair's offset (two start effects), each
prompt's own speed-up about the change (centred: the change is the prompt set's mean), and
each side's request noise (analysis/verdict/sequential.py → `simulate_stop`). Each cell is
decided by `decide` through the stop rule (looks at 12, 24, 36, 48), by the fixed design's
quantile at every look (naive), or once at 48 (fixed), on the same cells (one seed). It prints:

1. false calls per direction at no change, margin 0, where each direction may err at
   alpha / m = 0.1 (countable in a thousand cells), and at the main job's alpha / m = 0.05 / 8;
2. where a cell with no change stops at the main job's level, at margins of 3% and 10%;
3. power per prompt type, the stop rule against the fixed design, at a true -10% and -20%
   (the main job's design: alpha 0.05 over 4 prompt types x 2 metrics, margin 3%), and the
   slots a -45% change sends;
4. what an early stop does to the printed change: per look where a call stopped, the mean
   printed change, the truth, and what the reason says a cell stopping there prints on average.

Run from the repository root (10 min 22 s on 2 cores shared with other work at the defaults,
215 s of CPU):

    .venv/bin/python -m benchmarks.sequential_stop [--cells 1000] [--null-cells 4000]
"""

from __future__ import annotations

import argparse
import math
import time
from collections import defaultdict
from dataclasses import replace

import numpy as np

from pytest_specdecode.analysis.verdict.sequential import Simulated, Stopped, simulate_stop
from pytest_specdecode.analysis.verdict.stats import Verdict

MODELS = {
    "many slots, little offset (0.5%, 10% a request)": Simulated(
        offset_sd=0.005, slot_sd=0.1, speedup_sd=0.05
    ),
    "the H200's (offset 3.6%, 3 df; 8% a request; speed-ups 30%)": Simulated(
        offset_sd=0.036, slot_sd=0.08, speedup_sd=0.3
    ),
    "offsets known better (2.5%, 8 df; 8% a request; speed-ups 30%)": Simulated(
        offset_sd=0.025, slot_sd=0.08, speedup_sd=0.3, noise_df=8.0
    ),
    "noisy requests (1.5%, 8 df; 25% a request; speed-ups 30%)": Simulated(
        offset_sd=0.015, slot_sd=0.25, speedup_sd=0.3, noise_df=8.0
    ),
}
RULES = {
    "stop rule": {"sequential": True},
    "fixed quantile at every look": {"naive": True},
    "fixed design (48)": {"sequential": False},
}
MAIN = {"alpha": 0.05, "min_effect": 0.03, "family": 8}  # the main job's design


def run(model: Simulated, cells: int, how: dict[str, bool], **design: float) -> list[Stopped]:
    """`cells` cells of this model under one rule; the same seed, so the same cells per rule."""
    rng = np.random.default_rng(2026)
    estimate = how.get("sequential", False) and not how.get("naive", False)
    return [
        simulate_stop(rng, model, **design, **how, estimate=estimate)  # type: ignore[arg-type]
        for _ in range(cells)
    ]


def share(found: list[Stopped], verdict: Verdict) -> float:
    return sum(f.verdict is verdict for f in found) / len(found)


def false_calls(cells: int, null_cells: int) -> None:
    print(f"## 1. False calls at no change, margin 0 ({cells} cells a row)\n")
    print("Each direction may err at alpha/m = 0.2/2 = 0.1 (two standard errors: 0.019).\n")
    print("| pairs | rule | false regressed | false improved | slots, mean |")
    print("|---|---|---|---|---|")
    for name, model in MODELS.items():
        for rule, how in RULES.items():
            found = run(model, cells, how, alpha=0.2, min_effect=0.0, family=2)
            print(f"| {name} | {rule} | {share(found, Verdict.REGRESSED):.3f} | "
                  f"{share(found, Verdict.IMPROVED):.3f} | "
                  f"{np.mean([f.slots for f in found]):.1f} |")  # fmt: skip
    allowed = MAIN["alpha"] / MAIN["family"]
    se = 2.0 * math.sqrt(allowed * (1 - allowed) / null_cells)
    print(f"\nThe main job's level, each direction at alpha/m = 0.05/8 = {allowed:.5f} "
          f"({null_cells} cells a row; two standard errors: {se:.4f}), margin 0.\n")  # fmt: skip
    print("| pairs | rule | false regressed | false improved |")
    print("|---|---|---|---|")
    for name, model in MODELS.items():
        for rule in ("stop rule", "fixed design (48)"):
            found = run(model, null_cells, RULES[rule], **{**MAIN, "min_effect": 0.0})
            print(f"| {name} | {rule} | {share(found, Verdict.REGRESSED):.4f} | "
                  f"{share(found, Verdict.IMPROVED):.4f} |")  # fmt: skip


def no_change(cells: int) -> None:
    print(f"\n## 2. No change at the main job's level: where a cell stops ({cells} cells a row)\n")
    print("A cell with no change stops only on a decided verdict: equivalent (its interval inside "
          "the margin) or a false call.\n")  # fmt: skip
    print("| pairs | margin | slots, mean | equivalent | regressed or improved |")
    print("|---|---|---|---|---|")
    for name, model in MODELS.items():
        for margin in (0.03, 0.10):
            found = run(model, cells, RULES["stop rule"], **{**MAIN, "min_effect": margin})
            wrong = share(found, Verdict.REGRESSED) + share(found, Verdict.IMPROVED)
            print(f"| {name} | {margin:.0%} | {np.mean([f.slots for f in found]):.1f} | "
                  f"{share(found, Verdict.EQUIVALENT):.3f} | {wrong:.3f} |")  # fmt: skip


def power(cells: int) -> dict[tuple[str, float], list[Stopped]]:
    print(f"\n## 3. Power per prompt type: alpha 0.05 over 4 prompt types x 2 metrics, margin "
          f"3% ({cells} cells a row, the same cells for both rules)\n")  # fmt: skip
    print("| pairs | true change | fixed design | stop rule | difference (points) | "
          "slots, mean | most | past 24 |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    kept = {}
    for name, model in MODELS.items():
        for change in (-0.10, -0.20, -0.45):
            changed = replace(model, change=math.log1p(change))
            fixed = run(changed, cells, RULES["fixed design (48)"], **MAIN)
            stop = kept[name, change] = run(changed, cells, RULES["stop rule"], **MAIN)
            slots = [f.slots for f in stop]
            a, b = share(fixed, Verdict.REGRESSED), share(stop, Verdict.REGRESSED)
            print(f"| {name} | {change:+.0%} | {a:.3f} | {b:.3f} | {100 * (b - a):+.1f} | "
                  f"{np.mean(slots):.1f} | {max(slots)} | "
                  f"{np.mean(np.array(slots) > 24):.0%} |")  # fmt: skip
    return kept


def early(kept: dict[tuple[str, float], list[Stopped]]) -> None:
    print("\n## 4. What an early stop prints: the stop rule's calls, by the look that stopped "
          "them\n")  # fmt: skip
    print(
        "Points of change away from no change. 'overstates': the mean printed change less the "
        "true one. The reason of a call stopped early says what a cell stopping there prints on "
        "average were the change the printed one, and were it the interval's end nearer no "
        "change; 'at the printed', 'at the near end': how much further out than that change, "
        "their means over the calls.\n"
    )
    print("| pairs | true change | stopped at | calls | printed, mean | overstates | "
          "at the printed | at the near end |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for (name, change), found in kept.items():
        by: dict[int, list[Stopped]] = defaultdict(list)
        for f in found:
            if f.verdict is Verdict.REGRESSED and f.overstated is not None:
                by[f.slots].append(f)
        for slots in sorted(by):
            calls = by[slots]
            printed = float(np.mean([math.expm1(f.estimate) for f in calls]))
            notes = np.array([
                [away(f.estimate, f.overstated[0]), away(f.near, f.overstated[1])]  # type: ignore[index]
                for f in calls
            ])  # fmt: skip
            print(f"| {name} | {change:+.0%} | {slots} | {len(calls)} | {printed:+.1%} | "
                  f"{100 * (change - printed):.1f} | {100 * notes[:, 0].mean():.1f} | "
                  f"{100 * notes[:, 1].mean():.1f} |")  # fmt: skip


def away(change: float, over: float) -> float:
    """How much further from no change than `change` the note says a stop here prints (points
    of change; the log overstatement `over` on the change's own scale)."""
    return (
        abs(math.expm1(change - over)) - abs(math.expm1(change))
        if change < 0
        else (math.expm1(change + over) - math.expm1(change))
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--null-cells", type=int, default=4000)
    args = parser.parse_args()
    began = time.monotonic()
    false_calls(args.cells, args.null_cells)
    no_change(args.cells)
    early(power(args.cells))
    print(f"\n{time.monotonic() - began:.0f} s")


if __name__ == "__main__":
    main()
