"""The map's carrier on the embedded vLLM's own libraries (no server): an EAGLE-3 head of a shape,
its config.json alone, taken by vLLM 0.32's SpeculativeConfig with synthetic acceptance beside a
target served with dummy weights and cut by --hf-overrides, and built as Eagle3LlamaForCausalLM.
(The CPU sampler refuses synthetic acceptance at the first step: the map itself is GPU-only.)"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_specdecode.analysis.drafters.carrier import carrier_head_config

from ..support.embedded import MODEL_DIR, SERVER_PYTHON

pytestmark = pytest.mark.skipif(
    not (SERVER_PYTHON.exists() and (MODEL_DIR / "config.json").exists()),
    reason="the embedded vLLM is not set up (scripts/setup-embedded)",
)

BUILD = textwrap.dedent(
    """
    import json, socket, sys
    import torch
    from vllm.config import (LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig,
                             VllmConfig, set_current_vllm_config)
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
    target, head, tok = sys.argv[1], sys.argv[2], sys.argv[3]
    mc = ModelConfig(model=target, tokenizer=tok, dtype="bfloat16", max_model_len=512,
                     hf_overrides={"num_hidden_layers": 4})
    pc = ParallelConfig()
    sc = SpeculativeConfig(method="eagle3", model=head, num_speculative_tokens=3,
                           rejection_sample_method="synthetic", synthetic_acceptance_length=2.5,
                           target_model_config=mc, target_parallel_config=pc)
    vc = VllmConfig(model_config=mc, parallel_config=pc, speculative_config=sc,
                    load_config=LoadConfig(load_format="dummy"))
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        torch.set_default_dtype(torch.bfloat16)
        model = Eagle3LlamaForCausalLM(vllm_config=vc)
    shapes = {n: list(p.shape) for n, p in model.named_parameters()}
    print(json.dumps({
        "target_layers": mc.hf_config.num_hidden_layers,
        "draft_layers": sc.draft_model_config.hf_config.num_hidden_layers,
        "draft_load_config": repr(sc.draft_load_config),
        "rates": sc.synthetic_acceptance_rates,
        "fc": shapes["model.fc.weight"], "lm_head": shapes["lm_head.weight"],
    }))
    """
)


def test_a_head_of_the_shape_serves_from_its_config_alone(tmp_path: Path) -> None:
    smol = json.loads((MODEL_DIR / "config.json").read_text())
    target, head = tmp_path / "shape", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text(json.dumps(smol))  # the shape: no weights
    (head / "config.json").write_text(json.dumps(carrier_head_config(smol, depth=4)))
    cmd = [str(SERVER_PYTHON), "-c", BUILD, str(target), str(head), str(MODEL_DIR)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["target_layers"] == 4  # the cut is the target's only
    assert found["draft_layers"] == 1
    assert found["draft_load_config"] == "None"  # so the head loads as the target: dummy
    assert len(found["rates"]) == 3  # synthetic acceptance resolved per position
    assert found["fc"] == [576, 3 * 576] and found["lm_head"] == [32000, 576]


SPEC_ONLY = textwrap.dedent(
    """
    import json, sys
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    target, head, tok = sys.argv[1], sys.argv[2], sys.argv[3]
    mc = ModelConfig(model=target, tokenizer=tok, dtype="bfloat16", max_model_len=512,
                     hf_overrides={"num_hidden_layers": 4})
    sc = SpeculativeConfig(method="eagle3", model=head, num_speculative_tokens=3,
                           rejection_sample_method="synthetic", synthetic_acceptance_length=2.5,
                           target_model_config=mc, target_parallel_config=ParallelConfig())
    h = sc.draft_model_config.hf_config
    print(json.dumps({"architectures": sc.draft_model_config.architectures,
                      "kv_lora_rank": h.kv_lora_rank, "layers": h.num_hidden_layers,
                      "target_layers": mc.hf_config.num_hidden_layers}))
    """
)


def test_an_mla_shapes_head_is_taken_as_vllms_mla_head_not_as_mtp(tmp_path: Path) -> None:
    from pytest_specdecode.config.shape.named import named_shape

    deepseek = dict(named_shape("deepseek-v3").config)
    target, head = tmp_path / "shape", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (target / "config.json").write_text(json.dumps(deepseek))
    (head / "config.json").write_text(json.dumps(carrier_head_config(deepseek, depth=4)))
    cmd = [str(SERVER_PYTHON), "-c", SPEC_ONLY, str(target), str(head), str(MODEL_DIR)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["architectures"] == ["Eagle3DeepseekV3ForCausalLM"]
    assert found["kv_lora_rank"] == 512 and found["layers"] == 1 and found["target_layers"] == 4
