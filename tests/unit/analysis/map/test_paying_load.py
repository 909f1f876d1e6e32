"""The paying load of a speedup series (where it crosses 1.0), on constructed points with known
answers; its plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_specdecode.analysis.map.paying_load import (
    LevelPoint,
    PayingLoad,
    PayingLoadKind,
    log_crossing,
    paying_load,
)
from pytest_specdecode.report.plots import speedup_vs_load


def point(c: float, ratio: float, low: float, high: float, verdict: str = "") -> LevelPoint:
    return LevelPoint(f"c{c:g}", c, ratio, low, high, verdict)


def power_law(loads: list[float], at: float, slope: float, spread: float) -> list[LevelPoint]:
    """ratio = (load / at) ** -slope exactly, interval ratio / spread to ratio * spread."""
    return [point(x, (x / at) ** -slope, (x / at) ** -slope / spread, (x / at) ** -slope * spread)
            for x in loads]  # fmt: skip


def test_log_crossing_is_exact_on_a_power_law():
    # y = (x / 6) ** -0.5 through x = 4 and x = 16 reaches 1.0 at x = 6.
    assert log_crossing(4, (4 / 6) ** -0.5, 16, (16 / 6) ** -0.5) == pytest.approx(6, rel=1e-12)
    assert log_crossing(1, 2.0, 4, 0.5) == pytest.approx(2.0, rel=1e-12)  # geometric midpoint
    assert log_crossing(2, 1.0, 8, 0.5) == 2  # on the first level itself
    assert log_crossing(2, 1.5, 8, 1.0) == pytest.approx(8)


def test_a_falling_speedup_crosses_where_the_power_law_says_with_its_uncertainty():
    # The interval is the ratio divided / multiplied by 1.2: its low bound reaches 1.0 at
    # 6 / 1.2**2 and its high bound at 6 * 1.2**2, both exactly, in log-log.
    pays = paying_load(power_law([1, 4, 16, 64], 6, 0.5, 1.2), prompt_type="coding", candidate="k5")

    assert pays.kind is PayingLoadKind.CROSSING
    assert pays.direction == "falls"
    assert pays.load == pytest.approx(6, rel=1e-12)
    assert pays.low == pytest.approx(6 / 1.44, rel=1e-12)
    assert pays.high == pytest.approx(6 * 1.44, rel=1e-12)
    assert pays.crossings == 1 and pays.monotone and pays.first
    assert pays.text == "speedup falls below 1.0 at c6.0 (between c4.2 and c8.6)"
    assert [p.level for p in pays.points] == ["c1", "c4", "c16", "c64"]


def test_a_rising_speedup_crosses_too():
    pays = paying_load(power_law([1, 4, 16, 64], 6, -0.5, 1.2))

    assert pays.direction == "rises"
    assert pays.load == pytest.approx(6, rel=1e-12)
    # Rising: the high bound leaves "slower" first, the low bound reaches "faster" later.
    assert pays.low == pytest.approx(6 / 1.44, rel=1e-12)
    assert pays.high == pytest.approx(6 * 1.44, rel=1e-12)
    assert pays.text.startswith("speedup rises above 1.0 at c6.0")


def test_the_order_of_the_points_does_not_matter():
    points = power_law([1, 4, 16, 64], 6, 0.5, 1.2)
    assert paying_load(points[::-1]) == paying_load(points)


def test_an_end_is_open_where_no_interval_lies_wholly_on_that_side():
    # Significantly faster at c1 only; slower at c8 and c16 but never significantly.
    points = [point(1, 1.4, 1.2, 1.6), point(4, 1.1, 0.9, 1.3), point(8, 0.9, 0.7, 1.1),
              point(16, 0.85, 0.6, 1.2)]  # fmt: skip
    pays = paying_load(points)

    assert pays.kind is PayingLoadKind.CROSSING
    assert pays.load == pytest.approx(log_crossing(4, 1.1, 8, 0.9))
    assert pays.low == pytest.approx(log_crossing(1, 1.2, 4, 0.9))
    assert pays.high is None
    assert pays.text == (
        f"speedup falls below 1.0 at c{pays.load:.1f} "
        f"(from c{pays.low:.1f} to beyond the measured range)"
    )

    # The mirror: nothing significant before the crossing, significantly slower at c16.
    mirror = [point(1, 1.2, 0.9, 1.5), point(4, 0.95, 0.8, 1.1), point(16, 0.7, 0.6, 0.8)]
    pays = paying_load(mirror)
    assert pays.low is None
    assert pays.high == pytest.approx(log_crossing(4, 1.1, 16, 0.8))
    assert "(from below the measured range to c" in pays.text


def test_an_unknown_neighbouring_bound_widens_the_range_to_the_measured_level():
    points = [point(1, 1.4, 1.2, 1.6), point(4, 0.9, math.nan, math.nan), point(16, 0.7, 0.6, 0.8)]
    pays = paying_load(points)
    assert (pays.low, pays.high) == (1, 16)


@pytest.mark.parametrize(
    ("ratios", "kind", "text"),
    [
        ([1.3, 1.2, 1.1], PayingLoadKind.FASTER, "always faster (c1 to c16)"),
        ([0.9, 0.8, 0.7], PayingLoadKind.SLOWER, "always slower (c1 to c16)"),
        ([1.2, 1.0, 1.1], PayingLoadKind.FASTER, "always faster"),  # touches 1.0, no crossing
        ([1.0, 1.0, 1.0], PayingLoadKind.FLAT, "exactly 1.0 at every level"),
    ],
)
def test_no_paying_load_in_the_measured_range(ratios, kind, text):
    # Tight intervals: every level but those at exactly 1.0 is significant.
    points = [point(c, r, r * 0.97, r / 0.97) for c, r in zip([1, 4, 16], ratios, strict=True)]
    pays = paying_load(points)
    assert pays.kind is kind
    assert pays.load is None and pays.low is None and pays.high is None
    assert pays.text.startswith("the speedup does not cross 1.0 in the measured range: ")
    assert text in pays.text
    assert "not significant" not in pays.text


def test_always_faster_without_significance_says_so():
    points = [point(1, 1.1, 0.9, 1.3), point(4, 1.05, 0.8, 1.3)]
    pays = paying_load(points)
    assert pays.kind is PayingLoadKind.FASTER and pays.significant == 0
    assert pays.text.endswith("always faster (c1 to c4; not significant at any level)")


def test_both_sides_with_every_interval_straddling_is_mixed_not_a_crossing():
    points = [point(1, 1.1, 0.8, 1.4), point(4, 0.9, 0.7, 1.2), point(16, 1.05, 0.8, 1.3)]
    pays = paying_load(points)
    assert pays.kind is PayingLoadKind.MIXED
    assert pays.crossings == 2 and not pays.monotone and pays.load is None
    assert pays.text.startswith(
        "the speedup does not cross 1.0 in the measured range: mixed, no clean crossing"
    )


def test_a_non_monotone_series_reports_its_first_crossing_and_says_so():
    points = [point(1, 1.3, 1.2, 1.4), point(4, 0.9, 0.85, 0.95), point(16, 1.2, 1.1, 1.3),
              point(64, 0.8, 0.7, 0.9)]  # fmt: skip
    pays = paying_load(points)
    assert pays.kind is PayingLoadKind.CROSSING and pays.first
    assert pays.load == pytest.approx(log_crossing(1, 1.3, 4, 0.9))
    assert pays.crossings == 3 and not pays.monotone
    assert pays.text.endswith("; not monotone: crosses 1.0 3 times")


def test_a_bump_without_a_second_crossing_is_still_called_not_monotone():
    points = [point(1, 1.3, 1.2, 1.4), point(4, 1.1, 1.05, 1.15), point(8, 1.2, 1.1, 1.3),
              point(16, 0.8, 0.7, 0.9)]  # fmt: skip
    pays = paying_load(points)
    assert pays.crossings == 1 and not pays.monotone
    assert pays.text.endswith("; not monotone")
    assert pays.low == pytest.approx(log_crossing(8, 1.1, 16, 0.7))  # the last faster level


def test_an_unconfirmed_first_crossing_gives_way_to_a_confirmed_one():
    # c1 -> c4 crosses with no interval on either side; c4 -> c16 rises to significance.
    points = [point(1, 1.05, 0.9, 1.2), point(4, 0.95, 0.8, 1.1), point(16, 1.3, 1.2, 1.4)]
    pays = paying_load(points)
    assert pays.kind is PayingLoadKind.CROSSING and pays.direction == "rises"
    assert not pays.first and pays.crossings == 2
    assert pays.load == pytest.approx(log_crossing(4, 0.95, 16, 1.3))
    assert "the first crossing an interval confirms" in pays.text


def test_a_level_at_exactly_one_is_the_crossing():
    pays = paying_load([point(1, 1.2, 1.1, 1.3), point(4, 1.0, 0.9, 1.1), point(16, 0.8, 0.7, 0.9)])
    assert pays.kind is PayingLoadKind.CROSSING and pays.load == 4
    pays = paying_load([point(1, 1.2, 1.1, 1.3), point(4, 1.0, 0.9, 1.1), point(8, 1.0, 0.9, 1.1),
                       point(16, 0.8, 0.7, 0.9)])  # fmt: skip
    assert pays.load == 4  # the first level that reaches 1.0
    assert pays.low == pytest.approx(log_crossing(1, 1.1, 4, 0.9))
    assert pays.high == pytest.approx(log_crossing(8, 1.1, 16, 0.9))


def test_one_level_or_none_cannot_tell_the_paying_load():
    pays = paying_load([point(4, 0.8, 0.7, 0.9)])
    assert pays.kind is PayingLoadKind.SINGLE
    assert pays.text == "one level only (c4): the paying load cannot be told"
    # A level without a speedup (insufficient samples) is skipped, and said so.
    pays = paying_load([point(1, math.nan, math.nan, math.nan), point(4, 0.8, 0.7, 0.9)])
    assert pays.kind is PayingLoadKind.SINGLE and pays.skipped == ("c1",)
    assert paying_load([]).kind is PayingLoadKind.EMPTY


def test_rate_levels_are_written_as_rates_and_axes_do_not_mix():
    points = [LevelPoint("r0.5", 0.5, 1.2, 1.1, 1.3, ""), LevelPoint("r2", 2, 0.8, 0.7, 0.9, "")]
    pays = paying_load(points)
    assert pays.axis == "rate"
    assert pays.text == "speedup falls below 1.0 at r0.93 (between r0.67 and r1.3)"
    with pytest.raises(ValueError, match="mixes open-loop"):
        paying_load([*points, point(4, 1.0, 0.9, 1.1)])
    with pytest.raises(ValueError, match="two levels share a load"):
        paying_load([point(4, 1.0, 0.9, 1.1), point(4, 1.1, 1.0, 1.2)])
    with pytest.raises(ValueError, match="load must be a positive number"):
        LevelPoint("c0", 0, 1.0, 0.9, 1.1, "")


def test_to_dict_is_json():
    pays = paying_load(power_law([1, 4, 16], 6, 0.5, 1.2), prompt_type="math", candidate="ngram")
    data = json.loads(json.dumps(pays.to_dict()))
    assert data["kind"] == "crossing" and data["prompt_type"] == "math"
    assert data["load"] == pytest.approx(6) and data["text"] == pays.text
    assert len(data["points"]) == 3
    nan = paying_load([point(1, math.nan, math.nan, math.nan)]).to_dict()
    assert json.loads(json.dumps(nan))["skipped"] == ["c1"]


def test_the_plot_is_a_png_and_nothing_is_drawn_without_points(tmp_path: Path):
    series = {
        "coding": power_law([1, 4, 16], 6, 0.5, 1.2),
        "math": power_law([1, 4, 16], 40, 0.3, 1.1),  # always faster here
        "empty": [],
    }
    paying_loads: dict[str, PayingLoad] = {k: paying_load(v) for k, v in series.items()}
    path = speedup_vs_load(series, paying_loads, tmp_path / "speedup.png", title="ngram")
    assert path == tmp_path / "speedup.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000

    nothing = speedup_vs_load({"x": []}, {}, tmp_path / "none.png", title="t")
    assert nothing is None and not (tmp_path / "none.png").exists()
