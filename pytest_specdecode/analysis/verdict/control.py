"""--spec-control: a candidate's change split in three, each through `compare_arms`.

The control arm is the original's configuration started with the candidate's side changes
(analysis/verdict/side_changes.py). Then, per prompt type:
- the flag as the operator would turn it on: baseline → candidate (the verdicts' own figure,
  the one the gate decides on);
- speculation itself: control → candidate;
- the side changes: baseline → control.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...config.arms import BASELINE
from ...record.schema import Phase, RunRecord
from .compare import PromptTypeVerdict, compare_arms
from .side_changes import control_name, side_changes
from .stats import Comparison, RestartNoise

PARTS = (
    ("flag", "the flag as turned on"),
    ("speculation", "speculation itself"),
    ("side", "the side changes"),
)


@dataclass(frozen=True)
class ControlSplit:
    """One candidate's change, split by its control arm, per prompt type."""

    candidate: str
    control: str
    added: str  # what the control added to the original's configuration
    flag: Mapping[str, PromptTypeVerdict]  # baseline → candidate
    speculation: Mapping[str, PromptTypeVerdict]  # control → candidate
    side: Mapping[str, PromptTypeVerdict]  # baseline → control
    checked: str = ""  # what the control's own log says it ran with, and what it did not confirm

    @property
    def keys(self) -> list[str]:
        return [k for k in self.flag if k in self.speculation and k in self.side]

    def part(self, name: str, key: str) -> Comparison:
        """The throughput comparison of one part ("flag", "speculation", "side") on one key."""
        verdicts: Mapping[str, PromptTypeVerdict] = getattr(self, name)
        return verdicts[key].throughput

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "control": self.control,
            "added": self.added,
            "checked": self.checked,
            "parts": {
                name: {k: v.to_json() for k, v in getattr(self, name).items()} for name, _ in PARTS
            },
        }


def control_splits(
    record: RunRecord,
    verdicts: Mapping[str, Mapping[str, PromptTypeVerdict]],
    *,
    noise: dict[str, RestartNoise],
    kin: Sequence[Phase] = (),
) -> dict[str, ControlSplit]:
    """Per candidate that has a measured control arm: its change in three."""
    out = {}
    baseline = record.arm_phases(BASELINE)
    for candidate, flag in verdicts.items():
        name = control_name(candidate)
        control = [p for p in record.arm_phases(name) if p.control_of == candidate]
        if not control or not flag:
            continue
        mine = record.arm_phases(candidate)
        first = control[0]
        env = [f"{key}={value}" for key, value in sorted(first.env.items())]
        added = " ".join([*env, *first.extra_args])
        out[candidate] = ControlSplit(
            candidate=candidate,
            control=name,
            added=added or "nothing (no side change to reproduce)",
            flag=flag,
            speculation=_compare(record, control, mine, (name, candidate), noise, kin),
            side=_compare(record, baseline, control, (BASELINE, name), noise, kin),
            checked=_checked(baseline, mine, first),
        )
    return out


def _checked(baseline: Sequence[Phase], candidate: Sequence[Phase], control: Phase) -> str:
    """What the control's own log says it ran with, and which of the candidate's side changes
    that log does not show (not logged, or otherwise): reproduced as asked, not confirmed."""
    engines = [baseline[0].engine, candidate[0].engine, control.engine] if baseline else []
    if not engines or any(e is None or not e.known for e in engines):
        return "its log did not tell what it ran with: no side change is confirmed"
    base, cand, mine = engines
    assert base is not None and cand is not None and mine is not None
    shown = {c.setting: c.candidate for c in side_changes(base, mine)}
    unconfirmed = [
        c.text()
        for c in side_changes(base, cand)
        if c.setting != "warning" and shown.get(c.setting) != c.candidate
    ]
    text = f"it ran with: {mine.describe()}"
    return text + (f"; not confirmed by its log: {'; '.join(unconfirmed)}" if unconfirmed else "")


def _compare(
    record: RunRecord,
    before: Sequence[Phase],
    after: Sequence[Phase],
    labels: tuple[str, str],
    noise: dict[str, RestartNoise],
    kin: Sequence[Phase],
) -> dict[str, PromptTypeVerdict]:
    spec = record.candidates.get(labels[1]) or {}
    k = spec.get("num_speculative_tokens")
    return compare_arms(
        before,
        after,
        alpha=record.run.alpha,
        min_effect=record.run.min_effect,
        noise=noise,
        num_speculative_tokens=int(k) if isinstance(k, int) else None,
        labels=labels,
        kin=kin,
    )
