"""A scripted target and vLLM API: a seam for millisecond tests of the experiment's logic.

Nothing here stands in for a fault of a real server: the same logic is tested against the real
CPU vLLM (tests/real_vllm) and the real systemd host (tests/real_host). Here, each service's
speed per prompt, and its failures (a crash at start, a server that never gets ready, a slow
restore), are scripted, and its HTTP API is answered through `httpx.MockTransport`, no socket.
Time is virtual (support/virtual_clock.py): a scripted 10 ms is measured as 10 ms, however busy
the machine, and a wait costs no real time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from pytest_specdecode.config.settings import Settings
from pytest_specdecode.config.specconfig import SpecConfig, VllmFacts
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.measure.experiment.arms import Experiment
from pytest_specdecode.measure.host_load import Probe
from pytest_specdecode.record.store import RunStore
from pytest_specdecode.targets.base import Progress, Transports
from pytest_specdecode.targets.facts.vllm import VllmFactsError
from pytest_specdecode.targets.hosts.base import LocalHost
from pytest_specdecode.targets.lifecycle import experiment_services

from .synthetic import record
from .virtual_clock import VirtualTime

API = "http://scripted.invalid:8000"
BESIDE = "http://scripted.invalid:8001"  # a second server, beside the original (--spec-arms)


@dataclass(frozen=True)
class Speed:
    """How a service answers one prompt: time to the first token, then one chunk per step."""

    ttft_s: float = 0.02
    gap_s: float = 0.010
    tokens: int = 8
    tokens_per_chunk: int = 1  # > 1: speculation delivers several tokens a step
    text: str = "the same greedy output"


@dataclass
class Script:
    """One service: its speed per prompt, and how it starts."""

    speeds: dict[str, Speed] = field(default_factory=dict)  # by prompt text
    restarted: dict[str, Speed] | None = None  # from its second start on, if it drifts
    crash_at_start: str | None = None  # the process exits with this in its log
    crash_log: list[str] | None = None  # the whole log of a crashed start (a captured one)
    # lines of a crashed start's log that arrive late_s after its death (a journal behind)
    crash_log_late: list[str] | None = None
    late_s: float = 3.0
    crash_starts: int | None = None  # how many of its starts crash (None: every one)
    ready_after_s: float = 0.0  # math.inf: never ready
    restore_s: float = 0.0  # the original takes this long to come back at the restore
    token_ids: bool = False  # answers untimed requests with vLLM 0.32's return_token_ids
    batch_cost: float = 0.0  # each step takes (1 + batch_cost x (requests in flight - 1)) gaps
    start_log: tuple[str, ...] = ()  # the log of each start (its settings are read from it)
    crowded: float = 0.0  # each step takes (1 + crowded x (servers beside - 1)) gaps
    # draft tokens counted each step (0: tokens_per_chunk - 1); above what its chunks accept, a
    # drafter that accepts little (tokens_per_chunk 1: a broken drafter, accepting nothing)
    drafted: int = 0

    def speed(self, prompt: str) -> Speed:
        return self.speeds.get(prompt, Speed())


class ScriptedService:
    def __init__(
        self, target: ScriptedTarget, name: str, script: Script, api_base: str = API
    ) -> None:
        self.target = target
        self.name = name
        self.script = script
        self.label = f"scripted service '{name}'"
        self.api_base = api_base
        self.model = target.model
        self.active = False
        self.started_at = 0.0
        self.starts = 0
        self.crashed = False  # its latest start crashed

    def is_active(self) -> bool:
        return self.active

    def start(self) -> None:
        self.target.events.append(f"start {self.name}")
        self.starts += 1
        self.started_at = self.target.time.now
        crashes = self.target.crashes.get(self.name, 0)
        limit = self.script.crash_starts
        self.crashed = self.script.crash_at_start is not None and (limit is None or crashes < limit)
        self.target.crashes[self.name] = crashes + self.crashed
        self.active = not self.crashed
        if self.active:
            self.target.serving = self

    def stop(self) -> None:
        self.target.events.append(f"stop {self.name}")
        self.active = False
        if self.target.serving is self:
            self.target.serving = None

    def ready(self) -> bool:
        delay = self.script.ready_after_s
        if self.name == "original" and self.starts > 1:
            delay = self.script.restore_s
        return self.active and self.target.time.now - self.started_at >= delay

    def failure(self) -> str | None:
        if self.crashed and not self.active and self.starts:
            return "the process exited with status 1"
        return None

    def log_tail(self, lines: int = 20) -> list[str]:
        return self.start_log()[-lines:]

    def start_log(self) -> list[str]:
        if self.crashed and self.script.crash_log is not None:
            late = self.script.crash_log_late or []
            arrived = self.target.time.now - self.started_at >= self.script.late_s
            return [*self.script.crash_log, *(late if arrived else [])]
        tail = ["INFO starting", "Traceback (most recent call last):"]
        if self.crashed and self.script.crash_at_start:
            return [*tail, self.script.crash_at_start]
        return [*tail[:1], *self.script.start_log]

    def settings_log(self) -> list[str]:
        return self.start_log()


class ScriptedTarget:
    """The original and candidates as scripted services; every start and stop is recorded."""

    host_name = "scripted-host"
    api_base = API
    typical_start_s = 1.0

    def __init__(
        self,
        original: Script,
        candidates: dict[str, Script] | None = None,
        *,
        model: str = "smollm2-135m-instruct",
        running: bool = False,
        refuse: str | None = None,
        neighbour: int = 0,
        background: bool = False,
        speculative: Callable[[SpecConfig], Script] | None = None,
    ) -> None:
        self.model = model
        self.time = VirtualTime()  # the clock of every wait and timing over this target
        self.host = LocalHost()
        self.adopts_running_original = running
        self.events: list[str] = []
        self.crashes: dict[str, int] = {}  # by service: how many of its starts crashed
        self.token_id_requests = 0  # untimed requests for token ids, over all starts
        self.serving: ScriptedService | None = None
        self.beside: ScriptedService | None = None  # a second server on BESIDE
        self.besides: dict[str, ScriptedService] = {}  # every server beside, by its api_base
        self.streams: list[tuple[str, float, float]] = []  # (service, start, end) of each stream
        self.counters: dict[str, float] = {}
        self.in_flight = 0
        self._refuse = refuse
        self.neighbour = neighbour  # another client: its requests left, one per request of ours
        self.background = background  # another client, sending on its own all along
        self._scripts = candidates or {}
        self._speculative = speculative  # a candidate's script from its config (a search's)
        self.candidates: list[ScriptedService] = []  # every candidate service made
        self.specs: list[SpecConfig] = []  # what each was made from
        self._original = ScriptedService(self, "original", original)
        if running:
            self._original.start()
            self.events.clear()

    # -- Target -------------------------------------------------------------------------------
    def preflight(self) -> None:
        if self._refuse:
            raise ConfigError(self._refuse)

    def before_swap(self) -> None:
        self.events.append("before swap")

    def original(self) -> ScriptedService:
        return self._original

    def candidate(self, spec: SpecConfig) -> ScriptedService:
        script = self._scripts.get(spec.name)
        if script is None:
            script = self._speculative(spec) if self._speculative else Script()
        service = ScriptedService(self, spec.name, script)
        self.candidates.append(service)
        self.specs.append(spec)
        return service

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        return ["measure the original", *(f"start candidate {s.name}" for s in specs)]

    def vllm_facts(self, progress=None) -> VllmFacts:
        raise VllmFactsError("a scripted target has no vLLM to ask")

    def transports(self) -> Transports:
        return Transports(
            httpx.MockTransport(self._answer),
            httpx.MockTransport(self._stream),
            clock=self.time.clock,
        )

    def hand_over(self, reason: str) -> str | None:
        return None  # nothing on a host: the controller restores by itself

    def await_host_restore(self, timeout_s: float, progress: Progress) -> None:
        return None

    def reachable(self) -> bool:
        return True

    def after_restore(self) -> list[str]:
        return []

    def close(self) -> None:
        self.events.append("close")

    def start_beside(self, spec: SpecConfig, place: int = 1) -> ScriptedService:
        """A candidate's server beside the serving original, on its own port (BESIDE for the
        first place, the next ports for more)."""
        script = self._scripts.get(spec.name) or Script()
        api_base = BESIDE if place == 1 else f"http://scripted.invalid:{8000 + place}"
        service = ScriptedService(self, spec.name, script, api_base=api_base)
        self.events.append(f"start {spec.name} beside")
        service.starts, service.started_at, service.active = 1, self.time.now, True
        self.besides[api_base] = service
        self.beside = self.beside or service
        return service

    def stop_beside(self) -> None:
        for service in self.besides.values():
            self.events.append(f"stop {service.name} beside")
            service.active = False
        self.besides.clear()
        self.beside = None

    # -- the API ------------------------------------------------------------------------------
    def _route(self, request: httpx.Request) -> ScriptedService | None:
        for api_base, service in self.besides.items():
            if str(request.url).startswith(api_base):
                return service
        return self.serving

    def _answer(self, request: httpx.Request) -> httpx.Response:
        service = self._route(request)
        if service is None or not service.ready():
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": self.model}]})
        if path == "/version":
            return httpx.Response(200, json={"version": "0.32.0"})
        if path == "/metrics":
            if self.background:  # between two scrapes, another client's request finished
                self._add("requests", 1)
                self._add("generation_tokens", 20)
            return httpx.Response(200, text=self._metrics(service))
        if path == "/v1/chat/completions" and service.script.token_ids:
            return self._token_ids(service, json.loads(request.content))
        return httpx.Response(404)

    def _token_ids(self, service: ScriptedService, body: dict[str, Any]) -> httpx.Response:
        """An untimed greedy request: the stream's text, one id per token (100 + word index)."""
        self.token_id_requests += 1
        prompt = body["messages"][0]["content"]
        speed = service.script.speed(prompt)
        n = min(speed.tokens, body["max_tokens"])
        words = speed.text.split()
        text = "".join(t for _, t in _chunks(speed))  # what the stream sends, as one text
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "length" if n == body["max_tokens"] else "stop",
            "token_ids": [100 + i % len(words) for i in range(n)],
        }
        prompt_ids = [1, *(10 + i for i, _ in enumerate(prompt.split())), 2]
        return httpx.Response(200, json={"choices": [choice], "prompt_token_ids": prompt_ids})

    async def _stream(self, request: httpx.Request) -> httpx.Response:
        service = self._route(request)
        if service is None or not service.ready():
            raise httpx.ConnectError("connection refused", request=request)
        body = json.loads(request.content)
        prompt = body["messages"][0]["content"]
        speed = service.script.speed(prompt)
        if service.starts > 1 and service.script.restarted is not None:
            speed = service.script.restarted.get(prompt, speed)
        if service.script.crowded and len(self.besides) > 1:  # slowed by idle neighbours
            slower = 1 + service.script.crowded * (len(self.besides) - 1)
            speed = dataclasses.replace(speed, gap_s=speed.gap_s * slower)
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=self._events(service, speed, len(prompt.split())),
        )

    async def _events(self, service: ScriptedService, speed: Speed, prompt_tokens: int
                      ) -> AsyncIterator[bytes]:  # fmt: skip
        def event(choices: list[dict[str, Any]], done: int) -> bytes:
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": done}
            data = {"choices": choices, "usage": usage}
            return f"data: {json.dumps(data)}\n\n".encode()

        self.in_flight += 1
        start = self.time.now
        try:
            await asyncio.sleep(speed.ttft_s)  # vLLM sends the role with the first token's step
            yield event([{"index": 0, "delta": {"role": "assistant"}}], 0)
            done = 0
            steps = 0
            for step, text in _chunks(speed):
                if done:
                    batch = 1 + service.script.batch_cost * (self.in_flight - 1)
                    await asyncio.sleep(speed.gap_s * batch)
                    steps += 1
                    self._count_step(service, step - 1)
                done += step
                yield event([{"index": 0, "delta": {"content": text}}], done)
        finally:
            self.in_flight -= 1
            self.streams.append((service.name, start, self.time.now))
        self._add("requests", 1)
        self._add("prompt_tokens", prompt_tokens)
        self._add("generation_tokens", done)
        if self.neighbour:  # someone else's request finished meanwhile
            self.neighbour -= 1
            self._add("requests", 1)
            self._add("generation_tokens", 7)
        self._add("decode_steps", steps)
        yield event([], done)
        yield b"data: [DONE]\n\n"

    def _count_step(self, service: ScriptedService, accepted: int) -> None:
        k = service.script.speeds and max(
            s.tokens_per_chunk for s in service.script.speeds.values()
        )
        drafted = service.script.drafted or (k - 1 if k else 0)
        if drafted < 1 or service.name == "original":
            return
        self._add("drafts", 1)
        self._add("draft_tokens", drafted)
        self._add("accepted", accepted)
        for position in range(accepted):
            self._add(f"pos{position}", 1)

    def _add(self, name: str, value: float) -> None:
        self.counters[name] = self.counters.get(name, 0.0) + value

    def _metrics(self, service: ScriptedService) -> str:
        c = self.counters
        lines = [
            f"vllm:request_success_total {c.get('requests', 0.0)}",
            f"vllm:prompt_tokens_total {c.get('prompt_tokens', 0.0)}",
            f"vllm:generation_tokens_total {c.get('generation_tokens', 0.0)}",
            f"vllm:inter_token_latency_seconds_count {c.get('decode_steps', 0.0)}",
            "vllm:num_requests_running 0.0",
            "vllm:num_requests_waiting 0.0",
        ]
        if service.name != "original":
            lines += [
                f"vllm:spec_decode_num_drafts_total {c.get('drafts', 0.0)}",
                f"vllm:spec_decode_num_draft_tokens_total {c.get('draft_tokens', 0.0)}",
                f"vllm:spec_decode_num_accepted_tokens_total {c.get('accepted', 0.0)}",
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} '
                    f"{c.get(f'pos{i}', 0.0)}"
                    for i in range(4)
                ),
            ]
        return "\n".join(lines) + "\n"


def _chunks(speed: Speed) -> list[tuple[int, str]]:
    """(tokens, text) of each chunk a service streams for one prompt."""
    words = speed.text.split()
    out, done = [], 0
    while done < speed.tokens:
        step = 1 if done == 0 else min(speed.tokens_per_chunk, speed.tokens - done)
        done += step
        out.append((step, " ".join(words[(done - step) % len(words) : done % len(words) or None])))
    return out


NEVER = math.inf


def measure_arms(
    target: ScriptedTarget, s: Settings, where: Path, *arms: str, probe: Probe | None = None
) -> RunStore:
    """The experiment over a scripted target: each arm measured in order, stored under
    `where/run`; returns the store once the restore has run. `probe`: the serving host's
    samples, scripted (tests/unit/measure/test_host_load.py)."""
    (where / "run").mkdir()
    store = RunStore(where / "run", record(s))
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=target.transports().sync, clock=target.time.clock,
    ) as board:  # fmt: skip
        exp = Experiment(
            s, board, store, progress=lambda _: None, transports=target.transports(), probe=probe
        )
        for arm in arms:
            exp.arm(arm)
    return store
