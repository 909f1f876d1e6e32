"""What a service backend provides, and the bounded, talkative wait until one is ready."""

from __future__ import annotations

import inspect
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from ..clock import MACHINE, Clock
from ..config.specconfig import SpecConfig, VllmFacts
from ..errors import ServiceError, StartDied
from .hosts.base import Host
from .start_failure import (
    failure_lines,
    first_errors,
    last_exception,
    root_cause,
    settled,
    start_cause,
)

Progress = Callable[[str], None]
# A dead start's log is read again every SETTLE_POLL_S until it settles (`start_failure.settled`:
# it stopped growing, and it names a cause beside the engine's death), SETTLE_MOST_S at most
SETTLE_POLL_S = 2.0
SETTLE_MOST_S = 10.0


@dataclass(frozen=True)
class Transports:
    """How the services' API is reached and timed: httpx transports (None means a real network
    connection) and the clock (the machine's, unless a test's seam keeps virtual time)."""

    sync: httpx.BaseTransport | None = None
    async_: httpx.AsyncBaseTransport | None = None
    clock: Clock = MACHINE


class Service(Protocol):
    """One way of running vLLM: the original, or a candidate with speculation."""

    label: str  # e.g. "unit vllm.service on root@gpu:22", used in every message
    api_base: str
    model: str

    def is_active(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def failure(self) -> str | None:
        """Why the service is known to be dead or failing, or None while it may still come up."""
        ...

    def log_tail(self, lines: int = 20) -> list[str]: ...

    def start_log(self) -> list[str]:
        """Every log line of the latest start, oldest first (redacted)."""
        ...

    def settings_log(self) -> list[str]:
        """The lines of the current start that tell the settings it ran with, oldest first
        (record/engine_settings.py); [] where they cannot be read."""
        ...


class Target(Protocol):
    """A deployment: its original service, and candidates derived from it."""

    host_name: str  # as shown in every message, e.g. "root@gpu:22" or "localhost"
    host: Host  # where the services run: facts such as the GPUs are read there
    api_base: str  # where the services' API answers from here (a tunnel's local end, maybe)
    adopts_running_original: bool  # True: the original is measured as it runs, not started
    typical_start_s: float  # a server start, for estimates before any run was stored

    def preflight(self) -> None:
        """Refuse, before anything is touched, what would make the experiment unsafe."""
        ...

    def vllm_facts(self, progress: Progress | None = None) -> VllmFacts:
        """The version, speculative methods and keys of the vLLM this target runs.

        Asked of the server's own Python without loading a model; reads, never changes.
        Raises VllmFactsError (targets/facts/vllm.py) where that Python cannot tell.
        """
        ...

    def before_swap(self) -> None:
        """Called before the serving service is stopped (the systemd backend arms a watchdog)."""
        ...

    def original(self) -> Service: ...

    def candidate(self, spec: SpecConfig) -> Service: ...

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        """The steps the experiment would take, readable before anything is touched."""
        ...

    def room_beside(self, spec: SpecConfig) -> str | None:
        """`--spec-arms together`: None where a second server with `spec` fits beside the
        original; else why not (the host, the figures). Reads only. A backend without it
        refuses: `room_beside` below. A backend that serves several beside the original at
        once takes `of`, how many."""
        ...

    def beside(self, spec: SpecConfig) -> Service:
        """The second server, with `spec`, on its own port (and cores or GPU share); not yet
        started. Its `placement`, where it has one, says where it runs. With several beside at
        once: `place` (1..of) of `of`."""
        ...

    def transports(self) -> Transports:
        """How to reach the API: real connections, unless a test's seam says otherwise."""
        ...

    def hand_over(self, reason: str) -> str | None:
        """On the first interrupt, from a thread: start putting the original back at once, in a
        way that completes without this controller. Says what it started, or None."""
        ...

    def await_host_restore(self, timeout_s: float, progress: Progress) -> None:
        """After hand_over: block until what it started has finished."""
        ...

    def reachable(self) -> bool:
        """Whether the host answers at all (a restore waits out a reboot)."""
        ...

    def after_restore(self) -> list[str]:
        """Once the original serves again: what else to put back; notes for the report."""
        ...

    def close(self) -> None:
        """Undo what this run did on the host (nothing else), then let go of it."""
        ...


def room_beside(target: Target, spec: SpecConfig, *, of: int = 1) -> str | None:
    """The target's answer, or a refusal where its backend cannot run `of` servers beside the
    original at once."""
    method = getattr(target, "room_beside", None)
    if method is None:
        return (
            f"the {type(target).__name__} backend on {target.host_name} cannot serve a second "
            "server beside the original; use --spec-arms one-at-a-time"
        )
    if of == 1:
        return method(spec)
    if "of" not in inspect.signature(method).parameters:
        return (
            f"the {type(target).__name__} backend on {target.host_name} serves one server "
            f"beside the original at a time, not {of}; use [run] beside = 1"
        )
    return method(spec, of=of)


def port_answers(api_base: str) -> bool:
    """Whether something accepts TCP connections on the API's host and port."""
    parts = urlsplit(api_base)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex((parts.hostname or "127.0.0.1", port)) == 0


def wait_until_ready(
    service: Service,
    *,
    timeout_s: float,
    progress: Progress,
    poll_s: float = 1.0,
    report_every_s: float = 15.0,
    headers: dict[str, str] | None = None,
    transport: httpx.BaseTransport | None = None,
    clock: Clock = MACHINE,
) -> float:
    """Block until /health answers and /v1/models lists the model; returns the seconds waited."""
    start = clock.now()
    last_report = start
    progress(f"waiting for {service.label} at {service.api_base} (up to {timeout_s:.0f}s)")
    with httpx.Client(timeout=5.0, headers=headers, transport=transport) as client:
        while True:
            elapsed = clock.now() - start
            reason = service.failure()
            if reason:  # the cause, once the dying server (or its journal) has written it
                raise start_died(service, reason, elapsed, settled_log(service, clock))
            if _serves(client, service):
                progress(f"{service.label} ready after {elapsed:.0f}s")
                return elapsed
            if elapsed > timeout_s:
                raise ServiceError(
                    f"{service.label} not ready after {timeout_s:.0f}s "
                    f"(no healthy /health and /v1/models at {service.api_base})"
                    + _tail_text(service.label, service.log_tail(30))
                )
            if clock.now() - last_report >= report_every_s:
                last_report = clock.now()
                tail = service.log_tail(1)
                progress(
                    f"  … {elapsed:.0f}s elapsed, waiting for {service.label}; "
                    f"last log line: {tail[-1][:160] if tail else '(none yet)'}"
                )
            clock.sleep(poll_s)


def _serves(client: httpx.Client, service: Service) -> bool:
    try:
        if client.get(f"{service.api_base}/health").status_code != 200:
            return False
        response = client.get(f"{service.api_base}/v1/models")
    except httpx.HTTPError:
        return False
    if response.status_code in (401, 403):
        raise ServiceError(
            f"{service.label} refuses the API key (HTTP {response.status_code} on /v1/models): "
            "set [target] api_key_env to the variable that holds the server's key"
        )
    if response.status_code != 200:
        return False
    served = [m.get("id") for m in response.json().get("data", [])]
    if service.model not in served:
        raise ServiceError(
            f"{service.label} is up but serves {served}, not the configured model "
            f"{service.model!r}; fix `model` in the config"
        )
    return True


def settled_log(service: Service, clock: Clock = MACHINE) -> list[str]:
    """A dead start's whole log, once it settled (`SETTLE_POLL_S`, `SETTLE_MOST_S`): a retry is
    decided on its cause, not on which of its lines came first."""
    lines = _whole_log(service)
    waited = 0.0
    while waited < SETTLE_MOST_S:
        clock.sleep(SETTLE_POLL_S)
        waited += SETTLE_POLL_S
        again = _whole_log(service)
        if settled(lines, again):
            return again
        lines = again
    return lines


def start_died(
    service: Service, reason: str, elapsed: float, whole: Sequence[str] | None = None
) -> StartDied:
    """A start that died before it served: its text (`start_failure_text`), its cause, and
    whether vLLM refused its configuration (`start_failure.start_cause`), from `whole`, its
    settled log (read now where not given)."""
    whole = _whole_log(service) if whole is None else list(whole)
    found = start_cause(whole)
    return StartDied(
        start_failure_text(service, reason, elapsed, whole),
        cause=found.cause or last_exception(service.log_tail(30)) or reason,
        after_s=elapsed,
        refused=found.refused,
    )


def _whole_log(service: Service) -> list[str]:
    return service.start_log() if hasattr(service, "start_log") else service.log_tail(30)


def start_failure_text(
    service: Service, reason: str, elapsed: float, whole: Sequence[str] | None = None
) -> str:
    """Why a start failed: the root cause first, then the first error of every process of the
    server (API server, engine core, workers) from the start's whole log, then its tail."""
    tail = service.log_tail(30)
    whole = _whole_log(service) if whole is None else whole  # a hook's own may keep none
    errors = first_errors(whole)
    root = root_cause(errors)
    if root is not None:
        head = f"{root.process}: {root.text} ({reason})"
    else:
        cause = last_exception(tail)
        head = f"{cause} ({reason})" if cause else reason
    text = f"{service.label} failed while starting, after {elapsed:.0f}s: {head}"
    if len(errors) > 1:
        text += (
            f"\nfirst error of each server process, from the {len(whole)} log lines of this "
            "start:\n" + "\n".join(failure_lines(errors))
        )
    return text + _tail_text(service.label, tail)


def _tail_text(label: str, tail: Sequence[str]) -> str:
    if not tail:
        return ""
    return f"\n--- last {len(tail)} log lines of {label} ---\n" + "\n".join(tail)
