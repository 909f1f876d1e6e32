"""A run's timing figures per window, beside their targets: a benchmark, not a test.

These used to be asserted in tests/real_vllm/test_prediction_real.py, where a loaded machine
could fail them by chance. They depend on the machine, so they are reported here as figures:

- the untimed token-id requests' cost, as a share of the timed window (issue 19's targets: 15%
  of a baseline's window, 30% of a candidate's, whose window can be several times shorter);
- each window's host environment, where the run recorded one (issue 30).

Run on any results.json of a run that recorded token ids (the prediction run's, for example):

    .venv/bin/python -m benchmarks.window_figures reports/<run>/results.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.record.store import load_run

TARGET_SHARE = {"baseline": 0.15, "candidate": 0.30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path, help="a run's results.json")
    args = parser.parse_args()
    record = load_run(args.results)
    print(f"{'window':<28} {'token ids':>10} {'timed':>8} {'share':>7} {'target':>7}  environment")
    over = 0
    for phase in record.phases.values():
        target = TARGET_SHARE["baseline" if phase.arm == BASELINE else "candidate"]
        for key, m in phase.measurements.items():
            ids, wall = m.token_ids, m.wall_s
            env = m.environment.describe() if m.environment else "not recorded"
            if ids is None or ids.recorded_s is None or not wall:
                print(f"{phase.name + ' ' + key:<28} {'-':>10} {'-':>8} {'-':>7} {'-':>7}  {env}")
                continue
            share = ids.recorded_s / wall
            over += share > target
            print(
                f"{phase.name + ' ' + key:<28} {ids.recorded_s:>9.2f}s {wall:>7.1f}s "
                f"{share:>7.1%} {target:>7.0%}  {env}"
            )
    print(f"{over} window(s) over their target share")


if __name__ == "__main__":
    main()
