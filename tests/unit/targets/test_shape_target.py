"""The shape target's reads and its servers (targets/facts/shape_site.py, targets/shaped.py):
each source read where it is, the room from real nvidia-smi output and /proc/meminfo, and the local
backend serving the shape (a systemd unit's: systemd/test_systemd_shape.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_specdecode.config.shape.memory import GPU_ALLOWANCE
from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.config.shape.served import ServedShape
from pytest_specdecode.config.shape.table import ShapeConfig
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.config.target import TargetConfig
from pytest_specdecode.errors import ConfigError, HostError
from pytest_specdecode.targets import open_target
from pytest_specdecode.targets.facts.model_config import ModelSite
from pytest_specdecode.targets.facts.shape_site import read_room, read_shape
from pytest_specdecode.targets.hosts.base import CommandResult, LocalHost
from pytest_specdecode.targets.shaped import ShapedTarget, shaped_target

DATA = Path(__file__).parents[2] / "data" / "nvidia-smi-h200"
SMOL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
}  # fmt: skip


def site(tmp_path: Path, model: str | None = "models/smol") -> ModelSite:
    folder = tmp_path / "models" / "smol"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SMOL))
    where = "the local server command on localhost"
    return ModelSite(LocalHost(), where, model, workdir=str(tmp_path))


# -- the sources ---------------------------------------------------------------------------


def test_the_unit_source_is_the_config_json_where_the_server_loads_its_model(tmp_path) -> None:
    shape, vocab = read_shape(ShapeConfig("unit"), site(tmp_path))
    assert shape.config == SMOL and shape.source == "unit" and vocab == 49152
    assert shape.origin.startswith("the served model's config.json, ") and "on localhost" in (
        shape.origin
    )


def test_a_server_command_without_a_model_has_no_served_shape(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"names no model whose config\.json could be read"):
        read_shape(ShapeConfig("unit"), site(tmp_path, model=None))


def test_a_file_source_is_read_here_and_the_tokenizers_vocabulary_from_the_model(tmp_path):
    path = tmp_path / "mixtral.json"
    mixtral = {**SMOL, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8,
               "num_experts_per_tok": 2, "vocab_size": 32000}  # fmt: skip
    path.write_text(json.dumps(mixtral))
    shape, vocab = read_shape(ShapeConfig(f"file:{path}"), site(tmp_path))
    assert shape.config == mixtral and shape.is_moe and shape.routed_experts == 8
    assert vocab == 49152 and shape.origin == f"{path} on this machine"


def test_a_named_source_reads_nothing_but_the_tokenizers_vocabulary(tmp_path) -> None:
    shape, vocab = read_shape(ShapeConfig("deepseek-v3"), site(tmp_path))
    assert shape == named_shape("deepseek-v3") and vocab == 49152
    assert read_shape(ShapeConfig("deepseek-v3"), None) == (named_shape("deepseek-v3"), None)


# -- the room ------------------------------------------------------------------------------


class Answers:
    """A host that answers nvidia-smi with captured output (or not at all) and /proc/meminfo."""

    name = "root@gpu-1:22"

    def __init__(self, smi: str | None, meminfo: str = "MemAvailable:   23000000 kB") -> None:
        self.smi, self.meminfo = smi, meminfo

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True) -> CommandResult:
        if argv[0] == "nvidia-smi":
            if self.smi is None:
                raise HostError("nvidia-smi: not found")
            return CommandResult(self.name, tuple(argv), 0, self.smi, "")
        return CommandResult(self.name, tuple(argv), 0, self.meminfo, "")


def h200s(count: int) -> str:
    header, row = (DATA / "query-gpu.csv").read_text().splitlines()[:2]
    rows = [row.replace("0, NVIDIA", f"{i}, NVIDIA", 1) for i in range(count)]
    return "\n".join([header, *rows]) + "\n"


def test_the_room_of_a_gpu_server_is_its_gpus_at_its_memory_share() -> None:
    argv = ["vllm", "serve", "m", "--gpu-memory-utilization", "0.8"]
    room = read_room(Answers(h200s(1)), argv, {})
    assert room is not None and room.device == "gpu" and room.kv_bytes is None
    assert room.bytes == int(143771 * 2**20 * 0.8) - GPU_ALLOWANCE
    assert "1 x NVIDIA H200 (143771 MiB) x --gpu-memory-utilization 0.8" in room.where


def test_the_room_counts_the_tensor_parallel_gpus_it_is_allowed() -> None:
    host = Answers(h200s(4))
    two = read_room(host, ["vllm", "serve", "m", "-tp", "2"], {"CUDA_VISIBLE_DEVICES": "2,3"})
    one = read_room(host, ["vllm", "serve", "m"], {})
    assert two is not None and one is not None and two.bytes == 2 * one.bytes
    assert "2 x NVIDIA H200" in two.where and "--gpu-memory-utilization 0.9" in one.where


def test_the_room_refuses_a_tensor_parallel_size_larger_than_the_gpus_it_sees() -> None:
    with pytest.raises(ConfigError) as refused:
        read_room(Answers(h200s(4)), ["vllm", "serve", "m", "-tp", "4"],
                  {"CUDA_VISIBLE_DEVICES": "2,3"})  # fmt: skip
    text = str(refused.value)
    assert text.startswith(
        "the shape's room on root@gpu-1:22: the server command asks for --tensor-parallel-size "
        "4, 4 GPUs, and sees 2 GPUs (CUDA_VISIBLE_DEVICES=2,3 of the 4 listed)"
    )
    assert text.endswith("; nothing was touched")
    eight = read_room(Answers(h200s(8)), ["vllm", "serve", "m", "-tp", "8"], {})
    assert eight is not None and eight.gpus == eight.tensor_parallel == 8
    assert eight.bytes == 8 * eight.per_gpu and "tensor parallel 8" in eight.where


def test_the_room_of_a_cpu_server_is_the_memory_available_and_its_kv_space() -> None:
    room = read_room(Answers(None), ["vllm", "serve", "m"], {"VLLM_CPU_KVCACHE_SPACE": "2"})
    assert room is not None and room.device == "cpu" and room.kv_bytes == 2 * 2**30
    assert room.bytes == 23000000 * 1024 - 4 * 2**30
    assert read_room(Answers(None, meminfo=""), ["vllm", "serve", "m"], {}) is None


# -- the servers ---------------------------------------------------------------------------


def local_config(tmp_path: Path) -> TargetConfig:
    return TargetConfig(
        backend="local",
        api_base="http://127.0.0.1:8011",
        model="smol",
        command=("vllm", "serve", "models/smol", "--port", "8011"),
        workdir=tmp_path,
        env={"VLLM_CPU_KVCACHE_SPACE": "1"},
        startup_timeout_s=60,
        restore_timeout_s=60,
        api_key_env=None,
    )


def a_shape(folder: Path, name: str = "deepseek-v3") -> ServedShape:
    env = {"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": "uniform_random"}
    return ServedShape(
        shape=named_shape(name),
        layers=4,
        overrides={"num_hidden_layers": 4},
        env=env if named_shape(name).is_moe else {},
        tokenizer="models/smol",
        served_name="smol",
        folder=str(folder),
        engine="vLLM 0.32.0 on localhost",
    )


def test_the_local_backend_serves_the_shape_and_writes_its_config_before_the_first_start(
    tmp_path: Path,
) -> None:
    served = a_shape(tmp_path / "run" / "shape")
    target = shaped_target(
        local_config(tmp_path), served, open_target=open_target, log_dir=tmp_path
    )
    assert isinstance(target, ShapedTarget)
    command = target.inner.command  # the backend's own target, on the shape's command
    assert command[:3] == ["vllm", "serve", str(tmp_path / "run" / "shape")]
    assert target.inner.env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random"
    assert target.original().argv == command and target.host_name == "localhost"
    steps = target.plan([SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})])
    assert steps[0].startswith(f"write the shape's config.json into {tmp_path / 'run' / 'shape'}")
    assert "--load-format dummy" in steps[1] and "--speculative-config" in steps[3]
    written = tmp_path / "run" / "shape" / "config.json"
    assert not written.exists()  # nothing is written before a server starts
    target.before_swap()
    assert json.loads(written.read_text()) == dict(named_shape("deepseek-v3").config)
