"""The standard experiment as tests: thresholds per arm and prompt type, and the hypothesis.

The plugin collects this module itself whenever a candidate is given (`--spec-config`), under
the node id `specdecode`, marked `specdecode`: `pytest --spec-config ngram -m specdecode` runs
only these. A project's own tests may use the same fixtures beside them.
"""

from __future__ import annotations

import pytest

from ..analysis.verdict.compare import PromptTypeVerdict
from ..config.arms import AA_ARM
from ..config.settings import PromptType
from ..record.measurement import Measurement
from ..record.schema import Phase
from ..report.rows import Row
from ..report.text import decided_by
from ..run.outcome import Undecided
from ..run.session import SpecDecodeSession

pytestmark = pytest.mark.specdecode


def test_throughput_threshold(
    specdecode_measurement: Measurement, specdecode_prompt_type: PromptType, specdecode_phase: Phase
) -> None:
    m = specdecode_measurement
    floor = specdecode_prompt_type.min_tokens_per_s
    if floor is None:
        pytest.skip("no min_tokens_per_s configured")
    assert m.median_tokens_per_s >= floor, (
        f"[{specdecode_phase.name}] {m.key}: median {m.median_tokens_per_s:.1f} tok/s "
        f"is below the threshold {floor:.1f} tok/s (samples: "
        f"{', '.join(f'{v:.1f}' for v in m.tokens_per_s)})"
    )


def test_tpot_threshold(
    specdecode_measurement: Measurement, specdecode_prompt_type: PromptType, specdecode_phase: Phase
) -> None:
    m = specdecode_measurement
    ceiling = specdecode_prompt_type.max_tpot_ms
    if ceiling is None:
        pytest.skip("no max_tpot_ms configured")
    assert m.median_tpot_ms <= ceiling, (
        f"[{specdecode_phase.name}] {m.key}: median TPOT {m.median_tpot_ms:.1f} ms "
        f"is above the threshold {ceiling:.1f} ms"
    )


def test_speculation_does_not_regress(
    specdecode_verdict: PromptTypeVerdict, specdecode_session: SpecDecodeSession
) -> None:
    """Passes on improved or equivalent; a regression fails the gate, and so does no verdict,
    reported as undecided (`run/outcome.py`)."""
    v = specdecode_verdict
    row = Row.of(v).sentence()
    decided = decided_by(v)  # the metric that decided it, with its interval, said first
    if v.candidate == AA_ARM:  # A/A: the original against itself; any difference is false
        assert v.passes, f"A/A false alarm: {row}"
        return
    name = specdecode_session.describe(v.candidate)
    if v.regressed:
        message = f"speculation {name} regressed on {v.prompt_type}, by {decided}: {row}"
        pytest.fail(message, pytrace=False)
    if v.undecided:
        where = f", {decided}" if decided else ""
        raise Undecided(f"no verdict for {name} ({v.verdict}{where}): {row}")


def test_crossover_does_not_regress(
    specdecode_session: SpecDecodeSession, specdecode_experiment: object
) -> None:
    """Across replicas (collected only there): each candidate's crossover verdict over the
    prompt set (analysis/replicas/crossover.py → `crossover_of`). A regression fails the gate; no
    verdict is undecided, as per prompt type on one host."""
    verdicts = getattr(specdecode_session, "crossover_verdicts", None)
    if verdicts is None:
        pytest.skip("no crossover: the target has no [[target.replicas]]")
    found, why = verdicts()
    if found is None:
        raise Undecided(f"no crossover verdict: {why}")
    entries = dict(found)
    said = "; ".join(f"{name} {_crossover_text(e)}" for name, e in entries.items())
    regressed = [name for name, e in entries.items() if e["verdict"] == "regressed"]
    if regressed:
        pytest.fail(
            f"speculation {', '.join(regressed)} regressed across replicas: {said}", pytrace=False
        )
    undecided = [
        name for name, e in entries.items() if e["verdict"] not in ("improved", "equivalent")
    ]
    if undecided:
        raise Undecided(f"no verdict across replicas for {', '.join(undecided)}: {said}")


def _crossover_text(entry: dict) -> str:
    metrics = [f"{m} {entry[m]['verdict']}" for m in ("throughput", "tpot") if m in entry]
    return f"{entry['verdict']} ({', '.join(metrics)})"


def test_baseline_did_not_drift(
    specdecode_session: SpecDecodeSession, specdecode_experiment: object
) -> None:
    """--spec-aba: the original, measured again last, must not have moved beyond its noise."""
    if not specdecode_session.config.getoption("spec_aba"):
        pytest.skip("no drift check: pass --spec-aba")
    drift = specdecode_session.drift()
    if drift is None:
        pytest.skip("no drift check: no candidate was measured")
    if drift.unreliable:
        pytest.fail(f"the run is unreliable: {drift.text()}", pytrace=False)


def test_break_even_map(
    specdecode_session: SpecDecodeSession, specdecode_experiment: object
) -> None:
    """--spec-break-even: every map server drafted, and vLLM accepted its drafts at the length
    it was asked for (within a quarter of a token), so the map measures what it says."""
    if not specdecode_session.settings.run.break_even:
        pytest.skip("no break-even map: pass --spec-break-even")
    found = specdecode_session.complete_design().break_even
    if found is None:
        pytest.fail("no break-even map: none of its servers was measured", pytrace=False)
    off = [
        f"{p.candidate} at {p.level}: asked {p.length:g} accepted per draft, measured "
        + ("nothing (no counters)" if p.measured_length is None else f"{p.measured_length:.2f}")
        for line in found.overall
        for p in line.points
        if p.measured_length is None or abs(p.measured_length - p.length) > LENGTH_TOLERANCE
    ]
    idle = [
        f"{p.candidate} at {p.level}" for line in found.overall for p in line.points
        if not p.drafts_per_step
    ]  # fmt: skip
    assert not off, "the map's servers did not accept as asked: " + "; ".join(off)
    assert not idle, "no drafts counted on " + ", ".join(idle)
    for line in found.overall:
        print(line.describe())


LENGTH_TOLERANCE = 0.25
