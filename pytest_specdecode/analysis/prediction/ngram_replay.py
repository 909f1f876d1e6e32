"""Offline replay of vLLM's n-gram proposer over a baseline's token ids. Pure: no vLLM, no torch.

With greedy decoding a candidate must produce the baseline's tokens, and an n-gram draft is a
deterministic function of the context. Replaying the proposer over the baseline's prompt and
output ids therefore gives, for any n-gram config, the drafts the server would make and accept.

The rules, as read from vLLM 0.32's source (file names are vLLM's):

- **Effective settings** (`config/speculative.py`): both lookup bounds unset gives 5..5; only
  `prompt_lookup_max` set gives min = max; only `prompt_lookup_min` set gives max = min.
- **Proposal** (`v1/spec_decode/ngram_proposer.py`, the numba `NgramProposer` of the V1 model
  runner; rule ``"v1"``). After every forward pass that samples (the prefill, then each decode
  step) the context is the prompt plus every output token so far. The proposer takes the largest
  n in [min, max] such that the context's last n tokens occur earlier, in an occurrence that ends
  before the last token; of those occurrences, the *earliest*. It proposes the tokens after it:
  k of them, fewer when the context ends first, and never more than max_model_len - context.
  No match (or a context shorter than min) means no draft: the next step is a plain decode.
- **Scheduling** (`v1/core/sched/scheduler.py`): a step may hold at most
  max_model_len - context - 1 draft tokens; a draft trimmed to nothing is not scheduled.
- **Counting** (`scheduler.update_from_output`, `v1/spec_decode/metrics.py`): a step with m > 0
  draft tokens adds 1 draft, m draft tokens, and a accepted tokens (the leading draft tokens equal
  to the target's greedy tokens) to positions 0..a-1. It yields a + 1 tokens. The counts are
  taken *before* the stop check: tokens accepted past max_tokens or EOS are counted, though the
  client never receives them. See `ngram_types.ReplayStats` for how that last step is
  bounded.
- **Prefix cache**: a repeated prompt whose cached part leaves exactly one token to compute is
  scheduled as a padded decode (1 + k rows, k placeholder drafts): one extra draft of k tokens,
  none accepted (pass ``cached_prompt_tokens``).
- Rule ``"v2"``: Model Runner V2's `NgramGPUSpeculator` (`v1/worker/gpu/spec_decode/ngram/`),
  vLLM 0.32's default for ``method="ngram"`` on a GPU with Triton. It takes the *latest*
  occurrence of the longest match, and always proposes k tokens: slots past the end of the
  context, or all k when nothing matches, hold the last token. Read from the source only; the CPU
  build here runs rule ``"v1"``, so ``"v2"`` is not verified against a server.

Suffix decoding is not replayed (its global tree depends on earlier requests), and draft-model,
EAGLE or MTP methods cannot be: their drafts come from a model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from .ngram_types import NgramSettings, ReplayStats, RequestTokens, grid_settings

__all__ = [
    "ReplayStep",
    "StepReplay",
    "grid",
    "propose",
    "replay",
    "replay_many",
]

Proposer = Literal["v1", "v2"]


def propose(
    context: Sequence[int],
    settings: NgramSettings,
    *,
    max_model_len: int | None = None,
    proposer: Proposer = "v1",
) -> list[int]:
    """The draft for one context, written plainly (the reference for the fast replay).

    `max_model_len` applies the v1 proposer's own cap (max_model_len - context); the scheduler
    trims one token more, which :func:`replay` applies.
    """
    k = settings.num_speculative_tokens
    lo, hi = settings.prompt_lookup_min, settings.prompt_lookup_max
    tokens = list(context)
    total = len(tokens)
    if max_model_len is not None and proposer == "v1":
        k = min(k, max_model_len - total)
    if k <= 0 or total == 0:
        return []
    for n in range(min(hi, total - 1), lo - 1, -1):
        suffix = tokens[total - n :]
        starts = [s for s in range(total - n) if tokens[s : s + n] == suffix]
        if starts:
            start = (starts[0] if proposer == "v1" else starts[-1]) + n
            draft = tokens[start : start + k]
            if proposer == "v2":
                draft += [tokens[-1]] * (k - len(draft))
            return draft
    return [tokens[-1]] * k if proposer == "v2" else []


def replay(
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    settings: NgramSettings,
    *,
    lookahead_ids: Sequence[int] = (),
    max_model_len: int | None = None,
    cached_prompt_tokens: int = 0,
    proposer: Proposer = "v1",
) -> ReplayStats:
    """The server's counters for one request under `settings` (see the module docstring)."""
    request = RequestTokens.of(prompt_ids, output_ids, lookahead_ids, cached_prompt_tokens)
    return replay_many([request], settings, max_model_len=max_model_len, proposer=proposer)


