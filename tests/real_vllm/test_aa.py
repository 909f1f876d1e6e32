"""A/A on the real CPU vLLM: the original against itself, two starts per arm, never regressed.

Its figures (the spread between starts, the verdict) are recorded in docs/statistics.md.
"""

from __future__ import annotations

import json
import re

import pytest

from ..support.embedded import require_embedded, write_experiment


def test_aa_with_two_starts_per_arm_is_never_regressed(pytester: pytest.Pytester) -> None:
    require_embedded()
    exp = write_experiment(pytester, run={"samples": 5, "max_samples": 5, "repeats": 2})
    result = pytester.runpytest_subprocess(
        *exp.args("--spec-config", "baseline", "--spec-prompt-type", "coding", "-rA")
    )
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.OK, out + err
    # Four starts of the same configuration, in a balanced order.
    starts = re.findall(r"starting local vLLM process '(\S+)'", err)
    assert starts == ["original", "candidate-baseline-again", "candidate-baseline-again",
                      "original"], err  # fmt: skip
    assert exp.leftover_servers() == []
    data = exp.results()
    analysis = data["analysis"]
    verdict = analysis["verdicts"]["baseline-again"]["coding"]
    assert verdict["verdict"] not in ("regressed", "improved"), verdict
    measured = analysis["measured_restart_noise"]
    assert measured["throughput"]["measured"] and measured["throughput"]["df"] == 3
    t = verdict["throughput"]
    print(  # the figures for docs/statistics.md
        "A/A figures:",
        json.dumps(
            {
                "starts": [p["name"] for p in data["phases"].values()],
                "start_means_tok_s": {
                    p["name"]: p["measurements"]["coding"]["summary"]["median_tokens_per_s"]
                    for p in data["phases"].values()
                },
                "restart_noise_throughput": measured["throughput"]["sd"],
                "restart_noise_tpot": measured["tpot"]["sd"],
                "verdict": verdict["verdict"],
                "change": t["change"],
                "interval": t["ratio_ci"],
            }
        ),
    )
