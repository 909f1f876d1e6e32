"""specdecode-drafter: an EAGLE-3 head and a cut draft model from a tiny made-up Llama target,
read back tensor by tensor; a bad request refused before anything is written. No torch."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.drafters.check import check_drafter
from pytest_specdecode.cli.drafter import main
from pytest_specdecode.record.safetensors_io import (
    SafetensorsFile,
    TensorOut,
    bf16_bytes,
    bf16_values,
    write_safetensors,
)
from pytest_specdecode.targets.facts.model_config import tensor_shapes

H, HEADS, KV, HD, INTER, LAYERS, VOCAB = 64, 4, 2, 16, 128, 4, 128

TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": H,
    "intermediate_size": INTER,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV,
    "head_dim": HD,
    "num_hidden_layers": LAYERS,
    "vocab_size": VOCAB,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "dtype": "bfloat16",
}


def _layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (H,),
        p + "post_attention_layernorm.weight": (H,),
        p + "self_attn.q_proj.weight": (HEADS * HD, H),
        p + "self_attn.k_proj.weight": (KV * HD, H),
        p + "self_attn.v_proj.weight": (KV * HD, H),
        p + "self_attn.o_proj.weight": (H, HEADS * HD),
        p + "mlp.gate_proj.weight": (INTER, H),
        p + "mlp.up_proj.weight": (INTER, H),
        p + "mlp.down_proj.weight": (H, INTER),
    }


@pytest.fixture
def target(tmp_path: Path) -> Path:
    """A 4-layer Llama with tied embeddings: config.json, model.safetensors, a tokenizer."""
    d = tmp_path / "target"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TARGET_CONFIG))
    (d / "tokenizer.json").write_text('{"model": {}}')
    shapes = {"model.embed_tokens.weight": (VOCAB, H), "model.norm.weight": (H,)}
    for i in range(LAYERS):
        shapes.update(_layer_shapes(i))
    rng = np.random.default_rng(7)
    tensors = [
        TensorOut(n, "BF16", s, lambda s=s: [bf16_bytes(rng.normal(0, 1, int(np.prod(s))))])
        for n, s in shapes.items()
    ]
    write_safetensors(d / "model.safetensors", tensors)
    return d


# What vLLM 0.32 loads for an EAGLE-3 Llama head, read in its
# vllm/model_executor/models/llama_eagle3.py: the checkpoint's `midlayer.` is layers.0
# (:291); q/k/v take 2 x hidden in the first layer (:82); the layer's hidden_norm (:98); fc of
# target_hidden_size x aux states (:221, :242); the final norm (:253); lm_head over
# draft_vocab_size (:329); d2t of draft_vocab_size longs (:341, :429); t2d is skipped (:426).
def expected_head(aux: int, draft: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    bf = "BF16"
    found = {
        "midlayer.input_layernorm.weight": (bf, (H,)),
        "midlayer.hidden_norm.weight": (bf, (H,)),
        "midlayer.post_attention_layernorm.weight": (bf, (H,)),
        "midlayer.self_attn.q_proj.weight": (bf, (HEADS * HD, 2 * H)),
        "midlayer.self_attn.k_proj.weight": (bf, (KV * HD, 2 * H)),
        "midlayer.self_attn.v_proj.weight": (bf, (KV * HD, 2 * H)),
        "midlayer.self_attn.o_proj.weight": (bf, (H, HEADS * HD)),
        "midlayer.mlp.gate_proj.weight": (bf, (INTER, H)),
        "midlayer.mlp.up_proj.weight": (bf, (INTER, H)),
        "midlayer.mlp.down_proj.weight": (bf, (H, INTER)),
        "fc.weight": (bf, (H, aux * H)),
        "norm.weight": (bf, (H,)),
        "lm_head.weight": (bf, (draft, H)),
    }
    if draft < VOCAB:
        found["d2t"] = ("I64", (draft,))
        found["t2d"] = ("BOOL", (VOCAB,))
    return found


def _read(d: Path) -> tuple[dict, SafetensorsFile]:
    return json.loads((d / "config.json").read_text()), SafetensorsFile.open(
        d / "model.safetensors"
    )


def test_eagle3_head_has_the_tensors_vllm_loads(target, tmp_path, capsys):
    out = tmp_path / "head"
    assert main(["eagle3", str(target), str(out)]) == 0
    line = capsys.readouterr().out
    config, weights = _read(out)
    assert {n: (e.dtype, e.shape) for n, e in weights.entries.items()} == expected_head(3, VOCAB)
    # vLLM's default guess for 4 layers (2, L // 2, L - 3), stated in the config
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 2, 1]
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["tie_word_embeddings"] is False
    for key in ("hidden_size", "num_key_value_heads", "head_dim", "rope_parameters"):
        assert config[key] == TARGET_CONFIG[key]
    check = check_drafter("eagle3", config, TARGET_CONFIG, tensors=weights.shapes())
    assert check.ok and not check.warnings, check
    assert "eagle3 drafter" in line and "1 layer" in line and "aux layers [2, 2, 1]" in line
    assert (out / "tokenizer.json").read_text() == (target / "tokenizer.json").read_text()
    norm = bf16_values(weights.read("midlayer.hidden_norm.weight"))
    fc = bf16_values(weights.read("fc.weight"))
    assert np.all(norm == 1.0)
    assert 0.015 < fc.std() < 0.025 and abs(fc.mean()) < 0.005


def test_eagle3_head_with_its_own_aux_ids_and_draft_vocabulary(target, tmp_path):
    out = tmp_path / "head"
    argv = ["eagle3", str(target), str(out), "--aux-layers", "1,4", "--draft-vocab", "32"]
    assert main([*argv, "--seed", "3"]) == 0
    config, weights = _read(out)
    assert {n: (e.dtype, e.shape) for n, e in weights.entries.items()} == expected_head(2, 32)
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 4]
    assert config["num_aux_hidden_states"] == 2 and config["draft_vocab_size"] == 32
    d2t = np.frombuffer(weights.read("d2t"), dtype="<i8")
    t2d = np.frombuffer(weights.read("t2d"), dtype=np.uint8).astype(bool)
    kept = np.arange(32) + d2t  # vLLM's compute_logits: target id = draft id + d2t
    assert np.all(np.diff(kept) > 0) and kept[-1] < VOCAB
    assert np.array_equal(np.flatnonzero(t2d), kept)
    assert check_drafter("eagle3", config, TARGET_CONFIG, tensors=weights.shapes()).ok
    # the same seed, the same head; another seed, another
    again = tmp_path / "again"
    assert main([*argv[:2], str(again), *argv[3:], "--seed", "3"]) == 0
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    other = tmp_path / "other"
    assert main([*argv[:2], str(other), *argv[3:], "--seed", "4"]) == 0
    assert (other / "model.safetensors").read_bytes() != (out / "model.safetensors").read_bytes()


def test_cut_keeps_the_first_layers_byte_for_byte(target, tmp_path, capsys):
    out = tmp_path / "cut"
    assert main(["cut", str(target), str(out), "--layers", "2"]) == 0
    assert "draft_model drafter" in capsys.readouterr().out
    config, weights = _read(out)
    source = SafetensorsFile.open(target / "model.safetensors")
    kept = {n for n in source.entries if not n.startswith(("model.layers.2.", "model.layers.3."))}
    assert set(weights.entries) == kept
    assert "lm_head.weight" not in weights.entries  # tied, as the target has it
    for name in kept:
        assert weights.entries[name].dtype == source.entries[name].dtype
        assert weights.read(name) == source.read(name), name
    assert config["num_hidden_layers"] == 2 and config["tie_word_embeddings"] is True
    assert {k: v for k, v in config.items() if k != "num_hidden_layers"} == {
        k: v for k, v in TARGET_CONFIG.items() if k != "num_hidden_layers"
    }
    assert check_drafter("draft_model", config, TARGET_CONFIG).ok


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["eagle3", "--aux-layers", "2,5"], "[5] outside 0..4"),
        (["eagle3", "--draft-vocab", "129"], "draft_vocab_size 129"),
        (["cut", "--layers", "4"], "a cut keeps 1..3"),
        (["cut", "--layers", "0"], "a cut keeps 1..3"),
    ],
)
def test_a_bad_request_is_refused_before_anything_is_written(target, tmp_path, capsys, argv, said):
    out = tmp_path / "drafter"
    assert main([argv[0], str(target), str(out), *argv[1:]]) == 2
    assert said in capsys.readouterr().err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # no half-written folder beside


def test_a_folder_with_files_is_not_overwritten(target, tmp_path, capsys):
    out = tmp_path / "head"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    assert main(["eagle3", str(target), str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["mine.txt"]


def test_bf16_rounds_to_nearest_even_and_the_header_is_what_the_host_check_reads(tmp_path):
    one = np.float32(1.0).view(np.uint32)
    halfway_even = np.array([one + 0x8000], dtype=np.uint32).view(np.float32)  # tie: stays 1.0
    halfway_odd = np.array([one + 0x18000], dtype=np.uint32).view(np.float32)  # tie: rounds up
    above = np.array([one + 0x8001], dtype=np.uint32).view(np.float32)
    got = np.frombuffer(bf16_bytes(np.concatenate([halfway_even, halfway_odd, above])), "<u2")
    assert list(got) == [0x3F80, 0x3F82, 0x3F81]
    path = tmp_path / "w.safetensors"
    size = write_safetensors(path, [TensorOut("x", "F32", (2, 3), lambda: [bytes(24)])])
    assert path.stat().st_size == size
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    assert tensor_shapes(raw[8 : 8 + n].decode()) == {"x": (2, 3)}
    with pytest.raises(ValueError, match="5 bytes given"):
        write_safetensors(path, [TensorOut("x", "F32", (2,), lambda: [bytes(5)])])
