"""The shape's memory and the depth that fits (config/shape/memory.py): the figures against the
published parameter counts, the choice of a depth, and the refusal of what cannot fit."""

from __future__ import annotations

import pytest

from pytest_specdecode.config.shape.memory import (
    GIB,
    cpu_room,
    fit_depths,
    gpu_room,
    shape_bytes,
)
from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.errors import ShapeRefused

H100_MIB, H200_MIB = 81559, 143771  # nvidia-smi's memory.total (tests/data/nvidia-smi-h200)


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-3.1-8b", 8.03e9),  # Meta: 8.03B
        ("llama-3.2-1b", 1.24e9),  # Meta: 1.23B
        ("deepseek-v3", 671e9),  # DeepSeek: 671B in the main model (the MTP module apart)
        ("kimi-k2", 1.03e12),  # Moonshot: 1.04T; Hugging Face lists 1.03T
    ],
)
def test_a_named_shape_counts_its_published_parameters(name: str, published: float) -> None:
    shape = named_shape(name)
    one_byte = shape_bytes(shape, dtype_bytes=1, kv_dtype_bytes=1)  # bytes are parameters
    assert one_byte.weights(shape, shape.layers) == pytest.approx(published, rel=0.012)


def test_fp8_weights_take_one_byte_in_the_layers_and_two_in_the_embeddings() -> None:
    v3 = named_shape("deepseek-v3")
    bf16 = shape_bytes(v3, dtype_bytes=2, kv_dtype_bytes=2)
    one = shape_bytes(v3, dtype_bytes=1, kv_dtype_bytes=1)
    assert bf16.moe_mlp == one.moe_mlp and bf16.attention == one.attention  # fp8 config
    assert bf16.embeddings == 2 * one.embeddings == 2 * 2 * 129280 * 7168
    assert bf16.kv_per_token == 2 * (512 + 64)  # MLA: the compressed latent and the rope key


def test_auto_serves_the_largest_depth_that_fits_and_all_of_a_small_model() -> None:
    llama = named_shape("llama-3.1-8b")
    h100 = gpu_room([H100_MIB], share=0.9, host="gpu-1")
    assert fit_depths(llama, None, h100, max_model_len=8192).depths == (32,)
    small = gpu_room([16384], share=0.9, host="gpu-1")  # a 16 GiB card
    fit = fit_depths(llama, None, small, max_model_len=8192)
    (depth,) = fit.depths
    weights, kv = fit.need(llama, depth)
    assert weights + kv <= small.bytes < sum(fit.need(llama, depth + 1))
    assert 10 < depth < 32


def test_a_moe_shape_keeps_its_dense_layers_and_one_moe_layer_at_least() -> None:
    v3 = named_shape("deepseek-v3")
    assert v3.min_depth == 4 and named_shape("kimi-k2").min_depth == 2
    h200 = gpu_room([H200_MIB], share=0.9, host="gpu-1")
    fit = fit_depths(v3, None, h200, max_model_len=4096)
    assert fit.depths[0] >= 4
    with pytest.raises(ShapeRefused) as refused:
        fit_depths(v3, [2], h200, max_model_len=4096)
    assert "from 4 (3 dense layers, first_k_dense_replace" in str(refused.value)


def test_what_cannot_fit_even_at_its_minimum_depth_is_refused_with_the_figures() -> None:
    kimi = named_shape("kimi-k2")
    l4 = gpu_room([23034], share=0.9, host="gpu-7")  # an L4
    with pytest.raises(ShapeRefused) as refused:
        fit_depths(kimi, None, l4, max_model_len=4096)
    text = str(refused.value)
    assert "cannot fit even at its minimum depth: 2 of 61 layers" in text
    assert "GiB of weights" in text and "23034 MiB" in text and "on gpu-7" in text


def test_depths_asked_are_each_checked_and_one_that_does_not_fit_is_named() -> None:
    llama = named_shape("llama-3.1-8b")
    small = gpu_room([16384], share=0.9, host="gpu-1")
    assert fit_depths(llama, [4, 2], small, max_model_len=8192).depths == (2, 4)
    with pytest.raises(ShapeRefused) as refused:
        fit_depths(llama, [2, 32], small, max_model_len=8192)
    assert "does not fit at 32 of 32 layers" in str(refused.value)


