"""The plots, drawn with matplotlib's object API on the Agg canvas (no pyplot, no global state)
and written as PNG files into the run folder."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..analysis.map.paying_load import LevelPoint, PayingLoad, PayingLoadKind
from ..analysis.run import RunAnalysis
from ..config.arms import BASELINE, BASELINE_AFTER
from ..record.counters import ACCEPTED_PER_DRAFT
from ..record.schema import RunRecord
from .rows import Row, rows
from .sections.acceptance import PLOT_CAPTION
from .sections.break_even import MAP_X_LABEL
from .sections.break_even import PLOT_CAPTION as MAP_CAPTION
from .sections.prediction import HEATMAP_CAPTION
from .text import finite, fmt_num

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FILES = {"throughput": "throughput.png", "tpot": "tpot.png", "acceptance": "acceptance.png"}
CAPTIONS = {
    "throughput": "Throughput per prompt type: bars are each arm's tok/s per request as the "
    "results table gives it (a candidate's on the baseline's prompts), whiskers a candidate's "
    "interval from its verdict, dots are the requests.",
    "tpot": "TPOT distributions per prompt type: boxes are quartiles, diamonds each arm's TPOT "
    "as the results table gives it, dots are the requests.",
    "acceptance": "Per-position acceptance: the share of drafts whose k-th proposed token was "
    "accepted (from vLLM's spec-decode counters).",
    "prediction": HEATMAP_CAPTION,  # written by report.prediction.write_heatmap
    "prompt-acceptance": PLOT_CAPTION,  # written by report.acceptance.write_plot
    "break-even": MAP_CAPTION,
    "time": "Throughput against time, one panel per server start: each request's tok/s at the "
    "moment it was sent, coloured by prompt type (an interleaved order spreads drift over them).",
    "speedup": "Speedup against load, per prompt type: the candidate's per-request tok/s over "
    "the baseline's at each level, with the verdict's interval; the band and diamond on 1.0 mark "
    "where the speedup crosses it (interpolated in log-log) and its uncertainty.",
}


def caption(name: str) -> str:
    """A plot's caption by its name ("speedup-ngram" takes the "speedup" one)."""
    return CAPTIONS.get(name) or CAPTIONS.get(name.split("-", 1)[0], name)


_SPEEDUP_TICKS = (0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 3, 5, 10)
_BASE_COLOR = "#4c72b0"
_AFTER_COLOR = "#9a9a9a"
_CANDIDATE_COLORS = ("#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3")


def write_plots(record: RunRecord, analysis: RunAnalysis, run_dir: Path) -> dict[str, Path]:
    drawers = {"throughput": _throughput, "tpot": _tpot, "acceptance": _acceptance}
    out = {name: drawers[name](record, analysis, run_dir / file) for name, file in FILES.items()}
    over_time = throughput_over_time(record, run_dir / "time.png")
    if over_time is not None:
        out["time"] = over_time
    if analysis.break_even is not None:
        out["break-even"] = break_even_map(analysis, run_dir / "break-even.png")
    for candidate, per in analysis.paying_loads.items():  # several load levels
        series = {x.prompt_type: list(x.points) for x in per.values()}
        name = f"speedup-{candidate}"
        drawn = speedup_vs_load(
            series,
            per,
            run_dir / f"{name}.png",
            title=f"{candidate}: speedup against load (throughput per request)",
        )
        if drawn is not None:
            out[name] = drawn
    return out


