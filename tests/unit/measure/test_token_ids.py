"""Token-id capture against stand-in servers (httpx.MockTransport) shaped like vLLM 0.32's answers.

The real server is exercised in tests/real_vllm/test_prediction_real.py; these check the logic:
what is sent, the fallbacks for older servers, the look-ahead split and the check against the
timed run.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest

from pytest_specdecode.errors import RequestError
from pytest_specdecode.measure.requests.loadgen import RequestSpec
from pytest_specdecode.measure.requests.token_ids import capture_token_ids, record_token_ids
from pytest_specdecode.record.requests.samples import RequestSample
from pytest_specdecode.record.requests.token_capture import TokenIdSupport

API = "http://vllm.test"
PROMPT_IDS = [1, 9690, 198, 2683, 2]
GREEDY = [48825, 365, 8241, 3211, 6288, 14743, 25, 284, 48440, 365, 3706, 257]  # 12 tokens


def spec(max_tokens: int = 8, endpoint: str = "chat") -> RequestSpec:
    return RequestSpec(api_base=API, model="m", prompt="Explain TCP.", max_tokens=max_tokens,
                       endpoint=endpoint)  # type: ignore[arg-type]  # fmt: skip


class StandIn:
    """A stand-in vLLM: greedy output GREEDY (then EOS 2 if `eos_at`), features switchable."""

    def __init__(self, *, token_ids: bool = True, tokenize: bool = True, eos_at: int | None = None):
        self.token_ids, self.tokenize, self.eos_at = token_ids, tokenize, eos_at
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self.barrier: threading.Barrier | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        self.requests.append((request.url.path, body))
        if request.url.path == "/tokenize":
            if not self.tokenize:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json={"count": 5, "tokens": PROMPT_IDS})
        if request.url.path in ("/v1/models", "/metrics"):
            return httpx.Response(404)
        if self.barrier is not None:
            self.barrier.wait()  # raises when the requests do not arrive together
        ids = GREEDY if self.eos_at is None else [*GREEDY[: self.eos_at], 2]
        if isinstance(body.get("prompt"), list):  # a continuation: prompt and output as ids
            ids = ids[len(body["prompt"]) - len(PROMPT_IDS) :]
        ids = ids[: body["max_tokens"]]
        finish = "stop" if self.eos_at is not None and len(ids) <= self.eos_at + 1 else "length"
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        text = "".join(f"<{i}>" for i in ids)
        if request.url.path == "/v1/chat/completions":
            choice["message"] = {"role": "assistant", "content": text}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"token": f"token_id:{i}"} for i in ids]}
        else:
            choice["text"] = text
            if body.get("logprobs"):
                choice["logprobs"] = {"tokens": [f"token_id:{i}" for i in ids]}
        answer: dict[str, Any] = {"choices": [choice]}
        if self.token_ids and body.get("return_token_ids"):
            choice["token_ids"] = ids
            if request.url.path == "/v1/chat/completions":
                answer["prompt_token_ids"] = PROMPT_IDS
            else:
                choice["prompt_token_ids"] = PROMPT_IDS
        return httpx.Response(200, json=answer)


def test_return_token_ids_gives_prompt_output_and_lookahead_in_one_request():
    server = StandIn()
    got = capture_token_ids(spec(8), lookahead=4, transport=server.transport())
    assert got.prompt_ids == tuple(PROMPT_IDS)
    assert got.output_ids == tuple(GREEDY[:8]) and got.lookahead_ids == tuple(GREEDY[8:12])
    assert got.support == TokenIdSupport("return_token_ids", "return_token_ids")
    assert got.consistent and got.finish_reason == "length"
    ((path, body),) = server.requests
    assert path == "/v1/chat/completions" and body["max_tokens"] == 12
    assert body["return_token_ids"] is True and body["temperature"] == 0.0
    assert "stream" not in body and body["messages"] == [
        {"role": "user", "content": "Explain TCP."}
    ]


def test_completions_endpoint_carries_prompt_ids_in_the_choice():
    got = capture_token_ids(spec(8, "completions"), lookahead=2, transport=StandIn().transport())
    assert got.prompt_ids == tuple(PROMPT_IDS) and got.output_ids == tuple(GREEDY[:8])


def test_older_server_falls_back_to_logprobs_and_tokenize():
    server = StandIn(token_ids=False)
    got = capture_token_ids(spec(8), lookahead=2, transport=server.transport())
    assert got.output_ids == tuple(GREEDY[:8]) and got.lookahead_ids == tuple(GREEDY[8:10])
    assert got.prompt_ids == tuple(PROMPT_IDS)
    assert got.support == TokenIdSupport("logprobs", "tokenize")
    paths = [p for p, _ in server.requests]
    assert paths == ["/v1/chat/completions", "/v1/chat/completions", "/tokenize"]
    tokenize = server.requests[2][1]
    assert tokenize["messages"][0]["content"] == "Explain TCP."
    assert tokenize["add_generation_prompt"] is True
    assert server.requests[1][1]["return_tokens_as_token_ids"] is True


def test_no_ids_at_all_is_an_error_naming_the_server():
    server = StandIn(token_ids=False)

    def without_logprobs(request: httpx.Request) -> httpx.Response:
        response = server.handle(request)
        data = response.json()
        if "choices" in data:
            data["choices"][0].pop("logprobs", None)
        return httpx.Response(response.status_code, json=data)

    with pytest.raises(RequestError, match=r"http://vllm.test: the server returned no output"):
        capture_token_ids(spec(), transport=httpx.MockTransport(without_logprobs))
    with pytest.raises(RequestError, match="no prompt token ids"):
        capture_token_ids(spec(), transport=StandIn(token_ids=False, tokenize=False).transport())


def test_eos_before_max_tokens_leaves_no_lookahead():
    got = capture_token_ids(spec(8), lookahead=4, transport=StandIn(eos_at=5).transport())
    assert got.output_ids == (*GREEDY[:5], 2) and got.lookahead_ids == ()
    assert got.finish_reason == "stop"


def test_lookahead_checked_against_the_timed_output():
    ok = capture_token_ids(spec(8), reference_ids=GREEDY[:8], transport=StandIn().transport())
    assert ok.consistent and ok.lookahead_ids and ok.check == "ids equal the timed output's"
    bad_ids = [*GREEDY[:3], 7, *GREEDY[4:8]]
    bad = capture_token_ids(spec(8), reference_ids=bad_ids, transport=StandIn().transport())
    assert not bad.consistent and bad.lookahead_ids == () and "from token 3" in bad.check
    by_text = capture_token_ids(
        spec(8), reference_text="<48825><365>", transport=StandIn().transport()
    )
    assert by_text.consistent and "prefix" in by_text.check
    other = capture_token_ids(spec(8), reference_text="<1>", transport=StandIn().transport())
    assert not other.consistent and other.lookahead_ids == ()


def test_http_errors_and_temperature_refused():
    failing = httpx.MockTransport(lambda r: httpx.Response(500, text="engine dead"))
    with pytest.raises(RequestError, match="HTTP 500 to the token-id request: engine dead"):
        capture_token_ids(spec(), transport=failing)
    warm = RequestSpec(api_base=API, model="m", prompt="p", max_tokens=4, temperature=0.7)
    with pytest.raises(RequestError, match="only replayable at temperature 0"):
        capture_token_ids(warm, transport=StandIn().transport())


def timed(prompt: str, output: list[int] | None, finish: str | None) -> RequestSample:
    """A timed request as the load generator keeps it, with or without its streamed ids."""
    return RequestSample(
        prompt_type="t", phase="baseline", index=0, warmup=False, started_at=0.0, ttft_s=0.1,
        e2e_s=1.0, output_tokens=len(output or GREEDY[:8]), prompt_tokens=5, chunks=8,
        text="".join(f"<{i}>" for i in (output or GREEDY[:8])),
        prompt_ids=PROMPT_IDS if output else None, output_ids=output, finish_reason=finish,
    )  # fmt: skip


def test_streamed_ids_cost_only_the_lookahead_asked_for_all_prompts_at_once():
    server = StandIn()
    server.barrier = threading.Barrier(3, timeout=10)  # three look-aheads, all in flight together
    prompts = {f"p{i}": timed(f"p{i}", GREEDY[:8], "length") for i in range(3)}
    got = record_token_ids(spec(8), prompts, lookahead=4, transport=server.transport())
    assert got.missing is None and list(got.prompts) == ["p0", "p1", "p2"]
    for ids in got.prompts.values():
        assert ids.output_ids == tuple(GREEDY[:8]) and ids.lookahead_ids == tuple(GREEDY[8:12])
        assert ids.prompt_ids == tuple(PROMPT_IDS) and ids.consistent
        assert "own streamed ids" in ids.check
    asked = [body for path, body in server.requests if path == "/v1/completions"]
    assert len(asked) == 3 == len(server.requests) - 2  # and /v1/models, /metrics
    assert all(b["prompt"] == PROMPT_IDS + GREEDY[:8] and b["max_tokens"] == 4 for b in asked)


def test_an_output_that_ended_on_eos_needs_no_request_and_one_without_ids_is_asked_whole():
    server = StandIn()
    prompts = {
        "ended": timed("ended", [*GREEDY[:5], 2], "stop"),
        "no ids": timed("no ids", None, None),
    }
    got = record_token_ids(spec(8), prompts, lookahead=4, transport=server.transport())
    assert got.prompts["ended"].lookahead_ids == () and got.prompts["ended"].finish_reason == "stop"
    whole = got.prompts["no ids"]
    assert whole.lookahead_ids == tuple(GREEDY[8:12]) and "prefix" in whole.check
    asked = [(path, body["max_tokens"]) for path, body in server.requests if body]
    assert asked == [("/v1/chat/completions", 12)]  # only the prompt without streamed ids


def test_a_failed_lookahead_request_leaves_the_reason_not_an_error():
    failing = httpx.MockTransport(lambda r: httpx.Response(500, text="engine dead"))
    prompts = {"p": timed("p", GREEDY[:8], "length")}
    got = record_token_ids(spec(8), prompts, transport=failing)
    assert got.prompts == {} and "HTTP 500" in (got.missing or "")
    assert "engine dead" in (got.missing or "")
