"""`--spec-break-even`: the map's servers, each a synthetic-acceptance config.

vLLM's `rejection_sample_method: "synthetic"` accepts the drafter's proposals at a stated
accepted per draft L (vLLM's mean acceptance length, 1 + accepted tokens / drafting steps),
whatever the target model says. One server per (k, L) then measures what a step of k drafts
costs on this engine, hardware and load: no drafter has to be good for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ConfigError
from .specconfig import NGRAM_METHODS, SpecConfig

__all__ = ["MAP_PREFIX", "map_candidates", "map_ks", "map_lengths", "map_spec", "point_of"]

MAP_PREFIX = "map-"
OTHER_K = {1: 3, 2: 4, 3: 5}  # the candidate's k and one other: 2 further, down where k > 3


def map_spec(method: str, k: int, length: float, lookup_max: int) -> dict[str, Any]:
    """One map server's `--speculative-config`: the drafter at k, proposing wherever any earlier
    token matches (prompt_lookup_min 1), its drafts accepted at mean length `length`."""
    return {
        "method": method,
        "num_speculative_tokens": k,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": max(1, lookup_max),
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_length": round(float(length), 3),
    }


def point_of(spec: Mapping[str, Any]) -> tuple[int, float] | None:
    """(k, asked accepted per draft) of a map server's config; None for any other config."""
    if spec.get("rejection_sample_method") != "synthetic":
        return None
    k = spec.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        return None
    length = spec.get("synthetic_acceptance_length")
    rates = spec.get("synthetic_acceptance_rates")
    if isinstance(length, int | float) and not isinstance(length, bool):
        return k, float(length)
    if isinstance(rates, list) and all(isinstance(r, int | float) for r in rates):
        return k, 1.0 + float(sum(rates))
    return None


def map_ks(text: str, candidates: Sequence[SpecConfig]) -> tuple[int, ...]:
    """The k the map measures: `auto` (the first n-gram candidate's k and one other; 3 and 5
    without one), or a list such as `3,5`."""
    if text.strip() == "auto":
        k = next(
            (c.values.get("num_speculative_tokens") for c in candidates if _drafts(c.values)),
            None,
        )
        if not isinstance(k, int):
            return (3, 5)
        other = OTHER_K.get(k, k - 2)
        return tuple(sorted({k, other}))
    found: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 16:
            raise ConfigError(
                f"--spec-break-even {text!r}: give 'auto' or the k to map, e.g. 3,5 (each "
                "from 1 to 16)"
            )
        found.append(int(part))
    return tuple(sorted(set(found)))


def map_lengths(k: int, points: int) -> tuple[float, ...]:
    """`points` accepted per draft from 1 (nothing accepted) to k + 1 (everything), evenly."""
    if points < 2:
        raise ConfigError(f"[run] break_even_points must be 2 or more (a line), got {points}")
    return tuple(round(1.0 + k * i / (points - 1), 3) for i in range(points))


def map_candidates(
    text: str, candidates: Sequence[SpecConfig], points: int
) -> tuple[SpecConfig, ...]:
    """The map's servers as candidates, named `map-k3-L1`, `map-k3-L4`, ... The drafter is the
    first model-free candidate's (its prompt_lookup_max), else n-gram's."""
    first = next((c.values for c in candidates if _drafts(c.values)), None)
    method = str(first["method"]) if first else "ngram"
    lookup = first.get("prompt_lookup_max") if first else None
    out = []
    for k in map_ks(text, candidates):
        for length in map_lengths(k, points):
            name = f"{MAP_PREFIX}k{k}-L{length:g}".replace(".", "p")
            values = map_spec(method, k, length, lookup if isinstance(lookup, int) else k)
            out.append(SpecConfig(name=name, values=values))
    return tuple(out)


def _drafts(values: Mapping[str, Any]) -> bool:
    return values.get("method") in NGRAM_METHODS and point_of(values) is None
