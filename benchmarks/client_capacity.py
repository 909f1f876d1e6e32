"""Client capacity: this plugin's load generator beside vLLM's own benchmark client.

Both clients stream from one local SSE source that speaks vLLM's chat-completions protocol
(`SSESource` below: a minimal asyncio HTTP/1.1 server, no framework) on 127.0.0.1. The source
runs pinned to one core, and each client in turn runs pinned to the other, alone:

- chunks/s: every stream sends its chunks as fast as the source can (coalesced on the wire, as
  a busy server's are), many streams at once; the figure is chunks received over wall time;
- concurrent streams: 5 ms between chunks, 256 (and more) streams at once; every stream must
  complete, and the source counts how many were open at once;
- TPOT and inter-chunk-gap distortion at 5 ms gaps: the source records when it wrote every
  chunk (CLOCK_MONOTONIC, which both processes share), so each client's TPOT and gaps are
  compared with what was sent, not with the nominal 5 ms.

vLLM's client (`vllm.benchmarks.serve`) runs in the server venv as a subprocess of this script;
ours runs in the interpreter that runs this script. Usage, from the repository root:

  .venv/bin/python benchmarks/client_capacity.py [--quick] [--json OUT]

Targets (issue 11): >= 50,000 chunks/s on one core, 256 concurrent streams, < 1% TPOT
distortion at 5 ms gaps, and no figure worse than vLLM's client's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EMBEDDED = Path(os.environ.get("SPECDECODE_EMBEDDED_DIR", REPO / ".embedded"))
SERVER_PYTHON = EMBEDDED / "server-venv" / "bin" / "python"
TOKENIZER = EMBEDDED / "models" / "SmolLM2-135M-Instruct"
MODEL = "sse-source"
SOURCE_CORE, CLIENT_CORE = 1, 0

# --------------------------------------------------------------------------- the SSE source


def _http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return _http_chunk(f"data: {data}\n\n".encode())


def stream_events(n_tokens: int, *, continuous_usage: bool) -> list[bytes]:
    """The HTTP chunks of one stream as vLLM sends them: a role chunk, n one-token chunks,
    then (in the last write) the usage chunk, [DONE] and the end of the body."""

    def chunk(delta: dict[str, Any], tokens: int, finish: str | None) -> bytes:
        obj: dict[str, Any] = {
            "id": "chatcmpl-sse-source",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if continuous_usage:
            obj["usage"] = {
                "prompt_tokens": 12,
                "total_tokens": 12 + tokens,
                "completion_tokens": tokens,
            }
        return _event(obj)

    events = [chunk({"role": "assistant", "content": ""}, 0, None)]
    for k in range(1, n_tokens + 1):
        events.append(chunk({"content": f" w{k}"}, k, "length" if k == n_tokens else None))
    usage = {
        "id": "chatcmpl-sse-source",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": 12,
            "total_tokens": 12 + n_tokens,
            "completion_tokens": n_tokens,
        },
    }
    events[-1] += _event(usage) + _event("[DONE]") + b"0\r\n\r\n"
    return events


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)


@dataclass
class _Run:
    """What the source sent for one run id."""

    send_times: list[list[float]] = field(default_factory=list)  # per stream, per chunk
    in_flight: int = 0
    peak_in_flight: int = 0
    cpu0: float = field(default_factory=time.process_time)
    wall0: float = field(default_factory=time.perf_counter)


@dataclass
class _Stream:
    writer: asyncio.StreamWriter
    events: list[bytes]
    times: list[float]
    done: asyncio.Future[None]
    i: int = 0


class SSESource:
    """A fast SSE source. A request's path says what to send: /RUN/nN-gG/v1/chat/completions
    sends N one-token chunks, G ms apart (G = 0: all at once); RUN groups requests for
    GET /stats/RUN. Chunks G ms apart are written by one ticker for all streams."""

    def __init__(self) -> None:
        self.runs: dict[str, _Run] = {}
        self.ticking: dict[float, list[_Stream]] = {}
        self.tickers: dict[float, asyncio.Task[None]] = {}
        self.cache: dict[tuple[int, bool], list[bytes]] = {}

    async def serve(self, port: int, ready: Path) -> None:
        server = await asyncio.start_server(self._connection, "127.0.0.1", port, backlog=2048)
        ready.write_text(str(server.sockets[0].getsockname()[1]))
        async with server:
            await server.serve_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while await self._request(reader, writer):
                pass
        writer.close()

    async def _request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = 0
        for line in lines[1:]:
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        body = json.loads(await reader.readexactly(length)) if length else {}
        parts = path.strip("/").split("/")
        if method == "GET" and parts[0] == "stats":
            self._answer(writer, 200, json.dumps(self._stats(parts[1])).encode())
            return True
        if method != "POST" or len(parts) < 4 or not path.endswith("/chat/completions"):
            self._answer(writer, 404, b'{"error": "no such path"}')
            return True
        run_id, shape = parts[0], parts[1]
        n_tokens, gap_ms = (int(x[1:]) for x in shape.split("-"))
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        key = (n_tokens, continuous)
        if key not in self.cache:
            self.cache[key] = stream_events(n_tokens, continuous_usage=continuous)
        run = self.runs.setdefault(run_id, _Run())
        run.in_flight += 1
        run.peak_in_flight = max(run.peak_in_flight, run.in_flight)
        times: list[float] = []
        writer.write(_HEAD)
        try:
            if gap_ms == 0:
                writer.write(b"".join(self.cache[key]))
                times.extend([time.perf_counter()] * len(self.cache[key]))
                await writer.drain()
            else:
                stream = _Stream(
                    writer, self.cache[key], times, asyncio.get_running_loop().create_future()
                )
                gap_s = gap_ms / 1000
                self.ticking.setdefault(gap_s, []).append(stream)
                if gap_s not in self.tickers or self.tickers[gap_s].done():
                    self.tickers[gap_s] = asyncio.ensure_future(self._tick(gap_s))
                await stream.done
        finally:
            run.in_flight -= 1
            run.send_times.append(times)
        return True

    async def _tick(self, gap_s: float) -> None:
        """Every gap_s (on an absolute schedule), the next chunk of every stream."""
        streams = self.ticking[gap_s]
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while streams:
            for s in list(streams):
                if s.writer.is_closing():
                    streams.remove(s)
                    s.done.set_result(None)
                    continue
                s.writer.write(s.events[s.i])
                s.times.append(time.perf_counter())
                s.i += 1
                if s.i == len(s.events):
                    streams.remove(s)
                    s.done.set_result(None)
            next_t += gap_s
            await asyncio.sleep(max(0.0, next_t - loop.time()))

    @staticmethod
    def _answer(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
        reason = b"OK" if status == 200 else b"Not Found"
        writer.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (status, reason, len(body), body)
        )

    def _stats(self, run_id: str) -> dict[str, Any]:
        run = self.runs.pop(run_id, _Run())
        gaps = [b - a for t in run.send_times for a, b in itertools.pairwise(t)]
        tpots = [(t[-1] - t[0]) / (len(t) - 2) for t in run.send_times if len(t) > 2]
        return {
            "streams": len(run.send_times),
            "peak_in_flight": run.peak_in_flight,
            "gaps_s": gaps,
            "tpots_s": tpots,
            "cpu_share": (time.process_time() - run.cpu0) / (time.perf_counter() - run.wall0),
        }


# --------------------------------------------------------------------------- the two clients


def run_ours(base: str, shape: str, requests: int, concurrency: int, n_tokens: int) -> dict:
    """This plugin's load generator: one closed-loop level."""
    from pytest_specdecode.config.load import LoadLevel
    from pytest_specdecode.measure.requests.loadgen import RequestSpec, run_level

    spec = RequestSpec(
        api_base=f"{base}/{shape}",
        model=MODEL,
        prompt="Count.",
        max_tokens=n_tokens,
        timeout_s=600,
        read_timeout_s=120,
    )
    result = asyncio.run(
        run_level(
            [spec] * requests, LoadLevel(concurrency=concurrency), workload="bench", phase="p"
        )
    )
    samples = result.samples
    return {
        "duration_s": result.stats.wall_s,
        "completed": len(samples),
        "chunks": sum(s.chunks for s in samples),
        "output_tokens": sum(s.output_tokens for s in samples),
        "tpots_s": [s.tpot_s for s in samples],
        "gaps_s": [g for s in samples for g in s.chunk_gaps_s],
        "client_cpu_share": result.stats.client_cpu_share,
        "peak_in_flight": result.stats.peak_in_flight,
    }


