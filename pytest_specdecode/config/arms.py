"""The experiment's arms, the order of their server starts, and the names of their measurements.

An arm is what one or more server starts serve: the original (`baseline`), a candidate
(`--spec-config`), the original again as a candidate (`baseline-again`, an A/A run), or the
original measured once more after the candidates (`baseline-after`, the ABA drift check).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .load import LoadLevel

BASELINE = "baseline"
BASELINE_AFTER = "baseline-after"  # the original measured again, last (the ABA drift check)
AA_ARM = "baseline-again"  # the original's configuration started again, as a candidate
ORIGINAL_ARMS = (BASELINE, AA_ARM, BASELINE_AFTER)  # every start of the original configuration


def design_order(candidates: Sequence[str], repeats: int) -> list[tuple[str, str]]:
    """The server starts in order, each (phase name, arm): balanced, A B C, C B A, A B C, ...

    A drift in time then weighs on every arm alike. The first start of an arm is named after
    it; the next ones get "#2", "#3".
    """
    arms = [BASELINE, *candidates]
    seen: dict[str, int] = {}
    out = []
    for block in range(repeats):
        for arm in arms if block % 2 == 0 else arms[::-1]:
            seen[arm] = seen.get(arm, 0) + 1
            out.append((arm if seen[arm] == 1 else f"{arm}#{seen[arm]}", arm))
    return out


def together_order(
    candidates: Sequence[str], repeats: int, at_once: int = 1
) -> list[tuple[str, str]]:
    """`--spec-arms together`: each candidate's start beside a baseline start, as consecutive
    (phase name, arm) entries, baseline first; candidates A B C, C B A, ... `at_once`: up to
    that many candidates beside one baseline start (`[run] beside`)."""
    seen: dict[str, int] = {}
    out = []
    for block in range(repeats):
        ordered = list(candidates if block % 2 == 0 else candidates[::-1])
        for first in range(0, len(ordered), max(1, at_once)):
            for name in (BASELINE, *ordered[first : first + max(1, at_once)]):
                seen[name] = seen.get(name, 0) + 1
                out.append((name if seen[name] == 1 else f"{name}#{seen[name]}", name))
    return out


def planned_order(
    arms: Sequence[str], repeats: int, *, together: bool, at_once: int = 1
) -> list[tuple[str, str]]:
    """The design's server starts as the run takes them: side by side (`together_order`, up to
    `at_once` candidates beside each baseline start) or one at a time (`design_order`)."""
    return together_order(arms, repeats, at_once) if together else design_order(arms, repeats)


def together_groups(order: Sequence[tuple[str, str]]) -> dict[str, list[tuple[str, str]]]:
    """Side by side: each baseline start's entry, and the candidates' entries after it, served
    at once with it (the run's groups: measure/experiment/arms.py, and the plan's)."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for name, arm in order:
        if arm == BASELINE:
            current = out.setdefault(name, [])
        elif current is not None:
            current.append((name, arm))
    return {name: group for name, group in out.items() if group}


def cell_key(prompt_type: str, level: LoadLevel, *, several: bool) -> str:
    """A measurement's name in a phase: the prompt type, and `@level` when a run measures
    several levels ("coding", or "coding@c4"). Verdicts and tests are keyed by it."""
    return f"{prompt_type}@{level.label}" if several else prompt_type


def design_keys(prompt_types: Iterable[str], levels: Sequence[LoadLevel]) -> list[str]:
    """Every measurement key of a design, prompt type by prompt type, level by level."""
    several = len(levels) > 1
    return [cell_key(name, level, several=several) for name in prompt_types for level in levels]
