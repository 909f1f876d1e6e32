"""The dynamic-k table: families of k, the per-level winners, the batch-size rule, and the
checks of `num_speculative_tokens_per_batch_size` that a recommendation must pass."""

from __future__ import annotations

import json

import pytest

from pytest_specdecode.analysis.map.dynamic_k import (
    DEFAULT_MAX_BATCH,
    batch_boundaries,
    k_families,
    recommend_dynamic_k,
)
from pytest_specdecode.analysis.map.paying_load import LevelPoint
from pytest_specdecode.config.specconfig import (
    check_spec_shape,
    parse_spec_config,
    validate_spec_values,
)
from pytest_specdecode.errors import ConfigError

NGRAM = {"method": "ngram", "prompt_lookup_max": 4}
SPECS = {
    "ngram-k3": {**NGRAM, "num_speculative_tokens": 3},
    "ngram-k5": {**NGRAM, "num_speculative_tokens": 5},
}
TABLE = "num_speculative_tokens_per_batch_size"


def pt(level: str, ratio: float, verdict: str = "inconclusive") -> LevelPoint:
    load = float(level[1:])
    return LevelPoint(level, load, ratio, ratio * 0.95, ratio / 0.95, verdict)


def series(*points: LevelPoint, prompt_type: str = "coding") -> dict[str, list[LevelPoint]]:
    return {prompt_type: list(points)}


# k5 pays at one stream, k3 at four, neither at sixteen.
K3 = series(pt("c1", 1.10, "improved"), pt("c4", 1.06, "improved"), pt("c16", 0.8, "regressed"))
K5 = series(pt("c1", 1.25, "improved"), pt("c4", 0.97), pt("c16", 0.7, "regressed"))


@pytest.mark.parametrize(
    ("levels", "cap", "ranges"),
    [
        ([1, 4], 256, [(1, 2), (3, 256)]),  # sqrt(1 * 4) = 2
        ([1, 4, 16], 256, [(1, 2), (3, 8), (9, 256)]),
        ([1, 2], 8, [(1, 1), (2, 8)]),  # sqrt(2) = 1.41: a batch of 2 is level c2's
        ([4, 8], 128, [(1, 5), (6, 128)]),  # sqrt(32) = 5.66; below c4 takes c4's range
        ([16, 1, 4], 6, [(1, 2), (3, 6)]),  # any order; c16's range starts above the cap
        ([1, 4], 2, [(1, 2)]),
        ([3], 1, [(1, 1)]),
    ],
)
def test_batch_ranges_meet_at_geometric_midpoints(levels, cap, ranges):
    assert batch_boundaries(levels, cap) == ranges


def test_batch_boundaries_refuse_bad_levels():
    for levels, cap in (([], 8), ([0, 4], 8), ([4, 4], 8), ([1], 0)):
        with pytest.raises(ValueError):
            batch_boundaries(levels, cap)


def test_k_families_group_values_identical_but_for_k():
    specs = {
        **SPECS,
        "ngram-k3-again": {**NGRAM, "num_speculative_tokens": 3},  # a second name for k3
        "ngram-lookup2-k3": {
            "method": "ngram",
            "prompt_lookup_max": 2,
            "num_speculative_tokens": 3,
        },
        "suffix-k4": {"method": "suffix", "num_speculative_tokens": 4},
        "suffix-k8": {"method": "suffix", "num_speculative_tokens": 8},
        "dyn": {**NGRAM, "num_speculative_tokens": 7, TABLE: [[1, 8, 7]]},
        "baseline-again": {},
    }
    assert k_families(specs) == [{3: "ngram-k3", 5: "ngram-k5"}, {4: "suffix-k4", 8: "suffix-k8"}]
    assert k_families({"ngram-k5": SPECS["ngram-k5"]}) == []


