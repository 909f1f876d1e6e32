"""Side by side: this plugin's load generator and vLLM's own benchmark client, one server.

Both send the same chat prompts, one at a time, greedy, with the same max tokens. Runs
alternate (ours, vLLM's, ours, vLLM's, ...) so drift hits both alike. Prints mean TPOT and
output throughput from each, and their difference.

  .venv/bin/python scripts/compare_with_vllm_bench.py --api-base http://127.0.0.1:8011 \
      --model smollm2-135m-instruct --tokenizer .embedded/models/SmolLM2-135M-Instruct \
      --server-python .embedded/server-venv/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from pytest_specdecode.loadgen import RequestSpec, run_requests

VLLM_BENCH = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("RESULT_JSON " + json.dumps({k: result[k] for k in
      ("mean_tpot_ms", "output_throughput", "mean_ttft_ms", "total_output_tokens", "completed")}))
"""


def vllm_bench(args: argparse.Namespace, prompts: list[str]) -> dict[str, float]:
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    argv = [
        args.server_python,
        "-c",
        VLLM_BENCH,
        "--backend",
        "openai-chat",
        "--base-url",
        args.api_base,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        args.model,
        "--tokenizer",
        args.tokenizer,
        "--dataset-name",
        "custom",
        "--dataset-path",
        f.name,
        "--skip-chat-template",
        "--custom-output-len",
        str(args.max_tokens),
        "--num-prompts",
        str(len(prompts)),
        "--max-concurrency",
        "1",
        "--temperature",
        "0",
        "--num-warmups",
        "0",
        "--disable-tqdm",
    ]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT_JSON "):
            return json.loads(line.removeprefix("RESULT_JSON "))
    sys.exit(f"vllm bench failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def ours(args: argparse.Namespace, prompts: list[str]) -> dict[str, float]:
    samples, wall = [], 0.0
    for prompt in prompts:
        spec = RequestSpec(args.api_base, args.model, prompt, args.max_tokens)
        got, took = asyncio.run(run_requests(spec, workload="w", phase="p", count=1))
        samples += got
        wall += took
    return {
        "mean_tpot_ms": statistics.fmean(s.tpot_s * 1000 for s in samples),
        "output_throughput": sum(s.output_tokens for s in samples) / wall,
        "mean_ttft_ms": statistics.fmean(s.ttft_s * 1000 for s in samples),
        "total_output_tokens": sum(s.output_tokens for s in samples),
        "completed": len(samples),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--api-base", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--server-python", required=True)
    ap.add_argument("--config", default="suites/specdecode.toml")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    workloads = tomllib.loads(Path(args.config).read_text())["workloads"]
    prompts = [w["prompt"] for w in workloads.values()]
    ours(args, prompts[:1])  # warm-up, not counted
    runs: dict[str, list[dict[str, float]]] = {"pytest-specdecode": [], "vllm bench": []}
    for _ in range(args.rounds):
        runs["pytest-specdecode"].append(ours(args, prompts))
        runs["vllm bench"].append(vllm_bench(args, prompts))
    pooled = {}
    for name, rs in runs.items():
        pooled[name] = {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
    a, b = pooled["pytest-specdecode"], pooled["vllm bench"]
    print(f"{'':22}{'pytest-specdecode':>20}{'vllm bench':>14}{'difference':>12}")
    for key in ("mean_tpot_ms", "output_throughput", "mean_ttft_ms", "total_output_tokens"):
        print(f"{key:22}{a[key]:>20.2f}{b[key]:>14.2f}{(a[key] / b[key] - 1):>+12.2%}")
    print(
        f"({args.rounds} alternating rounds of {len(prompts)} prompts, max_tokens "
        f"{args.max_tokens}, concurrency 1, temperature 0)"
    )


if __name__ == "__main__":
    main()
