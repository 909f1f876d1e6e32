"""The prediction as a reader meets it: predicted beside measured (terminal, summary.md, HTML),
the heat map of predicted speedup over the grid, the grid for specdecode-predict, and the dry
run's lines. Everything here reads `analysis.prediction.RunPrediction`; nothing is computed."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ...analysis.map.break_even import map_of_run
from ...analysis.prediction.candidates import CandidatePrediction
from ...analysis.prediction.inputs import first_key
from ...analysis.prediction.ngram_types import NGRAM_GRID_K, NgramSettings
from ...analysis.prediction.predict import RunPrediction, predict_run
from ...analysis.run import Figures, RunAnalysis, verdicts_and_map
from ...config.settings import Settings
from ...record.counters import ACCEPTED_PER_DRAFT_MEANS, TOKENS_PER_STEP_MEANS
from ...record.schema import RunRecord
from ..text import fmt_num, fmt_pct

if TYPE_CHECKING:
    from matplotlib.axes import Axes

HEATMAP_FILE = "prediction.png"
HEATMAP_CAPTION = (
    "Predicted speedup over the baseline for every n-gram config of the grid, per prompt type "
    "(rows: prompt_lookup_min..max, columns: num_speculative_tokens), from the replay of the "
    "baseline's token ids and the fitted cost model; without a measured n-gram candidate, the "
    "ceiling (a speculative step costing no more than a plain one). Colours saturate at x0.5 "
    "and x2. Blank: no prediction, its band wider than the measurements support. Boxes: "
    "measured candidates; star: the recommendation."
)
HEADER = (
    "Prompt",
    "Candidate (effective)",
    "Accepted per draft pred / meas",
    "Draft acceptance pred / meas",
    "Tokens per step",
    "tok/s predicted [band]",
    "tok/s measured",
    "Measured in band",
    "Replay vs counters",
)


@dataclass(frozen=True)
class PredictionRow:
    """One measured n-gram candidate on one prompt type: predicted beside measured."""

    candidate: str
    label: str
    prompt_type: str
    status: str
    detail: str
    predicted_length: float | None
    measured_length: float | None
    predicted_rate: float | None
    measured_rate: float | None
    tokens_per_step: float | None
    predicted_tps: float | None
    band: tuple[float, float] | None
    measured_tps: float | None
    withheld: str | None = None  # why the band is no prediction (the notes say it whole)
    inside: bool | None = None  # the measured ratio in the predicted band; None: not predicted

    def cells(self) -> tuple[str, ...]:
        band = f" [{self.band[0]:.1f}, {self.band[1]:.1f}]" if self.band else ""
        predicted = "no prediction" if self.withheld else fmt_num(self.predicted_tps) + band
        return (
            self.prompt_type,
            f"{self.candidate} ({self.label})",
            f"{fmt_num(self.predicted_length, '.2f')} / {fmt_num(self.measured_length, '.2f')}",
            f"{fmt_pct(self.predicted_rate, sign=False)} / "
            f"{fmt_pct(self.measured_rate, sign=False)}",
            fmt_num(self.tokens_per_step, ".2f"),
            predicted,
            fmt_num(self.measured_tps),
            {True: "yes", False: "no", None: "-"}[self.inside],
            self.status,
        )


def prediction_rows(
    record: RunRecord,
    prediction: RunPrediction,
    figures: Figures,
    ones: Sequence[CandidatePrediction] = (),
) -> list[PredictionRow]:
    """Predicted beside measured; the measured tok/s is the arm's figure in the results table
    (`RunAnalysis.figures`), and whether it lies in the band is the candidate's one prediction's
    (`RunAnalysis.candidate_predictions`, the same figure)."""
    out = []
    first = record.run.levels[0].label if record.run.levels else None
    one = {(o.candidate, o.prompt_type): o for o in ones if o.level == first}
    for candidate, per in prediction.comparisons.items():
        for name, c in per.items():
            pred = prediction.predictions.get(name, {}).get(c.settings)
            key = first_key(record, name)
            measured = figures.get(candidate, {}).get(key, {}).get("throughput")
            stats, counts = c.predicted, c.measured
            said = one.get((candidate, name))  # its one prediction, in the results table's tok/s
            predicted_tps = said.tokens_per_s if said else pred.tokens_per_s if pred else None
            band = said.tokens_per_s_band if said else pred.tokens_per_s_band if pred else None
            out.append(
                PredictionRow(
                    candidate=candidate,
                    label=c.settings.label,
                    prompt_type=name,
                    status=c.status,
                    detail=c.detail,
                    predicted_length=stats.mean_acceptance_length if stats else None,
                    measured_length=counts.mean_acceptance_length if counts else None,
                    predicted_rate=stats.draft_acceptance_rate if stats else None,
                    measured_rate=counts.draft_acceptance_rate if counts else None,
                    tokens_per_step=stats.decode_tokens_per_step if stats else None,
                    predicted_tps=predicted_tps,
                    band=band,
                    measured_tps=measured,
                    withheld=pred.withheld if pred else None,
                    inside=said.inside if said else None,
                )
            )
    return out


def notes(prediction: RunPrediction, *, searched: bool = False) -> list[str]:
    """The sentences below the table: unpredicted candidates, the cost model, the next reload.

    In a search run (`searched`) the search names the one best config: this section's fit
    leaves out the stored runs' prior, so it names none of its own."""
    out = [f"{n.name}: {n.reason}" for n in prediction.candidates.values() if n.settings is None]
    missing = {k: v for k, v in prediction.token_ids.items() if k not in prediction.replays}
    out += [f"{name}: not predicted ({why})" for name, why in missing.items()]
    if prediction.suffix_note:
        out.append(prediction.suffix_note)
    out += [
        f"{candidate}/{name} ({c.settings.label}): {p.withheld}"
        for candidate, per in prediction.comparisons.items()
        for name, c in per.items()
        if (p := prediction.predictions.get(name, {}).get(c.settings)) and p.withheld
    ]
    out += [
        f"{name} on {w}: {r.settings.label}, the baseline's {r.requests} requests replayed in "
        f"order: {r.tokens_per_step:.2f} tokens per step ({r.drafts} drafts of {r.draft_tokens} "
        f"tokens, {r.accepted} accepted)"
        for name, per in prediction.suffix.items()
        for w, r in per.items()
    ]
    if prediction.mapped:
        ks = ", ".join(f"k={k}" for k in prediction.mapped)
        out.append(
            f"Read from the break-even map: the configs at {ks} (the baseline's tok/s times the "
            "map's ratio at their replayed tokens per step, with its band, plus the measured "
            "n-gram candidates' own cost per step beyond the map's, from the other prompt types; "
            "the break-even map's section gives each measured candidate's line)"
            + ("; the cost model below only at other k" if prediction.fit is not None else "")
        )
    if prediction.fit is not None:
        out.append(f"Cost model: {prediction.fit.describe()}")
    elif prediction.available:
        out.append(
            "Cost model: unknown until an n-gram candidate is measured; the grid shows the "
            "ceiling (tokens per step alone)"
        )
    if prediction.recommendation is not None and searched:
        out.append(
            "Next: as the search's answer says (its cost model also weighs the stored runs; "
            "this section's fits this run's candidates alone)"
        )
    elif prediction.recommendation is not None:
        out.append(f"Next: {prediction.recommendation.reason}")
    return out


