"""The experiment: measure each phase once, keep every sample, compare candidates to baseline."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..analysis.stats import Comparison, Verdict, compare_family
from ..config.settings import Settings, Workload
from ..config.specconfig import SpecConfig
from ..record.store import ResultsFile
from ..targets.base import Progress, Service
from ..targets.lifecycle import Switchboard
from .loadgen import RequestSample, RequestSpec, run_requests
from .server_metrics import (
    Acceptance,
    SpecCounters,
    acceptance_between,
    client_accepted_tokens,
    combine,
    cross_check,
    parse_spec_counters,
)

BASELINE = "baseline"
BASELINE_AFTER = "baseline-after"  # the original measured again, last (the ABA drift check)


@dataclass
class WorkloadMeasurement:
    workload: str
    samples: list[RequestSample]
    wall_s: float
    acceptance: Acceptance

    @property
    def tokens_per_s(self) -> list[float]:
        return [s.tokens_per_s for s in self.samples]

    @property
    def tpot_ms(self) -> list[float]:
        return [s.tpot_s * 1000 for s in self.samples if s.tpot_s is not None]

    @property
    def median_tokens_per_s(self) -> float:
        return statistics.median(self.tokens_per_s)

    @property
    def median_tpot_ms(self) -> float:
        return statistics.median(self.tpot_ms) if self.tpot_ms else float("nan")

    @property
    def output_throughput(self) -> float:
        """Output tokens over the wall time of the measured requests (vLLM bench's figure)."""
        return sum(s.output_tokens for s in self.samples) / self.wall_s

    @property
    def client_accepted(self) -> int | None:
        """Accepted tokens as the client saw them; None without per-chunk usage."""
        if any(s.tokens_per_chunk is None for s in self.samples):
            return None
        return sum(client_accepted_tokens(s.tokens_per_chunk or []) for s in self.samples)

    def summary(self) -> dict[str, Any]:
        return {
            "n": len(self.samples),
            "median_tokens_per_s": self.median_tokens_per_s,
            "median_tpot_ms": self.median_tpot_ms,
            "mean_tpot_ms": statistics.fmean(self.tpot_ms) if self.tpot_ms else None,
            "mean_ttft_ms": statistics.fmean(s.ttft_s * 1000 for s in self.samples),
            "output_throughput": self.output_throughput,
            "wall_s": self.wall_s,
            "client_accepted_tokens": self.client_accepted,
            "acceptance": self.acceptance.to_dict(),
        }


@dataclass
class PhaseResult:
    name: str
    spec: SpecConfig | None
    measurements: dict[str, WorkloadMeasurement] = field(default_factory=dict)
    server_version: str | None = None

    @property
    def acceptance(self) -> Acceptance:
        return combine([m.acceptance for m in self.measurements.values()])


@dataclass(frozen=True)
class WorkloadVerdict:
    """One prompt type: candidate against baseline on throughput and TPOT."""

    workload: str
    candidate: str
    baseline: WorkloadMeasurement
    measured: WorkloadMeasurement
    throughput: Comparison
    tpot: Comparison
    acceptance_disagreement: str | None

    @property
    def regressed(self) -> bool:
        return Verdict.REGRESSED in (self.throughput.verdict, self.tpot.verdict)

    @property
    def insufficient(self) -> bool:
        return Verdict.INSUFFICIENT in (self.throughput.verdict, self.tpot.verdict)

    @property
    def verdict(self) -> str:
        if self.regressed:
            return Verdict.REGRESSED.value
        if self.insufficient:
            return Verdict.INSUFFICIENT.value
        if Verdict.IMPROVED in (self.throughput.verdict, self.tpot.verdict):
            return Verdict.IMPROVED.value
        return Verdict.NO_DIFFERENCE.value

    def row(self) -> str:
        """A row like the seed's table."""
        t, p, acc = self.throughput, self.tpot, self.measured.acceptance
        length = f"{acc.mean_acceptance_length:.2f}" if acc.mean_acceptance_length else "n/a"
        return (
            f"{self.workload}: {t.baseline_median:.1f} -> {t.candidate_median:.1f} tok/s "
            f"({t.change:+.1%}, p_adj={t.p_adjusted:.3g}, 95% CI of ratio "
            f"[{t.ratio_ci[0]:.3f}, {t.ratio_ci[1]:.3f}]); TPOT {p.baseline_median:.1f} -> "
            f"{p.candidate_median:.1f} ms ({p.change:+.1%}, p_adj={p.p_adjusted:.3g}); "
            f"acceptance length {length}; verdict: {self.verdict}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "candidate": self.candidate,
            "verdict": self.verdict,
            "throughput": self.throughput.to_dict(),
            "tpot": self.tpot.to_dict(),
            "acceptance": self.measured.acceptance.to_dict(),
            "acceptance_disagreement": self.acceptance_disagreement,
            "row": self.row(),
        }


class Experiment:
    """Phases measured on demand, each exactly once, the baseline always first."""

    def __init__(
        self,
        settings: Settings,
        board: Switchboard,
        results: ResultsFile,
        *,
        progress: Progress,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.board = board
        self.results = results
        self.progress = progress
        self.headers = dict(headers or {})
        self.phases: dict[str, PhaseResult] = {}
        self.failures: dict[str, Exception] = {}
        self._verdicts: dict[str, dict[str, WorkloadVerdict]] = {}

    def candidate(self, name: str) -> SpecConfig:
        for spec in self.settings.candidates:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def phase(self, name: str) -> PhaseResult:
        """A phase's measurements. A phase that failed fails again at once: no second reload."""
        if name in self.phases:
            return self.phases[name]
        if name in self.failures:
            raise self.failures[name]
        try:
            if name != BASELINE:
                self.phase(BASELINE)
            spec = None if name == BASELINE else self.candidate(name)
            service = self.board.activate(spec)
            self.phases[name] = self._measure(name, spec, service)
        except Exception as exc:
            self.failures[name] = exc
            raise
        return self.phases[name]

    def baseline_after(self) -> PhaseResult:
        """The original measured once more, after the candidates: the drift check (ABA)."""
        if BASELINE_AFTER not in self.phases:
            service = self.board.activate(None)
            self.phases[BASELINE_AFTER] = self._measure(BASELINE_AFTER, None, service)
        return self.phases[BASELINE_AFTER]

    def verdicts(self, candidate: str) -> dict[str, WorkloadVerdict]:
        """Per prompt type, with Holm correction across the prompt types."""
        if candidate in self._verdicts:
            return self._verdicts[candidate]
        base, cand = self.phase(BASELINE), self.phase(candidate)
        assert cand.spec is not None
        run = self.settings.run
        names = list(cand.measurements)
        tput = compare_family(
            {
                w: (base.measurements[w].tokens_per_s, cand.measurements[w].tokens_per_s)
                for w in names
            },
            metric="throughput",
            higher_is_better=True,
            alpha=run.alpha,
            min_effect=run.min_effect,
        )
        tpot = compare_family(
            {w: (base.measurements[w].tpot_ms, cand.measurements[w].tpot_ms) for w in names},
            metric="tpot",
            higher_is_better=False,
            alpha=run.alpha,
            min_effect=run.min_effect,
        )
        out = {
            w: WorkloadVerdict(
                workload=w,
                candidate=candidate,
                baseline=base.measurements[w],
                measured=cand.measurements[w],
                throughput=tput[w],
                tpot=tpot[w],
                acceptance_disagreement=cross_check(
                    cand.measurements[w].acceptance,
                    cand.measurements[w].client_accepted,
                    requests=len(cand.measurements[w].samples),
                    num_speculative_tokens=int(cand.spec.values["num_speculative_tokens"]),
                ),
            )
            for w in names
        }
        self._verdicts[candidate] = out
        self.results.data["verdicts"][candidate] = {w: v.to_dict() for w, v in out.items()}
        self.results.flush()
        return out

    def _measure(self, name: str, spec: SpecConfig | None, service: Service) -> PhaseResult:
        result = PhaseResult(name=name, spec=spec, server_version=self._version(service))
        self.results.set_phase(
            name,
            {
                "spec": spec.values if spec else None,
                "server_version": result.server_version,
                "service": service.label,
                "workloads": {},
            },
        )
        for workload in self.settings.workloads.values():
            self.progress(
                f"[{name}] {workload.name}: {self.settings.run.warmup} warm-up + "
                f"{self.settings.run.samples} requests of up to {workload.max_tokens} tokens"
            )
            measurement = self._measure_workload(name, workload, service)
            result.measurements[workload.name] = measurement
            self.results.data["phases"][name]["workloads"][workload.name] = measurement.summary()
            self.results.flush()
            self.progress(
                f"[{name}] {workload.name}: median {measurement.median_tokens_per_s:.1f} tok/s, "
                f"TPOT {measurement.median_tpot_ms:.1f} ms"
                + _acceptance_text(measurement.acceptance)
            )
        self.results.data["phases"][name]["acceptance"] = result.acceptance.to_dict()
        self.results.flush()
        return result

    def _measure_workload(
        self, phase: str, workload: Workload, service: Service
    ) -> WorkloadMeasurement:
        run = self.settings.run
        request = RequestSpec(
            api_base=service.api_base,
            model=service.model,
            prompt=workload.prompt,
            max_tokens=workload.max_tokens,
            endpoint=run.endpoint,
            ignore_eos=run.ignore_eos,
            timeout_s=run.request_timeout_s,
            read_timeout_s=run.read_timeout_s,
        )

        def send(count: int, warmup: bool) -> tuple[list[RequestSample], float]:
            return asyncio.run(
                run_requests(
                    request,
                    workload=workload.name,
                    phase=phase,
                    count=count,
                    warmup=warmup,
                    concurrency=run.concurrency,
                    headers=self.headers,
                    on_sample=lambda s: self.results.add_sample(s.to_dict()),
                )
            )

        if run.warmup:
            send(run.warmup, True)
        before = self._counters(service)
        samples, wall = send(run.samples, False)
        after = self._counters(service)
        return WorkloadMeasurement(workload.name, samples, wall, acceptance_between(before, after))

    def _counters(self, service: Service) -> SpecCounters:
        text = self._get(service, "/metrics")
        return parse_spec_counters(text) if text is not None else SpecCounters()

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
            response = httpx.get(f"{service.api_base}{path}", headers=self.headers, timeout=10)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None


def _acceptance_text(acc: Acceptance) -> str:
    if not acc.present or acc.mean_acceptance_length is None:
        return ""
    rates = ", ".join(f"{r:.2f}" for r in acc.per_position_rates)
    return (
        f"; acceptance length {acc.mean_acceptance_length:.2f}, draft acceptance "
        f"{acc.draft_acceptance_rate:.1%}, per position [{rates}]"
    )