def replay_many(
    requests: Sequence[RequestTokens],
    settings: NgramSettings,
    *,
    max_model_len: int | None = None,
    proposer: Proposer = "v1",
) -> ReplayStats:
    """Several requests under one config, aggregated."""
    table = _Table.build(
        requests, proposer, settings.prompt_lookup_max, settings.num_speculative_tokens
    )
    return _walk(table, [settings], max_model_len, proposer)[0]


def grid(
    requests_by_type: Mapping[str, Sequence[RequestTokens]],
    settings: Sequence[NgramSettings] | None = None,
    *,
    max_model_len: int | None = None,
    proposer: Proposer = "v1",
) -> dict[str, dict[NgramSettings, ReplayStats]]:
    """Replay every config (default: the whole grid) per prompt type, aggregated per type."""
    configs = list(settings) if settings is not None else grid_settings()
    if not configs:
        return {name: {} for name in requests_by_type}
    n_max = max(s.prompt_lookup_max for s in configs)
    k_max = max(s.num_speculative_tokens for s in configs)
    out: dict[str, dict[NgramSettings, ReplayStats]] = {}
    for name, requests in requests_by_type.items():
        table = _Table.build(requests, proposer, n_max, k_max)
        out[name] = dict(zip(configs, _walk(table, configs, max_model_len, proposer), strict=True))
    return out


@dataclass(frozen=True)
class ReplayStep:
    """One forward pass of one request, as the replay makes it.

    `position` is the number of output tokens before the step (1 after the prefill; 0 for
    the padded prefill after a prefix-cache hit). A step with `drafted` 0 is a plain decode.
    `unverified` counts draft tokens past the known tokens (a last step): the server may have
    accepted up to `accepted + unverified`.
    """

    position: int
    drafted: int
    accepted: int
    unverified: int = 0
    padded: bool = False

    def matches(self, drafted: int, accepted: int) -> bool:
        """Whether a server step of these counts is this step, within the last-step bound."""
        return drafted == self.drafted and (
            self.accepted <= accepted <= self.accepted + self.unverified
        )


class StepReplay:
    """One request replayed step by step, for the comparison with the server's per-step arrays.

    `steps()` walks the request as the server would, from the prefill to the last token;
    `at(position)` is the step the proposer would make after any number of output tokens, which
    tells where a server that skipped or shortened a draft went on from.
    """

    def __init__(
        self,
        request: RequestTokens,
        settings: NgramSettings,
        *,
        max_model_len: int | None = None,
        proposer: Proposer = "v1",
    ) -> None:
        self.request, self.settings = request, settings
        self.max_model_len, self.proposer = max_model_len, proposer
        self._table = _Table.build(
            [request], proposer, settings.prompt_lookup_max, settings.num_speculative_tokens
        )

    @property
    def output_len(self) -> int:
        return len(self.request.output_ids)

    def at(self, position: int) -> ReplayStep:
        """The step that starts after `position` output tokens (1 <= position < output)."""
        if not 1 <= position < self.output_len:
            raise ValueError(f"no decode step starts at output position {position}")
        t, s = self._table, self.settings
        p = len(self.request.prompt_ids)
        ctx, row = p + position, position - 1
        n = min(int(t.largest_n[row]), s.prompt_lookup_max)
        k = s.num_speculative_tokens
        if self.max_model_len is not None:
            k = min(k, self.max_model_len - ctx - 1)
        k = max(k, 0)
        available, start = 0, 0
        if n >= s.prompt_lookup_min:
            start = int(t.occurrence[n, row]) + n
            available = ctx - start
        if self.proposer == "v1":
            m = copied = min(k, available)
        else:
            m, copied = k, min(k, available)
        tokens = t.tokens
        accepted = 0
        while accepted < m:
            draft = tokens[start + accepted] if accepted < copied else tokens[ctx - 1]
            if draft != tokens[ctx + accepted]:
                break
            accepted += 1
        unverified = m - accepted if accepted < m and tokens[ctx + accepted] == _UNKNOWN else 0
        return ReplayStep(position, m, accepted, unverified)

    def steps(self) -> list[ReplayStep]:
        """Every step of the request, the padded prefill (if any) first."""
        out = []
        k, p = self.settings.num_speculative_tokens, len(self.request.prompt_ids)
        if bool(self._table.padded_prefill[0]) and (
            self.max_model_len is None or p + k + 1 <= self.max_model_len
        ):
            out.append(ReplayStep(0, k, 0, padded=True))
        position = 1
        while position < self.output_len:
            step = self.at(position)
            out.append(step)
            position += step.accepted + 1
        return out


