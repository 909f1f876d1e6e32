"""The HTML report's pieces: the summary at the top, each test's extra, the environment table.

pytest-html assembles the page; `../html_hooks.py` hands it these pieces.
"""

from __future__ import annotations

import base64
import html
import json
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..analysis.run import RunAnalysis
from ..record.schema import RunRecord
from ..redaction import redact_text
from .plots import caption
from .rows import TABLE_HEADER, Row, checks, headline, rows, undecided
from .sections import (
    acceptance,
    break_even,
    cut,
    host_env,
    levels,
    prediction,
    regime,
    search,
    shape,
    side_changes,
)
from .text import STATISTICS_NOTE, acceptance_text, design_text, fmt_num, suite_text

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
.specdecode .v-insufficient-samples, .specdecode .v-inconclusive,
.specdecode .v-contaminated {background: #fff4d1}
.specdecode .v-equivalent {background: #eef4fb}
.specdecode .headline {font-size: 14px; font-weight: bold; padding: 6px 10px;
  border-left: 5px solid #999; background: #f7f7f7}
.specdecode .headline.regressed, .specdecode .headline.unreliable {border-color: #c0392b}
.specdecode .headline.improved {border-color: #2e8b57}
.specdecode .specdecode-answer {font-size: 14px; padding: 8px 10px; border-left: 5px solid #1f3bb3;
  background: #f2f5ff}
.specdecode .specdecode-cut {border: 2px solid #c0392b; background: #fdecea; padding: 6px 12px;
  margin: 0 0 10px}
.specdecode .cut-headline {font-size: 15px; font-weight: bold; color: #9b1c1c; margin: 4px 0}
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


def table(found: Iterable[Row]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in TABLE_HEADER)
    body = []
    for row in found:
        cells = row.cells()
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells[:-1])
        klass = "v-" + row.verdict.replace(" ", "-")
        body.append(
            f"<tr>{tds}<td class='verdict {klass}' title='{_e(row.reason)}'>{_e(cells[-1])}"
            "</td></tr>"
        )
    return (
        f"<table class='specdecode-table'><thead><tr>{head}</tr></thead>"
        f"<tbody>{''.join(body)}</tbody></table>"
    )


def summary(record: RunRecord, analysis: RunAnalysis, plots: Mapping[str, Path] | None) -> str:
    """The section at the top of the HTML report: verdict, table, checks, plots."""
    unreliable = analysis.drift is not None and analysis.drift.unreliable
    klass = "unreliable" if unreliable else analysis.outcome.split()[0]
    parts = [
        f"<section class='specdecode' id='specdecode-summary'><style>{CSS}</style>",
        cut.html_section(record.cut),
        search.answer_html(analysis.search),
        shape.html_section(record),
        f"<p class='headline {klass}'>{_e(cut.result_label(record))}: {_e(headline(analysis))}</p>",
        *(f"<p class='note'>{_e(line)}</p>" for line in undecided(analysis, record)),
        regime.html_block(analysis),
        f"<p class='note'>{_e(design_text(record.run))}</p>",
    ]
    for name in analysis.verdicts:
        spec = record.candidates.get(name)
        slowed = regime.mark(analysis, name)
        parts.append(
            f"<h3>{_e(name)}"
            + (f" <code>{_e(json.dumps(spec, sort_keys=True))}</code>" if spec else "")
            + (f" <span class='warn'>⚠ {_e(slowed)}</span>" if slowed else "")
            + "</h3>"
        )
        parts.append(table(rows(analysis, name)))
        parts.append(f"<p>{_e(acceptance_text(record.arm_phases(name)[0].acceptance))}</p>")
        parts.append(side_changes.html_block(analysis, name))
    parts.append(levels.html_section(record, analysis))
    parts.append(break_even.html_section(analysis))
    parts.append(search.html_section(record, analysis.search))
    parts.append(prediction.html_section(record, analysis))
    parts.append(acceptance.html_section(record, analysis))
    parts.append(host_env.html_section(record))
    found = checks(record, analysis)
    if found:
        items = "".join(
            f"<li class='{'warn' if c.warn else ''}'>{'⚠ ' if c.warn else ''}{_e(c.text)}</li>"
            for c in found
        )
        parts.append(f"<h3>Checks</h3><ul>{items}</ul>")
    parts.append(f"<p class='note'>{_e(STATISTICS_NOTE)} Hover a verdict for its reason.</p>")
    if plots:
        figures = []
        for name, path in plots.items():
            data = base64.b64encode(Path(path).read_bytes()).decode()
            figures.append(
                f"<figure><img id='specdecode-plot-{name}' alt='{_e(name)} plot' "
                f"src='data:image/png;base64,{data}'/>"
                f"<figcaption>{_e(caption(name))}</figcaption></figure>"
            )
        parts.append(f"<h3>Plots</h3><div class='plots'>{''.join(figures)}</div>")
    parts.append("</section>")
    return redact_text("".join(parts))


def extra(
    record: RunRecord, analysis: RunAnalysis | None, phase: str, prompt_type: str | None
) -> str:
    """A test's extra: its prompt type's row, acceptance and output check (the measured table
    alone while the design is incomplete: no analysis yet)."""
    measured = record.phases[phase]
    names = [prompt_type] if prompt_type else list(measured.measurements)
    parts = ["<div class='specdecode'>"]
    verdicts = analysis.verdicts.get(measured.arm) if analysis is not None else None
    if analysis is not None and verdicts:
        found = [r for r in rows(analysis, measured.arm) if r.prompt_type in names]
        parts.append(table(found))
        for row in found:
            parts.append(f"<p class='note'>{_e(row.prompt_type)}: {_e(row.reason)}</p>")
            if row.note:
                parts.append(f"<p class='warn'>Acceptance cross-check: {_e(row.note)}</p>")
    else:
        parts.append(_phase_table(record, phase, names))
    for name in names:
        m = measured.measurements.get(name)
        if m is not None and m.acceptance.present:
            parts.append(f"<p>{_e(acceptance_text(m.acceptance))} ({_e(name)})</p>")
            parts.append(_per_position(m.acceptance.per_position_rates))
        entry = analysis.equivalence.get(measured.arm, {}).get(name) if analysis else None
        if entry is not None:
            klass = "" if entry.status == "identical" else "warn"
            parts.append(f"<p class='{klass}'>Output: {_e(entry.text())}</p>")
            if entry.divergence:
                div = entry.divergence
                parts.append(
                    f"<p class='note'>first difference at character {div['at_char']}: "
                    f"baseline <code>{_e(div['baseline'])}</code> vs candidate "
                    f"<code>{_e(div['candidate'])}</code></p>"
                )
    parts.append("</div>")
    return redact_text("".join(parts))


def _phase_table(record: RunRecord, phase: str, names: list[str]) -> str:
    head = ("Prompt", "Phase", "n", "Median tok/s", "Median TPOT ms", "Mean TTFT ms", "Threshold")
    body = []
    for name in names:
        m = record.phases[phase].measurements.get(name)
        if m is None:
            continue
        spec = record.prompt_types.get(m.prompt_type)
        limits = [
            f"≥ {spec.min_tokens_per_s} tok/s" if spec and spec.min_tokens_per_s else "",
            f"≤ {spec.max_tpot_ms} ms TPOT" if spec and spec.max_tpot_ms else "",
        ]
        ttft = statistics.fmean(s.ttft_s * 1000 for s in m.samples) if m.samples else None
        cells = (
            name,
            phase,
            len(m.samples),
            fmt_num(m.median_tokens_per_s),
            fmt_num(m.median_tpot_ms),
            fmt_num(ttft),
            ", ".join(x for x in limits if x) or "none",
        )
        body.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return (
        "<table class='specdecode-table'><thead><tr>"
        + "".join(f"<th>{_e(h)}</th>" for h in head)
        + f"</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def _per_position(rates: list[float]) -> str:
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


def environment(record: RunRecord) -> dict[str, Any]:
    """What was tested, where: the rows of the HTML report's environment table."""
    target = record.target
    versions = {p.name: p.server_version for p in record.phases.values() if p.server_version}
    distinct = sorted(set(versions.values()))
    gpus = record.environment.get("gpus")
    table_rows: dict[str, Any] = {
        "Experiment": "baseline vs " + (", ".join(record.candidates) or "nothing"),
        "Host": target.host,
        "Backend": target.backend,
        "Unit": target.unit or "none (a local process)",
        "Model": target.model,
        "API base": target.api_base,
        "vLLM version": (
            distinct[0]
            if len(distinct) == 1
            else ", ".join(f"{p} {v}" for p, v in versions.items()) or "unknown"
        ),
        "GPUs": "; ".join(gpus) if gpus else f"none listed (no nvidia-smi on {target.host})",
        "Speculation configs": {
            name: json.dumps(values, sort_keys=True) for name, values in record.candidates.items()
        }
        or "none",
        "Requests": design_text(record.run),
        "pytest-specdecode": record.plugin_version,
        "Suite commit": suite_text(record.environment),
        "Config file": record.config_file,
    }
    if record.baseline_from:
        table_rows["Stored baseline"] = record.baseline_from.path
    if record.shape:
        table_rows["Shape"] = record.shape.label + " (dummy weights)"
    return table_rows
