"""specdecode-drafter on the embedded SmolLM2, loaded by the embedded vLLM's own libraries: the cut
model generates with transformers; the EAGLE-3 head's tensors load into vLLM 0.32's
Eagle3LlamaForCausalLM (built on the CPU, no server)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from pytest_specdecode.cli.drafter import main

from ..support.embedded import MODEL_DIR, SERVER_PYTHON

pytestmark = pytest.mark.skipif(
    not (SERVER_PYTHON.exists() and (MODEL_DIR / "model.safetensors").exists()),
    reason="the embedded vLLM is not set up (scripts/setup-embedded)",
)

GENERATE = textwrap.dedent(
    """
    import json, sys
    from transformers import AutoModelForCausalLM, AutoTokenizer
    path = sys.argv[1]
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    print(json.dumps({"layers": len(model.model.layers), "new": new, "text": tok.decode(new)}))
    """
)

# vLLM's own module and loader: names it does not know, or shapes that differ, raise.
LOAD_HEAD = textwrap.dedent(
    """
    import json, socket, sys
    import torch
    from safetensors import safe_open
    from vllm.config import (ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig,
                             set_current_vllm_config)
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.model_executor.models.llama_eagle3 import Eagle3LlamaForCausalLM
    target, head = sys.argv[1], sys.argv[2]
    mc = ModelConfig(model=target, dtype="bfloat16", max_model_len=512)
    pc = ParallelConfig()
    sc = SpeculativeConfig(method="eagle3", model=head, num_speculative_tokens=3,
                           target_model_config=mc, target_parallel_config=pc)
    vc = VllmConfig(model_config=mc, parallel_config=pc, speculative_config=sc)
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1, 1)
        torch.set_default_dtype(torch.bfloat16)
        model = Eagle3LlamaForCausalLM(vllm_config=vc)
        with safe_open(f"{head}/model.safetensors", "pt") as f:
            weights = {k: f.get_tensor(k) for k in f.keys()}
        model.load_weights(iter(weights.items()))
        d2t = model.draft_id_to_target_id
        print(json.dumps({
            "params": {n: list(p.shape) for n, p in model.named_parameters()},
            "fc_equal": bool(torch.equal(model.model.fc.weight, weights["fc.weight"])),
            "d2t_equal": bool(torch.equal(d2t, weights["d2t"])) if d2t is not None else None,
            "aux": sc.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids,
        }))
    """
)


def _last_json(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_cut_smollm2_generates_with_transformers(tmp_path: Path):
    out = tmp_path / "smol-6"
    assert main(["cut", str(MODEL_DIR), str(out), "--layers", "6"]) == 0
    found = _last_json([str(SERVER_PYTHON), "-c", GENERATE, str(out)])
    assert found["layers"] == 6
    assert len(found["new"]) == 5


def test_an_eagle3_head_loads_into_vllms_module(tmp_path: Path):
    out = tmp_path / "smol-eagle3"
    argv = ["eagle3", str(MODEL_DIR), str(out), "--draft-vocab", "32000"]
    assert main(argv) == 0
    found = _last_json([str(SERVER_PYTHON), "-c", LOAD_HEAD, str(MODEL_DIR), str(out)])
    params = found["params"]
    h = json.loads((MODEL_DIR / "config.json").read_text())["hidden_size"]
    assert params["model.fc.weight"] == [h, 3 * h]
    assert params["model.layers.0.self_attn.qkv_proj.weight"][1] == 2 * h
    assert params["lm_head.weight"] == [32000, h]
    assert params["draft_id_to_target_id"] == [32000]
    assert found["fc_equal"] and found["d2t_equal"]
    assert found["aux"] == [2, 15, 27]
