"""Replicas of the local backend, one per GPU or GPU group (issue 51 item 1): `devices` and `port`
in each `[[target.replicas]]` entry, validated (each replica's own GPUs and port); each
replica's facts read with its own CUDA_VISIBLE_DEVICES on a host of two H200s (the real capture,
tests/data/nvidia-smi-h200, renumbered), the alike check naming each replica's GPUs, and the
refusals before anything is touched. The dry run through the plugin:
plugin/test_local_replicas_dry_run.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from pytest_specdecode.analysis.replicas.alike import ReplicaFacts, alike
from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.run.replicas import replica_facts
from pytest_specdecode.targets.local import LocalProcessTarget

from ..targets.test_tensor_parallel import Host

HEAD = f"""
[target]
model = "smol"
api_base = "http://127.0.0.1:18000"
command = ["{sys.executable}", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
  "--port", "18000"]
{{extra}}
[presets]
ngram = {{{{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}}}
[prompt_types.coding]
prompt = "coding"
"""

ONE_PER_GPU = """
[[target.replicas]]
name = "a"
devices = [0]
port = 18011

[[target.replicas]]
name = "b"
devices = "1"
port = 18012
"""


def settings_of(tmp_path: Path, replicas: str, extra: str = ""):
    path = tmp_path / "specdecode.toml"
    path.write_text(HEAD.format(extra=extra) + replicas)
    return load_settings(path)


# -- the config ---------------------------------------------------------------------------------


def test_each_local_replica_gets_its_own_gpus_port_and_api_base(tmp_path: Path) -> None:
    a, b = settings_of(tmp_path, ONE_PER_GPU).replicas
    assert (a.devices, b.devices) == ((0,), (1,)) and (a.port, b.port) == (18011, 18012)
    assert (
        a.target.env["CUDA_VISIBLE_DEVICES"] == "0" and b.target.env["CUDA_VISIBLE_DEVICES"] == "1"
    )
    assert a.target.api_base == "http://127.0.0.1:18011"
    assert b.target.api_base == "http://127.0.0.1:18012"
    assert a.target.command[-2:] == ("--port", "18011") and a.target.command.count("--port") == 1
    assert b.target.command[:-2] == a.target.command[:-2]  # one command, its own port
    assert "a: a local server (" in a.describe()
    assert a.describe().endswith("on GPU 0 (CUDA_VISIBLE_DEVICES=0), API http://127.0.0.1:18011")
    group = settings_of(tmp_path, ONE_PER_GPU.replace("[0]", "[0, 1]").replace('"1"', '"2,3"'))
    assert [r.target.env["CUDA_VISIBLE_DEVICES"] for r in group.replicas] == ["0,1", "2,3"]
    assert "on GPUs 0,1 (CUDA_VISIBLE_DEVICES=0,1)" in group.replicas[0].describe()


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        (ONE_PER_GPU.replace('"1"', "[0]"), "entry 2 ('b') and entry 1 ('a') share the GPU '0'"),
        (
            ONE_PER_GPU.replace("18012", "18011"),
            "entry 2 ('b') and entry 1 ('a') share the api_base 'http://127.0.0.1:18011'",
        ),
        (
            ONE_PER_GPU.replace(
                "port = 18012", 'port = 18011\napi_base = "http://localhost:18011"'
            ),
            "entry 2 ('b') and entry 1 ('a') share the port '18011 on this machine'",
        ),
        (ONE_PER_GPU.replace("[0]", "[-1]"), "entry 1 ('a'): devices must be GPU indices"),
        (ONE_PER_GPU.replace("[0]", '["x"]'), "entry 1 ('a'): devices must be GPU indices"),
        (ONE_PER_GPU.replace("[0]", "[0, 0]"), "entry 1 ('a'): devices must name each GPU once"),
        (ONE_PER_GPU.replace("18011", "70000"), "entry 1 ('a'): port must be a TCP port"),
        (
            ONE_PER_GPU.replace(
                "port = 18011", 'port = 18011\nenv = { CUDA_VISIBLE_DEVICES = "3" }'
            ),
            "entry 1 ('a'): devices = [0] and env's CUDA_VISIBLE_DEVICES='3' disagree",
        ),
        (
            ONE_PER_GPU.replace("port = 18011", 'port = 18011\napi_base = "http://127.0.0.1:9"'),
            "entry 1 ('a'): port = 18011 and api_base 'http://127.0.0.1:9' disagree",
        ),
        (
            ONE_PER_GPU.replace(
                'name = "a"', 'name = "a"\nhost = "ssh://r@h1:22"\nunit = "vllm.service"'
            ),
            "entry 1 ('a'): devices and port are a local replica's",
        ),
    ],
)
def test_gpus_and_ports_are_each_replicas_own(tmp_path: Path, replicas: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        settings_of(tmp_path, replicas)


# -- each replica's facts, read with its own CUDA_VISIBLE_DEVICES ------------------------------


def opened(tmp_path: Path, replicas: str, gpus: int = 2, command: str | None = None):
    """Each replica's local target, as the plugin opens it, on a host of `gpus` H200s; `command`:
    [target]'s own, in place of HEAD's."""
    head = HEAD if command is None else re.sub(r"command = \[[^\]]*\]", command, HEAD, count=1)
    path = tmp_path / "specdecode.toml"
    path.write_text(head.format(extra="") + replicas)
    out = []
    for replica in load_settings(path).replicas:
        t = replica.target
        target = LocalProcessTarget(
            command=t.command,
            api_base=t.api_base,
            model=t.model,
            workdir=t.workdir,
            env=t.env,
            log_dir=tmp_path / "logs",
        )
        target.host = Host(gpus)  # type: ignore[assignment]
        out.append((replica, target))
    return out


def facts_of(tmp_path: Path, replicas: str) -> list[ReplicaFacts]:
    return [replica_facts(r, t, lambda line: None) for r, t in opened(tmp_path, replicas)]


def test_each_replica_reads_the_gpus_it_sees_and_the_alike_check_names_them(tmp_path) -> None:
    a, b = facts_of(tmp_path, ONE_PER_GPU)
    assert (a.devices, b.devices) == ((0,), (1,)) and a.host == b.host == "localhost"
    assert a.gpus == b.gpus == ("NVIDIA H200",) and a.driver == "580.159.04"
    assert a.describe() == (
        "a: model smol (/m), vLLM unknown, 1 x NVIDIA H200 (GPU 0), driver 580.159.04"
    )
    assert "1 x NVIDIA H200 (GPU 1)" in b.describe()
    found = alike([a, b])
    assert found.refusals == found.differences == ()


def test_two_replicas_that_see_one_gpu_are_refused_naming_it(tmp_path) -> None:
    """One replica without devices sees both GPUs of the host, the other's too."""
    found = alike(facts_of(tmp_path, ONE_PER_GPU.replace("devices = [0]\n", "")))
    assert found.refusals == (
        "replica b and replica a both see GPU 1 on localhost: each replica needs GPUs of its own "
        "(devices in its [[target.replicas]] entry)",
    )


@pytest.mark.parametrize(
    ("replicas", "gpus", "command", "message"),
    [
        (
            ONE_PER_GPU.replace('"1"', '"2"'), 2, None,
            "CUDA_VISIBLE_DEVICES=2 names '2', which nvidia-smi on localhost does not list (it "
            "lists 0 (GPU-695d5997-a103-0d89-580b-71c5e61fbb00), 1 (GPU-695d5997-a103-0d89-580b-"
            "71c5e61fbb01)); nothing was touched",
        ),
        (
            ONE_PER_GPU, 0, None,
            "devices = [0], and nvidia-smi lists no GPU on localhost; nothing was touched",
        ),
        (
            ONE_PER_GPU, 2, 'command = ["vllm", "serve", "/m", "-tp", "2"]',
            "the server command asks for --tensor-parallel-size 2, 2 GPUs, and sees 1 GPU "
            "(CUDA_VISIBLE_DEVICES=0 of the 2 listed) on localhost",
        ),
    ],
)  # fmt: skip
def test_a_replica_that_cannot_serve_on_its_gpus_is_refused_before_anything_is_touched(
    tmp_path, replicas: str, gpus: int, command: str | None, message: str
) -> None:
    targets = opened(tmp_path, replicas, gpus, command)
    with pytest.raises(ConfigError) as refused:
        for replica, local in targets:
            replica_facts(replica, local, lambda line: None)
    assert message in str(refused.value)
    assert all(not local.original().is_active() for _, local in targets)  # nothing started
