"""Numbers and sentences shared by every renderer: one spelling of each figure."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..analysis.verdict.compare import PromptTypeVerdict
from ..analysis.verdict.stats import Comparison, RestartNoise
from ..config.break_even import MAP_PREFIX
from ..config.settings import RunConfig
from ..record.counters import ACCEPTED_PER_DRAFT, Acceptance


def finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def fmt_num(x: Any, fmt: str = ".1f") -> str:
    return format(x, fmt) if finite(x) else "n/a"


def fmt_pct(x: Any, *, sign: bool = True) -> str:
    if not finite(x):
        return "n/a"
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def fmt_p(p: Any) -> str:
    if not finite(p):
        return "n/a"
    return f"{p:.1e}" if 0 < p < 0.001 else f"{p:.3f}"


METRIC_NAMES = {"throughput": "throughput", "tpot": "TPOT"}


def metric_change(c: Comparison) -> str:
    """ "TPOT +38.0% [+4.6%, +82.2%]": a metric's change and its interval."""
    low, high = c.ratio_ci
    ci = f"[{low - 1:+.1%}, {high - 1:+.1%}]" if finite(low) and finite(high) else "(no interval)"
    return f"{METRIC_NAMES.get(c.metric, c.metric)} {fmt_pct(c.change)} {ci}"


def decided_by(v: PromptTypeVerdict) -> str:
    """The metric that decided the verdict, with its interval (both for equivalent; empty
    when other clients' traffic decided it)."""
    return ", ".join(metric_change(c) for c in v.deciding)


def verdict_text(v: PromptTypeVerdict) -> str:
    """ "regressed (TPOT +38.0% [+4.6%, +82.2%])": the verdict and what decided it."""
    decided = decided_by(v)
    return f"{v.verdict.value} ({decided})" if decided else v.verdict.value


def suite_text(environment: Mapping[str, Any], *, markdown: bool = False) -> str:
    """The suite that ran: its commit, else its folder and content hash (not a git checkout)."""
    quote = "`" if markdown else ""
    commit = environment.get("git_commit")
    if commit:
        return f"{quote}{commit[:12]}{quote}" if markdown else str(commit)
    content = environment.get("suite_content")
    if content:
        return f"{quote}{content}{quote} (not a git checkout)"
    return "not a git checkout, its files unread"


def fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def acceptance_text(acc: Acceptance) -> str:
    if not acc.present:
        return "Acceptance: no spec-decode counters in /metrics."
    rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
    return (
        f"Acceptance: {fmt_num(acc.mean_acceptance_length, '.2f')} {ACCEPTED_PER_DRAFT} "
        "(vLLM's mean acceptance length: 1 + accepted tokens / drafting steps), draft "
        f"acceptance {fmt_pct(acc.draft_acceptance_rate, sign=False)} ({acc.accepted:.0f} of "
        f"{acc.draft_tokens:.0f} draft tokens, {acc.drafts:.0f} drafts), per position [{rates}]"
    )


def design_text(run: RunConfig) -> str:
    most = run.max_samples or 0
    samples = f"{run.samples}" + (f" to {most}" if most > run.samples else "")
    levels = ", ".join(level.label for level in run.levels)
    starts = f"{run.repeats} server start{'s' if run.repeats != 1 else ''} per arm"
    return (
        f"{samples} measured + {run.warmup} warm-up requests per prompt type, level and start "
        f"(at least 2 x N at N in flight); {starts}; up to {run.max_tokens} tokens; "
        f"load levels {levels}; "
        f"{run.endpoint} endpoint; alpha {run.alpha}, minimum effect {run.min_effect:.0%}"
    )


def noise_text(noise: RestartNoise) -> str:
    """ "1.2% [0.4%, 2.5%], measured (SOURCE; 7 degrees of freedom)", or the assumption."""
    if not noise.measured:
        return noise.source
    low, high = noise.interval()
    return (
        f"{noise.sd:.1%} [{low:.1%}, {high:.1%}] (90% interval), measured ({noise.source}; "
        f"{noise.df:.0f} degrees of freedom)"
    )


def title(candidates: Sequence[str], model: str | None = None, host: str | None = None) -> str:
    """The run's title; the break-even map's servers (`map-…`) are named as one map."""
    shown = [c for c in candidates if not c.startswith(MAP_PREFIX)]
    mapped = len(candidates) - len(shown)
    versus = ", ".join(shown) if shown else "baseline only"
    if mapped:
        versus += f", and a break-even map of {mapped} servers"
    where = f" · {model} on {host}" if model else ""
    return f"Speculative decoding: baseline vs {versus}{where}"


STATISTICS_NOTE = (
    "tok/s: geometric mean over the server starts of each start's geometric mean. Brackets: "
    "the interval of the change, requests nested within server starts and the prompts' own "
    "levels removed, with the restart noise (its own uncertainty in the t quantile), "
    "Bonferroni-adjusted for the family of m comparisons (1 - 2 alpha / m). Regressed or "
    "improved: the whole interval beyond the minimum effect, and the requests' ranks agree (p: "
    "Mann-Whitney U, Holm-adjusted over the family); equivalent: the whole interval inside it; "
    "otherwise inconclusive, with what would decide it."
)
