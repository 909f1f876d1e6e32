"""A dynamic-k table for vLLM: several k of one method, the best k per load level. Pure.

`recommend_dynamic_k` turns several k of one method, measured at several closed-loop levels,
into vLLM's `num_speculative_tokens_per_batch_size` table (vLLM 0.32: inclusive [start, end, k]
ranges, the first starting at 1, k >= 0; see config/specconfig.py for the checks). It reads the
per-level speedups of paying_load.py (`LevelPoint`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from ...config.specconfig import BATCH_TABLE_KEY, check_spec_shape
from .paying_load import LevelPoint

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DynamicK",
    "LevelChoice",
    "batch_boundaries",
    "k_families",
    "recommend_dynamic_k",
]

REGRESSED = "regressed"
NO_VERDICT = frozenset({"insufficient samples", "contaminated"})  # cannot win a level
TABLE_KEY = BATCH_TABLE_KEY
# The table's last range ends here when the server's max_num_seqs is not known: the largest
# default max_num_seqs of vLLM 0.32's API server (B200/H100-class GPUs). vLLM clips ranges at
# its max_num_seqs and carries the last k forward beyond the table's end, so this only matters
# to a reader.
DEFAULT_MAX_BATCH = 1024

_CLOSED_LOOP = re.compile(r"^c(\d+)$")


@dataclass(frozen=True)
class LevelChoice:
    """The k chosen for one closed-loop level, and why."""

    level: str
    concurrency: int
    k: int  # 0: no k may run here (vLLM 0.32 accepts 0: no drafts at these batch sizes)
    ratio: float | None  # the winner's speedup (geometric mean over prompt types)
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "concurrency": self.concurrency,
            "k": self.k,
            "ratio": self.ratio,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class DynamicK:
    """A `num_speculative_tokens_per_batch_size` table for one method measured at several k.

    `table` holds [start, end, k] ranges of batch sizes (inclusive, contiguous from 1 to
    `max_batch`); `spec` is the candidate to pass back: the method's values with
    num_speculative_tokens the table's largest k, and the table. Both are None when no k may
    run at any level; `notes` then say why.
    """

    method: str
    candidates: Mapping[int, str]  # k -> candidate name
    choices: tuple[LevelChoice, ...]
    table: list[list[int]] | None
    spec: dict[str, Any] | None
    max_batch: int
    max_batch_source: str  # "max_num_seqs" or "default"
    notes: tuple[str, ...]

    @property
    def name(self) -> str:
        """A name for the recommended candidate, e.g. ngram-k3-5-dynamic."""
        ks = "-".join(str(k) for k in sorted(self.candidates))
        return f"{self.method}-k{ks}-dynamic"

    @property
    def text(self) -> str:
        if self.table is None:
            return f"{self.method}: no dynamic-k table ({'; '.join(self.notes)})"
        return f"{self.method}: {TABLE_KEY} = {json.dumps(self.table)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "name": self.name,
            "candidates": {str(k): v for k, v in sorted(self.candidates.items())},
            "choices": [c.to_dict() for c in self.choices],
            "table": self.table,
            "spec": self.spec,
            "max_batch": self.max_batch,
            "max_batch_source": self.max_batch_source,
            "notes": list(self.notes),
            "text": self.text,
        }


def k_families(specs: Mapping[str, Mapping[str, Any]]) -> list[dict[int, str]]:
    """Candidates whose values are identical except num_speculative_tokens, two k or more.

    Each family maps k -> candidate name (the first name in sorted order where two candidates
    share a k). Candidates that already carry a dynamic-k table are left out.
    """
    groups: dict[str, dict[int, str]] = {}
    for name in sorted(specs):
        values = specs[name]
        k = values.get("num_speculative_tokens")
        if TABLE_KEY in values or isinstance(k, bool) or not isinstance(k, int) or k < 1:
            continue
        rest = {key: v for key, v in values.items() if key != "num_speculative_tokens"}
        groups.setdefault(json.dumps(rest, sort_keys=True), {}).setdefault(k, name)
    return [dict(sorted(g.items())) for _, g in sorted(groups.items()) if len(g) >= 2]


def batch_boundaries(concurrencies: Sequence[int], max_batch: int) -> list[tuple[int, int]]:
    """Inclusive batch-size ranges, one per concurrency level, from 1 to `max_batch`.

    Adjacent levels c_i < c_j meet at floor(sqrt(c_i * c_j)), their geometric midpoint: a
    batch of that size or smaller takes level i's k. The first range starts at 1, the last
    ends at `max_batch`; ranges starting above `max_batch` are dropped.
    """
    cs = sorted(concurrencies)
    if not cs or any(c < 1 for c in cs) or len(set(cs)) != len(cs):
        raise ValueError(f"concurrencies must be distinct integers >= 1, got {concurrencies!r}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    ends = [math.isqrt(a * b) for a, b in pairwise(cs)] + [max_batch]
    out, start = [], 1
    for end in ends:
        if start > max_batch:
            break
        out.append((start, min(end, max_batch)))
        start = end + 1
    return out


def recommend_dynamic_k(
    specs: Mapping[str, Mapping[str, Any]],
    points: Mapping[str, Mapping[str, Sequence[LevelPoint]]],
    *,
    max_num_seqs: int | None = None,
) -> list[DynamicK]:
    """One dynamic-k table per method measured at two k or more; [] when there is none.

    `specs`: candidate name -> its speculative config values; `points`: candidate name ->
    prompt type -> its LevelPoints. Only closed-loop levels (c4) count: a rate has no batch
    size. At each level the winner is the k with the best speedup (geometric mean over the
    prompt types measured there) among those not regressed, and with a verdict, on every one
    of them; ties go to the smaller k. Where no k may run, k = 0 (no drafts), which vLLM 0.32
    accepts. `max_num_seqs` (the server's) ends the last range; without it DEFAULT_MAX_BATCH.
    """
    if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or max_num_seqs < 1):
        raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    return [_recommend(family, specs, points, max_num_seqs) for family in k_families(specs)]


def _recommend(
    family: Mapping[int, str],
    specs: Mapping[str, Mapping[str, Any]],
    points: Mapping[str, Mapping[str, Sequence[LevelPoint]]],
    max_num_seqs: int | None,
) -> DynamicK:
    method = str(specs[family[max(family)]].get("method"))
    max_batch = max_num_seqs or DEFAULT_MAX_BATCH
    source = "max_num_seqs" if max_num_seqs else "default"
    notes: list[str] = []
    # level -> k -> prompt type -> point, closed-loop levels only
    by_level: dict[int, dict[int, dict[str, LevelPoint]]] = {}
    labels: dict[int, str] = {}
    open_loop: set[str] = set()
    for k, name in family.items():
        for prompt_type, series in points.get(name, {}).items():
            for p in series:
                match = _CLOSED_LOOP.match(p.level)
                if not match:
                    open_loop.add(p.level)
                    continue
                c = int(match.group(1))
                labels[c] = p.level
                by_level.setdefault(c, {}).setdefault(k, {})[prompt_type] = p
    if open_loop:
        notes.append(
            f"open-loop levels have no batch size, not used: {', '.join(sorted(open_loop))}"
        )

    def make(choices: Sequence[LevelChoice], table: list[list[int]] | None = None) -> DynamicK:
        spec = None
        if table is not None:
            top = max(row[2] for row in table)
            values = {**specs[family[max(family)]], "num_speculative_tokens": top, TABLE_KEY: table}
            spec = check_spec_shape(values, source=f"{method}-k{top}-dynamic")
        return DynamicK(
            method, dict(family), tuple(choices), table, spec, max_batch, source, tuple(notes)
        )

    if not by_level:
        notes.append("no closed-loop level was measured for these candidates")
        return make(())
    choices = [_choose(labels[c], c, by_level[c], list(family)) for c in sorted(by_level)]
    ranges = batch_boundaries([c.concurrency for c in choices], max_batch)
    cap = "the server's max_num_seqs" if max_num_seqs else "vLLM 0.32's largest default"
    notes.append(
        "ranges meet at floor(sqrt(c_i * c_j)) of adjacent levels; the first starts at 1, "
        f"the last ends at {max_batch} ({cap} max_num_seqs)"
    )
    lowest = choices[0]
    if lowest.concurrency > 1:
        notes.append(
            f"batch sizes below {lowest.concurrency} were not measured: they take "
            f"{lowest.level}'s k"
        )
    if len(ranges) < len(choices):
        dropped = ", ".join(c.level for c in choices[len(ranges) :])
        notes.append(f"{dropped}: above max_num_seqs={max_batch}, no batch is that large")
    table: list[list[int]] = []
    for (start, end), choice in zip(ranges, choices, strict=False):
        if table and table[-1][2] == choice.k:
            table[-1][1] = end  # the same k as the range before: one range
        else:
            table.append([start, end, choice.k])
    if max(row[2] for row in table) == 0:
        notes.append("no k may run at any measured level: keep speculation off")
        return make(choices)
    return make(choices, table)


def _choose(
    label: str, concurrency: int, measured: Mapping[int, Mapping[str, LevelPoint]], ks: list[int]
) -> LevelChoice:
    """The winning k of one level, or 0 when none may run."""
    types = sorted({t for per_type in measured.values() for t in per_type})
    scores: dict[int, float] = {}
    refused: list[str] = []
    for k in ks:
        per_type = measured.get(k, {})
        missing = [t for t in types if t not in per_type]
        regressed = [t for t in types if t in per_type and per_type[t].verdict == REGRESSED]
        no_verdict = [
            t
            for t in types
            if t in per_type and (per_type[t].verdict in NO_VERDICT or not per_type[t].measured)
        ]
        if missing:
            refused.append(f"k{k} not measured on {', '.join(missing)}")
        elif regressed:
            refused.append(f"k{k} regressed on {', '.join(regressed)}")
        elif no_verdict:
            refused.append(f"k{k} has no verdict on {', '.join(no_verdict)}")
        else:
            logs = [math.log(per_type[t].ratio) for t in types]
            scores[k] = math.exp(sum(logs) / len(logs))
    over = f" over {len(types)} prompt types" if len(types) > 1 else ""
    why_not = f"; {'; '.join(refused)}" if refused else ""
    if not scores:
        return LevelChoice(
            label,
            concurrency,
            0,
            None,
            f"{label}: k=0, no drafts (vLLM 0.32 accepts 0 in the table){why_not}",
        )
    best = max(scores.values())
    k = min(k for k, s in scores.items() if s == best)
    others = ", ".join(f"k{j} {s:.3f}" for j, s in sorted(scores.items()) if j != k)
    beat = f" (beats {others})" if others else ""
    slow = "; below 1.0 but not regressed" if best < 1.0 else ""
    return LevelChoice(
        label,
        concurrency,
        k,
        best,
        f"{label}: k{k}, speedup {best:.3f}{over}{beat}{slow}{why_not}",
    )
