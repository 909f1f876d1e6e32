"""What do idle servers beside cost a vLLM server on one GPU? For a GPU host (issue 41).

Starts two baselines (the "probe" and its "twin") and measures them with one idle server beside;
then three speculative servers (real n-gram k=5, n-gram k=5 with synthetic acceptance at nothing
and at everything), one after the other, and measures each of the five in turn, four beside;
then freezes the four (SIGSTOP: their CUDA contexts and memory stay, their processes do no
work) and measures the probe again, and thaws them. Between phases it reads each server's CPU time
(its whole process group, from /proc) and the GPU's clocks, so that what the neighbours do
while idle is seen, not guessed. Every measurement is c1, greedy, a fixed output length
(ignore_eos), over the same prompts; blocks alternate so that drift shows.

    python -m benchmarks.beside_probe MODEL OUT_JSON [--share 0.15] [--requests 12]

Prints one line a measurement and writes them all to OUT_JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

PROMPTS = Path(__file__).resolve().parents[1] / "pytest_specdecode" / "prompts"
BASE_PORT = 8101
TICK = os.sysconf("SC_CLK_TCK")


def prompts(count: int) -> list[str]:
    rows = []
    for name in ("coding", "math", "structured", "explanatory"):
        lines = (PROMPTS / f"{name}.jsonl").read_text().splitlines()
        rows += [json.loads(line)["prompt"] for line in lines[:3]]
    return rows[:count]


def start(
    model: str, port: int, share: float, logs: Path, extra_env: dict[str, str], extra: list[str]
) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "2048", "--seed", "0", "--gpu-memory-utilization", f"{share:g}", *extra,
    ]  # fmt: skip
    env = {**os.environ, "VLLM_USE_FLASHINFER_SAMPLER": "0", **extra_env}
    log = (logs / f"server-{port}.log").open("wb")
    return subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def wait_ready(
    servers: dict[int, subprocess.Popen[bytes]], logs: Path, timeout: float = 300
) -> float:
    """Seconds until each server on its port answers /health; a server that dies is named with
    the end of its log."""
    t0 = time.monotonic()
    waiting = set(servers)
    while waiting and time.monotonic() - t0 < timeout:
        for port in list(waiting):
            if servers[port].poll() is not None:
                tail = (logs / f"server-{port}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the server on port {port} died while starting:\n{tail}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    waiting.discard(port)
            except httpx.HTTPError:
                pass
        time.sleep(1)
    if waiting:
        raise RuntimeError(f"servers on ports {sorted(waiting)} did not serve in {timeout:.0f} s")
    return time.monotonic() - t0


def one_request(client: httpx.Client, port: int, prompt: str, tokens: int) -> dict[str, float]:
    body = {
        "model": "m", "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
    }  # fmt: skip
    t0 = time.perf_counter()
    first = last = None
    usage = 0
    with client.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            now = time.perf_counter()
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                first = first or now
                last = now
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    assert first is not None and last is not None and usage > 1
    return {"tok_s": usage / (end - t0), "tpot_ms": 1000 * (last - first) / (usage - 1)}


def group_cpu_s(pgid: int) -> tuple[float, int]:
    """CPU seconds (user + system) of every live process in a process group, and its threads."""
    total, threads = 0, 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # field 5 (pgrp) is index 2 after the command
            total += int(fields[11]) + int(fields[12])  # utime, stime
            threads += int(fields[17])
    return total / TICK, threads


def gpu_state() -> str:
    query = "clocks.sm,clocks.mem,power.draw,utilization.gpu,memory.used,temperature.gpu"
    if not shutil.which("nvidia-smi"):
        return "no nvidia-smi"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return out.stdout.strip()


def measure(
    label: str, port: int, rows: list[str], tokens: int, others: list[int]
) -> dict[str, object]:
    cpu0 = {p: group_cpu_s(p)[0] for p in others}
    t0 = time.monotonic()
    with httpx.Client(timeout=120) as client:
        one_request(client, port, rows[0], 16)  # warm the connection
        results = [one_request(client, port, prompt, tokens) for prompt in rows]
    wall = time.monotonic() - t0
    others_cpu = {p: round((group_cpu_s(p)[0] - cpu0[p]) / wall, 3) for p in others}
    out = {
        "label": label,
        "tok_s_median": round(statistics.median(r["tok_s"] for r in results), 1),
        "tpot_ms_median": round(statistics.median(r["tpot_ms"] for r in results), 3),
        "tok_s": [round(r["tok_s"], 1) for r in results],
        "neighbour_cores_busy": others_cpu,  # CPU seconds per second of each idle neighbour
        "gpu": gpu_state(),
        "wall_s": round(wall, 1),
    }
    print(json.dumps({k: v for k, v in out.items() if k != "tok_s"}), flush=True)
    return out


def idle_cpu(pgids: list[int], seconds: float = 10) -> dict[int, tuple[float, int]]:
    before = {p: group_cpu_s(p)[0] for p in pgids}
    time.sleep(seconds)
    return {
        p: (round((group_cpu_s(p)[0] - before[p]) / seconds, 3), group_cpu_s(p)[1]) for p in pgids
    }


SERVERS = {  # port offset: (name, --speculative-config or None)
    0: ("probe", None),
    1: ("twin", None),
    2: ("ngram-k5", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}),
    3: ("ngram-k5-min1", {"method": "ngram", "num_speculative_tokens": 5,
                          "prompt_lookup_min": 1, "prompt_lookup_max": 4}),
    4: ("synthetic-k5-L1", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
                            "prompt_lookup_max": 4, "rejection_sample_method": "synthetic",
                            "synthetic_acceptance_length": 1.0}),
    5: ("synthetic-k5-L6", {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 1,
                            "prompt_lookup_max": 4, "rejection_sample_method": "synthetic",
                            "synthetic_acceptance_length": 6.0}),
}  # fmt: skip
MORE = [2, 4, 5]  # started after the one-beside phase: the probe then has four beside


def counters(port: int) -> dict[str, float]:
    """The spec-decode counters of /metrics, summed over labels (none for a baseline)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:spec_decode_num_") and "_total" in line and "per_pos" not in line:
            name = line.split("{")[0].split(" ")[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        if line.startswith("vllm:generation_tokens_total"):
            out["generation"] = out.get("generation", 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def measure_server(name: str, port: int, rows: list[str], tokens: int) -> dict[str, object]:
    before = counters(port)
    out = measure(name, port, rows, tokens, [])
    after = counters(port)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    accepted = delta.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
    drafts = delta.get("vllm:spec_decode_num_drafts_total", 0.0)
    generated = delta.get("generation", 0.0)
    if generated:
        out["tokens_per_step"] = round(generated / max(1.0, generated - accepted), 3)
    if drafts:
        out["accepted_per_draft"] = round(1 + accepted / drafts, 3)
        out["drafting_share"] = round(drafts / max(1.0, generated - accepted), 3)
    out["counters"] = delta
    print(
        f"  {name}: tokens per step {out.get('tokens_per_step')}, accepted per draft "
        f"{out.get('accepted_per_draft')}, drafting share {out.get('drafting_share')}",
        flush=True,
    )
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("out")
    parser.add_argument("--share", type=float, default=0.15)
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--idle-only", action="store_true", help="one server: its idle CPU")
    args = parser.parse_args()
    out_path = Path(args.out)
    logs = out_path.parent
    rows = prompts(args.requests)
    servers: dict[int, subprocess.Popen[bytes]] = {}
    record: dict[str, object] = {"cpus": os.cpu_count(), "share": args.share, "phases": []}
    phases: list[dict[str, object]] = record["phases"]  # type: ignore[assignment]

    def save() -> None:
        out_path.write_text(json.dumps(record, indent=1))

    def launch(offsets: list[int]) -> list[float]:
        """One after the other: vLLM's memory profile fails where two start on a GPU at once."""
        took = []
        for i in offsets:
            _name, spec = SERVERS[i]
            extra = ["--speculative-config", json.dumps(spec)] if spec else []
            server = start(args.model, BASE_PORT + i, args.share, logs, {}, extra)
            try:
                took.append(round(wait_ready({BASE_PORT + i: server}, logs), 1))
            except RuntimeError as error:  # a speculative one may fail: go on without it
                if i in (0, 1):
                    raise
                print(f"{SERVERS[i][0]} did not start: {error}", flush=True)
                record.setdefault("start_errors", {})[SERVERS[i][0]] = str(error)[-1500:]  # type: ignore[union-attr]
                if server.poll() is None:
                    os.killpg(server.pid, signal.SIGKILL)
                continue
            servers[i] = server
            print(f"{SERVERS[i][0]} ready in {took[-1]} s", flush=True)
        return took

    try:
        if args.idle_only:  # one server: what it does while nothing is asked of it
            record["one_start_s"] = launch([0])
            record["idle_one"] = idle_cpu([servers[0].pid])
            print(f"idle: cores busy and threads: {record['idle_one']}", flush=True)
            phases.append(measure("probe alone", BASE_PORT, rows, args.tokens, []))
            record["idle_one_after"] = idle_cpu([servers[0].pid])
            print(f"idle after requests: {record['idle_one_after']}", flush=True)
            return 0
        record["two_starts_s"] = launch([0, 1])
        print(f"probe and twin ready in {record['two_starts_s']} s; {gpu_state()}", flush=True)
        for _ in range(2):  # one beside: the probe and its twin, alternating
            phases.append(measure("probe beside 1", BASE_PORT, rows, args.tokens, [servers[1].pid]))
            phases.append(
                measure("twin beside 1", BASE_PORT + 1, rows, args.tokens, [servers[0].pid])
            )
        save()
        record["more_starts_s"] = launch(MORE)
        record["idle_all_six"] = idle_cpu([s.pid for s in servers.values()])
        print(f"idle: cores busy and threads, per server: {record['idle_all_six']}", flush=True)
        save()
        others = [servers[i].pid for i in servers if i != 0]
        for block in range(2):  # beside 4: each server in turn; then the probe, the rest frozen
            order = list(servers) if block == 0 else list(reversed(servers))
            for i in order:
                name = SERVERS[i][0]
                phases.append(
                    measure_server(
                        f"{name} beside {len(servers) - 1}", BASE_PORT + i, rows, args.tokens
                    )
                )
            for pid in others:
                os.killpg(pid, signal.SIGSTOP)
            phases.append(
                measure(f"probe beside {len(servers) - 1} frozen", BASE_PORT, rows, args.tokens, [])
            )
            for pid in others:
                os.killpg(pid, signal.SIGCONT)
            save()
        more = [i for i in MORE if i in servers]
        for i in more:  # back to one beside: does the probe recover?
            os.killpg(servers[i].pid, signal.SIGTERM)
        for i in more:
            servers[i].wait(timeout=60)
        phases.append(
            measure("probe beside 1 again", BASE_PORT, rows, args.tokens, [servers[1].pid])
        )
        save()
    finally:
        for s in servers.values():
            if s.poll() is None:
                os.killpg(s.pid, signal.SIGCONT)
                os.killpg(s.pid, signal.SIGTERM)
        for s in servers.values():
            try:
                s.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(s.pid, signal.SIGKILL)
        save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