def throughput_over_time(record: RunRecord, path: Path) -> Path | None:
    """Each start's requests, tok/s against the seconds since its first was sent (None: no
    measured request)."""
    starts = {
        name: [x for m in phase.measurements.values() for x in m.samples]
        for name, phase in record.phases.items()
        if not phase.reused_from
    }
    starts = {name: samples for name, samples in starts.items() if samples}
    if not starts:
        return None
    types = list(dict.fromkeys(x.prompt_type for samples in starts.values() for x in samples))
    colors = {t: _CANDIDATE_COLORS[i % len(_CANDIDATE_COLORS)] for i, t in enumerate(types)}
    fig = _figure(8.0, 1.0 + 2.0 * len(starts))
    axes = fig.subplots(len(starts), 1, squeeze=False)[:, 0]
    for ax, (name, samples) in zip(axes, starts.items(), strict=True):
        t0 = min(x.started_at for x in samples)
        for prompt_type in types:
            own = [x for x in samples if x.prompt_type == prompt_type]
            if own:
                ax.scatter(
                    [x.started_at - t0 for x in own],
                    [x.tokens_per_s for x in own],
                    s=12,
                    color=colors[prompt_type],
                    label=prompt_type,
                )
        phase = record.phases[name]
        order = f", {phase.order}" if phase.order else ""
        beside = f", beside {phase.together_with}" if phase.together_with else ""
        ax.set_title(f"{name}{order}{beside}", fontsize=9, loc="left")
        ax.set_ylabel("tok/s")
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("seconds since the start's first measured request")
    _legend(axes[0], fontsize=8)
    fig.savefig(path)
    return path


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def _color(record: RunRecord, phase: str) -> str:
    if phase == BASELINE:
        return _BASE_COLOR
    if phase == BASELINE_AFTER:
        return _AFTER_COLOR
    others = [p for p in record.phases if p not in (BASELINE, BASELINE_AFTER)]
    index = others.index(phase) if phase in others else 0
    return _CANDIDATE_COLORS[index % len(_CANDIDATE_COLORS)]


def _grouped(record: RunRecord, metric: str):
    data = {
        (phase.name, name): getattr(m, metric)
        for phase in record.phases.values()
        for name, m in phase.measurements.items()
    }
    names = [n for n in record.keys if any(data.get((p, n)) for p in record.phases)]
    phases = [p for p in record.phases if any(data.get((p, n)) for n in names)]
    return phases, names, data


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def _position(n_phases: int, j: int, i: int) -> tuple[float, float]:
    width = 0.8 / max(n_phases, 1)
    return j - 0.4 + width * (i + 0.5), width


def _legend(ax: Axes, **kwargs) -> None:
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, **kwargs)


def _throughput(record: RunRecord, analysis: RunAnalysis, path: Path) -> Path:
    phases, names, data = _grouped(record, "tokens_per_s")
    fig = _figure(max(6.5, 1.7 * len(names) + 3.5), 4.4)
    ax = fig.add_subplot()
    if not names:
        _empty(ax, "no measured requests")
    changes = {(r.candidate, r.prompt_type): r for r in rows(analysis)}
    rng = np.random.default_rng(0)
    for i, phase in enumerate(phases):
        color = _color(record, phase)
        labelled = False
        arm = record.phases[phase].arm
        for j, name in enumerate(names):
            values = data.get((phase, name))
            if not values:
                continue
            x, width = _position(len(phases), j, i)
            row = changes.get((arm, name))
            med, (low, high) = _figure_of(analysis, arm, name, row)
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
            if row is not None and phase == arm and finite(row.change):
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
    if names:
        ax.set_xticks(range(len(names)), names)
        ax.set_ylabel("tok/s per request")
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.08)
        ax.grid(axis="y", alpha=0.3, zorder=0)
        _legend(ax, fontsize=9)
    ax.set_title("Throughput per prompt type (the table's figures, requests)", fontsize=11)
    fig.savefig(path, format="png")
    return path


def _figure_of(
    analysis: RunAnalysis, arm: str, key: str, row: Row | None
) -> tuple[float, tuple[float, float]]:
    """An arm's tok/s as the table gives it, and a candidate's interval (else no whisker)."""
    figure = analysis.figures.get(arm, {}).get(key, {}).get("throughput", 0.0)
    if row is not None and finite(row.baseline_tps):
        low, high = row.ratio_ci
        if finite(low) and finite(high):
            return figure, (row.baseline_tps * low, row.baseline_tps * high)
    return figure, (figure, figure)