def test_the_table_takes_each_levels_winner_and_passes_validation():
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": K3, "ngram-k5": K5}, max_num_seqs=128)

    assert [(c.level, c.k) for c in rec.choices] == [("c1", 5), ("c4", 3), ("c16", 0)]
    assert rec.table == [[1, 2, 5], [3, 8, 3], [9, 128, 0]]
    assert rec.spec == {**NGRAM, "num_speculative_tokens": 5, TABLE: rec.table}
    assert rec.max_batch == 128 and rec.max_batch_source == "max_num_seqs"
    assert rec.name == "ngram-k3-5-dynamic"
    assert rec.choices[0].reason == "c1: k5, speedup 1.250 (beats k3 1.100)"
    assert rec.choices[1].reason == "c4: k3, speedup 1.060 (beats k5 0.970)"
    assert rec.choices[2].reason == (
        "c16: k=0, no drafts (vLLM 0.32 accepts 0 in the table); "
        "k3 regressed on coding; k5 regressed on coding"
    )
    # The recommendation round-trips as a candidate of its own.
    spec = parse_spec_config(json.dumps(rec.spec), {})
    assert spec.name == "ngram-k5-dynamic" and dict(spec.values) == rec.spec
    assert validate_spec_values(rec.spec, source=spec.name) == rec.spec
    assert json.loads(json.dumps(rec.to_dict()))["table"] == rec.table


def test_without_max_num_seqs_the_table_ends_at_the_stated_default():
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": K3, "ngram-k5": K5})
    assert rec.table == [[1, 2, 5], [3, 8, 3], [9, DEFAULT_MAX_BATCH, 0]]
    assert rec.max_batch_source == "default"
    assert "the last ends at 1024 (vLLM 0.32's largest default max_num_seqs)" in rec.notes[0]


def test_neighbouring_levels_with_the_same_winner_are_one_range():
    k3 = series(pt("c1", 1.1), pt("c2", 1.2), pt("c4", 1.1), pt("c8", 1.05))
    k5 = series(pt("c1", 1.3), pt("c2", 1.1), pt("c4", 1.0), pt("c8", 0.9))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=64)
    assert rec.table == [[1, 1, 5], [2, 64, 3]]
    assert rec.spec is not None and rec.spec["num_speculative_tokens"] == 5


def test_num_speculative_tokens_is_the_largest_k_the_table_uses():
    k3 = series(pt("c1", 1.3), pt("c4", 1.1))
    k5 = series(pt("c1", 1.2), pt("c4", 0.9, "regressed"))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=16)
    assert rec.table == [[1, 16, 3]]
    assert rec.spec == {**NGRAM, "num_speculative_tokens": 3, TABLE: [[1, 16, 3]]}


def test_no_table_when_no_k_may_run_anywhere():
    k3 = series(pt("c1", 0.9, "regressed"), pt("c4", 0.8, "regressed"))
    k5 = series(pt("c1", 0.85, "regressed"), pt("c4", 1.2, "contaminated"))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5})
    assert rec.table is None and rec.spec is None
    assert [c.k for c in rec.choices] == [0, 0]
    assert "k5 has no verdict on coding" in rec.choices[1].reason
    assert rec.notes[-1] == "no k may run at any measured level: keep speculation off"
    assert rec.text.startswith("ngram: no dynamic-k table (")


def test_several_prompt_types_one_table_geometric_mean_and_no_regression_on_any():
    k3 = {
        "coding": [pt("c1", 1.2), pt("c4", 1.3)],
        "math": [pt("c1", 1.2), pt("c4", 0.9, "regressed")],
    }
    k5 = {
        "coding": [pt("c1", 1.0), pt("c4", 1.0)],
        "math": [pt("c1", 1.5), pt("c4", 1.05)],
    }
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=8)
    # c1: k3 sqrt(1.2 * 1.2) = 1.2 < k5 sqrt(1.0 * 1.5) = 1.225; c4: k3 regressed on math.
    assert [c.k for c in rec.choices] == [5, 5]
    assert rec.choices[0].reason == "c1: k5, speedup 1.225 over 2 prompt types (beats k3 1.200)"
    assert "k3 regressed on math" in rec.choices[1].reason
    assert rec.table == [[1, 8, 5]]


def test_a_k_missing_a_prompt_type_at_a_level_cannot_win_it():
    k3 = {"coding": [pt("c1", 1.5)], "math": [pt("c1", 1.5)]}
    k5 = {"coding": [pt("c1", 1.1)]}
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=4)
    assert rec.choices[0].k == 3
    assert "k5 not measured on math" in rec.choices[0].reason


def test_ties_go_to_the_smaller_k_and_a_slower_winner_is_flagged():
    k3 = series(pt("c1", 0.98))
    k5 = series(pt("c1", 0.98))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=4)
    assert rec.choices[0].k == 3
    assert rec.choices[0].reason.endswith("; below 1.0 but not regressed")


