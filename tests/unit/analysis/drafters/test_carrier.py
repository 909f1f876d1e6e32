"""The map's drafters of the target's shape: an EAGLE-3 head's config (Llama and MLA targets), a
named smaller shape as a draft model; and how the map's carrier is chosen, with its spec."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_specdecode.analysis.drafters.carrier import (
    DRAFT_VOCAB,
    LLAMA_HEAD,
    MLA_HEAD,
    carrier_aux_ids,
    carrier_head_config,
    draft_model_config,
)
from pytest_specdecode.analysis.drafters.check import check_drafter, mapped_architectures
from pytest_specdecode.config.break_even import (
    Carrier,
    TargetShape,
    carrier_of,
    map_candidates,
    map_carriers,
    map_spec,
    point_of,
    served_layers,
    target_shape,
)
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.errors import ConfigError
from tests.support import synthetic

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
    "num_hidden_layers": 32, "vocab_size": 128256, "rope_theta": 500000.0,
    "rms_norm_eps": 1e-5, "max_position_embeddings": 131072, "bos_token_id": 128000,
    "eos_token_id": 128009,
}  # fmt: skip
LLAMA_1B = {**LLAMA_8B, "hidden_size": 2048, "intermediate_size": 8192,
            "num_hidden_layers": 16, "eos_token_id": 128001}  # fmt: skip
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
    "first_k_dense_replace": 3, "n_routed_experts": 256, "num_experts_per_tok": 8,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "vocab_size": 129280,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
}  # fmt: skip


@pytest.mark.parametrize("depth", [2, 3, 4, 6, 7, 8, 32, 61])
def test_the_aux_ids_are_three_distinct_states_within_the_depth_served(depth: int) -> None:
    ids = carrier_aux_ids(depth)
    assert len(set(ids)) == 3 and all(0 <= i <= depth for i in ids)
    if depth >= 8:
        assert ids == (2, depth // 2, depth - 3)  # vLLM's own choice where it is one


def test_a_head_needs_two_layers_served() -> None:
    with pytest.raises(ConfigError, match="three hidden states"):
        carrier_aux_ids(1)


def test_a_llama_heads_config_is_of_the_targets_shape_and_passes_the_drafter_check() -> None:
    head = carrier_head_config(LLAMA_8B, depth=4)
    assert head["architectures"] == [LLAMA_HEAD] and head["num_hidden_layers"] == 1
    assert head["hidden_size"] == head["target_hidden_size"] == 4096
    assert head["draft_vocab_size"] == DRAFT_VOCAB and head["vocab_size"] == 128256
    assert head["head_dim"] == 128 and head["num_key_value_heads"] == 8
    assert head["eagle_aux_hidden_state_layer_ids"] == [0, 2, 4]
    served = {**LLAMA_8B, "num_hidden_layers": 4}
    check = check_drafter("eagle3", head, served)
    # its only warning: no d2t, so draft id i is the target's i; synthetic acceptance decides
    assert check.ok and [w[:16] for w in check.warnings] == ["draft_vocab_size"], check
    assert mapped_architectures("eagle3", head["architectures"]) == [LLAMA_HEAD]


def test_an_mla_target_gets_an_mla_head_with_its_attention() -> None:
    head = carrier_head_config(DEEPSEEK_V3, depth=8)
    assert head["architectures"] == [MLA_HEAD] and head["model_type"] == "deepseek_v2"
    assert head["kv_lora_rank"] == 512 and head["qk_rope_head_dim"] == 64
    assert head["intermediate_size"] == 18432  # a dense MLP, never MoE (deepseek_eagle3.py)
    assert "n_routed_experts" not in head and head["num_hidden_layers"] == 1
    assert check_drafter("eagle3", head, {**DEEPSEEK_V3, "num_hidden_layers": 8}).ok
    kimi = {"architectures": ["KimiK25ForConditionalGeneration"], "text_config": DEEPSEEK_V3}
    assert carrier_head_config(kimi, depth=8)["target_hidden_size"] == 7168


def test_a_named_smaller_shape_drafts_with_the_targets_vocabulary() -> None:
    draft = draft_model_config({**LLAMA_1B, "vocab_size": 128000}, LLAMA_8B)
    assert draft["vocab_size"] == 128256 and draft["eos_token_id"] == 128009
    assert draft["num_hidden_layers"] == 16
    assert check_drafter("draft_model", draft, LLAMA_8B).ok
    with pytest.raises(ConfigError, match="not smaller"):
        draft_model_config(LLAMA_8B, LLAMA_1B)


def _shape(config=LLAMA_8B, *, layers=4, dummy=True, folder="/r/map-drafters") -> TargetShape:
    return TargetShape(config, layers, dummy, folder)


def test_auto_takes_an_eagle3_head_where_it_can_be_had_and_n_gram_elsewhere() -> None:
    (carrier,) = map_carriers("auto", (), (), _shape())
    assert carrier.method == "eagle3" and carrier.make == "eagle3" and carrier.tag == ""
    assert carrier.model == "/r/map-drafters/eagle3-d4"
    for shape, why in (
        (_shape(dummy=False), "its own weights"),
        (_shape(config=None), "cannot be read here"),
        (_shape({**LLAMA_8B, "architectures": ["MixtralForCausalLM"]}), "no EAGLE-3"),
        (_shape(folder=None), "for a shape target only"),
    ):
        (fallback,) = map_carriers("auto", (), (), shape)
        assert fallback.method == "ngram" and why in fallback.why
        with pytest.raises(ConfigError, match="nothing was touched"):
            map_carriers("eagle3", (), (), shape)
    (given,) = map_carriers("auto", (), (), _shape(dummy=False), head="/heads/mine")
    assert given.model == "/heads/mine" and given.make is None  # a head you made: its weights
    (asked,) = map_carriers("ngram", (), (), _shape())
    assert asked.method == "ngram"
    with pytest.raises(ConfigError, match="break_even_carrier"):
        map_carriers("medusa", (), (), _shape())


def test_the_drafters_to_pay_off_get_servers_of_their_own() -> None:
    carriers = map_carriers("ngram", ("eagle3", "draft_model:llama-3.2-1b"), (), _shape())
    assert [c.tag for c in carriers] == ["", "eagle3", "dm-llama-3p2-1b"]
    assert carriers[2].model == "/r/map-drafters/draft-llama-3.2-1b"
    assert carriers[2].label == "draft_model:llama-3.2-1b"
    names = [c.name for c in map_candidates("3", (), 2, carriers)]
    assert names == ["map-k3-L1", "map-k3-L4", "map-eagle3-k3-L1", "map-eagle3-k3-L4",
                     "map-dm-llama-3p2-1b-k3-L1", "map-dm-llama-3p2-1b-k3-L4"]  # fmt: skip
    # the eagle3 carrier already tells the head's pay-off: no second set of its servers
    assert len(map_carriers("eagle3", ("eagle3",), (), _shape())) == 1
    with pytest.raises(ConfigError, match="draft_model:NAME"):
        map_carriers("auto", ("medusa",), (), _shape())
    with pytest.raises(ConfigError, match="--load-format dummy"):
        map_carriers("ngram", ("draft_model:llama-3.2-1b",), (), _shape(dummy=False))


def test_a_carrier_with_a_model_always_drafts_and_n_gram_looks_up_from_one_token() -> None:
    eagle = map_spec(Carrier("eagle3", "/h"), 3, 4.0)
    assert eagle == {"method": "eagle3", "num_speculative_tokens": 3, "model": "/h",
                     "rejection_sample_method": "synthetic",
                     "synthetic_acceptance_length": 4.0}  # fmt: skip
    assert point_of(eagle) == (3, 4.0) and carrier_of(eagle) == "eagle3"
    ngram = map_spec(Carrier("ngram", lookup_max=4), 5, 1.0)
    assert ngram["prompt_lookup_min"] == 1 and ngram["prompt_lookup_max"] == 4
    assert carrier_of(ngram) == "ngram"
    dm = map_spec(Carrier("draft_model", "/x/draft-llama-3.2-1b-abc"), 3, 1.0)
    assert carrier_of(dm) == "draft_model:draft-llama-3.2-1b-abc"
    # without carriers, as before: the first n-gram candidate's drafter
    k5 = SpecConfig(
        "ngram", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 2}
    )
    assert map_candidates("auto", [k5], 2)[0].values["prompt_lookup_max"] == 2


def test_the_depth_served_is_read_from_the_hf_overrides() -> None:
    argv = ["vllm", "serve", "/m", "--hf-overrides", '{"num_hidden_layers": 4}']
    assert served_layers(argv, LLAMA_8B) == 4
    assert served_layers(["vllm", "serve", "/m"], LLAMA_8B) == 32
    nested = ["vllm", "serve", "/m", '--hf-overrides={"text_config": {"num_hidden_layers": 6}}']
    assert served_layers(nested, None) == 6
    assert served_layers(["vllm", "serve", "/m", "--hf-overrides", "[1]"], None) is None


def test_a_local_target_is_read_here_and_a_head_must_be_named(tmp_path) -> None:
    model = tmp_path / "shape"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA_8B))
    s = synthetic.settings(tmp_path, candidates=())
    argv = ("vllm", "serve", str(model), "--load-format", "dummy", "--hf-overrides",
            '{"num_hidden_layers": 4}')  # fmt: skip
    shape = target_shape(dataclasses.replace(s.target, command=argv))
    assert shape.config == LLAMA_8B and shape.layers == 4 and shape.dummy
    assert shape.folder is None  # the run makes a head for a shape target only
    (carrier,) = map_carriers("auto", (), (), shape)
    assert carrier.method == "ngram" and "break_even_head" in carrier.why
    (named,) = map_carriers("auto", (), (), shape, head="/heads/e3")
    assert named.method == "eagle3" and named.model == "/heads/e3"
    unread = target_shape(s.target)  # /m: no config.json here
    assert unread.config is None and not unread.dummy
