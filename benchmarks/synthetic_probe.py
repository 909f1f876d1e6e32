"""Does vLLM's synthetic acceptance run here, and what does a step of k drafts cost? One config
per process, offline (no server): n-gram at k with prompt_lookup_min 1, its drafts accepted at
a stated mean length, or the baseline. Prints one JSON line: per-request tok/s of sequential
greedy requests (c1), and the spec-decode counters. For a GPU host (vLLM >= 0.26); vLLM 0.32's
CPU sampler refuses synthetic acceptance.

    python -m benchmarks.synthetic_probe MODEL baseline|K:L [REQUESTS]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

PROMPTS = Path(__file__).resolve().parents[1] / "pytest_specdecode" / "prompts" / "coding.jsonl"


def main(model: str, config: str, requests: int = 8) -> dict[str, object]:
    from vllm import LLM, SamplingParams

    spec = None
    if config != "baseline":
        k, length = config.split(":")
        spec = {
            "method": "ngram",
            "num_speculative_tokens": int(k),
            "prompt_lookup_min": 1,
            "prompt_lookup_max": 4,
            "rejection_sample_method": "synthetic",
            "synthetic_acceptance_length": float(length),
        }
    started = time.perf_counter()
    llm = LLM(
        model=model,
        speculative_config=spec,
        enforce_eager=True,
        gpu_memory_utilization=0.3,
        max_model_len=2048,
        seed=0,
        disable_log_stats=False,
    )
    ready_s = time.perf_counter() - started
    prompts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines()][:requests]
    params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
    llm.generate(prompts[:1], params, use_tqdm=False)  # warm-up
    rates = []
    for prompt in prompts:
        t0 = time.perf_counter()
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        rates.append(len(out.outputs[0].token_ids) / (time.perf_counter() - t0))
    counters = {
        m.name: getattr(m, "value", None)
        for m in llm.get_metrics()
        if "spec_decode" in m.name and hasattr(m, "value")
    }
    return {
        "config": config,
        "spec": spec,
        "ready_s": round(ready_s, 1),
        "tok_s_per_request": [round(r, 1) for r in rates],
        "mean_tok_s": round(sum(rates) / len(rates), 1),
        "counters": counters,
    }


if __name__ == "__main__":
    found = main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:4]))
    print("synthetic-probe:" + json.dumps(found), flush=True)
