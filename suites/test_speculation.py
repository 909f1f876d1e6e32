"""The experiment as tests: thresholds per phase and prompt type, and the no-regression hypothesis.

Run: pytest suites/ --spec-config ngram   (see the README for the options)
"""

from __future__ import annotations

import pytest

from pytest_specdecode.config.settings import Workload
from pytest_specdecode.measure.experiment import Experiment, PhaseResult


def test_throughput_threshold(specdecode_phase: PhaseResult, specdecode_workload: Workload) -> None:
    m = specdecode_phase.measurements[specdecode_workload.name]
    floor = specdecode_workload.min_tokens_per_s
    if floor is None:
        pytest.skip("no min_tokens_per_s configured")
    assert m.median_tokens_per_s >= floor, (
        f"[{specdecode_phase.name}] {m.workload}: median {m.median_tokens_per_s:.1f} tok/s "
        f"is below the threshold {floor:.1f} tok/s (samples: "
        f"{', '.join(f'{v:.1f}' for v in m.tokens_per_s)})"
    )


def test_tpot_threshold(specdecode_phase: PhaseResult, specdecode_workload: Workload) -> None:
    m = specdecode_phase.measurements[specdecode_workload.name]
    ceiling = specdecode_workload.max_tpot_ms
    if ceiling is None:
        pytest.skip("no max_tpot_ms configured")
    assert m.median_tpot_ms <= ceiling, (
        f"[{specdecode_phase.name}] {m.workload}: median TPOT {m.median_tpot_ms:.1f} ms "
        f"is above the threshold {ceiling:.1f} ms"
    )


def test_speculation_does_not_regress(
    specdecode_candidate: PhaseResult,
    specdecode_workload: Workload,
    specdecode_experiment: Experiment,
) -> None:
    verdict = specdecode_experiment.verdicts(specdecode_candidate.name)[specdecode_workload.name]
    if verdict.regressed:
        pytest.fail(
            f"speculation {specdecode_candidate.name} regressed: {verdict.row()}", pytrace=False
        )
    if verdict.insufficient:
        pytest.skip(f"no verdict for {specdecode_candidate.name}: {verdict.throughput.reason}")
