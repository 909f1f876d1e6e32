"""The paired design against the unpaired one at equal cost, by simulation over the real
analysis code (analysis/stats.py through analysis/compare.py).

A prompt set's prompts differ in speed (their lengths, their content); that spread is not noise
of the server. When every phase sends the same prompts in the same order, the analysis removes
each prompt's own level (`log value = start + prompt + residual`) and its rank guard aligns the
requests by prompt. This compares, for the same requests per start:

- paired: the same prompts in every phase, the analysis told which request sent which;
- ignored: the same requests, the analysis not told (what the tool did before pairing);
- unpaired: every request a new prompt from a large pool, so nothing pairs.

Run from the repository root:  .venv/bin/python -m benchmarks.paired_design [--runs 400]
"""

from __future__ import annotations

import argparse

from pytest_specdecode.analysis.stats import RestartNoise
from tests.support.simulate import Scenario, rates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=400)
    args = parser.parse_args()
    noise = RestartNoise(0.02, 20.0, "simulated A/A runs")
    print(f"{'prompt spread':>13} {'effect':>7} {'design':>9} {'regressed':>9} {'improved':>9}")
    for prompt_sd in (0.05, 0.15):
        for effect in (0.0, -0.05, -0.10):
            for pairing in ("paired", "ignored", "unpaired"):
                s = Scenario(
                    effect=effect,
                    start_sd=0.02,
                    noise=noise,
                    request_sd=0.03,
                    samples=8,
                    max_samples=None,
                    prompts=8,
                    prompt_sd=prompt_sd,
                    pairing=pairing,
                )
                r = rates(s, runs=args.runs, seed=5)
                print(
                    f"{prompt_sd:>13.0%} {effect:>+7.0%} {pairing:>9} {r.regressed:>9.3f} "
                    f"{r.improved:>9.3f}"
                )


if __name__ == "__main__":
    main()