def run_vllm(base: str, shape: str, requests: int, concurrency: int, n_tokens: int) -> dict:
    """vLLM's own client (`vllm bench serve`), in-process; needs the server venv."""
    import vllm.benchmarks.serve as serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    window: dict[str, float] = {}
    measured = serve.benchmark

    async def timed_benchmark(*a: Any, **kw: Any) -> Any:
        """vLLM's run itself, without its imports and dataset loading: the CPU share's window."""
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            return await measured(*a, **kw)
        finally:
            window["cpu"] = time.process_time() - cpu
            window["wall"] = time.perf_counter() - wall

    serve.benchmark = timed_benchmark

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i in range(requests):
            f.write(json.dumps({"prompt": f"Count to {i}."}) + "\n")
    parser = FlexibleArgumentParser()
    serve.add_cli_args(parser)
    args = parser.parse_args(
        [
            *("--backend", "openai-chat", "--base-url", base),
            *("--endpoint", f"/{shape}/v1/chat/completions", "--model", MODEL),
            *("--tokenizer", str(TOKENIZER), "--dataset-name", "custom"),
            *("--dataset-path", f.name, "--skip-chat-template"),
            *("--custom-output-len", str(n_tokens), "--num-prompts", str(requests)),
            *("--max-concurrency", str(concurrency), "--request-rate", "inf"),
            *("--ready-check-timeout-sec", "0", "--num-warmups", "0"),
            *("--disable-tqdm", "--save-detailed", "--temperature", "0"),
            *("--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"),
        ]
    )
    with contextlib.redirect_stdout(sys.stderr):
        r = serve.main(args)
    os.unlink(f.name)
    lat, ttft, out = r["latencies"], r["ttfts"], r["output_lens"]
    return {
        "duration_s": r["duration"],
        "completed": r["completed"],
        "failed": r["failed"],
        "chunks": sum(
            len(itl) + 1 for itl, err in zip(r["itls"], r["errors"], strict=True) if not err
        ),
        "output_tokens": r["total_output_tokens"],
        "tpots_s": [(e - t) / (o - 1) for e, t, o in zip(lat, ttft, out, strict=True) if o > 1],
        "gaps_s": [g for itl in r["itls"] for g in itl],
        "client_cpu_share": window["cpu"] / window["wall"],
        "peak_in_flight": r.get("max_concurrent_requests"),
        "errors": [e for e in r["errors"] if e][:3],
    }


