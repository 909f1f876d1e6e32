"""The shape as served (config/shape/served.py, resolve.py): the server command and environment
of both command forms, what is merged and kept, and the record round trip."""

from __future__ import annotations

import json

import pytest

from pytest_specdecode.config.shape.memory import gpu_room
from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.config.shape.resolve import serve_shape
from pytest_specdecode.config.shape.served import MOE_ROUTING_ENV, ServedShape
from pytest_specdecode.config.shape.table import ShapeConfig
from pytest_specdecode.config.specconfig import OFFLINE_FACTS
from pytest_specdecode.config.vllm_argv import option_value
from pytest_specdecode.errors import ConfigError

FACTS = OFFLINE_FACTS.__class__(
    **{
        **vars(OFFLINE_FACTS),
        "host": "gpu-1",
        "interpreter": "/opt/vllm/bin/python",
        "architectures": frozenset({"LlamaForCausalLM", "DeepseekV3ForCausalLM"}),
        "moe_routing": ("normal_routing", "uniform_random"),
    }
)
H200 = gpu_room([143771], share=0.9, host="gpu-1")
SERVE = ["vllm", "serve", "/models/llama-8b", "--port", "8000", "--max-model-len", "8192"]
API = [
    "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server",
    "--model=/models/llama-8b", "--served-model-name", "llama", "--port", "8000",
]  # fmt: skip


def served(command, *, name="llama-3.1-8b", layers=(2,), env=None, vocab=None) -> ServedShape:
    return serve_shape(
        named_shape(name),
        ShapeConfig(name, layers),
        command=command,
        env=env or {},
        served_name="llama",
        facts=FACTS,
        room=H200,
        folder="/runs/r1/shape",
        where="the local server command on gpu-1",
        tokenizer_vocab=vocab,
    )


def test_vllm_serve_model_gets_the_folder_dummy_weights_its_tokenizer_and_the_cut() -> None:
    shape = served(SERVE)
    argv = shape.argv(SERVE, where="[target] command")
    assert argv[:3] == ["vllm", "serve", "/runs/r1/shape"]
    assert option_value(argv, "--tokenizer") == "/models/llama-8b"  # prompts as in production
    assert option_value(argv, "--served-model-name") == "llama"  # the API's name kept
    assert option_value(argv, "--load-format") == "dummy"
    assert json.loads(option_value(argv, "--hf-overrides") or "") == {"num_hidden_layers": 2}
    assert option_value(argv, "--max-model-len") == "8192" and shape.env == {}


def test_the_api_server_module_form_with_model_equals_is_served_the_same_way() -> None:
    argv = served(API).argv(API, where="[target] command")
    assert argv[:5] == [*API[:3], "--model", "/runs/r1/shape"]
    assert argv.count("--served-model-name") == 1 and option_value(argv, "--tokenizer") == (
        "/models/llama-8b"
    )


def test_the_commands_own_overrides_load_format_and_tokenizer_are_merged_or_kept() -> None:
    command = [
        *SERVE, "--tokenizer", "/tok", "--load-format", "safetensors",
        "--hf-overrides", '{"rope_theta": 10000, "num_hidden_layers": 40}',
    ]  # fmt: skip
    shape = served(command)
    assert shape.overrides == {"rope_theta": 10000, "num_hidden_layers": 2}
    argv = shape.argv(command, where="[target] command")
    assert argv.count("--load-format") == 1 and option_value(argv, "--load-format") == "dummy"
    assert argv.count("--hf-overrides") == 1 and option_value(argv, "--tokenizer") == "/tok"
    assert shape.tokenizer == "/tok"


def test_a_command_whose_overrides_are_not_an_object_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"not a JSON object.*Nothing was touched"):
        served([*SERVE, "--hf-overrides", "[1]"])


def test_a_moe_shape_is_routed_uniformly_and_says_what_is_random_and_cut() -> None:
    shape = served(SERVE, name="deepseek-v3", layers=(5,))
    assert shape.env == {MOE_ROUTING_ENV: "uniform_random"}
    said = "\n".join(shape.statement())
    assert "random: the weights (--load-format dummy)" in said
    assert f"{MOE_ROUTING_ENV}=uniform_random): each token's 8 experts drawn uniformly" in said
    assert "cut: the layers: 61 → 5 (3 dense, 2 MoE; first_k_dense_replace kept)" in said
    assert "real: the engine: vLLM 0.32 on gpu-1" in said and "in fp8" in said


def test_a_vocabulary_below_the_tokenizers_is_raised_and_said() -> None:
    shape = served(SERVE, vocab=200000)
    assert shape.overrides["vocab_size"] == 200000
    assert shape.changed and "128256 → 200000, the tokenizer's" in shape.changed[0]
    assert served(SERVE, vocab=49152).changed == ()  # a smaller tokenizer's ids are all there


def test_the_served_shape_survives_results_json_and_serves_another_depth() -> None:
    shape = served(SERVE, name="deepseek-v3", layers=(4, 6))
    back = ServedShape.from_dict(json.loads(json.dumps(shape.to_dict())))
    assert back == shape and back.fit is not None and back.fit.depths == (4, 6)
    assert back.layers == 6 and back.label == "deepseek-v3 (DeepseekV3ForCausalLM), 6 of 61 layers"
    deeper = shape.at_depth(4)
    assert deeper.overrides["num_hidden_layers"] == 4 and deeper.cut_text().startswith(
        "the layers: 61 → 4"
    )
    assert shape.model_label("llama") == f"llama [shape {shape.label}]"
