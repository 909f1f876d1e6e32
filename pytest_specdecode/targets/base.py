"""What a service backend provides, and the bounded, talkative wait until one is ready."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from ..config.specconfig import SpecConfig
from ..errors import ServiceError

Progress = Callable[[str], None]


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


class Target(Protocol):
    """A deployment: its original service, and candidates derived from it."""

    host_name: str

    def preflight(self) -> None:
        """Refuse, before anything is touched, what would make the experiment unsafe."""
        ...

    def before_swap(self) -> None:
        """Called before the serving service is stopped (the systemd backend arms a watchdog)."""
        ...

    def original(self) -> Service: ...

    def candidate(self, spec: SpecConfig) -> Service: ...

    def plan(self, specs: Sequence[SpecConfig]) -> list[str]:
        """The steps the experiment would take, readable before anything is touched."""
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

    def close(self) -> None: ...


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
) -> float:
    """Block until /health answers and /v1/models lists the model; returns the seconds waited."""
    start = time.monotonic()
    last_report = start
    progress(f"waiting for {service.label} at {service.api_base} (up to {timeout_s:.0f}s)")
    with httpx.Client(timeout=5.0, headers=headers) as client:
        while True:
            elapsed = time.monotonic() - start
            reason = service.failure()
            if reason:
                time.sleep(2)  # let the dying server finish writing its traceback
                raise ServiceError(
                    f"{service.label} failed while starting, after {elapsed:.0f}s: {reason}"
                    + _tail_text(service)
                )
            if _serves(client, service):
                progress(f"{service.label} ready after {elapsed:.0f}s")
                return elapsed
            if elapsed > timeout_s:
                raise ServiceError(
                    f"{service.label} not ready after {timeout_s:.0f}s "
                    f"(no healthy /health and /v1/models at {service.api_base})"
                    + _tail_text(service)
                )
            if time.monotonic() - last_report >= report_every_s:
                last_report = time.monotonic()
                tail = service.log_tail(1)
                progress(
                    f"  … {elapsed:.0f}s elapsed, waiting for {service.label}; "
                    f"last log line: {tail[-1][:160] if tail else '(none yet)'}"
                )
            time.sleep(poll_s)


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


def _tail_text(service: Service, lines: int = 30) -> str:
    tail = service.log_tail(lines)
    if not tail:
        return ""
    return f"\n--- last {len(tail)} log lines of {service.label} ---\n" + "\n".join(tail)
