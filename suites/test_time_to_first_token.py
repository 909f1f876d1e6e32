"""A project's own test, beside the standard experiment (which the plugin adds by itself).

It asks for the `specdecode` fixture: one candidate against the baseline on one prompt type at
one load level, the same object whatever the design (docs/fixtures.md). Here, a rule of this
project's own: speculation must not make the first token much later. Run
`pytest suites/ --spec-config ngram`; `-m specdecode` runs only the standard experiment.
"""

from __future__ import annotations

import statistics

from pytest_specdecode import SpecDecodeCase

MAX_TTFT_RATIO = 1.5


def test_speculation_keeps_the_first_token_prompt(specdecode: SpecDecodeCase) -> None:
    before = statistics.median(s.ttft_s for s in specdecode.baseline.samples)
    after = statistics.median(s.ttft_s for s in specdecode.speculative.samples)
    assert after <= MAX_TTFT_RATIO * before, (
        f"{specdecode.where}: median TTFT {after * 1000:.0f} ms against "
        f"{before * 1000:.0f} ms for the baseline (at most {MAX_TTFT_RATIO}x)"
    )