def test_open_loop_levels_have_no_batch_size_and_are_left_out():
    k3 = series(pt("c1", 1.1), LevelPoint("r2", 2, 1.3, 1.2, 1.4, "improved"))
    k5 = series(pt("c1", 1.2), LevelPoint("r2", 2, 0.8, 0.7, 0.9, "regressed"))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=4)
    assert rec.table == [[1, 4, 5]]
    assert "open-loop levels have no batch size, not used: r2" in rec.notes
    # only open-loop levels: no table, and why
    only = {"ngram-k3": series(k3["coding"][1]), "ngram-k5": series(k5["coding"][1])}
    (rec,) = recommend_dynamic_k(SPECS, only)
    assert rec.table is None
    assert "no closed-loop level was measured for these candidates" in rec.notes


def test_levels_above_max_num_seqs_and_below_the_lowest_level_are_said():
    k3 = series(pt("c2", 1.0), pt("c16", 1.2))
    k5 = series(pt("c2", 1.3), pt("c16", 1.0))
    (rec,) = recommend_dynamic_k(SPECS, {"ngram-k3": k3, "ngram-k5": k5}, max_num_seqs=4)
    assert rec.table == [[1, 4, 5]]  # c16's range would start at 6
    assert "batch sizes below 2 were not measured: they take c2's k" in rec.notes
    assert "c16: above max_num_seqs=4, no batch is that large" in rec.notes


def test_fewer_than_two_k_of_one_method_gives_no_table():
    assert recommend_dynamic_k({"ngram-k5": SPECS["ngram-k5"]}, {"ngram-k5": K5}) == []
    with pytest.raises(ValueError, match="max_num_seqs"):
        recommend_dynamic_k(SPECS, {}, max_num_seqs=0)


# --------------------------------------------------------------------------- the checks

BASE = {"method": "ngram", "num_speculative_tokens": 5}


@pytest.mark.parametrize(
    "table",
    [
        [[1, 4, 5]],
        [[1, 1, 5], [2, 1024, 3]],
        [[5, 8, 2], [1, 4, 5]],  # any order: vLLM sorts by start
        [[1, 4, 5], [9, 16, 3]],  # a gap: vLLM carries k=5 through 5..8
        [[1, 4, 0]],  # k = 0: no drafts
        [[1, 4, 7]],  # above num_speculative_tokens: vLLM caps it at 5
    ],
)
def test_tables_vllm_accepts_are_accepted(table):
    values = {**BASE, TABLE: table}
    assert check_spec_shape(values, source="t") == values
    assert parse_spec_config(json.dumps(values), {}).name == "ngram-k5-dynamic"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ([], "must be a non-empty list of [start, end, k] ranges"),
        ({"1": 5}, "must be a list, got"),
        ([[1, 4]], "entry 0 [1, 4] must be [start, end, k], three integers"),
        ([[1, 4, 5, 6]], "entry 0 [1, 4, 5, 6] must be [start, end, k]"),
        ([5], "entry 0 5 must be [start, end, k]"),
        ([[1, 4, 5], [5, 8.0, 3]], "entry 1 [5, 8.0, 3]: start, end and k must be integers"),
        ([[1, 4, True]], "entry 0 [1, 4, true]: start, end and k must be integers"),
        ([[1, 4, "5"]], "start, end and k must be integers"),
        ([[0, 4, 5]], "entry 0 [0, 4, 5]: batch sizes must be >= 1"),
        ([[1, 4, 5], [6, 5, 3]], "entry 1 [6, 5, 3]: start 6 is above end 5"),
        ([[1, 4, -1]], "entry 0 [1, 4, -1]: k must be >= 0"),
        (
            [[1, 4, 5], [4, 8, 3]],
            "entry 1 [4, 8, 3] overlaps num_speculative_tokens_per_batch_size entry 0 [1, 4, 5]",
        ),
        ([[2, 8, 3]], "must cover batch size 1: its lowest range, "),
        ([[9, 16, 3], [2, 8, 5]], "lowest range, num_speculative_tokens_per_batch_size entry 1"),
    ],
)
def test_tables_vllm_refuses_are_refused_naming_the_entry(table, message):
    values = {**BASE, TABLE: table}
    with pytest.raises(ConfigError) as info:
        parse_spec_config(json.dumps(values), {})
    assert message in str(info.value)
    assert str(info.value).startswith("speculative config 'ngram-k5-dynamic': ")