def _tpot(record: RunRecord, analysis: RunAnalysis, path: Path) -> Path:
    from matplotlib.patches import Patch

    phases, names, data = _grouped(record, "tpot_ms")
    fig = _figure(max(6.5, 1.7 * len(names) + 3.5), 4.4)
    ax = fig.add_subplot()
    if not names:
        _empty(ax, "no TPOT measured (requests of one token)")
    rng = np.random.default_rng(1)
    for i, phase in enumerate(phases):
        color = _color(record, phase)
        for j, name in enumerate(names):
            values = data.get((phase, name))
            if not values:
                continue
            x, width = _position(len(phases), j, i)
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
            arm = record.phases[phase].arm
            figure = analysis.figures.get(arm, {}).get(name, {}).get("tpot")
            if figure is not None and finite(figure):
                ax.scatter([x], [figure], marker="D", s=28, color="#fff", ec="#111", zorder=5)
    if names:
        ax.set_xticks(range(len(names)), names)
        ax.set_xlim(-0.6, len(names) - 0.4)
        ax.set_ylabel("TPOT, ms per output token")
        ax.grid(axis="y", alpha=0.3, zorder=0)
        handles = [Patch(color=_color(record, p), alpha=0.75, label=p) for p in phases]
        _legend(ax, handles=handles, fontsize=9)
    ax.set_title("Time per output token (lower is better)", fontsize=11)
    fig.savefig(path, format="png")
    return path


def _acceptance(record: RunRecord, analysis: RunAnalysis, path: Path) -> Path:
    fig = _figure(8.5, 4.2)
    ax = fig.add_subplot()
    drawn = False
    styles = ((0, (4, 2)), (0, (1, 1.5)), (0, (6, 2, 1, 2)), (0, (2, 3)), (0, (8, 3)))
    markers = ("s", "^", "v", "D", "P", "X")
    for phase in record.phases.values():
        acc = phase.acceptance
        if phase.spec is None or not acc.present or not acc.per_position_rates:
            continue
        color = _color(record, phase.name)
        rates = acc.per_position_rates
        ax.plot(
            range(1, len(rates) + 1),
            rates,
            marker="o",
            lw=2.4,
            color=color,
            zorder=3,
            label=f"{phase.name}, all prompts ({fmt_num(acc.mean_acceptance_length, '.2f')} "
            f"{ACCEPTED_PER_DRAFT})",
        )
        if len(phase.measurements) > 1:
            for k, (name, m) in enumerate(phase.measurements.items()):
                wr = m.acceptance.per_position_rates
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
                        label=f"{phase.name}, {name}",
                        zorder=2,
                    )
        drawn = True
    if drawn:
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance rate")
        ax.set_ylim(-0.02, 1.03)
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        _legend(ax, fontsize=8)
    else:
        _empty(ax, "no per-position acceptance: no candidate exported spec-decode counters")
    ax.set_title("Per-position acceptance rate", fontsize=11)
    fig.savefig(path, format="png")
    return path