# --- the fast engine -------------------------------------------------------------------------
#
# For each request and each context c the decode could meet (prompt + 1 .. prompt + N - 1
# tokens), the table holds, per n, the start of the chosen earlier occurrence of the context's
# last n tokens (earliest for v1, latest for v2), and the largest n that occurs at all. Every
# config then walks all requests at once, vectorised over (config, request) pairs.

_UNKNOWN = -1  # token id filling the array past the known tokens


@dataclass
class _Table:
    tokens: np.ndarray  # all requests' known tokens, each followed by a run of _UNKNOWN
    offset: np.ndarray  # [R] where each request starts in `tokens`
    prompt_len: np.ndarray  # [R]
    output_len: np.ndarray  # [R]
    base: np.ndarray  # [R] row in the context table of each request's first decode context
    largest_n: np.ndarray  # [F] largest n whose suffix n-gram occurs earlier (0: none)
    occurrence: np.ndarray  # [n_max + 1, F] start of the chosen occurrence, -1: none
    padded_prefill: np.ndarray  # [R] bool: a prefix-cache hit leaves one token to compute
    n_max: int

    @classmethod
    def build(
        cls, requests: Sequence[RequestTokens], proposer: Proposer, n_max: int, k_max: int
    ) -> _Table:
        if not requests:
            raise ValueError("no requests to replay")
        pad = k_max + 1  # unknown tokens: a draft is never compared beyond them
        chunks, offsets, p_len, o_len, bases, occ_parts, largest_parts = [], [], [], [], [], [], []
        at = rows = 0
        for req in requests:
            if not req.output_ids:
                raise ValueError("a request without output tokens cannot be replayed")
            known = np.asarray(req.prompt_ids + req.output_ids, dtype=np.int64)
            if known.size and known.min() < 0:
                raise ValueError("token ids must be >= 0")
            full = np.concatenate(
                [known, np.asarray(req.lookahead_ids, dtype=np.int64), np.full(pad, _UNKNOWN)]
            )
            chunks.append(full)
            offsets.append(at)
            at += full.size
            p, n_out = len(req.prompt_ids), len(req.output_ids)
            p_len.append(p)
            o_len.append(n_out)
            bases.append(rows)
            contexts = np.arange(p + 1, p + n_out, dtype=np.int64)  # may be empty
            rows += contexts.size
            occ = np.full((n_max + 1, contexts.size), -1, dtype=np.int64)
            for n in range(1, n_max + 1):
                occ[n] = _occurrences(known, n, contexts, latest=proposer == "v2")
            found = occ[1:] >= 0
            largest = np.where(found.any(axis=0), n_max - np.argmax(found[::-1], axis=0), 0)
            occ_parts.append(occ)
            largest_parts.append(largest)
        padded = np.array(
            [0 < r.cached_prompt_tokens == len(r.prompt_ids) - 1 for r in requests], dtype=bool
        )
        return cls(
            tokens=np.concatenate(chunks),
            offset=np.asarray(offsets, dtype=np.int64),
            prompt_len=np.asarray(p_len, dtype=np.int64),
            output_len=np.asarray(o_len, dtype=np.int64),
            base=np.asarray(bases, dtype=np.int64),
            largest_n=np.concatenate(largest_parts).astype(np.int64),
            occurrence=np.concatenate(occ_parts, axis=1),
            padded_prefill=padded,
            n_max=n_max,
        )


def _occurrences(known: np.ndarray, n: int, contexts: np.ndarray, *, latest: bool) -> np.ndarray:
    """For each context length c: where the chosen earlier copy of known[c-n:c] starts, or -1.

    "Earlier" means the copy ends before the last token (it starts at or before c - n - 1).
    """
    out = np.full(contexts.size, -1, dtype=np.int64)
    count = known.size - n + 1
    if count < 2 or contexts.size == 0:
        return out
    windows = np.lib.stride_tricks.sliding_window_view(known, n)
    _, key = np.unique(windows, axis=0, return_inverse=True)
    key = key.reshape(-1)
    order = np.lexsort((np.arange(count), key))  # by key, then position
    same_as_prev = np.zeros(count, dtype=bool)
    same_as_prev[1:] = key[order[1:]] == key[order[:-1]]
    if latest:
        chosen = np.full(count, -1, dtype=np.int64)  # the previous copy
        chosen[order[1:][same_as_prev[1:]]] = order[:-1][same_as_prev[1:]]
    else:
        group_start = np.maximum.accumulate(np.where(same_as_prev, 0, np.arange(count)))
        chosen = np.empty(count, dtype=np.int64)  # the first copy
        chosen[order] = order[group_start]
    window = contexts - n  # the window that is the context's suffix
    valid = window >= 0
    pick = np.where(valid, chosen[np.clip(window, 0, count - 1)], -1)
    return np.where(valid & (pick >= 0) & (pick < window), pick, -1)


