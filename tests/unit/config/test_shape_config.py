"""`[shape]` and `--spec-shape` (config/shape/table.py), the named shapes and a Shape's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.config.shape.geometry import Shape
from pytest_specdecode.config.shape.named import NAMED, named_shape
from pytest_specdecode.config.shape.table import ShapeConfig, shape_config
from pytest_specdecode.errors import ConfigError

MINIMAL = """
[target]
api_base = "http://127.0.0.1:8011"
model = "m"
command = "vllm serve m --port 8011"
[presets]
ngram = { method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }
[prompt_types.coding]
prompt = "Write a binary search tree."
"""


def parse(table: dict, overrides: dict | None = None, base: Path = Path("/")) -> ShapeConfig:
    found = shape_config(table, overrides or {}, base=base, where="exp.toml")
    assert found is not None
    return found


def test_the_served_models_own_shape_by_either_name() -> None:
    assert parse({"source": "unit"}) == ShapeConfig("unit", None)
    assert parse({"source": "served"}).served and parse({"source": "unit"}).served


def test_a_file_source_is_read_relative_to_the_toml_and_must_exist(tmp_path: Path) -> None:
    (tmp_path / "shapes").mkdir()
    (tmp_path / "shapes" / "config.json").write_text("{}")
    asked = parse({"source": "file:shapes"}, base=tmp_path)
    assert asked.path == tmp_path / "shapes" / "config.json"
    with pytest.raises(ConfigError, match="is not a readable file"):
        parse({"source": "file:missing.json"}, base=tmp_path)


def test_a_named_shape_and_an_unknown_one() -> None:
    assert parse({"source": "Llama-3.1-8B"}).source == "llama-3.1-8b"
    with pytest.raises(ConfigError) as refused:
        parse({"source": "gpt-5"})
    assert all(name in str(refused.value) for name in NAMED)


@pytest.mark.parametrize(
    ("layers", "depths"),
    [("auto", None), (2, (2,)), ([4, 2, 4], (2, 4)), ("2,4", (2, 4))],
)
def test_layers_are_auto_a_depth_or_depths(layers, depths) -> None:
    assert parse({"source": "unit", "layers": layers}).layers == depths


@pytest.mark.parametrize("layers", [0, [], [1, "x"], True, 2.5])
def test_layers_that_are_no_depths_are_refused(layers) -> None:
    with pytest.raises(ConfigError, match="layers"):
        parse({"source": "unit", "layers": layers})


def test_the_options_override_the_table_and_the_settings_carry_it(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(MINIMAL + '[shape]\nsource = "unit"\nlayers = 4\n')
    assert load_settings(path).shape == ShapeConfig("unit", (4,))
    settings = load_settings(path, shape_overrides={"source": "kimi-k2", "layers": "2,3"})
    assert settings.shape == ShapeConfig("kimi-k2", (2, 3))
    path.write_text(MINIMAL)
    assert load_settings(path).shape is None
    assert load_settings(path, shape_overrides={"source": "unit"}).shape == ShapeConfig("unit")


def test_unknown_keys_of_shape_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "exp.toml"
    path.write_text(MINIMAL + '[shape]\nsource = "unit"\ndepth = 4\n')
    with pytest.raises(ConfigError, match=r"\[shape\]: unknown key\(s\) depth"):
        load_settings(path)


def test_a_shapes_figures_as_its_config_states_them() -> None:
    llama, v3 = named_shape("llama-3.1-8b"), named_shape("deepseek-v3")
    assert (llama.hidden, llama.layers, llama.heads, llama.kv_heads, llama.head_dim) == (
        4096, 32, 32, 8, 128,
    )  # fmt: skip
    assert (llama.intermediate, llama.vocab, llama.is_moe, llama.min_depth) == (
        14336, 128256, False, 1,
    )  # fmt: skip
    assert llama.config["rope_theta"] == 500000.0 and llama.max_position == 131072
    assert llama.config["rope_scaling"]["rope_type"] == "llama3"
    assert (v3.routed_experts, v3.experts_per_token, v3.shared_experts, v3.first_dense) == (
        256, 8, 1, 3,
    )  # fmt: skip
    assert v3.mla and v3.quantization == "fp8" and v3.moe_intermediate == 2048
    kimi = named_shape("kimi-k2")
    assert (kimi.routed_experts, kimi.heads, kimi.first_dense, kimi.vocab) == (384, 64, 1, 163840)
    assert named_shape("llama-3.2-1b").tied and named_shape("llama-3.2-1b").vocab == 128256


def test_a_nested_text_config_is_read_for_the_language_model() -> None:
    """Kimi-K2.5 nests DeepSeek-V3's figures in text_config."""
    k25 = Shape(
        "file:/k25.json",
        "/k25.json on this machine",
        {
            "architectures": ["KimiK25ForConditionalGeneration"],
            "text_config": {
                **{k: v for k, v in named_shape("kimi-k2").config.items() if k != "architectures"}
            },
        },
    )
    assert (k25.architecture, k25.routed_experts, k25.layers) == (
        "KimiK25ForConditionalGeneration", 384, 61,
    )  # fmt: skip


def test_a_file_that_is_not_a_models_config_is_refused() -> None:
    with pytest.raises(ConfigError, match="lacks hidden_size, num_hidden_layers, vocab_size"):
        Shape("file:/x.json", "/x.json on this machine", {"architectures": ["X"]})
