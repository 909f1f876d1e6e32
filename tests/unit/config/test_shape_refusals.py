"""Each refusal of the shape target, before anything is touched (config/shape/resolve.py): an
architecture the serving vLLM lacks, MoE routing left unbalanced, a shape that cannot fit even
cut; each names where and says that nothing was touched."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_specdecode.config.shape.memory import gpu_room
from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.config.shape.resolve import serve_shape
from pytest_specdecode.config.shape.table import ShapeConfig
from pytest_specdecode.config.specconfig import OFFLINE_FACTS, VllmFacts
from pytest_specdecode.errors import ShapeRefused

WHERE = "unit vllm.service on root@gpu-1:22"
COMMAND = ["vllm", "serve", "/models/m", "--max-model-len", "4096"]
ASKED = dataclasses.replace(
    OFFLINE_FACTS,
    host="root@gpu-1:22",
    interpreter="/opt/vllm/bin/python",
    architectures=frozenset({"LlamaForCausalLM", "DeepseekV3ForCausalLM", "MixtralForCausalLM"}),
    moe_routing=("normal_routing", "uniform_random"),
)
H200 = gpu_room([143771], share=0.9, host="root@gpu-1:22")


def serve(name: str, facts: VllmFacts = ASKED, *, env=None, room=H200, layers=None):
    return serve_shape(
        named_shape(name),
        ShapeConfig(name, layers),
        command=COMMAND,
        env=env or {},
        served_name="m",
        facts=facts,
        room=room,
        folder="/run/pytest-specdecode/shape",
        where=WHERE,
    )


def refused(name: str, facts: VllmFacts = ASKED, **kwargs) -> str:
    with pytest.raises(ShapeRefused) as caught:
        serve(name, facts, **kwargs)
    text = str(caught.value)
    assert text.startswith(WHERE) and text.endswith("Nothing was touched")
    return text


def test_an_architecture_the_serving_vllm_lacks_is_refused() -> None:
    lacking = dataclasses.replace(ASKED, architectures=frozenset({"LlamaForCausalLM"}))
    text = refused("deepseek-v3", lacking)
    assert "has no DeepseekV3ForCausalLM in its model registry (1 architectures" in text


def test_an_architecture_not_told_is_served_with_a_note() -> None:
    shape = serve("llama-3.1-8b", dataclasses.replace(ASKED, architectures=None))
    assert shape.notes and "not checked whether" in shape.notes[0]
    assert "note: not checked whether" in shape.statement()[-1]


def test_moe_routing_is_refused_where_the_serving_vllm_lacks_the_simulation() -> None:
    text = refused("deepseek-v3", dataclasses.replace(ASKED, moe_routing=()))
    assert "lacks VLLM_MOE_ROUTING_SIMULATION_STRATEGY" in text
    assert "its gates would route unevenly" in text


def test_moe_routing_is_refused_where_the_serving_vllm_could_not_be_asked() -> None:
    text = refused("kimi-k2", dataclasses.replace(OFFLINE_FACTS, note="no python"))
    assert "could not be asked (no python)" in text


def test_moe_routing_is_refused_where_the_environment_sets_another_strategy() -> None:
    env = {"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "normal_routing"}
    text = refused("deepseek-v3", env=env)
    assert "sets VLLM_MOE_ROUTING_SIMULATION_STRATEGY=normal_routing" in text
    balanced = serve("deepseek-v3", env={"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "uniform_random"})
    assert balanced.routing == "uniform_random"


def test_a_dense_shape_needs_no_routing_simulation() -> None:
    shape = serve("llama-3.1-8b", dataclasses.replace(ASKED, moe_routing=()))
    assert shape.routing is None and shape.env == {}


def test_a_shape_that_cannot_fit_even_cut_is_refused_with_the_figures() -> None:
    l4 = gpu_room([23034], share=0.9, host="root@gpu-1:22")
    text = refused("kimi-k2", room=l4)
    assert "cannot fit even at its minimum depth: 2 of 61 layers" in text and "23034 MiB" in text


def test_without_a_room_a_depth_must_be_asked() -> None:
    assert "give [shape] layers" in refused("llama-3.1-8b", room=None)
    assert serve("llama-3.1-8b", room=None, layers=(2,)).layers == 2
    assert "depths run from 4 to 61" in refused("deepseek-v3", room=None, layers=(2,))


def test_a_config_that_names_remote_code_is_served_with_a_note() -> None:
    shape = named_shape("kimi-k2")
    config = {**shape.config, "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}}
    served = serve_shape(
        dataclasses.replace(shape, config=config),
        ShapeConfig("kimi-k2", (2,)),
        command=COMMAND,
        env={},
        served_name="m",
        facts=ASKED,
        room=H200,
        folder="/f",
        where=WHERE,
    )
    assert served.notes and "auto_map: configuration_deepseek.py" in served.notes[0]
