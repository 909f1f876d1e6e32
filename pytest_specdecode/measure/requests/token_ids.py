"""Token ids of a baseline request, for the offline n-gram replay. Never inside a timed request.

What vLLM 0.32 offers (checked on the embedded CPU server, `/version` 0.32.0):

- ``"return_token_ids": true`` on a chat or completions request returns ``prompt_token_ids`` (the
  prompt after the chat template, equal to what ``/tokenize`` gives) and, per choice,
  ``token_ids``. The output ids include the EOS token when the request stopped on it (it is
  counted in ``usage.completion_tokens``). Streaming carries ``token_ids`` on every chunk.
- ``/tokenize`` with ``messages`` (chat, with the generation prompt) or ``prompt``.
- ``"logprobs": true`` with ``"return_tokens_as_token_ids": true`` names each output token
  ``token_id:N``: the fallback for servers without ``return_token_ids``.
- Unknown request fields are ignored (HTTP 200), so support is detected from the response.
- At temperature 0 the first max_tokens ids of a request for max_tokens + L tokens equal those
  of a request for max_tokens: one untimed request yields the output and L look-ahead tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ...errors import RequestError
from ...record.requests.samples import RequestSample
from ...record.requests.token_capture import (
    CapturedTokens,
    OutputSource,
    PromptSource,
    TokenIds,
    TokenIdSupport,
)
from .loadgen import RequestSpec

# Greedy tokens recorded past max_tokens. The last step of a request with k draft tokens checks
# at most k - 1 of them (its first draft token is always an output token), so 8 make every
# config of the grid (k <= 8) exact.
LOOKAHEAD = 8

# Untimed requests sent together: they are independent, and a server batches them.
_TOGETHER = 8


def record_token_ids(
    spec: RequestSpec,
    timed: Mapping[str, RequestSample | None],
    *,
    lookahead: int = LOOKAHEAD,
    headers: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> TokenIds:
    """The ids of each prompt in `timed` (prompt text -> its first timed request).

    A timed request that streamed its own ids (vLLM's `return_token_ids`) gives prompt and
    output: only the look-ahead is asked, `lookahead` tokens past the output, for all such
    prompts at once. Otherwise one untimed request per prompt asks for output and look-ahead,
    one at a time (batched outputs can differ on a CPU build), checked against the timed text.
    A server that offers no ids gives the reason instead.
    """
    found = TokenIds()
    try:
        own = {prompt: _streamed(sample, spec) for prompt, sample in timed.items()}
        going_on = [p for p, ids in own.items() if ids is not None and _needs_lookahead(ids, spec)]
        with ThreadPoolExecutor(max_workers=max(1, min(_TOGETHER, len(going_on)))) as pool:
            ahead = pool.map(
                lambda p: _with_lookahead(own[p], spec, lookahead, headers, transport), going_on
            )
            own.update(zip(going_on, ahead, strict=True))
        for prompt, sample in timed.items():
            found.prompts[prompt] = own[prompt] or capture_token_ids(
                replace(spec, prompt=prompt),
                lookahead=lookahead,
                reference_text=sample.text if sample is not None else None,
                headers=headers,
                transport=transport,
            )
    except Exception as exc:  # an extra: it never fails the measurement, it says why not
        text = str(exc) if isinstance(exc, RequestError) else f"{type(exc).__name__}: {exc}"
        return TokenIds(missing=text)
    with _client(spec, headers, transport) as client:
        found.max_model_len = _max_model_len(client, spec)
        found.block_size, found.prefix_caching = _cache_config(client, spec)
    return found


def _streamed(sample: RequestSample | None, spec: RequestSpec) -> CapturedTokens | None:
    """The timed request's own ids, when its stream carried all of them."""
    if sample is None or not sample.prompt_ids or not sample.output_ids:
        return None
    if len(sample.output_ids) != sample.output_tokens or len(sample.output_ids) > spec.max_tokens:
        return None  # a chunk without ids: not the whole output
    return CapturedTokens(
        prompt_ids=tuple(sample.prompt_ids),
        output_ids=tuple(sample.output_ids),
        lookahead_ids=(),
        finish_reason=sample.finish_reason,
        support=TokenIdSupport(output="return_token_ids", prompt="return_token_ids"),
        consistent=True,
        check="the timed request's own streamed ids",
    )


def _needs_lookahead(own: CapturedTokens, spec: RequestSpec) -> bool:
    """Only an output cut at max_tokens goes on; one that ended on EOS or a stop has no next."""
    if own.finish_reason is not None:
        return own.finish_reason == "length"
    return len(own.output_ids) >= spec.max_tokens


def _with_lookahead(
    own: CapturedTokens,
    spec: RequestSpec,
    lookahead: int,
    headers: Mapping[str, str] | None,
    transport: httpx.BaseTransport | None,
) -> CapturedTokens:
    """The greedy continuation of prompt + output: one untimed completions request of
    `lookahead` tokens, the prompt given as token ids (the chat template already applied)."""
    payload: dict[str, Any] = {
        "model": spec.model,
        "prompt": [*own.prompt_ids, *own.output_ids],
        "max_tokens": lookahead,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    if spec.ignore_eos:
        payload["ignore_eos"] = True
    url = f"{spec.api_base}/v1/completions"
    with _client(spec, headers, transport) as client:
        body = _post(client, url, payload, "look-ahead request")
    ids = _int_list(body["choices"][0].get("token_ids"))
    if ids is None:
        raise RequestError(f"{url} gave no look-ahead token ids: {str(body)[:300]}")
    return replace(
        own,
        lookahead_ids=tuple(ids[:lookahead]),
        check=f"{own.check}; look-ahead: the greedy continuation of prompt and output",
    )


def capture_token_ids(
    spec: RequestSpec,
    *,
    lookahead: int = 8,
    reference_ids: Sequence[int] | None = None,
    reference_text: str | None = None,
    headers: Mapping[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
) -> CapturedTokens:
    """One untimed, non-streaming greedy request for max_tokens + `lookahead` tokens.

    Its first max_tokens ids are the output, the rest the look-ahead. They are checked against
    the timed output: `reference_ids` (ids of a streamed request) must be equal, or else
    `reference_text` must be a prefix of this request's text. On a mismatch the look-ahead is
    dropped and `consistent` is False: the baseline was not reproducible.
    """
    if spec.temperature != 0:
        raise RequestError(
            f"{spec.api_base}: token ids are only replayable at temperature 0, "
            f"not {spec.temperature:g}"
        )
    with _client(spec, headers, transport) as client:
        body = _complete(client, spec, max_tokens=spec.max_tokens + lookahead, logprobs=False)
        choice = _choice(body, spec)
        output_source: OutputSource = "return_token_ids"
        ids = _int_list(choice.get("token_ids"))
        if ids is None:  # an older server: ask again with logprobs
            body = _complete(client, spec, max_tokens=spec.max_tokens + lookahead, logprobs=True)
            choice = _choice(body, spec)
            ids = _ids_from_logprobs(choice)
            output_source = "logprobs"
        if ids is None:
            raise RequestError(
                f"{spec.api_base}: the server returned no output token ids (neither "
                "`return_token_ids` nor logprobs with `return_tokens_as_token_ids`)"
            )
        prompt_source: PromptSource = "return_token_ids"
        prompt = _prompt_ids(body, spec)
        if prompt is None:
            prompt = _tokenize(client, spec)
            prompt_source = "tokenize"
        if prompt is None:
            raise RequestError(
                f"{spec.api_base}: the server returned no prompt token ids (neither "
                "`prompt_token_ids` with `return_token_ids` nor /tokenize)"
            )
    finish = choice.get("finish_reason")
    output, ahead = ids[: spec.max_tokens], ids[spec.max_tokens :]
    consistent, check = _check(output, _choice_text(choice), reference_ids, reference_text)
    return CapturedTokens(
        prompt_ids=tuple(prompt),
        output_ids=tuple(output),
        lookahead_ids=tuple(ahead) if consistent else (),
        finish_reason=str(finish) if finish is not None else None,
        support=TokenIdSupport(output=output_source, prompt=prompt_source),
        consistent=consistent,
        check=check,
    )


# --- helpers ---------------------------------------------------------------------------------


def _client(
    spec: RequestSpec, headers: Mapping[str, str] | None, transport: httpx.BaseTransport | None
) -> httpx.Client:
    return httpx.Client(
        headers=dict(headers or {}), transport=transport, timeout=httpx.Timeout(spec.timeout_s)
    )


def _complete(
    client: httpx.Client, spec: RequestSpec, *, max_tokens: int, logprobs: bool
) -> dict[str, Any]:
    url, payload = spec.url_and_payload()
    payload = {k: v for k, v in payload.items() if k not in ("stream", "stream_options")}
    payload.update(max_tokens=max_tokens, temperature=0.0, return_token_ids=True)
    if logprobs:
        payload.update(return_tokens_as_token_ids=True)
        payload["logprobs"] = True if spec.endpoint == "chat" else 1
    return _post(client, url, payload, "token-id request")


def _post(client: httpx.Client, url: str, payload: Mapping[str, Any], what: str) -> dict[str, Any]:
    """One untimed request; its answer, which has choices, or a RequestError saying why not."""
    try:
        response = client.post(url, json=payload)
    except httpx.HTTPError as exc:
        raise RequestError(
            f"{url}: the {what} failed ({type(exc).__name__}: {exc or 'no detail'})"
        ) from None
    if response.status_code != 200:
        raise RequestError(
            f"{url} answered HTTP {response.status_code} to the {what}: {response.text[:300]}"
        )
    body = response.json()
    if not isinstance(body, dict) or not body.get("choices"):
        raise RequestError(f"{url}: the {what}'s answer has no choices")
    return body


def _choice(body: Mapping[str, Any], spec: RequestSpec) -> Mapping[str, Any]:
    choice = body["choices"][0]
    if not isinstance(choice, Mapping):
        raise RequestError(f"{spec.api_base}: a choice of the token-id answer is not an object")
    return choice


def _prompt_ids(body: Mapping[str, Any], spec: RequestSpec) -> list[int] | None:
    """Chat answers carry prompt_token_ids at the top, completions in the choice."""
    ids = _int_list(body.get("prompt_token_ids"))
    if ids is None:
        ids = _int_list(_choice(body, spec).get("prompt_token_ids"))
    return ids


def _tokenize(client: httpx.Client, spec: RequestSpec) -> list[int] | None:
    """The prompt's ids from /tokenize, templated as the request is; None when unavailable."""
    _, payload = spec.url_and_payload()
    request: dict[str, Any] = {"model": spec.model}
    if spec.endpoint == "chat":
        request.update(messages=payload["messages"], add_generation_prompt=True)
    else:
        request.update(prompt=payload["prompt"], add_special_tokens=True)
    try:
        response = client.post(f"{spec.api_base}/tokenize", json=request)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return _int_list(response.json().get("tokens"))


def _max_model_len(client: httpx.Client, spec: RequestSpec) -> int | None:
    """From /v1/models (vLLM's model card carries it); None when the server does not say."""
    try:
        response = client.get(f"{spec.api_base}/v1/models")
        cards = response.json().get("data") if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for card in cards if isinstance(cards, list) else ():
        if isinstance(card, Mapping) and card.get("id") == spec.model:
            value = card.get("max_model_len")
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def _cache_config(client: httpx.Client, spec: RequestSpec) -> tuple[int | None, bool | None]:
    """(KV block size, prefix caching on) from the `vllm:cache_config_info` gauge's labels."""
    try:
        response = client.get(f"{spec.api_base}/metrics")
    except httpx.HTTPError:
        return None, None
    if response.status_code != 200:
        return None, None
    try:
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name == "vllm:cache_config_info":
                    size = sample.labels.get("block_size", "")
                    caching = sample.labels.get("enable_prefix_caching")
                    return (
                        int(size) if size.isdigit() else None,
                        {"True": True, "False": False}.get(caching or ""),
                    )
    except ValueError:
        return None, None
    return None, None


def _ids_from_logprobs(choice: Mapping[str, Any]) -> list[int] | None:
    """Output ids from logprobs named ``token_id:N`` (chat: content[]; completions: tokens[])."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, Mapping):
        return None
    if isinstance(logprobs.get("content"), list):
        names = [entry.get("token") for entry in logprobs["content"]]
    elif isinstance(logprobs.get("tokens"), list):
        names = list(logprobs["tokens"])
    else:
        return None
    ids = []
    for name in names:
        if not (isinstance(name, str) and name.startswith("token_id:")):
            return None
        try:
            ids.append(int(name.removeprefix("token_id:")))
        except ValueError:
            return None
    return ids


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return None
    return list(value)


def _choice_text(choice: Mapping[str, Any]) -> str:
    message = choice.get("message")
    if isinstance(message, Mapping):
        return str(message.get("content") or "")
    return str(choice.get("text") or "")


def _check(
    output: Sequence[int],
    text: str,
    reference_ids: Sequence[int] | None,
    reference_text: str | None,
) -> tuple[bool, str]:
    if reference_ids is not None:
        if list(output) == list(reference_ids):
            return True, "ids equal the timed output's"
        same = next(
            (i for i, (a, b) in enumerate(zip(output, reference_ids, strict=False)) if a != b),
            min(len(output), len(reference_ids)),
        )
        return False, (
            f"ids differ from the timed output's from token {same} "
            f"({len(output)} vs {len(reference_ids)} tokens)"
        )
    if reference_text is not None:
        if text.startswith(reference_text):
            return True, "the timed output's text is a prefix of this request's text"
        return False, "the timed output's text is not a prefix of this request's text"
    return True, "not compared with a timed output"