TITLE = "Predicted against measured: the n-gram replay of the baseline's token ids"


def terminal_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    """Predicted beside measured per prompt type for each n-gram candidate, then the notes."""
    prediction = analysis.prediction
    if prediction is None:
        return []
    if not prediction.available:
        return [f"prediction: none ({prediction.reason})"]
    out = [f"{TITLE} (predicted / measured):"]
    found = prediction_rows(record, prediction, analysis.figures, analysis.candidate_predictions)
    if found:
        out.append(
            f"  {'prompt':<12} {'candidate (effective)':<28} {'accepted per draft':>18} "
            f"{'draft acc':>13} {'tokens per step':>15} {'tok/s pred [band]':>24} {'meas':>6}"
            f" {'in band':>7}  replay"
        )
        for r in found:
            cells = r.cells()
            out.append(
                f"  {cells[0]:<12} {cells[1]:<28} {cells[2]:>18} {cells[3]:>13} {cells[4]:>15} "
                f"{cells[5]:>24} {cells[6]:>6} {cells[7]:>7}  {cells[8]}"
            )
        out += [f"  {ACCEPTED_PER_DRAFT_MEANS}", f"  {TOKENS_PER_STEP_MEANS}"]
    out += [f"  {line}" for line in notes(prediction, searched=record.search is not None)]
    return out


