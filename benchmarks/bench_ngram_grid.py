"""How long the whole n-gram grid takes for a stored baseline of the issue's size.

4 prompt types x 10 requests x 256 output tokens, with prompts of realistic lengths (from a
short question to a long document), over the 168 configs of k 1..8 x prompt_lookup_min <= max
in 1..6. The issue asks for under 5 s on one core. Run: python benchmarks/bench_ngram_grid.py
"""

from __future__ import annotations

import os
import random
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one core, before numpy loads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from pytest_specdecode.analysis.prediction.ngram_replay import grid
from pytest_specdecode.analysis.prediction.ngram_types import RequestTokens, grid_settings

PROMPT_LENGTHS = {"coding": 60, "math": 120, "structured": 400, "explanatory": 1500}
REQUESTS = 10
OUTPUT_TOKENS = 256
VOCAB = 150_000


def synthetic_text(rng: random.Random, length: int, phrases: list[list[int]]) -> list[int]:
    """Zipf-ish tokens with repeated phrases, so that n-grams match about as often as in text."""
    out: list[int] = []
    while len(out) < length:
        if rng.random() < 0.3:
            out += rng.choice(phrases)
        else:
            out.append(min(int(rng.paretovariate(1.1)), VOCAB - 1))
    return out[:length]


def workload(rng: random.Random) -> dict[str, list[RequestTokens]]:
    by_type = {}
    for name, prompt_len in PROMPT_LENGTHS.items():
        phrases = [[rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))] for _ in range(20)]
        prompt = synthetic_text(rng, prompt_len, phrases)
        by_type[name] = [
            RequestTokens.of(prompt, out[:OUTPUT_TOKENS], lookahead_ids=out[OUTPUT_TOKENS:])
            for out in (synthetic_text(rng, OUTPUT_TOKENS + 8, phrases) for _ in range(REQUESTS))
        ]
    return by_type


def main() -> None:
    by_type = workload(random.Random(0))
    configs = grid_settings()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        result = grid(by_type, configs)
        times.append(time.perf_counter() - t0)
    best = max(result["coding"].values(), key=lambda r: r.tokens_per_step)
    print(
        f"grid: {len(configs)} configs x {len(by_type)} prompt types x {REQUESTS} requests x "
        f"{OUTPUT_TOKENS} tokens (prompts {sorted(PROMPT_LENGTHS.values())} tokens)"
    )
    print(f"wall time: best {min(times):.2f} s, worst {max(times):.2f} s over {len(times)} runs")
    print(
        f"(sanity: best coding config {best.settings.label}, {best.tokens_per_step:.2f} tok/step)"
    )


if __name__ == "__main__":
    main()
