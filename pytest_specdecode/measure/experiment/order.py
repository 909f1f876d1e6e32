"""A start's requests in interleaved order: rounds of slots, drawn by a seeded shuffle.

A cell is one prompt type at one load level. A slot is one cell's next request at c1, or its
next burst of `concurrency` requests at cN (the level's own load, never mixed with another's);
an open-loop level's slot is a Poisson window of its least requests. A round holds one slot of
every cell still measuring, in a shuffled order, so that drift within a start spreads evenly
over the prompt types. With arms served together, each slot goes to every server in turn, never
two at once: for two, the first alternating from slot to slot; for more, a seeded order turned
by one each slot. Pure: measure/experiment/arms.py sends what it says.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from ...config.load import LoadLevel

__all__ = ["CellPlan", "RoundOrder", "order_seed", "slot_size"]


def order_seed(run_seed: int, phase: str) -> int:
    """The seed of one start's order: the run's seed with the start's name (stable over runs)."""
    return zlib.crc32(f"{run_seed}:{phase}".encode())


def slot_size(level: LoadLevel, least: int) -> int:
    """Requests in one slot: a burst of the level's concurrency (one request at c1), or an
    open-loop level's least requests (its Poisson arrivals need a window)."""
    if level.open_loop:
        return max(1, least)
    return level.concurrency or 1


@dataclass(frozen=True)
class CellPlan:
    """What one cell sends: its prompts of the request plan, at least `least`, at most `most`."""

    key: str
    indices: tuple[int, ...]  # the plan's prompt indices for the cell's level, in order
    least: int
    most: int
    step: int  # requests per slot

    def next_slot(self, sent: int) -> tuple[int, ...]:
        """The prompts of the slot after `sent` measured requests."""
        return self.indices[sent : min(sent + self.step, self.most)]

    def wants(self, sent: int, *, pinned: bool) -> bool:
        """Whether the cell sends another slot: below its least, or below its most while the
        adaptive stop rule has not pinned it."""
        return sent < self.least or (sent < self.most and not pinned)


class RoundOrder:
    """The seeded order of a start's rounds, and which arm goes first in each slot."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._rng = random.Random(seed)
        self._a_first = self._rng.random() < 0.5
        self._base: list[int] | None = None  # several servers: the seeded order, turned
        self._turned = 0

    def round(self, keys: Sequence[str]) -> list[str]:
        """One round: each key once, shuffled."""
        out = list(keys)
        self._rng.shuffle(out)
        return out

    def a_first(self) -> bool:
        """Whether the next slot goes to arm A before arm B: alternating, from a seeded start."""
        first = self._a_first
        self._a_first = not first
        return first

    def turn(self, servers: int) -> list[int]:
        """The order in which the next slot visits `servers` servers, each once: for two, A
        and B alternating (a_first); for more, a seeded order turned by one each slot, so that
        each server goes first, second, ... equally often."""
        if servers <= 2:
            return list(range(servers)) if servers < 2 or self.a_first() else [1, 0]
        if self._base is None or len(self._base) != servers:
            self._base = list(range(servers))
            self._rng.shuffle(self._base)
            self._turned = 0
        out = self._base[self._turned :] + self._base[: self._turned]
        self._turned = (self._turned + 1) % servers
        return out