def markdown_lines(record: RunRecord, analysis: RunAnalysis) -> list[str]:
    prediction = analysis.prediction
    if prediction is None:
        return []
    if not prediction.available:
        return ["### Prediction", "", f"Not predicted: {prediction.reason}.", ""]
    lines = [f"### {TITLE}", ""]
    found = prediction_rows(record, prediction, analysis.figures, analysis.candidate_predictions)
    if found:
        lines += ["| " + " | ".join(HEADER) + " |", "|:--|:--|--:|--:|--:|--:|--:|:-:|:--|"]
        for r in found:
            cells = list(r.cells())
            if r.status == "mismatch":
                cells[-1] = "**mismatch**"
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        lines.append("")
    lines += [f"- {line}" for line in notes(prediction, searched=record.search is not None)]
    lines += ["", "<sub>" + _FOOTNOTE + "</sub>", ""]
    return lines


_FOOTNOTE = (
    "Predicted: vLLM's n-gram proposer replayed over the baseline's token ids (prompt, output "
    "and a look-ahead recorded after the timed requests). Measured: the candidate's "
    "spec-decode counters over its timed requests. Exact where the outputs are equal and the "
    "look-ahead covered the last step; otherwise within the last step's bound (at most k-1 "
    "tokens per request). tok/s predicted: where the run measured a break-even map at the "
    "config's k, the baseline's tok/s times the map's ratio at the replayed tokens per step, "
    "plus the measured n-gram candidates' own cost per step beyond the map's (from the other "
    "prompt types), with the map's band; otherwise the cost model fitted from the measured "
    "n-gram candidates, its band a 95% prediction interval widened by the baseline's TPOT "
    "noise and the restart noise (a new server start). A band spanning more than a factor of "
    "2, or at tokens per step outside those its observations measured, is no prediction: the "
    "notes say what limits it, and no reload is recommended from it. "
    + ACCEPTED_PER_DRAFT_MEANS[0].upper()
    + ACCEPTED_PER_DRAFT_MEANS[1:]
    + ". "
    + TOKENS_PER_STEP_MEANS[0].upper()
    + TOKENS_PER_STEP_MEANS[1:]
    + "."
)


def html_section(record: RunRecord, analysis: RunAnalysis) -> str:
    """The HTML report's prediction section (the heat map sits with the plots)."""
    prediction = analysis.prediction
    if prediction is None:
        return ""
    e = html.escape
    if not prediction.available:
        return f"<h3>Prediction</h3><p class='note'>Not predicted: {e(str(prediction.reason))}</p>"
    parts = [f"<h3 id='specdecode-prediction'>{e(TITLE)}</h3>"]
    found = prediction_rows(record, prediction, analysis.figures, analysis.candidate_predictions)
    if found:
        head = "".join(f"<th>{e(h)}</th>" for h in HEADER)
        body = []
        for r in found:
            cells = r.cells()
            tds = "".join(f"<td>{e(c)}</td>" for c in cells[:-1])
            klass = {"mismatch": "v-regressed", "outputs differ": "v-insufficient-samples"}.get(
                r.status, ""
            )
            body.append(
                f"<tr>{tds}<td class='verdict {klass}' title='{e(r.detail)}'>{e(cells[-1])}"
                "</td></tr>"
            )
        parts.append(
            f"<table class='specdecode-table'><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>"
        )
    said = notes(prediction, searched=record.search is not None)
    items = "".join(f"<li>{e(line)}</li>" for line in said)
    parts.append(f"<ul>{items}</ul><p class='note'>{e(_FOOTNOTE)} Hover a status for the "
                 "figures.</p>")  # fmt: skip
    return "".join(parts)


# --- the grid ----------------------------------------------------------------------------------


def _value(prediction: RunPrediction, name: str, s: NgramSettings) -> float | None:
    p = prediction.predictions.get(name, {}).get(s)
    if p is None or p.withheld:
        return None
    return p.speedup if p.speedup is not None else p.ceiling_speedup


def _lookups(prediction: RunPrediction, name: str) -> list[tuple[int, int]]:
    return sorted({(s.prompt_lookup_min, s.prompt_lookup_max) for s in prediction.replays[name]})