def _walk(
    table: _Table, configs: Sequence[NgramSettings], max_model_len: int | None, proposer: Proposer
) -> list[ReplayStats]:
    n_req, n_cfg = table.offset.size, len(configs)
    k_cfg = np.array([s.num_speculative_tokens for s in configs], dtype=np.int64)
    lo_cfg = np.array([s.prompt_lookup_min for s in configs], dtype=np.int64)
    hi_cfg = np.array([s.prompt_lookup_max for s in configs], dtype=np.int64)
    if hi_cfg.max() > table.n_max:
        raise ValueError("the table was built for shorter n-grams than a config asks for")
    width = int(k_cfg.max())
    # One element per (config, request).
    k_e, lo_e, hi_e = (np.repeat(a, n_req) for a in (k_cfg, lo_cfg, hi_cfg))
    off_e, p_e, n_e, base_e = (
        np.tile(a, n_cfg) for a in (table.offset, table.prompt_len, table.output_len, table.base)
    )
    size = n_cfg * n_req
    drafts = np.zeros(size, dtype=np.int64)
    draft_tokens = np.zeros(size, dtype=np.int64)
    unverified = np.zeros(size, dtype=np.int64)
    hist = np.zeros((size, width + 1), dtype=np.int64)  # drafted steps by accepted count
    hist_max = np.zeros((size, width + 1), dtype=np.int64)  # by the most that could be accepted
    decode_steps = np.zeros(size, dtype=np.int64)

    # A prefix-cache hit that leaves one prompt token is scheduled as a padded decode: k
    # placeholder drafts, none accepted (needs room for 1 + k + 1 tokens).
    padded = np.tile(table.padded_prefill, n_cfg)
    if max_model_len is not None:
        padded &= p_e + k_e + 1 <= max_model_len
    drafts += padded
    draft_tokens += np.where(padded, k_e, 0)
    hist[:, 0] += padded
    hist_max[:, 0] += padded

    produced = np.ones(size, dtype=np.int64)  # the prefill yields the first token
    cols = np.arange(width, dtype=np.int64)
    active = np.nonzero(produced < n_e)[0]
    while active.size:
        i = active
        ctx = p_e[i] + produced[i]
        row = base_e[i] + produced[i] - 1
        n = np.minimum(table.largest_n[row], hi_e[i])
        matched = n >= lo_e[i]
        start = table.occurrence[np.where(matched, n, 0), row] + n
        available = np.where(matched, ctx - start, 0)
        k = k_e[i]
        if max_model_len is not None:
            k = np.minimum(k, max_model_len - ctx - 1)
        k = np.maximum(k, 0)
        if proposer == "v1":
            m = np.minimum(k, available)
            copied = m
        else:  # v2: always k, filled with the last token
            m = k
            copied = np.minimum(k, available)
        j = cols[None, :]
        src = np.where(j < copied[:, None], start[:, None] + j, ctx[:, None] - 1)
        draft = table.tokens[off_e[i][:, None] + src]
        truth = table.tokens[off_e[i][:, None] + ctx[:, None] + j]
        in_draft = j < m[:, None]
        hit = (draft == truth) & in_draft
        accepted = np.cumprod(hit, axis=1).sum(axis=1)
        unknown_next = truth[np.arange(i.size), np.minimum(accepted, width - 1)] == _UNKNOWN
        open_ended = (accepted < m) & unknown_next
        top = np.where(open_ended, m, accepted)
        drafted = m > 0
        drafts[i] += drafted
        draft_tokens[i] += m
        unverified[i] += top - accepted
        hist[i, accepted] += drafted
        hist_max[i, top] += drafted
        decode_steps[i] += 1
        produced[i] += accepted + 1
        active = i[produced[i] < n_e[i]]

    results = []
    for c, cfg in enumerate(configs):
        sl = slice(c * n_req, (c + 1) * n_req)
        kc = cfg.num_speculative_tokens
        h, hm = hist[sl].sum(axis=0), hist_max[sl].sum(axis=0)
        # Position p is accepted on every draft that accepted more than p tokens.
        per_pos = np.cumsum(h[::-1])[::-1][1 : kc + 1]
        per_pos_max = np.cumsum(hm[::-1])[::-1][1 : kc + 1]
        accepted_total = int((h * np.arange(width + 1)).sum())
        results.append(
            ReplayStats(
                settings=cfg,
                requests=n_req,
                output_tokens=int(table.output_len.sum()),
                steps=n_req + int(decode_steps[sl].sum()),
                drafts=int(drafts[sl].sum()),
                draft_tokens=int(draft_tokens[sl].sum()),
                accepted=accepted_total,
                accepted_per_position=tuple(int(x) for x in per_pos),
                unverified_tokens=int(unverified[sl].sum()),
                accepted_per_position_max=tuple(int(x) for x in per_pos_max),
            )
        )
    return results
