"""The experiment: measure each phase once, on demand, into the run record as it goes."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import httpx

from ..config.settings import PromptType, Settings
from ..config.specconfig import SpecConfig
from ..record.schema import BASELINE, BASELINE_AFTER, Measurement, Phase, RunRecord
from ..record.store import RunStore
from ..targets.base import Progress, Service, Transports
from ..targets.lifecycle import Switchboard
from .loadgen import RequestSpec, run_requests
from .server_metrics import (
    Acceptance,
    ServerCounters,
    acceptance_between,
    parse_counters,
    traffic_between,
)
from .token_ids import record_token_ids


class Experiment:
    """Phases measured on demand, each exactly once, the baseline always first."""

    def __init__(
        self,
        settings: Settings,
        board: Switchboard,
        store: RunStore,
        *,
        progress: Progress,
        headers: Mapping[str, str] | None = None,
        transports: Transports | None = None,
    ) -> None:
        self.settings = settings
        self.board = board
        self.store = store
        self.progress = progress
        self.headers = dict(headers or {})
        self._transports = transports or Transports()
        self._measured = set(store.record.phases)  # a reused baseline is already there
        self._errors: dict[str, Exception] = {}

    @property
    def record(self) -> RunRecord:
        return self.store.record

    def candidate(self, name: str) -> SpecConfig:
        for spec in self.settings.candidates:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def phase(self, name: str) -> Phase:
        """A phase's measurements. A phase that failed fails again at once: no second reload."""
        if name in self._measured:
            return self.record.phases[name]
        if name in self._errors:
            raise self._errors[name]
        try:
            if name != BASELINE:
                self.phase(BASELINE)
            spec = None if name == BASELINE else self.candidate(name)
            self._measure(name, name, spec)
        except Exception as exc:
            self._errors[name] = exc
            self.record.failures[name] = _first_line(exc)
            self.store.flush()
            raise
        return self.record.phases[name]

    def baseline_after(self) -> Phase:
        """The original measured once more, after the candidates: the drift check (ABA)."""
        if BASELINE_AFTER not in self._measured:
            self._measure(BASELINE_AFTER, BASELINE_AFTER, None)
        return self.record.phases[BASELINE_AFTER]

    def _measure(self, name: str, arm: str, spec: SpecConfig | None) -> None:
        service = self.board.activate(spec)
        phase = Phase(
            name=name,
            arm=arm,
            spec=dict(spec.values) if spec else None,
            service=service.label,
            server_version=self._version(service),
        )
        self.record.phases[name] = phase
        self.store.flush()
        for prompt_type in self.settings.prompt_types.values():
            self._measure_prompt_type(phase, prompt_type, service)
        self._measured.add(name)
        self.store.flush()

    def _measure_prompt_type(self, phase: Phase, prompt_type: PromptType, service: Service) -> None:
        run = self.settings.run
        name = prompt_type.name
        self.progress(
            f"[{phase.name}] {name}: {run.warmup} warm-up + {run.samples} requests of up to "
            f"{prompt_type.max_tokens} tokens"
        )
        measurement = Measurement(prompt_type=name, concurrency=run.concurrency)
        phase.measurements[name] = measurement
        request = RequestSpec(
            api_base=service.api_base,
            model=service.model,
            prompt=prompt_type.prompt,
            max_tokens=prompt_type.max_tokens,
            endpoint=run.endpoint,
            ignore_eos=run.ignore_eos,
            timeout_s=run.request_timeout_s,
            read_timeout_s=run.read_timeout_s,
        )

        def send(count: int, warmup: bool) -> float:
            kept = measurement.warmup if warmup else measurement.samples

            def keep(sample):  # as it comes: journalled at once
                kept.append(sample)
                self.store.add_sample(phase.name, sample)

            _, wall = asyncio.run(
                run_requests(
                    request,
                    prompt_type=name,
                    phase=phase.name,
                    count=count,
                    warmup=warmup,
                    concurrency=run.concurrency,
                    headers=self.headers,
                    on_sample=keep,
                    transport=self._transports.async_,
                )
            )
            return wall

        if run.warmup:
            send(run.warmup, True)
        before = self._counters(service)
        wall = send(run.samples, False)
        after = self._counters(service)
        measurement.wall_s = wall
        measurement.acceptance = acceptance_between(before, after)
        measurement.traffic = traffic_between(before, after)
        self.store.flush()
        if phase.arm != BASELINE_AFTER:  # the n-gram replay's input, outside the timed window
            last = measurement.samples[-1].text if measurement.samples else None
            measurement.token_ids = record_token_ids(
                request,
                {prompt_type.prompt: last},  # distinct prompt -> a timed output of it
                headers=self.headers,
                transport=self._transports.sync,
            )
            self.store.flush()
            ids = measurement.token_ids
            self.progress(
                f"[{phase.name}] {name}: token ids of {len(ids.prompts)} prompt(s) recorded "
                "(untimed)"
                if ids.missing is None
                else f"[{phase.name}] {name}: no token ids ({ids.missing})"
            )
        self.progress(
            f"[{phase.name}] {name}: median {measurement.median_tokens_per_s:.1f} tok/s, "
            f"TPOT {measurement.median_tpot_ms:.1f} ms" + _acceptance_text(measurement.acceptance)
        )

    def _counters(self, service: Service) -> ServerCounters:
        text = self._get(service, "/metrics")
        return parse_counters(text) if text is not None else ServerCounters()

    def _version(self, service: Service) -> str | None:
        text = self._get(service, "/version")
        if text is None:
            return None
        try:
            return str(httpx.Response(200, text=text).json().get("version"))
        except ValueError:
            return text.strip()[:80]

    def _get(self, service: Service, path: str) -> str | None:
        try:
            with httpx.Client(transport=self._transports.sync, headers=self.headers) as client:
                response = client.get(f"{service.api_base}{path}", timeout=10)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _acceptance_text(acc: Acceptance) -> str:
    if not acc.present or acc.mean_acceptance_length is None:
        return ""
    rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
    return (
        f"; acceptance length {acc.mean_acceptance_length:.2f}, draft acceptance "
        f"{acc.draft_acceptance_rate:.1%}, per position [{rates}]"
    )
