"""One figure per arm (issue 28): the results table's two figures reproduce its change, and the
search's band check and the band's coverage put the table's figure against the band."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.prediction.bands.coverage import held_out
from pytest_specdecode.analysis.run import analyze, candidate_verdicts
from pytest_specdecode.analysis.search.answer import search_answer
from pytest_specdecode.analysis.search.policy import SearchPolicy
from pytest_specdecode.analysis.verdict.compare import compare_arms, own_figure
from pytest_specdecode.analysis.verdict.stats import RestartNoise
from pytest_specdecode.record.measurement import Measurement
from pytest_specdecode.record.schema import Phase
from pytest_specdecode.report.plots import _figure_of
from pytest_specdecode.report.rows import Row, rows
from pytest_specdecode.report.sections.prediction import prediction_rows

from ....support.search_sim import Truth, measure, run_search, search_record, verdicts
from ....support.synthetic import recorded_run, sample

QUIET = RestartNoise(0.02, 20.0, "stored A/A runs")
NOISES = {"throughput": QUIET, "tpot": QUIET}
SLOWER = 0.45  # the candidate's speed on every prompt, against the baseline's


def level(prompt: int) -> float:
    """A prompt's own tok/s on the baseline: far apart, so the prompt mix moves a plain mean."""
    return 120.0 * 1.25**prompt


def window(name: str, arm: str, prompts: range, factor: float, seed: int) -> Phase:
    rng = np.random.default_rng(seed)
    m = Measurement(prompt_type="coding")
    for i, prompt in enumerate(prompts):
        s = sample("coding", name, i, level(prompt) * factor * (1 + rng.normal(0, 0.02)))
        s.prompt_index = prompt
        m.samples.append(s)
    phase = Phase(name=name, arm=arm, spec=None if arm == "baseline" else {"method": "ngram"})
    phase.measurements["coding"] = m
    return phase


def printed_change(baseline: str, candidate: str) -> float:
    return float(candidate) / float(baseline) - 1


@pytest.mark.parametrize(
    ("baseline_counts", "candidate_counts"),
    [((8,), (12,)), ((8, 10), (12, 9)), ((6, 12, 8), (12, 7))],
    ids=["8-vs-12", "two-starts-each", "three-and-two-starts"],
)
def test_the_tables_figures_reproduce_its_change(
    baseline_counts: tuple[int, ...], candidate_counts: tuple[int, ...]
) -> None:
    """Paired prompts, other counts per arm (adaptive sampling stopped them apart), one or
    several starts: the printed tok/s and TPOT give the printed change, to rounding."""
    baseline = [
        window(f"baseline#{j}", "baseline", range(n), 1.0, seed=j)
        for j, n in enumerate(baseline_counts)
    ]
    candidate = [
        window(f"ngram#{j}", "ngram", range(n), SLOWER, seed=10 + j)
        for j, n in enumerate(candidate_counts)
    ]
    v = compare_arms(baseline, candidate, alpha=0.05, min_effect=0.03, noise=NOISES)["coding"]
    row = Row.of(v)
    _, base, cand, change, *_ = row.cells()
    # rounding to 0.1 tok/s moves the ratio by at most this much
    rounding = 0.05 / row.baseline_tps + 0.05 / row.candidate_tps
    assert abs(printed_change(base, cand) - row.change) <= rounding, row.sentence()
    assert change.startswith(f"{row.change:+.1%} [")  # the printed change is the estimate's
    assert math.isclose(row.candidate_tps / row.baseline_tps - 1, row.change, rel_tol=1e-9)
    assert row.tpot_baseline is not None and row.tpot_candidate is not None
    assert row.tpot_change is not None
    assert math.isclose(row.tpot_candidate / row.tpot_baseline - 1, row.tpot_change, rel_tol=1e-9)
    # The estimate is the paired one: the candidate is -55% on every prompt.
    assert abs(row.change - (SLOWER - 1)) < 0.02
    # The candidate's plain geometric mean over all its requests, prompts the baseline never
    # sent included, is another figure: it would not reproduce the change.
    logs = [math.log(x) for p in candidate for x in p.measurements["coding"].tokens_per_s]
    plain = math.exp(sum(logs) / len(logs))
    if max(candidate_counts) > max(baseline_counts) or len(set(candidate_counts)) > 1:
        assert abs(plain / row.baseline_tps - 1 - row.change) > 0.02
    # The baseline's figure is its own, whichever candidate it is compared with.
    assert row.baseline_tps == pytest.approx(
        math.exp(
            np.mean([np.mean(np.log(p.measurements["coding"].tokens_per_s)) for p in baseline])
        )
    )


TRUTH = Truth(cost={"c1": (0.1, 0.03)})
K2 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3}
K6 = {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 1,
      "prompt_lookup_max": 4}  # fmt: skip


def test_the_band_check_uses_the_tables_figure(tmp_path: Path) -> None:
    rec = search_record(tmp_path, TRUTH)
    run_search(rec, SearchPolicy(margin=0.03, max_reloads=2), TRUTH)
    found = verdicts(rec)
    answer = search_answer(rec, found)
    assert answer is not None and answer.checks  # the check is not vacuous
    for check in answer.checks:
        row = Row.of(found[check.arm][check.key])
        assert check.measured == row.candidate_tps, (check.text, row.sentence())
        assert f"measured {row.candidate_tps:.1f} tok/s" in check.text


def test_the_bands_coverage_uses_the_tables_figure(tmp_path: Path) -> None:
    rec = search_record(tmp_path, TRUTH, seed=1)
    measure(rec, "k2", K2, TRUTH, seed=2)
    measure(rec, "k6", K6, TRUTH, seed=3)
    cases = held_out("r1", rec, [])
    assert cases  # two configs held out
    for case in cases:
        table = candidate_verdicts(rec, case.arm)[case.key].throughput
        assert case.measured == pytest.approx(table.candidate_center, rel=1e-12)
        assert table.baseline_center == pytest.approx(own_figure(rec, "baseline", case.key))


def test_every_renderer_reads_the_analysis_figures(tmp_path: Path) -> None:
    """The figures are computed once, in the analysis; the table's rows, the plots' bars and
    the predicted-vs-measured table read those."""
    rec = recorded_run(tmp_path)
    analysis = analyze(rec)
    found = rows(analysis)
    assert found
    for row in found:
        mine = analysis.figures[row.candidate][row.prompt_type]
        base = analysis.figures["baseline"][row.prompt_type]
        assert (mine["throughput"], base["throughput"]) == (row.candidate_tps, row.baseline_tps)
        assert (mine["tpot"], base["tpot"]) == (row.tpot_candidate, row.tpot_baseline)
        bar, _ = _figure_of(analysis, row.candidate, row.prompt_type, row)
        assert bar == row.candidate_tps
    assert analysis.prediction is not None
    predicted = prediction_rows(rec, analysis.prediction, analysis.figures)
    assert predicted
    table = {(r.candidate, r.prompt_type): r.candidate_tps for r in found}
    for r in predicted:
        assert r.measured_tps == table[(r.candidate, r.prompt_type)]
