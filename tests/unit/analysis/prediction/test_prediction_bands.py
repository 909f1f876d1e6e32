"""Prediction bands that bound (issue 41, analysis/prediction/bands/bounded.py): a tok/s band wider
than a factor of 2, or at tokens per step outside what the cost fit's observations measured, is
no prediction; the reports say what limits it, and "Next" never recommends from it, nor from a
config less likely faster than not."""

from __future__ import annotations

import pytest

from pytest_specdecode.analysis.prediction.bands.bounded import (
    MAX_BAND_RATIO,
    STEP_SLACK,
    Support,
    bounded,
    recommend,
    support_of,
    withheld_reason,
)
from pytest_specdecode.analysis.prediction.cost_model import CandidateTiming, Prediction
from pytest_specdecode.analysis.prediction.ngram_types import NgramSettings
from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.report import markdown, terminal
from pytest_specdecode.report.sections.prediction import notes, prediction_rows

from ....support.synthetic import recorded_run

MAP = Support(1.00, 1.96)  # the issue's map: its points at 1.00 to 1.96 tokens per step


def test_a_narrow_band_inside_the_map_is_a_prediction() -> None:
    assert withheld_reason((300.0, 420.0), 1.5, MAP) is None
    assert withheld_reason((300.0, 420.0), 1.5, None) is None


def test_the_issue_band_is_no_prediction_and_says_what_limits_it() -> None:
    said = withheld_reason((88.3, 7561.1), 3.2, MAP)
    assert said == (
        "no prediction: the band [88, 7561] tok/s is wider than the map can support (a factor "
        "of 85.63 from end to end, above 2; its points span 1.00 to 1.96 tokens per step; this "
        "config would lie at 3.20, beyond them)"
    )


def test_a_band_too_wide_inside_the_map_names_its_width_only() -> None:
    said = withheld_reason((200.0, 200.0 * MAX_BAND_RATIO * 1.01), 1.5, MAP)
    assert said is not None and "a factor of 2.02 from end to end, above 2" in said
    assert "this config would lie at 1.50" in said and "beyond" not in said
    assert withheld_reason((200.0, 200.0 * MAX_BAND_RATIO * 0.99), 1.5, MAP) is None


def test_a_narrow_band_beyond_the_map_is_an_extrapolation() -> None:
    said = withheld_reason((300.0, 330.0), 3.2, MAP)
    assert said is not None and "factor" not in said
    assert "its points span 1.00 to 1.96 tokens per step; this config would lie at 3.20" in said
    assert withheld_reason((300.0, 330.0), 0.5, MAP) is not None  # below the map, too
    assert withheld_reason((300.0, 330.0), MAP.high + STEP_SLACK * 0.8, MAP) is None
    assert withheld_reason((300.0, 330.0), MAP.high + STEP_SLACK * 1.2, MAP) is not None


def test_without_a_known_support_only_the_width_limits() -> None:
    said = withheld_reason((100.0, 300.0), 9.0, None)
    assert said is not None and "wider than the measurements can support" in said
    assert "tokens per step" not in said
    assert withheld_reason((100.0, 150.0), 9.0, None) is None


def test_the_support_is_the_range_of_each_config_and_prompt_types_mean() -> None:
    def timing(name: str, label: str, tau: float) -> CandidateTiming:
        return CandidateTiming(name, label, 0.01, tau, 1.0)

    found = support_of(
        [timing("a", "x", 1.0), timing("a", "x", 3.0), timing("b", "x", 1.5),
         timing("a", "y", 1.2)],
        name="the measured candidates",
        points="they",
    )  # fmt: skip
    assert found is not None and (found.low, found.high) == (1.2, 2.0)
    assert support_of([], name="the map", points="its points") is None


def _prediction(name: str, s: NgramSettings, speed: float, band: tuple[float, float],
                tau: float = 1.5) -> Prediction:  # fmt: skip
    base = 100.0
    p_faster = 0.9 if speed > 1 else 0.1
    return Prediction(name, s, tau, 1.0, base * tau, tau, base * speed,
                      (base * band[0], base * band[1]), speed, band, p_faster)  # fmt: skip


K3, K4, K5 = NgramSettings(3, 1, 2), NgramSettings(4, 1, 2), NgramSettings(5, 1, 2)


def test_next_never_recommends_from_a_band_that_does_not_bound() -> None:
    wide = {  # k=5 would be best, but on math its band spans a factor of 3
        "coding": {K4: _prediction("coding", K4, 1.2, (1.1, 1.3)),
                   K5: _prediction("coding", K5, 1.6, (1.4, 1.8))},
        "math": {K4: _prediction("math", K4, 1.15, (1.05, 1.25)),
                 K5: _prediction("math", K5, 1.5, (0.7, 2.1))},
    }  # fmt: skip
    found = bounded(wide, MAP)
    assert found["math"][K5].withheld and not found["coding"][K5].withheld
    assert found["math"][K5].verdict == "no prediction"
    advice = recommend(found)
    assert advice.settings == K4, advice.reason
    assert recommend(wide).settings == K5  # unbounded, k=5 would have been picked


def test_next_says_none_when_every_band_is_withheld() -> None:
    beyond = {"coding": {K3: _prediction("coding", K3, 0.9, (0.85, 0.95), tau=3.2),
                         K5: _prediction("coding", K5, 0.8, (0.75, 0.85), tau=3.5)}}  # fmt: skip
    advice = recommend(bounded(beyond, MAP))
    assert advice.settings is None and advice.mean_speedup is None
    assert advice.reason.startswith("none: no unmeasured config has a prediction that bounds")
    assert "this config would lie at 3.20, beyond them" in advice.reason
    assert "%" not in advice.reason  # no speedup figure read off a withheld band


