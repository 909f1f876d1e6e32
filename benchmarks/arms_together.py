"""Issue 29, part 4: on this machine, do two CPU servers side by side (half the cores each,
requests alternating A/B) give a tighter A/B comparison per minute than one server at a time?

Both designs are A/A runs of the embedded default (suites/specdecode.toml): the same
configuration twice, so every A/B difference is noise. One at a time: server A with every core
(vLLM's "auto" binding, as `make experiment` runs), its requests, then server B, the same
prompts in the same order. Side by side: `Switchboard.together`, each prompt sent to A then B.
Printed per design: tok/s per server, the SD of the A/B log ratio per request and per
8-request mean, the mean log ratio (the A/A error), and the minutes, starts included.
Run from the repository root, alone on the machine (under the shared lock):

    flock /work/real.lock .venv/bin/python -m benchmarks.arms_together [--pairs 32]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.targets import open_target
from pytest_specdecode.targets.base import Service
from pytest_specdecode.targets.lifecycle import experiment_services

REPO = Path(__file__).resolve().parents[1]
BLOCK = 8  # requests per mean: the SD of such means shows slow drift


def timed(client: httpx.Client, service: Service, prompt: str, max_tokens: int) -> float:
    """One request's generated tokens per second, the whole request timed."""
    body = {
        "model": service.model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    start = time.perf_counter()
    response = client.post(f"{service.api_base}/v1/chat/completions", json=body)
    elapsed = time.perf_counter() - start
    response.raise_for_status()
    return response.json()["usage"]["completion_tokens"] / elapsed


def figures(name: str, a: list[float], b: list[float], minutes: float, measuring: float) -> str:
    ratios = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    means = [statistics.fmean(ratios[i : i + BLOCK]) for i in range(0, len(ratios), BLOCK)]
    sd = statistics.stdev(ratios)
    se_per_minute = sd / math.sqrt(len(ratios) / measuring)  # SE of the mean after 1 min
    return (
        f"| {name} | {statistics.fmean(a):.1f} | {statistics.fmean(b):.1f} | {sd:.3f} | "
        f"{statistics.stdev(means):.3f} | {statistics.fmean(ratios):+.3f} | {len(ratios)} | "
        f"{measuring:.1f} | {minutes:.1f} | {se_per_minute:.3f} |"
    )


def run(pairs: int, max_tokens: int, seed: int, say: Callable[[str], None]) -> list[str]:
    settings = load_settings(REPO / "suites" / "specdecode.toml", spec_configs=["baseline"])
    (aa,) = settings.candidates
    texts = [p.text for t in settings.prompt_types.values() for p in t.prompts]
    random.Random(seed).shuffle(texts)
    prompts = [texts[i % len(texts)] for i in range(pairs)]
    rows = []
    with tempfile.TemporaryDirectory() as logs, httpx.Client(timeout=300) as client:

        def board():
            target = open_target(settings.target, log_dir=Path(logs))
            target.preflight()
            return experiment_services(
                target, ready_timeout_s=600, restore_timeout_s=120, progress=say
            )

        # one at a time: A's requests, then B's, each server with every core
        began = time.monotonic()
        a, b, measuring = [], [], 0.0
        with board() as switch:
            for arm, out in ((None, a), (aa, b)):
                service = switch.activate(arm, restart=True)
                timed(client, service, prompts[0], max_tokens)  # warm-up
                t0 = time.monotonic()
                out += [timed(client, service, p, max_tokens) for p in prompts]
                measuring += (time.monotonic() - t0) / 60
        rows.append(figures("one at a time", a, b, (time.monotonic() - began) / 60, measuring))
        say(rows[-1])

        # side by side: each prompt to A then B, each server on its own half of the cores
        began = time.monotonic()
        a, b = [], []
        with board() as switch, switch.together(aa, restart_original=True) as (one, two):
            for service in (one, two):
                timed(client, service, prompts[0], max_tokens)  # warm-up
            t0 = time.monotonic()
            for p in prompts:
                a.append(timed(client, one, p, max_tokens))
                b.append(timed(client, two, p, max_tokens))
            measuring = (time.monotonic() - t0) / 60
        rows.append(figures("side by side", a, b, (time.monotonic() - began) / 60, measuring))
        say(rows[-1])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = run(args.pairs, args.max_tokens, args.seed, lambda line: print(line, file=sys.stderr))
    print(
        "| design | A tok/s | B tok/s | SD log(B/A) per request | SD per 8-request mean | "
        "mean log(B/A) | pairs | measuring min | min in all | SE of the mean after 1 min |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
