"""The adaptive stop rule through the experiment, on the scripted target: a start keeps sending
until its effect is pinned down to the larger of the restart noise and half the margin, then
stops, before the most it may send (analysis/verdict/adaptive.py, measure/experiment/arms.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from pytest_specdecode.analysis.verdict.adaptive import target_se
from pytest_specdecode.config.arms import BASELINE

from ....support.scripted_target import Script, ScriptedTarget, Speed, measure_arms
from ....support.synthetic import settings

LEAST, MOST = 4, 24
PROMPTS = [f"prompt number {i}" for i in range(40)]  # more than MOST: no prompt sent twice
SPREAD = 0.1  # each prompt 10% faster or slower than the middle, in turn (log scale)


def test_a_start_stops_once_its_spread_pins_it_down_to_the_larger_target(tmp_path: Path) -> None:
    tables = f"""
[prompt_types.spread]
prompts = {json.dumps(PROMPTS)}
[prompt_types.steady]
prompts = ["the same prompt every time"]
"""
    s = settings(
        tmp_path, prompt_types=(), candidates=(), samples=LEAST, max_samples=MOST, warmup=0,
        run_extra="min_effect = 0.03\nassumed_restart_noise = 0.05", extra=tables,
    )  # fmt: skip
    # The restart noise (0.05) is the larger target; half the margin (0.0148) the smaller.
    assert target_se(0.05, 0.03) == 0.05
    speeds = {
        p: Speed(ttft_s=0.0, gap_s=0.010 * math.exp(SPREAD if i % 2 else -SPREAD), tokens=9)
        for i, p in enumerate(PROMPTS)
    }
    target = ScriptedTarget(Script(speeds))
    rec = measure_arms(target, s, tmp_path, BASELINE).record
    ms = rec.phases[BASELINE].measurements

    # A prompt answered at one speed has no spread: the least, nothing more.
    assert len(ms["steady"].samples) == LEAST
    # A spread of 10% per request: SE = 0.1/√n reaches 0.05 after a few more than the least,
    # far before the most (0.0148, the smaller target, would need ~46 requests).
    spread = ms["spread"]
    n = len(spread.samples)
    assert LEAST < n < MOST
    logs = np.log([v for v, _ in spread.by_prompt("tokens_per_s")])
    se = [float(np.std(logs[:k], ddof=1)) / math.sqrt(k) for k in (n - 1, n)]
    assert se[0] > 0.05 >= se[1]  # it stopped at the first request that pinned it down
