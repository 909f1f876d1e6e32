"""Adaptive samples against a fixed design, by simulation over the real analysis code.

Requests are cheap, server starts are not: keep sending requests only until each start's mean
is pinned down (measure/experiment.py `pinned`). This benchmark compares that rule (6 to 16
requests per prompt type and start) with a fixed 16, for the same decisions: the share of runs
that got the right verdict on every prompt type's regression or improvement, the false alarms,
and the requests used. Run from the repository root:

    .venv/bin/python -m benchmarks.adaptive_samples [--runs 300]
"""

from __future__ import annotations

import argparse
import dataclasses

from pytest_specdecode.analysis.stats import RestartNoise
from tests.support.simulate import Scenario, rates

MIX = (0.015, 0.03, 0.05, 0.10)  # within-start spread of the four prompt types (log scale)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    args = parser.parse_args()
    print(f"{'restart noise':>13} {'effect':>7} {'design':>9} {'right':>6} {'false':>6} "
          f"{'requests':>9}")  # fmt: skip
    totals = {"fixed": 0.0, "adaptive": 0.0}
    for noise_sd in (0.01, 0.02, 0.046):
        noise = RestartNoise(noise_sd, 20.0, "simulated A/A runs")
        for effect in (0.0, -0.10, 0.10):
            base = Scenario(effect=effect, start_sd=noise_sd, noise=noise, request_sd=MIX)
            for name, design in (
                ("fixed", dataclasses.replace(base, samples=16, max_samples=None)),
                ("adaptive", dataclasses.replace(base, samples=6, max_samples=16)),
            ):
                r = rates(design, runs=args.runs, seed=7)
                right = r.regressed if effect < 0 else r.improved if effect > 0 else float("nan")
                false = (
                    r.improved
                    if effect < 0
                    else r.regressed
                    if effect > 0
                    else max(r.regressed, r.improved)
                )
                totals[name] += r.requests
                print(f"{noise_sd:>13.1%} {effect:>+7.0%} {name:>9} {right:>6.2f} {false:>6.3f} "
                      f"{r.requests:>9.1f}")  # fmt: skip
    share = totals["adaptive"] / totals["fixed"]
    print(f"adaptive used {share:.0%} of the fixed design's requests over these scenarios")


if __name__ == "__main__":
    main()
