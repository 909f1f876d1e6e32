"""The search as a reader meets it: the answer first (terminal, summary.md, HTML), then each
reload with why it was chosen, what was predicted before it and what it measured; the band's
coverage; and the search plan of `specdecode-predict` and the dry run. Nothing is computed here.
"""

from __future__ import annotations

import html

from ...analysis.prediction.bands.bounded import withheld_reason
from ...analysis.search.answer import SearchAnswer
from ...analysis.search.policy import Reload, SearchPlan
from ...record.schema import RunRecord
from ...record.search import SearchRecord, SearchReload

ANSWER = "Answer"
TITLE = "The search: each reload chosen by prediction"


def answer_lines(answer: SearchAnswer | None) -> list[str]:
    """The one paragraph, for the top of the terminal summary."""
    return [f"{ANSWER}: {answer.paragraph}"] if answer is not None else []


def terminal_lines(record: RunRecord, answer: SearchAnswer | None) -> list[str]:
    """Each reload, why, predicted before and measured after; the stop; the band's coverage."""
    search = record.search
    if search is None or answer is None:
        return []
    out = [f"{TITLE} ({search.used} of {search.max_reloads} reloads, margin {search.margin:+.0%}):"]
    for reload in search.reloads:
        out.append(f"  {reload.arm}: {reload.label} [{reload.kind}]: {reload.why}")
        out += [f"    {line}" for line in _measured(reload, answer)]
    out += [f"  {line}" for line in _ending(search)]
    return out


def markdown_lines(record: RunRecord, answer: SearchAnswer | None) -> list[str]:
    search = record.search
    if search is None or answer is None:
        return []
    head = f"{search.used} of {search.max_reloads} reloads, margin {search.margin:+.0%}."
    lines = [f"### {TITLE}", "", head, ""]
    for reload in search.reloads:
        lines.append(f"- **{reload.arm}**: `{reload.label}` ({reload.kind}): {reload.why}")
        lines += [f"  - {line}" for line in _measured(reload, answer)]
    lines += ["", *(f"- {line}" for line in _ending(search)), ""]
    return lines


def answer_markdown(answer: SearchAnswer | None) -> list[str]:
    """The paragraph, at the top of summary.md."""
    return [f"> **{ANSWER}:** {answer.paragraph}", ""] if answer is not None else []


def answer_html(answer: SearchAnswer | None) -> str:
    """The paragraph, at the top of the HTML report."""
    if answer is None:
        return ""
    return (
        f"<p class='specdecode-answer' id='specdecode-answer'><strong>{ANSWER}:</strong> "
        f"{html.escape(answer.paragraph)}</p>"
    )


def html_section(record: RunRecord, answer: SearchAnswer | None) -> str:
    search = record.search
    if search is None or answer is None:
        return ""
    e = html.escape
    items = []
    for reload in search.reloads:
        sub = "".join(f"<li>{e(line)}</li>" for line in _measured(reload, answer))
        items.append(
            f"<li><strong>{e(reload.arm)}</strong>: <code>{e(reload.label)}</code> "
            f"({e(reload.kind)}): {e(reload.why)}<ul>{sub}</ul></li>"
        )
    ending = "".join(f"<li>{e(line)}</li>" for line in _ending(search))
    return (
        f"<h3 id='specdecode-search'>{e(TITLE)}</h3><p>{search.used} of {search.max_reloads} "
        f"reloads, margin {search.margin:+.0%}.</p><ul>{''.join(items)}</ul><ul>{ending}</ul>"
    )


def _measured(reload: SearchReload, answer: SearchAnswer) -> list[str]:
    """Per measurement: predicted before the reload, measured after, inside or not."""
    found = [c for c in answer.checks if c.arm == reload.arm]
    if not found:
        return ["no band before this reload (the cost was unknown)"] if not reload.predicted else []
    return [c.text.removeprefix(f"{reload.arm} ({reload.label}) ") for c in found]


def _ending(search: SearchRecord) -> list[str]:
    out = []
    if search.stopped:
        out.append(f"stopped: {search.stopped}")
    out.append(f"cost prior: {search.prior or 'none'}")
    out += search.coverage
    return out


def coverage_lines(answer: SearchAnswer | None) -> list[str]:
    """The band's coverage with this run's reloads counted in."""
    if answer is None or not answer.coverage:
        return []
    head = "band coverage (stored runs, and this run's reloads against their bands):"
    return [head, *(f"  {line}" for line in answer.coverage_lines())]


def plan_lines(plan: SearchPlan, *, budget: int | None = None) -> list[str]:
    """`specdecode-predict` and the dry run: coverage, prior, and the next reload and why."""
    out = list(plan.coverage.lines())
    if plan.prior:
        out += [f"cost prior at {level}: {p.text}" for level, p in plan.prior.items()]
    else:
        out.append(
            "cost prior: none (no stored run of this host, model, vLLM version and GPUs "
            "measured an n-gram config)"
        )
    head = f"search plan (--spec-search ngram, margin {plan.margin:+.0%}"
    head += f", up to {budget} reloads)" if budget else ")"
    step = plan.step
    if isinstance(step, Reload):
        out.append(f"{head}: next reload: {step.label} [{step.kind}]")
        out.append(f"  why: {step.why}")
        for key, b in step.predicted.items():
            # A band wider than a factor of 2 is no prediction: its reason, not its figures.
            why = withheld_reason((b.low, b.high), None, None)
            out.append(
                f"  on {key}: {why}"
                if why
                else f"  predicted on {key}: {b.tokens_per_s:.1f} tok/s [{b.low:.1f}, "
                f"{b.high:.1f}], {b.speedup - 1:+.1%} [{b.speedup_low - 1:+.1%}, "
                f"{b.speedup_high - 1:+.1%}]"
            )
    else:
        out.append(f"{head}: no reload: {step.why}")
    return out