# --------------------------------------------------------------------------- orchestration


@dataclass(frozen=True)
class Scenario:
    name: str
    n_tokens: int
    gap_ms: int
    concurrency: int
    requests: int


def scenarios(quick: bool) -> list[Scenario]:
    k = 2 if quick else 1  # quick: one round of streams per level instead of two
    return [
        Scenario("throughput", 400, 0, 64, 512 // k),
        Scenario("gaps c1", 200, 5, 1, 8 // k),
        Scenario("gaps c16", 200, 5, 16, 32 // k),
        Scenario("gaps c64", 200, 5, 64, 128 // k),
        Scenario("streams c256", 100, 5, 256, 512 // k),
        Scenario("streams c512", 50, 5, 512, 1024 // k),
    ]


def _pin(core: int):
    return lambda: os.sched_setaffinity(0, {core})


def _client(which: str, base: str, sc: Scenario, run_id: str) -> dict:
    python = sys.executable if which == "ours" else str(SERVER_PYTHON)
    shape = f"{run_id}/n{sc.n_tokens}-g{sc.gap_ms}"
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    argv = [python, __file__, "client", which, base, shape, str(sc.requests)]
    argv += [str(sc.concurrency), str(sc.n_tokens), str(out)]
    proc = subprocess.run(
        argv, preexec_fn=_pin(CLIENT_CORE), capture_output=True, text=True, cwd=REPO
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1:] or ["exit " + str(proc.returncode)]}
    data = json.loads(out.read_text())
    out.unlink()
    return data


def _get_json(base: str, path: str) -> dict:
    import urllib.request

    with urllib.request.urlopen(f"{base}{path}", timeout=30) as r:
        return json.loads(r.read())


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _p99(xs: list[float]) -> float:
    return statistics.quantiles(xs, n=100)[98] if len(xs) > 1 else float("nan")


def figures(sc: Scenario, got: dict, sent: dict) -> dict:
    """One client on one scenario, against what the source sent."""
    if "error" in got:
        return {"error": got["error"]}
    tpot_c, tpot_s = _mean(got["tpots_s"]), _mean(sent["tpots_s"])
    gap_c, gap_s = _mean(got["gaps_s"]), _mean(sent["gaps_s"])
    ok = got["completed"] == sc.requests and not got.get("failed")
    return {
        "completed": f"{got['completed']}/{sc.requests}",
        "all_ok": ok,
        "chunks_per_s": got["chunks"] / got["duration_s"],
        "peak_streams_at_source": sent["peak_in_flight"],
        "client_cpu_share": got["client_cpu_share"],
        "source_cpu_share": sent["cpu_share"],
        "tpot_ms": tpot_c * 1000,
        "tpot_sent_ms": tpot_s * 1000,
        "tpot_distortion": tpot_c / tpot_s - 1 if sc.gap_ms else None,
        "gap_mean_ms": gap_c * 1000,
        "gap_sent_mean_ms": gap_s * 1000,
        "gap_mean_distortion": gap_c / gap_s - 1 if sc.gap_ms else None,
        "gap_p99_ms": _p99(got["gaps_s"]) * 1000,
        "gap_sent_p99_ms": _p99(sent["gaps_s"]) * 1000,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests per scenario")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--only", help="comma-separated scenario names")
    ap.add_argument("--clients", default="ours,vllm")
    args = ap.parse_args()
    if os.cpu_count() is None or len(os.sched_getaffinity(0)) < 2:
        sys.exit("needs two cores: one for the source, one for the client")
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "port"
        source = subprocess.Popen(
            [sys.executable, __file__, "source", str(ready)], preexec_fn=_pin(SOURCE_CORE)
        )
        try:
            for _ in range(100):
                if ready.exists() and ready.read_text():
                    break
                time.sleep(0.1)
            base = f"http://127.0.0.1:{ready.read_text()}"
            results = _measure(base, args)
        finally:
            source.terminate()
            source.wait(10)
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


def _measure(base: str, args: argparse.Namespace) -> list[dict]:
    clients = args.clients.split(",")
    chosen = [s for s in scenarios(args.quick) if not args.only or s.name in args.only.split(",")]
    results = []
    for k, sc in enumerate(chosen):
        row: dict[str, Any] = {"scenario": sc.__dict__}
        order = clients if k % 2 == 0 else list(reversed(clients))  # alternate who goes first
        for which in order:
            run_id = f"{which}-{k}"
            got = _client(which, base, sc, run_id)
            sent = _get_json(base, f"/stats/{run_id}")
            row[which] = figures(sc, got, sent)
            print(f"{sc.name:14} {which:5} {_short(row[which])}", file=sys.stderr, flush=True)
        results.append(row)
    return results


def _short(f: dict) -> str:
    if "error" in f:
        return f"ERROR {f['error']}"
    dist = f["tpot_distortion"]
    return (
        f"{f['completed']} {f['chunks_per_s']:>9,.0f} chunks/s"
        f"  peak {f['peak_streams_at_source']:>4}"
        f"  TPOT {f['tpot_ms']:.3f} vs sent {f['tpot_sent_ms']:.3f} ms"
        + (f" ({dist:+.2%})" if dist is not None else "")
        + f"  gap p99 {f['gap_p99_ms']:.2f} vs {f['gap_sent_p99_ms']:.2f} ms"
        f"  client cpu {f['client_cpu_share']:.0%}, source cpu {f['source_cpu_share']:.0%}"
    )


def _print(results: list[dict]) -> None:
    print(
        f"{'scenario':14} {'client':6} {'done':>9} {'chunks/s':>9} {'peak':>5} "
        f"{'TPOT ms':>8} {'sent':>7} {'distort':>8} {'gap p99':>8} {'sent':>6} {'cpu':>5}"
    )
    for row in results:
        for which in ("ours", "vllm"):
            f = row.get(which)
            if f is None:
                continue
            if "error" in f:
                print(f"{row['scenario']['name']:14} {which:6} ERROR {f['error']}")
                continue
            dist = f["tpot_distortion"]
            print(
                f"{row['scenario']['name']:14} {which:6} {f['completed']:>9} "
                f"{f['chunks_per_s']:>9,.0f} {f['peak_streams_at_source']:>5} "
                f"{f['tpot_ms']:>8.3f} {f['tpot_sent_ms']:>7.3f} "
                f"{(f'{dist:+.2%}' if dist is not None else '-'):>8} "
                f"{f['gap_p99_ms']:>8.2f} {f['gap_sent_p99_ms']:>6.2f} "
                f"{f['client_cpu_share']:>5.0%}"
            )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "source":
        asyncio.run(SSESource().serve(0, Path(sys.argv[2])))
    elif len(sys.argv) > 1 and sys.argv[1] == "client":
        which, base, shape, requests, conc, n, out = sys.argv[2:9]
        fn = run_ours if which == "ours" else run_vllm
        Path(out).write_text(json.dumps(fn(base, shape, int(requests), int(conc), int(n))))
    else:
        main()