def speedup_vs_load(
    series: Mapping[str, Sequence[LevelPoint]],
    paying_loads: Mapping[str, PayingLoad],
    path: Path,
    *,
    title: str,
) -> Path | None:
    """Speedup (candidate/baseline tok/s) with its interval against load, one line per prompt
    type, both axes logarithmic (the paying load is interpolated in log-log, so it lies on the
    drawn line); a line at 1.0, and each paying load marked with its uncertainty.

    None, and no file, when no prompt type has a measured level.
    """
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    drawn = {
        name: sorted((p for p in points if p.measured), key=lambda p: p.load)
        for name, points in series.items()
    }
    drawn = {name: points for name, points in drawn.items() if points}
    if not drawn:
        return None
    fig = _figure(8.5, 4.6)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="#444", lw=1.0, ls="--", zorder=1)
    loads = sorted({p.load for points in drawn.values() for p in points})
    span = math.log(loads[-1] / loads[0]) if len(loads) > 1 else 1.0
    left, right = loads[0] / math.exp(0.08 * span), loads[-1] * math.exp(0.08 * span)
    ys: list[float] = [1.0]
    for i, (name, points) in enumerate(drawn.items()):
        color = _CANDIDATE_COLORS[i % len(_CANDIDATE_COLORS)]
        x = [p.load for p in points]
        y = [p.ratio for p in points]
        lows = [p.low if math.isfinite(p.low) and p.low > 0 else p.ratio for p in points]
        highs = [p.high if math.isfinite(p.high) and p.high > 0 else p.ratio for p in points]
        ys += lows + highs
        ax.errorbar(
            x,
            y,
            yerr=[
                [r - lo for r, lo in zip(y, lows, strict=True)],
                [hi - r for r, hi in zip(y, highs, strict=True)],
            ],
            color=color,
            marker="o",
            ms=5,
            lw=1.8,
            capsize=4,
            zorder=3,
            label=name,
        )
        paying = paying_loads.get(name)
        if paying is not None and paying.kind is PayingLoadKind.CROSSING and paying.load:
            lo = paying.low if paying.low is not None else left  # open: to the edge
            hi = paying.high if paying.high is not None else right
            ax.plot([lo, hi], [1.0, 1.0], color=color, lw=6, alpha=0.3, solid_capstyle="butt")
            ax.plot([paying.load], [1.0], marker="D", ms=8, color=color, mec="#111", zorder=4)
            ax.annotate(
                paying.fmt(paying.load),
                (paying.load, 1.0),
                textcoords="offset points",
                xytext=(0, 8 + 12 * i),
                ha="center",
                fontsize=8,
                color=color,
                fontweight="bold",
            )
    labels = {p.load: p.level for points in drawn.values() for p in points}
    ax.xaxis.set_major_locator(FixedLocator(loads))
    ax.xaxis.set_major_formatter(lambda v, _pos: labels.get(v, ""))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(left, right)
    bottom, top = min(ys), max(ys)
    low_y, high_y = bottom / 1.08, top * 1.08
    ax.set_ylim(low_y, high_y)
    ticks = [t for t in _SPEEDUP_TICKS if low_y <= t <= high_y]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_minor_formatter(NullFormatter())
    rate = any(p.level.startswith("r") for points in drawn.values() for p in points)
    ax.set_xlabel("request rate, requests/s" if rate else "concurrency (requests in flight)")
    ax.set_ylabel("speedup, candidate / baseline tok/s")
    ax.grid(alpha=0.3, which="both")
    _legend(ax, fontsize=9, title="prompt type")
    ax.set_title(title, fontsize=11)
    fig.savefig(path, format="png")
    return path


def break_even_map(analysis: RunAnalysis, path: Path) -> Path:
    """The map: ratio against tokens per step, a line per k with its band, a panel per load;
    the map's servers as circles, the measured candidates as diamonds; break-even dashed."""
    found = analysis.break_even
    assert found is not None
    levels = list(dict.fromkeys(line.level for line in found.overall))
    fig = _figure(4.2 * len(levels) + 2.0, 4.2)
    axes = fig.subplots(1, len(levels), squeeze=False)[0]
    for ax, level in zip(axes, levels, strict=True):
        ax.axhline(1.0, color="#444", lw=1.0, ls="--", zorder=1)
        for i, line in enumerate(x for x in found.overall if x.level == level):
            color = _CANDIDATE_COLORS[i % len(_CANDIDATE_COLORS)]
            xs = np.linspace(1.0, line.k + 1.0, 40)
            mid, lows, highs = zip(*(line.at(float(x)) for x in xs), strict=True)
            ax.plot(xs, mid, color=color, lw=1.8, label=f"k={line.k}", zorder=3)
            ax.fill_between(xs, lows, highs, color=color, alpha=0.18, lw=0, zorder=2)
            for p in line.points:
                low, high = p.band(line.confidence)
                ax.errorbar(
                    [p.x], [p.ratio], yerr=[[p.ratio - low], [high - p.ratio]],
                    color=color, marker="o", ms=5, capsize=3, lw=1.2, zorder=4,
                )  # fmt: skip
        on_map = (c for c in analysis.candidate_predictions if c.on_map and c.level == level)
        for j, check in enumerate(on_map):
            below, above = check.measured - check.measured_low, check.measured_high - check.measured
            ax.errorbar(
                [check.tokens_per_step], [check.measured], yerr=[[below], [above]],
                color="#111", marker="D", ms=6, capsize=3, lw=1.0, zorder=5, mfc="white",
            )  # fmt: skip
            ax.annotate(
                f"{check.candidate}/{check.prompt_type}", (check.tokens_per_step, check.measured),
                textcoords="offset points", xytext=(6, 4 - 9 * j), fontsize=7,
            )  # fmt: skip
        ax.set_title(f"load {level}")
        ax.set_xlabel(MAP_X_LABEL)
        ax.set_ylabel("throughput / baseline's")
    _legend(axes[-1])
    fig.savefig(path)
    return path
