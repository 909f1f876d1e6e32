"""The map on a shape target, before anything is touched: its carrier chosen on the shape, its
depths and servers, the drafters' files, and the plan (depths, servers, starts, time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.config.break_even import depth_of_arm, is_map_arm, map_depths
from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.config.shape.served import ServedShape
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.report.schedule import Timing
from pytest_specdecode.run.map_on_shape import FILES, MAP, map_plan, with_map_on_shape
from pytest_specdecode.targets.shaped import ShapedTarget
from tests.support import synthetic


def _served(name: str, layers: int, folder: Path) -> ServedShape:
    shape = named_shape(name)
    return ServedShape(
        shape=shape,
        layers=layers,
        overrides={"num_hidden_layers": layers},
        env={},
        tokenizer="/models/tok",
        served_name="m",
        folder=str(folder / "run" / "shape"),
        engine="vLLM 0.26.0 on localhost",
    )


def _settings(tmp_path: Path, extra: str = "", ks: str = "3,5", levels: str = "[1, 8]"):
    run = f'break_even = "{ks}"\nconcurrency = {levels}\n{extra}'
    shape = '[shape]\nsource = "llama-3.1-8b"'  # chosen again once resolved: n-gram till then
    found = synthetic.settings(tmp_path, candidates=("ngram",), run_extra=run, extra=shape)
    assert found.shape is not None and found.candidates[1].values["method"] == "ngram"
    return found


def test_the_depths_carry_a_cut_shape_and_leave_a_whole_one_alone() -> None:
    assert map_depths(8, 32, 1) == (4, 8)
    assert map_depths(32, 32, 1) == (32,)
    assert map_depths(5, 61, 4) == (4, 5)  # DeepSeek-V3: three dense layers, then one MoE
    assert map_depths(4, 61, 4) == (4,)  # the shallowest cut only: nothing to fit
    assert map_depths(16, 32, 1, asked=(4, 8, 16)) == (4, 8, 16)


def test_an_8b_shape_maps_with_an_eagle3_head_at_two_depths(tmp_path) -> None:
    settings, served = with_map_on_shape(_settings(tmp_path), _served("llama-3.1-8b", 8, tmp_path))
    names = [c.name for c in settings.candidates]
    assert names[0] == "ngram"  # the hypothesis is kept as it was
    at_8 = [n for n in names[1:] if depth_of_arm(n) is None]
    assert at_8 == ["map-k3-L1", "map-k3-L4", "map-k5-L1", "map-k5-L6"]
    at_4 = [n for n in names if depth_of_arm(n) == 4]
    assert at_4 == ["map-d4-baseline", *(n.replace("map-", "map-d4-") for n in at_8)]
    by_name = {c.name: c for c in settings.candidates}
    head = str(tmp_path / "run" / "map-drafters" / "eagle3-d4")
    assert by_name["map-k5-L6"].values["method"] == "eagle3"
    assert by_name["map-k5-L6"].values["model"] == head
    assert by_name["map-d4-baseline"].values == {}
    assert json.loads(by_name["map-d4-k3-L4"].extra_args[1]) == {"num_hidden_layers": 4}
    assert all(is_map_arm(n, by_name[n].values) for n in names[1:])
    (path, text), = served.extras[FILES].items()  # fmt: skip
    assert path == f"{head}/config.json"
    config = json.loads(text)
    assert config["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]  # within 4, the shallowest
    assert served.extras[MAP]["depths"] == [4, 8]


def test_the_plan_says_the_depths_the_servers_the_starts_and_the_time(tmp_path) -> None:
    settings, served = with_map_on_shape(_settings(tmp_path), _served("llama-3.1-8b", 8, tmp_path))
    timing = Timing(start_s=120.0, s_per_token=0.006, source="the H100's pace (assumed)")
    lines = map_plan(settings, served, timing)
    text = "\n".join(lines)
    assert "map on the shape: eagle3 (" in lines[0] and "drafts k every step" in lines[0]
    assert "measured at 4 and 8 of 32 layers (served: 8)" in text
    assert "an extrapolation" in text
    assert (
        "4 map servers and the original per depth: 5 starts at 4, 5 starts at 8; 10 starts" in text
    )
    minutes = float(text.split("about ")[1].split(" min")[0])
    assert 10 * 120 / 60 <= minutes < 60  # ten starts of two minutes, and their requests
    assert map_plan(settings, None) == []


def test_a_whole_shape_is_not_carried_and_n_gram_carries_where_asked(tmp_path) -> None:
    settings, served = with_map_on_shape(
        _settings(tmp_path, 'break_even_carrier = "ngram"'), _served("llama-3.2-1b", 16, tmp_path)
    )
    assert not [c for c in settings.candidates if depth_of_arm(c.name)]
    assert settings.candidates[1].values["method"] == "ngram" and not served.extras[FILES]
    assert "all 16 layers served: nothing to carry" in "\n".join(map_plan(settings, served))


def test_a_named_draft_model_is_written_with_the_targets_vocabulary(tmp_path) -> None:
    extra = 'break_even_drafters = ["draft_model:llama-3.2-1b"]'
    settings, served = with_map_on_shape(
        _settings(tmp_path, extra), _served("llama-3.1-8b", 32, tmp_path)
    )
    dm = [c for c in settings.candidates if c.name.startswith("map-dm-")]
    assert [c.name for c in dm][:2] == ["map-dm-llama-3p2-1b-k3-L1", "map-dm-llama-3p2-1b-k3-L4"]
    assert dm[0].values["method"] == "draft_model"
    files = {Path(p).parent.name: json.loads(t) for p, t in served.extras[FILES].items()}
    assert set(files) == {"eagle3-d32", "draft-llama-3.2-1b"}
    assert files["draft-llama-3.2-1b"]["vocab_size"] == 128256
    assert files["draft-llama-3.2-1b"]["num_hidden_layers"] == 16
    bad = _settings(tmp_path, 'break_even_drafters = ["draft_model:nope-1b"]')
    with pytest.raises(ConfigError, match="no named shape"):
        with_map_on_shape(bad, _served("llama-3.1-8b", 32, tmp_path))


def test_a_moe_shape_gets_an_mla_head_and_depths_past_its_dense_layers(tmp_path) -> None:
    _, served = with_map_on_shape(_settings(tmp_path, ks="3"), _served("deepseek-v3", 6, tmp_path))
    assert served.extras[MAP]["depths"] == [4, 6]
    (text,) = served.extras[FILES].values()
    assert json.loads(text)["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]


def test_the_shape_target_writes_the_drafters_beside_the_shape(tmp_path) -> None:
    _, served = with_map_on_shape(_settings(tmp_path), _served("llama-3.1-8b", 8, tmp_path))

    class Inner:
        def before_swap(self) -> None:
            return None

    ShapedTarget(Inner(), served).before_swap()  # type: ignore[arg-type]
    head = tmp_path / "run" / "map-drafters" / "eagle3-d4" / "config.json"
    assert json.loads(head.read_text())["num_hidden_layers"] == 1
    assert (tmp_path / "run" / "shape" / "config.json").exists()


def test_the_drafters_share_the_vocabulary_the_shape_is_served_with(tmp_path) -> None:
    import dataclasses

    raised = dataclasses.replace(
        _served("llama-3.1-8b", 32, tmp_path),
        overrides={"num_hidden_layers": 32, "vocab_size": 130000},  # the tokenizer's, larger
    )
    extra = 'break_even_drafters = ["draft_model:llama-3.2-1b"]'
    _, served = with_map_on_shape(_settings(tmp_path, extra), raised)
    assert {json.loads(t)["vocab_size"] for t in served.extras[FILES].values()} == {130000}
