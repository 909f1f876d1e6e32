"""Side by side: this plugin's load generator and vLLM's own benchmark client, one server.

Both send the same chat prompts, one at a time, greedy, with the same max tokens, from this
one process (so both clients cost the 2-core machine the same). Runs alternate (ours, vLLM's,
ours, ...) so drift hits both alike. Prints mean TPOT and output throughput from each.

Runs in the server venv, which has vLLM (and httpx, which the load generator needs):

  .embedded/server-venv/bin/python scripts/compare_with_vllm_bench.py \
      --api-base http://127.0.0.1:8011 --model smollm2-135m-instruct \
      --tokenizer .embedded/models/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pytest_specdecode.config.load import LoadLevel
from pytest_specdecode.config.prompts import prompt_types
from pytest_specdecode.measure.requests.loadgen import RequestSpec, run_level


def vllm_bench(args: argparse.Namespace, prompts: list[str]) -> dict[str, float]:
    """vLLM's own client (`vllm bench serve`), called in this same process."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for p in prompts:
            f.write(json.dumps({"prompt": p}) + "\n")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    bench_args = parser.parse_args(
        [
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
    )
    with contextlib.redirect_stdout(io.StringIO()):
        result = bench_main(bench_args)
    keys = ("mean_tpot_ms", "output_throughput", "mean_ttft_ms", "total_output_tokens")
    return {k: float(result[k]) for k in keys}


def ours(args: argparse.Namespace, prompts: list[str]) -> dict[str, float]:
    samples, wall = [], 0.0
    for prompt in prompts:
        spec = RequestSpec(args.api_base, args.model, prompt, args.max_tokens)
        one = LoadLevel(concurrency=1)
        result = asyncio.run(run_level([spec], one, prompt_type="w", phase="p"))
        samples += result.samples
        wall += result.stats.wall_s
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
    ap.add_argument("--config", default="suites/specdecode.toml")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    config = Path(args.config)
    workloads = tomllib.loads(config.read_text())["workloads"]
    prompts = [  # the first prompt of each prompt type, as the single-prompt experiment sends
        found[0].text
        for name, table in workloads.items()
        for found in prompt_types(name, table, base=config.parent, where=str(config)).values()
    ]
    ours(args, prompts[:1])  # warm-up, not counted
    vllm_bench(args, prompts[:1])
    clients = {"pytest-specdecode": ours, "vllm bench": vllm_bench}
    pairs: list[dict[str, dict[str, float]]] = []
    # Request-level ABBA pairs: the same prompt from both clients back to back, the order
    # alternating, so the machine's drift cancels within each pair.
    for i in range(args.rounds):
        for j, prompt in enumerate(prompts):
            order = list(clients) if (i + j) % 2 == 0 else list(reversed(clients))
            pairs.append({name: clients[name](args, [prompt]) for name in order})
    print(
        f"{len(pairs)} pairs ({args.rounds} rounds x {len(prompts)} prompts), max_tokens "
        f"{args.max_tokens}, concurrency 1, temperature 0"
    )
    print(f"{'':20}{'pytest-specdecode':>19}{'vllm bench':>12}{'ratio':>9}  95% CI of ratio")
    for key in ("mean_tpot_ms", "output_throughput", "mean_ttft_ms", "total_output_tokens"):
        a = [p["pytest-specdecode"][key] for p in pairs]
        b = [p["vllm bench"][key] for p in pairs]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        mean = statistics.fmean(ratios)
        half = 1.96 * statistics.stdev(ratios) / len(ratios) ** 0.5
        print(
            f"{key:20}{statistics.fmean(a):>19.2f}{statistics.fmean(b):>12.2f}"
            f"{mean:>9.4f}  [{mean - half:.4f}, {mean + half:.4f}]"
        )


if __name__ == "__main__":
    main()
