"""A project's own test, beside the standard experiment (which the plugin adds by itself).

It uses the plugin's fixtures: here, a rule of this project's own, that speculation must not
make the first token much later. Run `pytest suites/ --spec-config ngram`; `-m specdecode` runs
only the standard experiment.
"""

from __future__ import annotations

import statistics

from pytest_specdecode.config.settings import PromptType
from pytest_specdecode.measure.experiment import Experiment
from pytest_specdecode.record.schema import Phase

MAX_TTFT_RATIO = 1.5


def test_speculation_keeps_the_first_token_prompt(
    specdecode_experiment: Experiment,
    specdecode_candidate: Phase,
    specdecode_prompt_type: PromptType,
) -> None:
    name = specdecode_prompt_type.name
    baseline = specdecode_experiment.arm("baseline").measurements[name]
    candidate = specdecode_candidate.measurements[name]
    before = statistics.median(s.ttft_s for s in baseline.samples)
    after = statistics.median(s.ttft_s for s in candidate.samples)
    assert after <= MAX_TTFT_RATIO * before, (
        f"{specdecode_candidate.name} on {name}: median TTFT {after * 1000:.0f} ms against "
        f"{before * 1000:.0f} ms for the baseline (at most {MAX_TTFT_RATIO}x)"
    )
