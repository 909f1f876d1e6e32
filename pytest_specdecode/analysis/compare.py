"""One path from measurements to verdicts. Every consumer compares two arms here.

The pytest verdict tests, the terminal table, summary.md, the HTML report, the drift check, a
reused baseline and `specdecode-compare` all call `compare_arms`, on a live record or a stored
one alike, so the same samples always give the same verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..measure.server_metrics import Acceptance, combine
from ..record.schema import Measurement, Phase
from .checks import acceptance_cross_check
from .stats import Comparison, Verdict, compare_family

_PRECEDENCE = (Verdict.REGRESSED, Verdict.INSUFFICIENT, Verdict.IMPROVED, Verdict.NO_DIFFERENCE)


@dataclass(frozen=True)
class PromptTypeVerdict:
    """One prompt type: the candidate arm against the baseline arm, on throughput and TPOT."""

    prompt_type: str
    baseline: str  # arm names, as shown in tables
    candidate: str
    throughput: Comparison
    tpot: Comparison | None  # None when a side has no TPOT (one-token outputs)
    acceptance: Acceptance  # the candidate's, over this prompt type
    acceptance_note: str | None  # where the server's and the client's counts disagree

    @property
    def comparisons(self) -> list[Comparison]:
        return [self.throughput] + ([self.tpot] if self.tpot is not None else [])

    @property
    def verdict(self) -> Verdict:
        """Regressed on either metric wins; then no verdict possible; then improved."""
        found = {c.verdict for c in self.comparisons}
        return next(v for v in _PRECEDENCE if v in found or v is Verdict.NO_DIFFERENCE)

    @property
    def regressed(self) -> bool:
        return self.verdict is Verdict.REGRESSED

    @property
    def insufficient(self) -> bool:
        return self.verdict is Verdict.INSUFFICIENT

    @property
    def reason(self) -> str:
        """Why: the reason of the comparison that decided the verdict."""
        deciding = next((c for c in self.comparisons if c.verdict is self.verdict), None)
        return (deciding or self.throughput).reason

    def to_json(self) -> dict[str, Any]:
        return {
            "prompt_type": self.prompt_type,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "verdict": self.verdict.value,
            "reason": self.reason,
            "throughput": self.throughput.to_dict(),
            "tpot": self.tpot.to_dict() if self.tpot is not None else None,
            "acceptance": self.acceptance.to_dict(),
            "acceptance_note": self.acceptance_note,
        }


def arm_measurements(phases: Sequence[Phase], prompt_type: str) -> list[Measurement]:
    return [p.measurements[prompt_type] for p in phases if prompt_type in p.measurements]


def compared_prompt_types(baseline: Sequence[Phase], candidate: Sequence[Phase]) -> list[str]:
    """Prompt types with measured requests on both sides, in the candidate's order."""
    names: list[str] = []
    for phase in candidate:
        for name in phase.measurements:
            if name not in names and all(
                _values(arm_measurements(side, name), "tokens_per_s")
                for side in (baseline, candidate)
            ):
                names.append(name)
    return names


def compare_arms(
    baseline: Sequence[Phase],
    candidate: Sequence[Phase],
    *,
    alpha: float,
    min_effect: float,
    num_speculative_tokens: int | None = None,
    labels: tuple[str, str] | None = None,
) -> dict[str, PromptTypeVerdict]:
    """Per prompt type, Holm-corrected across the prompt types for each metric.

    `labels` name the two sides in tables (default: their arms).
    """
    if not baseline or not candidate:
        return {}
    base_label, cand_label = labels or (baseline[0].arm, candidate[0].arm)
    names = compared_prompt_types(baseline, candidate)
    samples = {
        metric: {
            name: (
                _values(arm_measurements(baseline, name), metric),
                _values(arm_measurements(candidate, name), metric),
            )
            for name in names
        }
        for metric in ("tokens_per_s", "tpot_ms")
    }
    tput = compare_family(
        samples["tokens_per_s"],
        metric="throughput",
        higher_is_better=True,
        alpha=alpha,
        min_effect=min_effect,
    )
    tpot = compare_family(
        {name: pair for name, pair in samples["tpot_ms"].items() if pair[0] and pair[1]},
        metric="tpot",
        higher_is_better=False,
        alpha=alpha,
        min_effect=min_effect,
    )
    out = {}
    for name in names:
        measured = arm_measurements(candidate, name)
        acceptance = combine([m.acceptance for m in measured])
        out[name] = PromptTypeVerdict(
            prompt_type=name,
            baseline=base_label,
            candidate=cand_label,
            throughput=tput[name],
            tpot=tpot.get(name),
            acceptance=acceptance,
            acceptance_note=_cross_check(measured, acceptance, num_speculative_tokens),
        )
    return out


def _values(measurements: Sequence[Measurement], metric: str) -> list[float]:
    return [v for m in measurements for v in getattr(m, metric)]


def _cross_check(
    measured: Sequence[Measurement], acceptance: Acceptance, k: int | None
) -> str | None:
    """The acceptance cross-check of each start of the arm; the first disagreement."""
    for m in measured:
        note = acceptance_cross_check(
            m.acceptance,
            m.traffic,
            requests=len(m.samples),
            client_accepted=m.client_accepted,
            num_speculative_tokens=k,
        )
        if note:
            return note
    return None
