"""A target of two local replicas, one per GPU, through pytest's dry run (issue 51): the real
local backend on a host of two GPUs (a stand-in nvidia-smi on PATH, answering with the real H200
capture renumbered), each replica read with its own CUDA_VISIBLE_DEVICES, the plan, and the
refusals; nothing started, nothing written."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pytest_specdecode.targets.facts.gpu import parse_gpus

from ...support.inprocess import run_in_process

DATA = Path(__file__).resolve().parents[2] / "data" / "nvidia-smi-h200"

CONFIG = """
reports_dir = "{reports}"
[target]
model = "smol"
api_base = "http://127.0.0.1:18000"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
  "--port", "18000"{tp}]

[[target.replicas]]
name = "a"
{a}
port = 18011

[[target.replicas]]
name = "b"
devices = [1]
port = 18012

[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompt = "the coding prompt"
"""


def standin_nvidia_smi(folder: Path, count: int = 2) -> None:
    """STAND-IN for nvidia-smi (not NVIDIA's tool; no GPU behind it): `count` H200s with the
    values captured on a real one (tests/data/nvidia-smi-h200), each its own index and UUID;
    `--query-gpu` for any of those fields, `--query-compute-apps`: none, as an idle host."""
    (gpu,) = parse_gpus((DATA / "query-gpu.csv").read_text().splitlines()[1] + "\n",
                        ("index", "name", "memory.total", "memory.used", "driver_version",
                         "uuid"))  # fmt: skip
    assert gpu.uuid is not None
    cases = "\n".join(
        f'    {field}) v="{value}" ;;'
        for field, value in [
            ("index", "$i"),
            ("uuid | gpu_uuid", f"{gpu.uuid[:-2]}0$i"),
            ("name | gpu_name", gpu.name),
            ("memory.total", f"{gpu.memory_total_mib} MiB"),
            ("memory.used", f"{gpu.memory_used_mib} MiB"),
            ("driver_version", gpu.driver),
        ]
    )
    script = f"""#!/bin/sh
fields="" header=yes query=""
for a in "$@"; do
  case "$a" in
    --query-gpu=*) query=gpu fields=${{a#*=}} ;;
    --query-compute-apps=*) query=apps ;;
    --format=*noheader*) header=no ;;
  esac
done
[ "$query" = gpu ] || exit 0
[ "$header" = yes ] && echo "$fields" | sed 's/,/, /g'
for i in $(seq 0 {count - 1}); do
  out="" sep=""
  for f in $(echo "$fields" | tr ',' ' '); do
    case "$f" in
{cases}
    *) v="[N/A]" ;;
    esac
    out="$out$sep$v" sep=", "
  done
  echo "$out"
done
"""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "nvidia-smi"
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def two_gpus(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = pytester.path / "bin"
    standin_nvidia_smi(folder)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    pytester.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")


def dry_run(pytester: pytest.Pytester, a: str = "devices = [0]", tp: str = "") -> pytest.RunResult:
    path = pytester.path / "experiment.toml"
    path.write_text(CONFIG.format(reports=pytester.path / "reports", a=a, tp=tp))
    return run_in_process(
        pytester, "--spec-file", str(path), "--spec-config", "ngram", "--spec-dry-run"
    )


@pytest.mark.usefixtures("two_gpus")
def test_two_local_replicas_one_per_gpu_are_planned_each_on_its_gpu(
    pytester: pytest.Pytester,
) -> None:
    result = dry_run(pytester)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "a target of 2 replicas; nothing was touched" in out
    assert (
        "a: a local server (python -m vllm.entrypoints.openai.api_server …) on GPU 0 "
        "(CUDA_VISIBLE_DEVICES=0), API http://127.0.0.1:18011" in out
    )
    assert "on GPU 1 (CUDA_VISIBLE_DEVICES=1), API http://127.0.0.1:18012" in out
    # read with each replica's own CUDA_VISIBLE_DEVICES: one H200 each, its own
    assert "a: model smol (/m), vLLM unknown, 1 x NVIDIA H200 (GPU 0), driver 580.159.04" in out
    assert "b: model smol (/m), vLLM unknown, 1 x NVIDIA H200 (GPU 1), driver 580.159.04" in out
    assert "refused" not in out
    assert "period 1: a the baseline (its original, not restarted), b candidate ngram" in out
    assert not (pytester.path / "reports").exists()  # nothing written


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(
    ("a", "tp", "said"),
    [
        (  # a GPU the host does not have
            "devices = [2]", "",
            "replica a: CUDA_VISIBLE_DEVICES=2 names '2', which nvidia-smi on localhost does not "
            "list (it lists 0 (GPU-695d5997-a103-0d89-580b-71c5e61fbb00), 1 (GPU-695d5997-a103-"
            "0d89-580b-71c5e61fbb01)); nothing was touched",
        ),
        (  # tensor parallel 2 on one GPU each
            "devices = [0]", ', "-tp", "2"',
            "replica a: the server command asks for --tensor-parallel-size 2, 2 GPUs, and sees 1 "
            "GPU (CUDA_VISIBLE_DEVICES=0 of the 2 listed) on localhost",
        ),
        (  # no devices: replica a sees both GPUs, b's too
            "", "",
            "refused: replica b and replica a both see GPU 1 on localhost: each replica needs "
            "GPUs of its own",
        ),
    ],
)  # fmt: skip
def test_replicas_that_cannot_serve_on_their_gpus_are_refused_before_anything_is_touched(
    pytester: pytest.Pytester, a: str, tp: str, said: str
) -> None:
    result = dry_run(pytester, a, tp)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert said in out
    assert not (pytester.path / "reports").exists()
