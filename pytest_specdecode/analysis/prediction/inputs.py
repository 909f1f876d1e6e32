"""The prediction's inputs, read from the run record: each measurement's prompts, the token ids
of its timed requests as the replay needs them (prefix-cache hits included), and the replay of
request groups, repeated requests replayed once (analysis/prediction/predict.py uses them)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from ...config.arms import BASELINE, cell_key
from ...record.measurement import Measurement
from ...record.requests.samples import RequestSample
from ...record.requests.token_capture import TokenIds
from ...record.schema import RunRecord
from .ngram_replay import grid
from .ngram_types import (
    NgramSettings,
    ReplayStats,
    RequestTokens,
    aggregate,
    prefix_cached_tokens,
)

__all__ = ["earlier_prompts", "first_key", "timed_prompts"]


def timed_prompts(record: RunRecord, m: Measurement) -> list[str]:
    """The prompt of each timed request, in order."""
    return _sent_prompts(record, m, m.samples)


def earlier_prompts(record: RunRecord, m: Measurement) -> list[str]:
    """Prompts the same server saw before the timed requests: the warm-up requests."""
    return _sent_prompts(record, m, m.warmup)


def _sent_prompts(record: RunRecord, m: Measurement, samples: Sequence[RequestSample]) -> list[str]:
    prompts = record.prompt_types[m.prompt_type].prompts
    return [prompts[s.prompt_index or 0].text for s in samples]


def first_key(record: RunRecord, prompt_type: str) -> str:
    """The measurement the prediction reads: the prompt type at the run's first load level
    (one stream in the default design; the replay models requests one after another)."""
    levels = record.run.levels
    return cell_key(prompt_type, levels[0], several=len(levels) > 1)


def request_tokens(
    prompts: Sequence[str], earlier: Sequence[str], ids: TokenIds, cache: TokenIds | None = None
) -> list[RequestTokens] | None:
    """The timed requests as the replay needs them; None when a prompt has no usable ids.

    A prompt the server saw before is served partly from its prefix cache (whole blocks, never
    the last token); `cache` says how that server's cache was set (default: as `ids` says).
    """
    cache = cache if cache is not None and cache.missing is None else ids
    seen = set(earlier)
    out = []
    for prompt in prompts:
        captured = ids.prompts.get(prompt)
        if captured is None or not captured.consistent or not captured.output_ids:
            return None
        cached = 0
        if prompt in seen and cache.prefix_caching and cache.block_size:
            cached = prefix_cached_tokens(len(captured.prompt_ids), cache.block_size)
        out.append(
            RequestTokens.of(
                captured.prompt_ids, captured.output_ids, captured.lookahead_ids, cached
            )
        )
        seen.add(prompt)
    return out


def first_measurement(record: RunRecord, arm: str, prompt_type: str) -> Measurement | None:
    for phase in record.arm_phases(arm):
        key = first_key(record, prompt_type)
        if key in phase.measurements:
            return phase.measurements[key]
    return None


def baseline_ids(
    record: RunRecord,
) -> tuple[dict[str, str], dict[str, tuple[Measurement, list[RequestTokens]]]]:
    """Per prompt type: where the baseline's ids came from (or why none), and its requests."""
    sources: dict[str, str] = {}
    found: dict[str, tuple[Measurement, list[RequestTokens]]] = {}
    for name in record.prompt_types:
        m = first_measurement(record, BASELINE, name)
        if m is None:
            continue
        ids = m.token_ids
        if ids is None:
            sources[name] = "no token ids recorded (the run ended before it recorded them)"
            continue
        if ids.missing is not None:
            sources[name] = f"no token ids: {ids.missing}"
            continue
        bad = [c.check for c in ids.prompts.values() if not c.consistent]
        if bad:
            sources[name] = f"the token ids do not reproduce the timed output: {bad[0]}"
            continue
        requests = request_tokens(timed_prompts(record, m), earlier_prompts(record, m), ids)
        if not requests:
            sources[name] = "no token ids for the timed requests' prompts"
            continue
        found[name] = (m, requests)
        sources[name] = _source_text(ids)
    return sources, found


def _source_text(ids: TokenIds) -> str:
    first = next(iter(ids.prompts.values()))
    ahead = min(len(c.lookahead_ids) for c in ids.prompts.values())
    cache = (
        f"prefix cache {'on' if ids.prefix_caching else 'off'}, block size {ids.block_size}"
        if ids.block_size
        else "KV block size unknown: a padded prefill after a prefix-cache hit is not modelled"
    )
    return (
        f"{len(ids.prompts)} prompt(s); output ids from {first.support.output}, prompt ids from "
        f"{first.support.prompt}; look-ahead {ahead}; {cache}"
    )


def max_model_len_of(baseline: Mapping[str, tuple[Measurement, list[RequestTokens]]]) -> int | None:
    lengths = [m.token_ids.max_model_len for m, _ in baseline.values() if m.token_ids]
    known = [n for n in lengths if n]
    return min(known) if known else None


def replay_groups(
    groups: Mapping[Any, Sequence[RequestTokens]],
    settings: Sequence[NgramSettings],
    max_model_len: int | None,
) -> dict[Any, dict[NgramSettings, ReplayStats]]:
    """Each group's requests under every config, aggregated; repeated requests replayed once."""
    distinct = {name: Counter(requests) for name, requests in groups.items()}
    keyed = {
        (name, j): [request]
        for name, counts in distinct.items()
        for j, request in enumerate(counts)
    }
    replayed = grid(keyed, settings, max_model_len=max_model_len)
    return {
        name: {
            s: aggregate(
                [_scaled(replayed[(name, j)][s], n) for j, n in enumerate(counts.values())]
            )
            for s in settings
        }
        for name, counts in distinct.items()
    }


def _scaled(stats: ReplayStats, times: int) -> ReplayStats:
    """One request's replay counted `times` times."""
    if times == 1:
        return stats
    return dataclasses.replace(
        stats,
        requests=stats.requests * times,
        output_tokens=stats.output_tokens * times,
        steps=stats.steps * times,
        drafts=stats.drafts * times,
        draft_tokens=stats.draft_tokens * times,
        accepted=stats.accepted * times,
        accepted_per_position=tuple(x * times for x in stats.accepted_per_position),
        unverified_tokens=stats.unverified_tokens * times,
        accepted_per_position_max=tuple(x * times for x in stats.accepted_per_position_max),
    )