def test_on_a_cpu_the_kv_space_is_apart_from_the_weights() -> None:
    llama = named_shape("llama-3.1-8b")
    room = cpu_room(8 * GIB, kv_space_gib=1, host="localhost")
    assert room.bytes == 5 * GIB and room.kv_bytes == GIB
    assert "VLLM_CPU_KVCACHE_SPACE=1 GiB" in room.where
    # 2 layers' KV of a 131072-token sequence (256 MiB) fits in 1 GiB; 8 layers' do not
    assert fit_depths(llama, [2], room, max_model_len=131072).depths == (2,)
    with pytest.raises(ShapeRefused):
        fit_depths(llama, [8], room, max_model_len=131072)


def test_side_by_side_each_server_gets_its_part_of_the_room() -> None:
    one_gpu = gpu_room([H100_MIB], share=0.9, host="gpu-1")
    halves = one_gpu.shared(2, share=0.45, beside="each of 2 servers side by side")
    assert halves.share == 0.45 and halves.bytes < one_gpu.bytes / 2
    assert halves.where.endswith("; each of 2 servers side by side")
    two_gpus = gpu_room([H100_MIB], share=0.9, host="gpu-1", visible=2)
    assert two_gpus.shared(2, share=0.45, beside="") == two_gpus  # a GPU of its own each
    cpu = cpu_room(16 * GIB, kv_space_gib=1, host="localhost")
    assert cpu.shared(2, share=0.45, beside="").bytes == 8 * GIB - 3 * GIB
    v3, h200 = named_shape("deepseek-v3"), gpu_room([H200_MIB], share=0.9, host="gpu-1")
    alone = fit_depths(v3, None, h200, max_model_len=4096).depths[0]
    beside = fit_depths(v3, None, h200.shared(2, share=0.45, beside=""), max_model_len=4096)
    assert beside.depths[0] < alone  # a MoE layer's 10.5 GiB each: fewer fit in half


def test_a_tensor_parallel_room_counts_every_gpu_each_holding_its_part() -> None:
    """The reference experiment's geometry (issue 51): DeepSeek-V3 in fp8 at full depth over 8
    H200s at tensor parallel 8: the weights split over the 8, the latent KV cache whole on each."""
    v3 = named_shape("deepseek-v3")
    eight = gpu_room([H200_MIB] * 8, share=0.9, host="gpu-8", tensor_parallel=8)
    one = gpu_room([H200_MIB], share=0.9, host="gpu-8")
    assert eight.bytes == 8 * one.bytes and eight.per_gpu == one.bytes
    full = fit_depths(v3, None, eight, max_model_len=4096)
    assert full.depths == (61,)
    assert fit_depths(v3, None, one, max_model_len=4096).depths[0] < 20
    weights, kv = full.need(v3, 61)
    assert eight.kv_split(v3) == 1 and weights / 8 + kv <= eight.per_gpu
    text = full.describe(v3)
    assert "on each of its 8 GPUs" in text and "(MLA's latent cache, whole on every rank)" in text
    assert "tensor parallel 8, on gpu-8" in eight.where
    assert "on each of its" not in fit_depths(v3, [4], one, max_model_len=4096).describe(v3)
    # GQA: a sequence's KV cache splits over the ranks up to its KV heads (8 in Llama 3.1 8B)
    llama = named_shape("llama-3.1-8b")
    assert gpu_room([H100_MIB] * 2, share=0.9, host="g", tensor_parallel=2).kv_split(llama) == 2
    assert gpu_room([H100_MIB] * 16, share=0.9, host="g", tensor_parallel=16).kv_split(llama) == 8
    assert gpu_room([H100_MIB] * 4, share=0.9, host="g", tensor_parallel=2).kv_split(llama) == 4
    # GPUs of two sizes: the weights split evenly, so the smaller bounds each part
    mixed = gpu_room([H100_MIB, H200_MIB], share=0.9, host="g", tensor_parallel=2)
    assert mixed.bytes == 2 * gpu_room([H100_MIB], share=0.9, host="g").bytes