def prediction(name: str, settings: NgramSettings, speedup: float, p_faster: float) -> Prediction:
    return Prediction(
        prompt_type=name,
        settings=settings,
        decode_tokens_per_step=1.5,
        draft_tokens_per_step=2.0,
        ceiling_tokens_per_s=50.0,
        ceiling_speedup=1.5,
        tokens_per_s=30.0 * speedup,
        tokens_per_s_band=(25.0, 40.0),
        speedup=speedup,
        speedup_band=(speedup * 0.8, speedup * 1.2),
        p_faster=p_faster,
    )


ONE_OF_FOUR = {"coding": (1.6, 0.6), "math": (0.95, 0.0), "structured": (0.95, 0.0)}
ONE_OF_FOUR["explanatory"] = (0.95, 0.0)  # faster on average, likely faster on one type only


@pytest.mark.parametrize(
    ("per_type", "worth"),
    [
        ({"coding": (1.6, 0.75), "math": (1.1, 0.25)}, True),  # mean P(faster) exactly 0.5
        ({"coding": (1.6, 0.74), "math": (1.1, 0.25)}, False),
        (ONE_OF_FOUR, False),
    ],
    ids=["P 0.50", "P 0.495", "P 0.15"],
)
def test_worth_a_reload_only_when_more_likely_faster_than_not(per_type, worth) -> None:
    s = NgramSettings(3, 2, 3)
    preds = {n: {s: prediction(n, s, speed, p)} for n, (speed, p) in per_type.items()}
    rec = recommend(preds)
    assert rec.mean_speedup is not None and rec.mean_speedup > 1
    assert (rec.settings == s) is worth
    assert ("worth a reload" in rec.reason) is worth
    assert ("a reload is not worth it" in rec.reason) is not worth


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    rec = recorded_run(tmp_path_factory.mktemp("bands"))
    return rec, analyze(rec)


def test_the_reports_print_a_withheld_band_as_its_reason(recorded) -> None:  # type: ignore[no-untyped-def]
    rec, analysis = recorded
    prediction = analysis.prediction
    assert prediction is not None and prediction.support is not None
    found = prediction_rows(rec, prediction, analysis.figures)
    withheld = [r for r in found if r.withheld]
    assert withheld, "the recorded run has a band wider than a factor of 2"
    said = notes(prediction)
    text = "\n".join(terminal.lines(rec, analysis, files={}))
    md = markdown.summary(rec, analysis)
    for r in found:
        pred = prediction.predictions[r.prompt_type][
            prediction.comparisons[r.candidate][r.prompt_type].settings
        ]
        assert pred.tokens_per_s_band is not None
        low, high = pred.tokens_per_s_band
        bounds = high / low <= MAX_BAND_RATIO and prediction.support.holds(
            pred.decode_tokens_per_step
        )
        assert bounds == (r.withheld is None), (r, pred)
        if r.withheld:
            assert r.cells()[5] == "no prediction"
            line = f"{r.candidate}/{r.prompt_type} ({r.label}): {r.withheld}"
            assert line in said and line in text and line in md
            assert f"[{low:.1f}, {high:.1f}]" not in text  # the band is not printed as one


def test_the_recorded_runs_next_rests_on_bands_that_bound(recorded) -> None:  # type: ignore[no-untyped-def]
    _, analysis = recorded
    prediction = analysis.prediction
    advice = prediction.recommendation
    assert advice is not None
    named = [
        s
        for per in prediction.predictions.values()
        for s in per
        if f" {s.label}" in advice.reason or advice.reason.startswith(s.label)
    ]
    assert named, advice.reason
    for s in set(named):
        assert not any(per[s].withheld for per in prediction.predictions.values() if s in per)


def test_results_json_carries_the_reason_in_the_grid(recorded) -> None:  # type: ignore[no-untyped-def]
    _, analysis = recorded
    data = analysis.prediction.to_json()
    assert data["support"]["name"] == "the measured candidates"
    said = [
        row[grid["columns"].index("withheld")]
        for grid in data["grid"].values()
        for row in grid["rows"]
    ]
    assert all(w is None or w.startswith("no prediction: the band [") for w in said)
    assert any(said) and not all(said)


def test_the_search_plan_prints_a_wide_band_as_its_reason() -> None:
    from pytest_specdecode.analysis.prediction.bands.coverage import Coverage
    from pytest_specdecode.analysis.search.policy import Reload, SearchPlan
    from pytest_specdecode.record.search import PredictedBand
    from pytest_specdecode.report.sections.search import plan_lines

    bands = {
        "coding": PredictedBand(300.0, 280.0, 330.0, 1.05, 0.98, 1.15),
        "math": PredictedBand(250.0, 88.3, 7561.1, 0.9, 0.3, 27.0),
    }
    step = Reload({"method": "ngram"}, "k=3 n=1..2", "teach", "a reason", bands, K3)
    out = "\n".join(plan_lines(SearchPlan(Coverage(), {}, step, 0.05)))
    assert "  predicted on coding: 300.0 tok/s [280.0, 330.0], +5.0% [-2.0%, +15.0%]" in out
    assert (
        "  on math: no prediction: the band [88, 7561] tok/s is wider than the measurements can "
        "support (a factor of 85.63 from end to end, above 2)"
    ) in out
    assert "7561.1" not in out
