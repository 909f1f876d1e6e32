"""Reports for review: the seed-style table, summary.md, the environment table and the plots.

Everything here reads a run's results document: `results.json` of a stored run, or
`Experiment.results.data` while the run is live, so the same functions render both. The plots
are drawn with matplotlib's object API on the Agg canvas (no pyplot, no global backend change)
and written as PNG files into the run folder.
"""

from __future__ import annotations

import base64
import html
import json
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..analysis.stats import Comparison, Verdict, compare_family
from ..measure.experiment import BASELINE, BASELINE_AFTER
from ..record.store import redact_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from ..config.settings import Settings
    from ..measure.experiment import Experiment

Doc = Mapping[str, Any]

SUMMARY_FILE = "summary.md"
PLOT_FILES = {
    "throughput": "throughput.png",
    "tpot": "tpot.png",
    "acceptance": "acceptance.png",
}
PLOT_CAPTIONS = {
    "throughput": "Throughput per prompt type: median tok/s per request, whiskers are the 95% "
    "bootstrap CI of the median, dots are the requests.",
    "tpot": "TPOT distributions per prompt type: boxes are quartiles, dots are the requests.",
    "acceptance": "Per-position acceptance: the share of drafts whose k-th proposed token was "
    "accepted (from vLLM's spec-decode counters).",
}
TABLE_HEADER = (
    "Prompt",
    "Baseline tok/s",
    "Candidate tok/s",
    "Change",
    "TPOT baseline → candidate",
    "p",
    "Verdict",
)
_BASE_COLOR = "#4c72b0"
_AFTER_COLOR = "#9a9a9a"
_CANDIDATE_COLORS = ("#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


# --------------------------------------------------------------------------- reading a run


def phase_order(doc: Doc) -> list[str]:
    """Measured phases: the baseline, the candidates in their order, the ABA baseline last."""
    phases = doc.get("phases", {})
    order = [BASELINE] if BASELINE in phases else []
    order += [c for c in doc.get("candidates", {}) if c in phases]
    order += [p for p in phases if p not in order and p != BASELINE_AFTER]
    if BASELINE_AFTER in phases:
        order.append(BASELINE_AFTER)
    return order


def candidates_with_verdicts(doc: Doc) -> list[str]:
    verdicts = doc.get("verdicts", {})
    names = [c for c in doc.get("candidates", {}) if c in verdicts]
    return names + [c for c in verdicts if c not in names]


def workload_names(doc: Doc) -> list[str]:
    names = list(doc.get("workloads", {}))
    for s in doc.get("samples", []):
        if s.get("workload") not in names:
            names.append(s.get("workload"))
    return names


def measured_samples(doc: Doc, phase: str, workload: str) -> list[Mapping[str, Any]]:
    return [
        s
        for s in doc.get("samples", [])
        if s.get("phase") == phase and s.get("workload") == workload and not s.get("warmup")
    ]


def tokens_per_s(doc: Doc, phase: str, workload: str) -> list[float]:
    return [
        float(s["tokens_per_s"])
        for s in measured_samples(doc, phase, workload)
        if _finite(s.get("tokens_per_s")) and s["tokens_per_s"] > 0
    ]


def tpot_ms(doc: Doc, phase: str, workload: str) -> list[float]:
    return [
        float(s["tpot_s"]) * 1000
        for s in measured_samples(doc, phase, workload)
        if _finite(s.get("tpot_s")) and s["tpot_s"] > 0
    ]


def compare_phases(
    a: Doc,
    phase_a: str,
    b: Doc,
    phase_b: str,
    names: Sequence[str],
    *,
    alpha: float,
    min_effect: float,
) -> tuple[dict[str, Comparison], dict[str, Comparison]]:
    """Throughput and TPOT of `phase_b` in run b against `phase_a` in run a, Holm per metric."""
    tput = compare_family(
        {w: (tokens_per_s(a, phase_a, w), tokens_per_s(b, phase_b, w)) for w in names},
        metric="throughput",
        higher_is_better=True,
        alpha=alpha,
        min_effect=min_effect,
    )
    tpot_names = [w for w in names if tpot_ms(a, phase_a, w) and tpot_ms(b, phase_b, w)]
    tpot = compare_family(
        {w: (tpot_ms(a, phase_a, w), tpot_ms(b, phase_b, w)) for w in tpot_names},
        metric="tpot",
        higher_is_better=False,
        alpha=alpha,
        min_effect=min_effect,
    )
    return tput, tpot


def server_versions(doc: Doc) -> dict[str, str]:
    return {
        name: str(p["server_version"])
        for name, p in doc.get("phases", {}).items()
        if p.get("server_version")
    }


def gpus(doc: Doc) -> list[str] | None:
    """The GPUs nvidia-smi listed on the serving host; None where there is no nvidia-smi."""
    return doc.get("environment", {}).get("gpus")


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Row:
    """One prompt type of one candidate, as in the seed's table."""

    candidate: str
    prompt: str
    verdict: str
    reason: str
    baseline_tps: float | None
    candidate_tps: float | None
    change: float | None
    ratio_ci: tuple[float | None, float | None]
    p: float | None
    tpot_baseline: float | None
    tpot_candidate: float | None
    tpot_change: float | None
    tpot_p: float | None
    acceptance_length: float | None = None
    draft_acceptance: float | None = None
    per_position: tuple[float, ...] = ()
    disagreement: str | None = None

    @property
    def change_text(self) -> str:
        low, high = self.ratio_ci
        ci = ""
        if _finite(low) and _finite(high):
            ci = f" [{low - 1:+.1%}, {high - 1:+.1%}]"  # type: ignore[operator]
        return fmt_pct(self.change) + ci

    @property
    def tpot_text(self) -> str:
        return (
            f"{fmt_num(self.tpot_baseline)} → {fmt_num(self.tpot_candidate)} ms "
            f"({fmt_pct(self.tpot_change)}, p {fmt_p(self.tpot_p)})"
        )

    def cells(self) -> tuple[str, ...]:
        return (
            self.prompt,
            fmt_num(self.baseline_tps),
            fmt_num(self.candidate_tps),
            self.change_text,
            self.tpot_text,
            fmt_p(self.p),
            self.verdict,
        )


def table_rows(doc: Doc, candidate: str | None = None) -> list[Row]:
    """The seed-style rows of one candidate (or all), from the stored verdicts."""
    rows: list[Row] = []
    names = [candidate] if candidate else candidates_with_verdicts(doc)
    for name in names:
        for workload, v in doc.get("verdicts", {}).get(name, {}).items():
            t, p = v.get("throughput", {}), v.get("tpot", {})
            acc = v.get("acceptance") or {}
            ci = t.get("ratio_ci") or [None, None]
            rows.append(
                Row(
                    candidate=name,
                    prompt=workload,
                    verdict=v.get("verdict", "n/a"),
                    reason=t.get("reason", ""),
                    baseline_tps=t.get("baseline_median"),
                    candidate_tps=t.get("candidate_median"),
                    change=t.get("change"),
                    ratio_ci=(ci[0], ci[1]),
                    p=t.get("p_adjusted"),
                    tpot_baseline=p.get("baseline_median"),
                    tpot_candidate=p.get("candidate_median"),
                    tpot_change=p.get("change"),
                    tpot_p=p.get("p_adjusted"),
                    acceptance_length=acc.get("mean_acceptance_length"),
                    draft_acceptance=acc.get("draft_acceptance_rate"),
                    per_position=tuple(acc.get("per_position_rates") or ()),
                    disagreement=v.get("acceptance_disagreement"),
                )
            )
    return rows


def outcome(doc: Doc) -> str:
    """The run's overall verdict: regressed, improved, no significant difference, ..."""
    verdicts = [r.verdict for r in table_rows(doc)]
    if not verdicts:
        return "not measured"
    for v in (Verdict.REGRESSED, Verdict.IMPROVED):
        if v.value in verdicts:
            return v.value
    if all(v == Verdict.INSUFFICIENT.value for v in verdicts):
        return Verdict.INSUFFICIENT.value
    return Verdict.NO_DIFFERENCE.value


def headline(doc: Doc) -> str:
    """One sentence: what the run found, and whether to trust it."""
    parts: list[str] = []
    for name in candidates_with_verdicts(doc):
        rows = table_rows(doc, name)
        by: dict[str, list[str]] = {}
        for r in rows:
            by.setdefault(r.verdict, []).append(r.prompt)
        said = [
            f"{verdict} on {_which(prompts, len(rows))}"
            for verdict, prompts in by.items()
            if verdict in (Verdict.REGRESSED.value, Verdict.IMPROVED.value)
        ]
        if not said:
            common = Counter(r.verdict for r in rows).most_common(1)[0][0]
            said = [f"{common} on {_which(by[common], len(rows))}"]
        parts.append(f"{name}: " + "; ".join(said))
    result = {
        Verdict.REGRESSED.value: "Regression",
        Verdict.IMPROVED.value: "Improvement, no regression",
        Verdict.NO_DIFFERENCE.value: "No significant difference",
        Verdict.INSUFFICIENT.value: "No verdict: too few samples",
        "not measured": "No candidate was measured",
    }[outcome(doc)]
    drift = doc.get("drift") or {}
    if drift.get("unreliable"):
        result = "UNRELIABLE (the baseline drifted during the run). " + result
    return result + (". " + ". ".join(parts) if parts else "")


def _which(prompts: Sequence[str], total: int) -> str:
    if len(prompts) == 1:
        return prompts[0]
    if len(prompts) == total:
        return f"all {total} prompt types"
    return f"{len(prompts)} of {total} prompt types ({', '.join(prompts)})"


def title(candidates: Sequence[str], model: str | None, host: str | None) -> str:
    versus = ", ".join(candidates) if candidates else "baseline only"
    where = f" · {model} on {host}" if model else ""
    return f"Speculative decoding: baseline vs {versus}{where}"


# --------------------------------------------------------------------------- the checks


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def equivalence(doc: Doc) -> dict[str, dict[str, dict[str, Any]]]:
    """Per candidate and prompt type: do the candidate's outputs match the baseline's?

    With greedy decoding speculation should not change the text. The reference is the
    baseline's most common output; each candidate output is compared with it, exactly and by
    the length of the common prefix (in characters). A difference is a warning, not a failure.
    """
    out: dict[str, dict[str, dict[str, Any]]] = {}
    phases = doc.get("phases", {})
    for name in phase_order(doc):
        if name in (BASELINE, BASELINE_AFTER) or phases[name].get("spec") is None:
            continue
        for workload in workload_names(doc):
            base = [s.get("text") or "" for s in measured_samples(doc, BASELINE, workload)]
            cand = [s.get("text") or "" for s in measured_samples(doc, name, workload)]
            if not base or not cand:
                continue
            reference = Counter(base).most_common(1)[0][0]
            prefixes = [common_prefix(reference, t) for t in cand]
            identical = sum(t == reference for t in cand)
            first_diff = next((t for t in cand if t != reference), None)
            entry: dict[str, Any] = {
                "n": len(cand),
                "identical": identical,
                "status": "identical" if identical == len(cand) else "differs",
                "min_common_prefix_chars": min(prefixes),
                "reference_chars": len(reference),
                "baseline_consistent": len(set(base)) == 1,
            }
            if first_diff is not None:
                at = common_prefix(reference, first_diff)
                entry["divergence"] = {
                    "at_char": at,
                    "baseline": reference[max(0, at - 40) : at + 40],
                    "candidate": first_diff[max(0, at - 40) : at + 40],
                }
            out.setdefault(name, {})[workload] = entry
    return out


def equivalence_text(entry: Mapping[str, Any]) -> str:
    n, same = entry["n"], entry["identical"]
    if entry["status"] == "identical":
        text = f"identical to the baseline ({same}/{n} outputs)"
    else:
        text = (
            f"differs from the baseline: {same}/{n} outputs identical, common prefix at least "
            f"{entry['min_common_prefix_chars']} of {entry['reference_chars']} characters"
        )
    if not entry.get("baseline_consistent", True):
        text += " (the baseline's own outputs were not all equal)"
    return text


def drift_check(doc: Doc) -> dict[str, Any] | None:
    """ABA: the baseline measured before the candidates against the one measured after.

    The same test as for a candidate (Mann-Whitney U, Holm over the prompt types, the run's
    alpha and minimum effect). A significant and material difference on any prompt type or
    metric marks the experiment unreliable: the service changed while it was being measured.
    """
    phases = doc.get("phases", {})
    if BASELINE not in phases or BASELINE_AFTER not in phases:
        return None
    run = doc.get("run", {})
    alpha, min_effect = float(run.get("alpha", 0.05)), float(run.get("min_effect", 0.03))
    names = [
        w
        for w in workload_names(doc)
        if tokens_per_s(doc, BASELINE, w) and tokens_per_s(doc, BASELINE_AFTER, w)
    ]
    if not names:
        return None
    tput, tpot = compare_phases(
        doc, BASELINE, doc, BASELINE_AFTER, names, alpha=alpha, min_effect=min_effect
    )
    comparisons = [*tput.values(), *tpot.values()]
    drifted = sorted(
        {
            w
            for w, c in [*tput.items(), *tpot.items()]
            if c.verdict in (Verdict.IMPROVED, Verdict.REGRESSED)
        }
    )
    if drifted:
        status = "drifted"
    elif all(c.verdict == Verdict.INSUFFICIENT for c in comparisons):
        status = "insufficient samples"
    else:
        status = "consistent"
    moves = ", ".join(
        f"{w} {c.baseline_median:.1f} → {c.candidate_median:.1f} tok/s ({c.change:+.1%})"
        for w, c in tput.items()
    )
    if status == "drifted":
        text = f"the baseline drifted on {', '.join(drifted)}: the experiment is unreliable"
    elif status == "insufficient samples":
        reason = next(c.reason for c in comparisons if c.verdict == Verdict.INSUFFICIENT)
        text = f"too few samples to tell whether the baseline drifted ({reason})"
    else:
        text = "no significant drift: the baseline before and after agree"
    return {
        "status": status,
        "unreliable": status == "drifted",
        "drifted": drifted,
        "text": f"{text}. Before → after: {moves}",
        "throughput": {w: c.to_dict() for w, c in tput.items()},
        "tpot": {w: c.to_dict() for w, c in tpot.items()},
    }


def warnings_of(doc: Doc) -> list[str]:
    """What a reviewer should know: output differences, drift, stored-baseline mismatches."""
    out = list(doc.get("warnings", []))
    for name, per in (doc.get("equivalence") or {}).items():
        for workload, entry in per.items():
            if entry["status"] != "identical":
                out.append(f"{name}/{workload} output {equivalence_text(entry)}")
    drift = doc.get("drift") or {}
    if drift.get("unreliable"):
        out.append(f"drift check (ABA): {drift['text']}")
    for row in table_rows(doc):
        if row.disagreement:
            out.append(f"{row.candidate}/{row.prompt} acceptance: {row.disagreement}")
    restore = doc.get("restore") or {}
    if restore.get("errors") or restore.get("was_active") != restore.get("is_active", True):
        out.append(f"restore: {restore_text(restore)}")
    return out


def restore_text(restore: Mapping[str, Any]) -> str:
    state = "active and serving" if restore.get("is_active") else "stopped"
    text = f"{restore.get('original')} restored to {state} in {restore.get('seconds', 0):.0f}s"
    if restore.get("observed") is False:  # handed to the host; the controller stopped watching
        text = f"{restore.get('original')}: the host restores it; not watched to the end"
    text += "".join(f"; {note}" for note in restore.get("notes") or [])
    if restore.get("errors"):
        text += "; problems on the way: " + "; ".join(restore["errors"])
    return text


# --------------------------------------------------------------------------- environment


def environment_table(doc: Doc) -> dict[str, Any]:
    """What was tested, where: the rows of the HTML report's environment table."""
    target = doc.get("target", {})
    env = doc.get("environment", {})
    versions = server_versions(doc)
    distinct = sorted(set(versions.values()))
    gpu_list = gpus(doc)
    table: dict[str, Any] = {
        "Experiment": "baseline vs " + (", ".join(doc.get("candidates", {})) or "nothing"),
        "Host": target.get("host"),
        "Backend": target.get("backend"),
        "Unit": target.get("unit") or "none (a local process)",
        "Model": target.get("model"),
        "API base": target.get("api_base"),
        "vLLM version": (
            distinct[0]
            if len(distinct) == 1
            else ", ".join(f"{p} {v}" for p, v in versions.items()) or "unknown"
        ),
        "GPUs": "; ".join(gpu_list)
        if gpu_list
        else f"none listed (no nvidia-smi on {target.get('host')})",
        "Speculation configs": {
            name: json.dumps(values, sort_keys=True)
            for name, values in doc.get("candidates", {}).items()
        }
        or "none",
        "Requests": run_text(doc.get("run", {})),
        "pytest-specdecode": doc.get("plugin_version"),
        "Suite commit": env.get("git_commit") or "unknown (not a git checkout)",
        "Config file": doc.get("config_file"),
    }
    if doc.get("baseline_from"):
        table["Stored baseline"] = doc["baseline_from"].get("path")
    return table


def run_text(run: Mapping[str, Any]) -> str:
    if not run:
        return "unknown"
    return (
        f"{run.get('samples')} measured + {run.get('warmup')} warm-up per prompt type and phase; "
        f"up to {run.get('max_tokens')} tokens; concurrency {run.get('concurrency')}; "
        f"{run.get('endpoint')} endpoint; alpha {run.get('alpha')}, minimum effect "
        f"{float(run.get('min_effect', 0)):.0%}"
    )


# --------------------------------------------------------------------------- Markdown


def summary_markdown(doc: Doc, *, failed: Sequence[str] = (), run_name: str | None = None) -> str:
    """summary.md: fit for a PR comment and for $GITHUB_STEP_SUMMARY."""
    target = doc.get("target", {})
    versions = sorted(set(server_versions(doc).values()))
    gpu_list = gpus(doc)
    lines = [
        f"## {title(list(doc.get('candidates', {})), None, None)}",
        "",
        f"`{target.get('model')}` on `{target.get('host')}` ({target.get('backend')}"
        + (f", unit `{target['unit']}`" if target.get("unit") else "")
        + f") · vLLM {', '.join(versions) or 'unknown'} · GPUs: "
        + ("; ".join(gpu_list) if gpu_list else "none listed")
        + f" · suite {_short_commit(doc)}",
        "",
        run_text(doc.get("run", {})) + ".",
        "",
        f"**Result: {headline(doc)}**",
        "",
    ]
    if failed:
        lines += [f"**Failed tests ({len(failed)}):** " + ", ".join(f"`{f}`" for f in failed), ""]
    for name in candidates_with_verdicts(doc):
        spec = doc.get("candidates", {}).get(name)
        lines += [
            f"### {name}" + (f" · `{json.dumps(spec, sort_keys=True)}`" if spec else ""),
            "",
            "| " + " | ".join(TABLE_HEADER) + " |",
            "|:--|--:|--:|--:|:--|--:|:--|",
        ]
        rows = table_rows(doc, name)
        for row in rows:
            cells = list(row.cells())
            if row.verdict in (Verdict.REGRESSED.value, Verdict.IMPROVED.value):
                cells[-1] = f"**{cells[-1]}**"
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        acc = doc.get("phases", {}).get(name, {}).get("acceptance") or {}
        lines += ["", acceptance_text(acc), ""]
    checks = _checks(doc)
    if checks:
        lines += ["### Checks", "", *(f"- {c}" for c in checks), ""]
    where = f"run folder `{run_name}`: " if run_name else ""
    lines += [
        "<sub>p: Holm-adjusted two-sided Mann-Whitney U p of throughput (of TPOT in the TPOT "
        "column); brackets: the 95% bootstrap CI of the change in median throughput. A verdict "
        "needs p < alpha and a change beyond the minimum effect. "
        f"Full data in the {where}results.json, report.html and the plots.</sub>",
        "",
    ]
    return "\n".join(lines)


def acceptance_text(acc: Mapping[str, Any]) -> str:
    if not acc or not acc.get("present"):
        return "Acceptance: no spec-decode counters in /metrics."
    rates = acc.get("per_position_rates") or []
    return (
        f"Acceptance: mean length {fmt_num(acc.get('mean_acceptance_length'), '.2f')}, draft "
        f"acceptance {fmt_pct(acc.get('draft_acceptance_rate'), sign=False)} "
        f"({acc.get('accepted', 0):.0f} of {acc.get('draft_tokens', 0):.0f} draft tokens, "
        f"{acc.get('drafts', 0):.0f} drafts), per position ["
        + ", ".join(f"{r:.2f}" for r in rates)
        + "]"
    )


def _checks(doc: Doc) -> list[str]:
    checks: list[str] = []
    for name, per in (doc.get("equivalence") or {}).items():
        for workload, entry in per.items():
            mark = "" if entry["status"] == "identical" else "⚠ "
            checks.append(f"{mark}Output, {name}/{workload}: {equivalence_text(entry)}")
    drift = doc.get("drift")
    if drift:
        mark = "⚠ " if drift.get("unreliable") else ""
        checks.append(f"{mark}Drift (ABA): {drift['text']}")
    for row in table_rows(doc):
        if row.disagreement:
            checks.append(f"⚠ Acceptance, {row.candidate}/{row.prompt}: {row.disagreement}")
    checks += [f"⚠ {w}" for w in doc.get("warnings", [])]
    if doc.get("baseline_from"):
        checks.append(f"Baseline reused from `{doc['baseline_from'].get('path')}`")
    if doc.get("restore"):
        checks.append(f"Restore: {restore_text(doc['restore'])}")
    return checks


def _short_commit(doc: Doc) -> str:
    commit = doc.get("environment", {}).get("git_commit")
    return f"`{commit[:12]}`" if commit else "unknown"


# --------------------------------------------------------------------------- HTML

CSS = """
#environment td {color: #333}
.specdecode {color: #222; font-size: 13px; max-width: 1400px}
.specdecode h3 {color: #111; font-size: 15px; margin: 18px 0 6px}
.specdecode p, .specdecode li {color: #222}
.specdecode table.specdecode-table {border-collapse: collapse; margin: 6px 0 10px}
.specdecode-table th, .specdecode-table td {border: 1px solid #d9d9d9; padding: 4px 9px;
  text-align: right; color: #222; white-space: nowrap}
.specdecode-table th {background: #f3f3f3}
.specdecode-table th:first-child, .specdecode-table td:first-child {text-align: left}
.specdecode-table td.verdict {text-align: left}
.specdecode .v-regressed {background: #fbe1e1; color: #9b1c1c; font-weight: bold}
.specdecode .v-improved {background: #ddf3e1; color: #17612b; font-weight: bold}
.specdecode .v-insufficient-samples {background: #fff4d1}
.specdecode .headline {font-size: 14px; font-weight: bold; padding: 6px 10px;
  border-left: 5px solid #999; background: #f7f7f7}
.specdecode .headline.regressed, .specdecode .headline.unreliable {border-color: #c0392b}
.specdecode .headline.improved {border-color: #2e8b57}
.specdecode .warn {color: #8a4b00}
.specdecode .note {color: #555; font-size: 12px}
.specdecode code {font-size: 12px; background: #f3f3f3; padding: 1px 3px}
.specdecode .plots {display: flex; flex-wrap: wrap; gap: 14px}
.specdecode figure {margin: 0; max-width: 100%}
.specdecode figure img {max-width: 100%; border: 1px solid #e5e5e5}
.specdecode figcaption {color: #555; font-size: 12px; max-width: 900px}
.specdecode .bar {display: inline-block; height: 9px; background: #dd8452;
  vertical-align: middle; margin-right: 4px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value))


def _verdict_class(verdict: str) -> str:
    return "v-" + verdict.replace(" ", "-")


def table_html(rows: Iterable[Row]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in TABLE_HEADER)
    body = []
    for row in rows:
        cells = row.cells()
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells[:-1])
        body.append(
            f"<tr>{tds}<td class='verdict {_verdict_class(row.verdict)}' "
            f"title='{_e(row.reason)}'>{_e(cells[-1])}</td></tr>"
        )
    return (
        f"<table class='specdecode-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def summary_html(doc: Doc, plots: Mapping[str, Path] | None = None) -> str:
    """The section at the top of the HTML report: verdict, table, checks, plots."""
    result = outcome(doc)
    klass = "unreliable" if (doc.get("drift") or {}).get("unreliable") else result.split()[0]
    parts = [
        f"<section class='specdecode' id='specdecode-summary'><style>{CSS}</style>",
        f"<p class='headline {klass}'>Result: {_e(headline(doc))}</p>",
        f"<p class='note'>{_e(run_text(doc.get('run', {})))}</p>",
    ]
    for name in candidates_with_verdicts(doc):
        spec = doc.get("candidates", {}).get(name)
        parts.append(
            f"<h3>{_e(name)}"
            + (f" <code>{_e(json.dumps(spec, sort_keys=True))}</code>" if spec else "")
            + "</h3>"
        )
        parts.append(table_html(table_rows(doc, name)))
        acc = doc.get("phases", {}).get(name, {}).get("acceptance") or {}
        parts.append(f"<p>{_e(acceptance_text(acc))}</p>")
    checks = _checks(doc)
    if checks:
        items = "".join(
            f"<li class='{'warn' if c.startswith('⚠') else ''}'>{_e(c)}</li>" for c in checks
        )
        parts.append(f"<h3>Checks</h3><ul>{items}</ul>")
    parts.append(
        "<p class='note'>p: Holm-adjusted two-sided Mann-Whitney U p of throughput (of TPOT in "
        "the TPOT column); brackets: the 95% bootstrap CI of the change in median throughput. "
        "A verdict needs p &lt; alpha and a change beyond the minimum effect; hover a verdict "
        "for its reason.</p>"
    )
    if plots:
        figures = []
        for name, path in plots.items():
            data = base64.b64encode(Path(path).read_bytes()).decode()
            figures.append(
                f"<figure><img id='specdecode-plot-{name}' alt='{_e(name)} plot' "
                f"src='data:image/png;base64,{data}'/>"
                f"<figcaption>{_e(PLOT_CAPTIONS.get(name, name))}</figcaption></figure>"
            )
        parts.append(f"<h3>Plots</h3><div class='plots'>{''.join(figures)}</div>")
    parts.append("</section>")
    return redact_text("".join(parts))


def extra_html(doc: Doc, phase: str, workload: str | None) -> str | None:
    """A test's extra in the HTML report: its prompt type's row, acceptance, output check."""
    if phase not in doc.get("phases", {}):
        return None
    workloads = [workload] if workload else workload_names(doc)
    parts = ["<div class='specdecode'>"]
    verdicts = doc.get("verdicts", {}).get(phase)
    if verdicts:
        rows = [r for r in table_rows(doc, phase) if r.prompt in workloads]
        parts.append(table_html(rows))
        for row in rows:
            parts.append(f"<p class='note'>{_e(row.prompt)}: {_e(row.reason)}</p>")
            if row.disagreement:
                parts.append(f"<p class='warn'>Acceptance cross-check: {_e(row.disagreement)}</p>")
    else:
        parts.append(_phase_table(doc, phase, workloads))
    for w in workloads:
        acc = doc["phases"][phase].get("workloads", {}).get(w, {}).get("acceptance")
        if acc and acc.get("present"):
            parts.append(f"<p>{_e(acceptance_text(acc))} ({_e(w)})</p>")
            parts.append(_per_position_html(acc.get("per_position_rates") or []))
        entry = (doc.get("equivalence") or equivalence(doc)).get(phase, {}).get(w)
        if entry:
            klass = "" if entry["status"] == "identical" else "warn"
            parts.append(f"<p class='{klass}'>Output: {_e(equivalence_text(entry))}</p>")
            div = entry.get("divergence")
            if div:
                parts.append(
                    f"<p class='note'>first difference at character {div['at_char']}: "
                    f"baseline <code>{_e(div['baseline'])}</code> vs candidate "
                    f"<code>{_e(div['candidate'])}</code></p>"
                )
    parts.append("</div>")
    return redact_text("".join(parts))


def _phase_table(doc: Doc, phase: str, workloads: Sequence[str]) -> str:
    head = ("Prompt", "Phase", "n", "Median tok/s", "Median TPOT ms", "Mean TTFT ms", "Threshold")
    rows = []
    for w in workloads:
        m = doc["phases"][phase].get("workloads", {}).get(w)
        if not m:
            continue
        spec = doc.get("workloads", {}).get(w, {})
        limits = [
            f"≥ {spec['min_tokens_per_s']} tok/s" if spec.get("min_tokens_per_s") else "",
            f"≤ {spec['max_tpot_ms']} ms TPOT" if spec.get("max_tpot_ms") else "",
        ]
        cells = (
            w,
            phase,
            m.get("n"),
            fmt_num(m.get("median_tokens_per_s")),
            fmt_num(m.get("median_tpot_ms")),
            fmt_num(m.get("mean_ttft_ms")),
            ", ".join(x for x in limits if x) or "none",
        )
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (
        "<table class='specdecode-table'><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
    )


def _per_position_html(rates: Sequence[float]) -> str:
    if not rates:
        return ""
    positions = "".join(f"<th>{i}</th>" for i in range(1, len(rates) + 1))
    cells = "".join(
        f"<td><span class='bar' style='width:{max(1, round(r * 60))}px'></span>{r:.2f}</td>"
        for r in rates
    )
    return (
        "<table class='specdecode-table'><thead><tr><th>draft position</th>"
        f"{positions}</tr></thead><tbody><tr><td>acceptance rate</td>{cells}</tr></tbody></table>"
    )


def terminal_notes(doc: Doc) -> list[str]:
    """Lines under the terminal table: the checks a reviewer should not miss."""
    return [f"warning: {w}" for w in warnings_of(doc)] + (
        [f"drift (ABA): {doc['drift']['text']}"]
        if doc.get("drift") and not doc["drift"].get("unreliable")
        else []
    )


# --------------------------------------------------------------------------- plots


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def phase_color(doc: Doc, phase: str) -> str:
    if phase == BASELINE:
        return _BASE_COLOR
    if phase == BASELINE_AFTER:
        return _AFTER_COLOR
    others = [p for p in phase_order(doc) if p not in (BASELINE, BASELINE_AFTER)]
    index = others.index(phase) if phase in others else 0
    return _CANDIDATE_COLORS[index % len(_CANDIDATE_COLORS)]


def median_ci(values: Sequence[float], *, n_resamples: int = 2000, seed: int = 0):
    """Percentile bootstrap 95% CI of the median; (m, m) when there is nothing to resample."""
    arr = np.asarray(values, dtype=float)
    med = float(np.median(arr))
    if arr.size < 2 or np.ptp(arr) == 0:
        return med, med
    rng = np.random.default_rng(seed)
    meds = np.median(arr[rng.integers(0, arr.size, size=(n_resamples, arr.size))], axis=1)
    low, high = np.percentile(meds, [2.5, 97.5])
    return float(low), float(high)


def _grouped(doc: Doc, metric: str) -> tuple[list[str], list[str], dict[tuple[str, str], list]]:
    getter = tokens_per_s if metric == "tokens_per_s" else tpot_ms
    phases = phase_order(doc)
    data = {(p, w): getter(doc, p, w) for p in phases for w in workload_names(doc)}
    workloads = [w for w in workload_names(doc) if any(data[(p, w)] for p in phases)]
    phases = [p for p in phases if any(data[(p, w)] for w in workloads)]
    return phases, workloads, data


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def _positions(n_phases: int, j: int, i: int) -> tuple[float, float]:
    width = 0.8 / max(n_phases, 1)
    return j - 0.4 + width * (i + 0.5), width


def plot_throughput(doc: Doc, path: Path) -> Path:
    phases, workloads, data = _grouped(doc, "tokens_per_s")
    fig = _figure(max(6.5, 1.7 * len(workloads) + 3.5), 4.4)
    ax = fig.add_subplot()
    if not workloads:
        _empty(ax, "no measured requests")
    changes = {(r.candidate, r.prompt): r for r in table_rows(doc)}
    rng = np.random.default_rng(0)
    for i, phase in enumerate(phases):
        color = phase_color(doc, phase)
        labelled = False
        for j, w in enumerate(workloads):
            values = data[(phase, w)]
            if not values:
                continue
            x, width = _positions(len(phases), j, i)
            med = statistics.median(values)
            low, high = median_ci(values)
            ax.bar(
                x,
                med,
                width * 0.88,
                color=color,
                alpha=0.85,
                zorder=2,
                label=None if labelled else phase,
            )
            labelled = True
            ax.errorbar(
                x,
                med,
                yerr=[[med - low], [high - med]],
                fmt="none",
                ecolor="#222",
                capsize=4,
                lw=1.3,
                zorder=3,
            )
            jitter = rng.uniform(-width * 0.18, width * 0.18, len(values))
            ax.scatter(x + jitter, values, s=9, color="#111", alpha=0.55, zorder=4, lw=0)
            row = changes.get((phase, w))
            if row is not None and _finite(row.change):
                mark = {"regressed": "#b22222", "improved": "#1e7b34"}.get(row.verdict, "#333")
                ax.annotate(
                    f"{row.change:+.1%}",
                    (x, max(high, max(values))),
                    textcoords="offset points",
                    xytext=(0, 4),
                    ha="center",
                    fontsize=8,
                    color=mark,
                    fontweight="bold" if mark != "#333" else "normal",
                )
    if workloads:
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_ylabel("tok/s per request")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
        ax.grid(axis="y", alpha=0.3, zorder=0)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=9)
    ax.set_title("Throughput per prompt type (median, 95% CI, requests)", fontsize=11)
    fig.savefig(path, format="png")
    return path


def plot_tpot(doc: Doc, path: Path) -> Path:
    from matplotlib.patches import Patch

    phases, workloads, data = _grouped(doc, "tpot_ms")
    fig = _figure(max(6.5, 1.7 * len(workloads) + 3.5), 4.4)
    ax = fig.add_subplot()
    if not workloads:
        _empty(ax, "no TPOT measured (requests of one token)")
    rng = np.random.default_rng(1)
    for i, phase in enumerate(phases):
        color = phase_color(doc, phase)
        for j, w in enumerate(workloads):
            values = data[(phase, w)]
            if not values:
                continue
            x, width = _positions(len(phases), j, i)
            box = ax.boxplot(
                [values],
                positions=[x],
                widths=width * 0.8,
                patch_artist=True,
                showfliers=False,
                medianprops={"color": "#111", "lw": 1.5},
                whiskerprops={"color": "#444"},
                capprops={"color": "#444"},
                manage_ticks=False,
                zorder=2,
            )
            for patch in box["boxes"]:
                patch.set_facecolor(color)
                patch.set_alpha(0.75)
            jitter = rng.uniform(-width * 0.18, width * 0.18, len(values))
            ax.scatter(x + jitter, values, s=9, color="#111", alpha=0.55, zorder=3, lw=0)
    if workloads:
        ax.set_xticks(range(len(workloads)), workloads)
        ax.set_xlim(-0.6, len(workloads) - 0.4)
        ax.set_ylabel("TPOT, ms per output token")
        ax.grid(axis="y", alpha=0.3, zorder=0)
        ax.legend(
            handles=[Patch(color=phase_color(doc, p), alpha=0.75, label=p) for p in phases],
            loc="upper left",
            bbox_to_anchor=(1.0, 1.0),
            frameon=False,
            fontsize=9,
        )
    ax.set_title("Time per output token (lower is better)", fontsize=11)
    fig.savefig(path, format="png")
    return path


def plot_acceptance(doc: Doc, path: Path) -> Path:
    fig = _figure(8.5, 4.2)
    ax = fig.add_subplot()
    drawn = False
    phases = doc.get("phases", {})
    styles = ((0, (4, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (2, 3)), (0, (8, 3)))
    markers = ("s", "^", "v", "D", "P", "X")
    for name in phase_order(doc):
        if phases[name].get("spec") is None:
            continue
        acc = phases[name].get("acceptance") or {}
        rates = acc.get("per_position_rates") or []
        if not acc.get("present") or not rates:
            continue
        color = phase_color(doc, name)
        length = acc.get("mean_acceptance_length")
        ax.plot(
            range(1, len(rates) + 1),
            rates,
            marker="o",
            lw=2.4,
            color=color,
            label=f"{name}, all prompts (mean length {fmt_num(length, '.2f')})",
            zorder=3,
        )
        per_workload = [
            (w, (m.get("acceptance") or {}).get("per_position_rates") or [])
            for w, m in phases[name].get("workloads", {}).items()
        ]
        if len(per_workload) > 1:
            for k, (w, wr) in enumerate(per_workload):
                if wr:
                    ax.plot(
                        range(1, len(wr) + 1),
                        wr,
                        lw=1.1,
                        ls=styles[k % len(styles)],
                        marker=markers[k % len(markers)],
                        ms=4,
                        color=color,
                        alpha=0.6,
                        label=f"{name}, {w}",
                        zorder=2,
                    )
        drawn = True
    if drawn:
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(-0.02, 1.03)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    else:
        _empty(ax, "no per-position acceptance: no candidate exported spec-decode counters")
    ax.set_title("Per-position acceptance rate", fontsize=11)
    fig.savefig(path, format="png")
    return path


def write_plots(doc: Doc, run_dir: Path) -> dict[str, Path]:
    drawers = {"throughput": plot_throughput, "tpot": plot_tpot, "acceptance": plot_acceptance}
    return {name: drawers[name](doc, run_dir / file) for name, file in PLOT_FILES.items()}


# --------------------------------------------------------------------------- the end of a run


@dataclass
class Written:
    """The report files of a run."""

    run_dir: Path
    summary: Path
    plots: dict[str, Path] = field(default_factory=dict)
    markdown: str = ""


def finish(
    experiment: Experiment,
    run_dir: Path,
    *,
    failed: Sequence[str] = (),
    step_summary: str | None = None,
) -> Written:
    """At the end of a run: verdicts, the checks, the plots and summary.md; results.json too.

    Only phases that were measured are used: nothing is started here.
    """
    if BASELINE in experiment.phases:
        for name, phase in list(experiment.phases.items()):
            if phase.spec is not None:
                experiment.verdicts(name)
    doc = experiment.results.data
    if experiment.board.restore_report is not None:
        doc["restore"] = dict(experiment.board.restore_report.__dict__)
    doc["equivalence"] = equivalence(doc)
    drift = drift_check(doc)
    if drift is not None:
        doc["drift"] = drift
    experiment.results.flush()
    plots = write_plots(doc, run_dir)
    markdown = redact_text(summary_markdown(doc, failed=failed, run_name=run_dir.name))
    summary = run_dir / SUMMARY_FILE
    summary.write_text(markdown)
    if step_summary:
        with Path(step_summary).open("a") as f:
            f.write(markdown + "\n")
    return Written(run_dir, summary, plots, markdown)


# --------------------------------------------------------------------------- dry run


@dataclass(frozen=True)
class Timing:
    """How long things took before: per server start and per output token."""

    start_s: float
    s_per_token: float
    source: str  # where these numbers come from


def count_requests(settings: Settings, *, baseline: bool, aba: bool) -> tuple[int, int]:
    """(phases measured, requests sent) for this configuration."""
    phases = int(baseline) + len(settings.candidates) + int(aba and bool(settings.candidates))
    per_phase = len(settings.workloads) * (settings.run.samples + settings.run.warmup)
    return phases, phases * per_phase


def estimate_seconds(
    settings: Settings, timing: Timing, *, baseline: bool, aba: bool
) -> tuple[float, int]:
    """(seconds, server starts): starts, plus every request at its full max_tokens."""
    candidates = len(settings.candidates)
    aba = aba and candidates > 0
    if settings.target.backend == "local":
        starts = int(baseline) + candidates + int(aba)
    else:  # the original is measured as it runs; the restore starts it again unless ABA did
        starts = candidates + (1 if aba else int(candidates > 0))
    phases, _ = count_requests(settings, baseline=baseline, aba=aba)
    per_phase = sum(
        (settings.run.samples + settings.run.warmup) * w.max_tokens * timing.s_per_token
        for w in settings.workloads.values()
    )
    return starts * timing.start_s + phases * per_phase / settings.run.concurrency, starts


def dry_run_lines(
    settings: Settings,
    steps: Sequence[str],
    *,
    host: str,
    timing: Timing,
    aba: bool,
    baseline_from: str | None,
) -> list[str]:
    """The plan, as --spec-dry-run prints it."""
    t = settings.target
    baseline = baseline_from is None
    phases, requests = count_requests(settings, baseline=baseline, aba=aba)
    seconds, starts = estimate_seconds(settings, timing, baseline=baseline, aba=aba)
    run = settings.run
    lines = [
        "pytest-specdecode dry run: nothing is started, written or changed.",
        f"host: {host} ({t.backend} backend)" + (f", unit {t.unit}" if t.unit else ""),
        f"model: {t.model} at {t.api_base}",
        "candidates: "
        + (", ".join(f"{c.name} {c.to_json()}" for c in settings.candidates) or "none"),
        f"prompt types: {', '.join(settings.workloads)}",
    ]
    if baseline_from:
        lines.append(
            f"baseline: reused from {baseline_from}, not measured"
            + ("; the original is not started for it" if t.backend == "local" else "")
        )
    steps = list(steps)
    if aba and settings.candidates:  # just before the restore, the plan's last step
        steps.insert(
            len(steps) - 1,
            "drift check (ABA): stop the last candidate, start the original and measure it "
            "again as 'baseline-after'",
        )
    lines.append("steps, in order:")
    for i, step in enumerate(steps, start=1):
        first, *rest = step.splitlines()
        lines.append(f"  {i}. {first}")
        lines += [f"     {line}" for line in rest]
    lines += [
        f"requests: {requests} = {phases} phases x {len(settings.workloads)} prompt types x "
        f"({run.samples} measured + {run.warmup} warm-up)",
        f"estimated duration: about {_duration(seconds)} ({starts} server "
        f"start{'' if starts == 1 else 's'} at "
        f"~{timing.start_s:.0f}s, requests at up to ~{timing.s_per_token * 1000:.0f} ms per "
        f"output token; {timing.source})",
    ]
    return lines


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# --------------------------------------------------------------------------- formatting


def _finite(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def fmt_num(x: Any, fmt: str = ".1f") -> str:
    return format(x, fmt) if _finite(x) else "n/a"


def fmt_pct(x: Any, *, sign: bool = True) -> str:
    if not _finite(x):
        return "n/a"
    return f"{x:+.1%}" if sign else f"{x:.1%}"


def fmt_p(p: Any) -> str:
    if not _finite(p):
        return "n/a"
    return f"{p:.1e}" if 0 < p < 0.001 else f"{p:.3f}"