def grid_lines(prediction: RunPrediction, *, top: int = 5) -> list[str]:
    """The grid per prompt type (predicted speedup, or its ceiling), then the best configs."""
    if not prediction.available:
        return [f"nothing to predict: {prediction.reason}"]
    kind = "predicted speedup" if prediction.fit else "ceiling speedup (cost unknown)"
    out: list[str] = []
    ks = list(NGRAM_GRID_K)
    for name in prediction.replays:
        out.append(f"{name}: {kind} over the baseline; rows n=min..max, columns k")
        out.append(f"  {'':<8}" + "".join(f"{'k=' + str(k):>7}" for k in ks))
        for lo, hi in _lookups(prediction, name):
            cells = []
            for k in ks:
                value = _value(prediction, name, NgramSettings(k, lo, hi))
                cells.append(f"{value:>7.2f}" if value is not None else f"{'':>7}")
            out.append(f"  {f'n={lo}..{hi}':<8}" + "".join(cells))
        found = prediction.predictions.get(name, {}).values()
        withheld = [p for p in found if p.withheld]
        ranked = sorted(
            (p for p in found if not p.withheld),
            key=lambda p: -(p.speedup if p.speedup is not None else p.ceiling_speedup),
        )[:top]
        if withheld:
            out.append(
                f"  no prediction for {len(withheld)} of {len(found)} configs (blank above), "
                f"e.g. {withheld[0].settings.label}: {withheld[0].withheld}"
            )
        out.append(f"  best {len(ranked)}:")
        for p in ranked:
            r = prediction.replays[name][p.settings]
            figure = (
                f"speedup {p.speedup:.2f} [{p.speedup_band[0]:.2f}, {p.speedup_band[1]:.2f}], "
                f"{p.tokens_per_s:.1f} tok/s, P(faster) {p.p_faster:.2f}"
                if p.speedup is not None
                and p.speedup_band
                and p.tokens_per_s
                and p.p_faster is not None
                else f"ceiling {p.ceiling_speedup:.2f}"
            )
            out.append(
                f"    {p.settings.label:<12} {figure}; {r.decode_tokens_per_step:.2f} tokens per "
                "step, "
                f"{fmt_num(r.mean_acceptance_length, '.2f')} accepted per draft, drafts on "
                f"{fmt_pct(r.drafts_per_step, sign=False)} of steps"
            )
    return out


def write_heatmap(record: RunRecord, analysis: RunAnalysis, run_dir: Path) -> dict[str, Path]:
    """prediction.png in the run folder: {"prediction": path}, or {} with nothing predicted."""
    prediction = analysis.prediction
    if prediction is None or not prediction.available:
        return {}
    from matplotlib.colors import LogNorm
    from matplotlib.figure import Figure

    names = list(prediction.replays)
    ks = list(NGRAM_GRID_K)
    rows = _lookups(prediction, names[0])
    values = {
        name: [[_value(prediction, name, NgramSettings(k, lo, hi)) for k in ks] for lo, hi in rows]
        for name in names
    }
    flat = [v for grid in values.values() for row in grid for v in row if v]
    # Symmetric in ratio around 1 (x0.8 as far as x1.25), saturating at x0.5 and x2.
    reach = min(max([max(v, 1 / v) for v in flat] + [1.1]), 2.0)
    norm = LogNorm(vmin=1 / reach, vmax=reach, clip=True)
    fig = Figure(figsize=(3.3 * len(names) + 1.2, 0.28 * len(rows) + 1.9), dpi=100,
                 layout="constrained")  # fmt: skip
    axes = fig.subplots(1, len(names), squeeze=False)[0]
    measured = {
        n.settings
        for c, n in prediction.candidates.items()
        if n.settings is not None and c in prediction.comparisons
    }
    best = prediction.recommendation.settings if prediction.recommendation else None
    image = None
    for ax, name in zip(axes, names, strict=True):
        grid = [[v if v is not None else float("nan") for v in row] for row in values[name]]
        image = ax.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto")
        for i, row in enumerate(values[name]):
            for j, v in enumerate(row):
                if v is not None:
                    dark = max(v, 1 / v) > reach**0.6
                    ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=5.5,
                            color="#fff" if dark else "#111")  # fmt: skip
        _mark(ax, rows, ks, measured, best)
        ax.set_xticks(range(len(ks)), [str(k) for k in ks], fontsize=8)
        ax.set_yticks(range(len(rows)), [f"{lo}..{hi}" for lo, hi in rows], fontsize=7)
        ax.set_xlabel("num_speculative_tokens", fontsize=8)
        ax.set_title(name, fontsize=10)
    axes[0].set_ylabel("prompt_lookup_min..max", fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes), shrink=0.8, extend="both")
        ticks = [
            t for t in (0.5, 0.67, 0.8, 0.9, 1.0, 1.11, 1.25, 1.5, 2.0) if 1 / reach <= t <= reach
        ]
        bar.set_ticks(ticks, labels=[f"x{t:g}" for t in ticks])
        bar.minorticks_off()
        bar.set_label("predicted speedup" if prediction.fit else "ceiling speedup (cost unknown)")
    path = run_dir / HEATMAP_FILE
    fig.savefig(path, format="png")
    return {"prediction": path}


def _mark(
    ax: Axes,
    rows: Sequence[tuple[int, int]],
    ks: Sequence[int],
    measured: set[NgramSettings],
    best: NgramSettings | None,
) -> None:
    from matplotlib.patches import Rectangle

    where = {(lo, hi): i for i, (lo, hi) in enumerate(rows)}
    for s in measured:
        i = where.get((s.prompt_lookup_min, s.prompt_lookup_max))
        if i is not None and s.num_speculative_tokens in ks:
            j = list(ks).index(s.num_speculative_tokens)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=1.8, ec="#000"))
    if best is not None:
        i = where.get((best.prompt_lookup_min, best.prompt_lookup_max))
        if i is not None and best.num_speculative_tokens in ks:
            j = list(ks).index(best.num_speculative_tokens)
            ax.plot([j + 0.32], [i - 0.25], marker="*", ms=7, color="#1f3bb3", mec="#fff", mew=0.5)


# --- the dry run -----------------------------------------------------------------------------


def dry_run_lines(settings: Settings, record: RunRecord, source: str) -> list[str]:
    """The planned candidates predicted from a stored baseline of this host and model."""
    configs = {c.name: dict(c.values) for c in settings.candidates}
    if not configs:
        return []
    same = [
        name
        for name, t in settings.prompt_types.items()
        if name in record.prompt_types
        and (record.prompt_types[name].prompt, record.prompt_types[name].max_tokens)
        == (t.prompt, t.max_tokens)
    ]
    verdicts, map_verdicts = verdicts_and_map(record)  # its map, where it measured one
    found = map_of_run(record, map_verdicts)
    prediction = predict_run(record, configs=configs, found=found, verdicts=verdicts)
    if not prediction.available:
        return [f"prediction: none from the stored run {source} ({prediction.reason})"]
    cost = (
        f"cost model fitted from its measured n-gram candidates: {prediction.fit.describe()}"
        if prediction.fit
        else "no measured n-gram candidate there, so the cost is unknown: ceilings only"
    )
    if prediction.mapped:
        ks = ", ".join(f"k={k}" for k in prediction.mapped)
        cost = f"the configs at {ks} read from its break-even map; " + cost
    lines = [f"prediction from the stored baseline of {source} (n-gram replay; {cost}):"]
    for note in prediction.candidates.values():
        if note.settings is None:
            lines.append(f"  {note.name}: {note.reason}")
            continue
        parts = []
        for name in same:
            p = prediction.predictions.get(name, {}).get(note.settings)
            r = prediction.replays.get(name, {}).get(note.settings)
            if p is None or r is None:
                continue
            speed = (
                p.withheld
                if p.withheld
                else f"predicted {p.speedup - 1:+.1%} [{p.speedup_band[0] - 1:+.1%}, "
                f"{p.speedup_band[1] - 1:+.1%}]"
                if p.speedup is not None and p.speedup_band
                else f"ceiling {p.ceiling_speedup - 1:+.1%}"
            )
            parts.append(
                f"{name} {r.decode_tokens_per_step:.2f} tokens per step, "
                f"{fmt_num(r.mean_acceptance_length, '.2f')} accepted per draft, {speed}"
            )
        lines.append(
            f"  {note.name} (effective {note.settings.label}): "
            + ("; ".join(parts) or "no prompt type in common")
        )
    other = [n for n in settings.prompt_types if n not in same]
    if other:
        lines.append(
            "  not predicted (prompt or max_tokens differ from the stored run, or not in it): "
            + ", ".join(other)
        )
    return lines
