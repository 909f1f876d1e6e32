"""Drift within a start (analysis/variance/time_drift.py): AR(1) drift beside the request's own
noise, from each start's residuals in time order; what an A/A run writes of it to the host
profile."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.variance.time_drift import (
    TimeDrift,
    block_sd,
    drift_of,
    drift_text,
    sent_in_blocks,
    start_residuals,
)
from pytest_specdecode.analysis.verdict import noise
from pytest_specdecode.record.profile import (
    Accelerator,
    HostProfile,
    ProfileEntry,
    add_entry,
    read_profile,
)
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report.rows import checks

from ....support.chain import Route, SimHost, aa_entries

DATA = Path(__file__).resolve().parents[3] / "data"
H200_AA = DATA / "vllm-0.26-h200-aa-blocked.results.json"


def _ar1(rng: np.random.Generator, n: int, phi: float, sd: float) -> np.ndarray:
    x = np.empty(n)
    x[0] = rng.normal(0.0, sd)
    steps = rng.normal(0.0, sd * np.sqrt(1 - phi**2), n)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + steps[i]
    return x


@pytest.mark.parametrize(("phi", "sd"), [(0.75, 0.10), (0.5, 0.05)])
def test_ar1_drift_beside_request_noise_is_recovered(phi: float, sd: float) -> None:
    """40 starts of 48 requests, drift AR(1) plus 6% white request noise: phi within 0.12 and
    the drift's SD within 15% (each about 3 of their standard errors over seeds)."""
    rng = np.random.default_rng(4)
    series = [_ar1(rng, 48, phi, sd) + rng.normal(0, 0.06, 48) for _ in range(40)]
    found = drift_of(series)
    assert found is not None
    assert found.phi == pytest.approx(phi, abs=0.12)
    assert found.sd == pytest.approx(sd, rel=0.15)
    assert found.noise_sd == pytest.approx(0.06, rel=0.2)
    # the lag-1 autocorrelation is the drift's share times phi (less what each start's mean took)
    assert found.lag1 == pytest.approx(phi * sd**2 / (sd**2 + 0.06**2), abs=0.08)


def test_white_request_noise_is_not_called_drift() -> None:
    """No drift: what is fitted as drift is the lag-1 sampling noise over the least phi
    (about 0.023 of autocorrelation over 0.3), under a fifth of the residual variance."""
    rng = np.random.default_rng(5)
    found = drift_of([rng.normal(0, 0.05, 48) for _ in range(40)])
    assert found is not None
    assert found.sd**2 < 0.2 * found.residual_sd**2
    assert abs(found.lag1) < 0.06


def test_a_start_shift_is_never_drift() -> None:
    """Each start about its own mean: start shifts of 50% and no drift leave the request
    noise alone (4%), and no drift beyond its sampling noise (as above)."""
    rng = np.random.default_rng(6)
    series = [rng.normal(0, 0.5) + rng.normal(0, 0.04, 48) for _ in range(20)]
    found = drift_of(series)
    assert found is not None
    assert found.residual_sd == pytest.approx(0.04, rel=0.1)
    assert found.sd**2 < 0.2 * found.residual_sd**2


def test_block_sd_is_the_ar1_means_sd() -> None:
    """Against the mean of 8 consecutive values of a long simulated AR(1)."""
    rng = np.random.default_rng(7)
    x = _ar1(rng, 400_000, 0.75, 0.10)
    means = x[: x.size // 8 * 8].reshape(-1, 8).mean(axis=1)
    assert block_sd(0.10, 0.75, 8) == pytest.approx(float(means.std()), rel=0.03)
    assert block_sd(0.10, 0.0, 8) == pytest.approx(0.10 / np.sqrt(8))


def test_the_h200_aa_run_drifts_within_its_blocked_starts() -> None:
    """A real A/A run (vLLM 0.26, one H200, 4 starts of 4 prompt types x 12 requests sent one
    block after another): its residuals in time order are positively correlated, as a plain
    per-start computation confirms, and the order is seen to be blocked."""
    record = RunRecord.from_json(json.loads(H200_AA.read_text()))
    found = noise.drift_of_run(record)
    assert found is not None and found.blocked is True
    assert found.starts == 4 and found.requests == 192
    phases = list(record.phases.values())
    _, gap = start_residuals(phases)
    # independently: per start, the log values about their prompt type's mean, lag-1 r pooled
    plain = []
    for phase in phases:
        timed = sorted(
            (s.started_at, key, np.log(s.tokens_per_s))
            for key, m in phase.measurements.items()
            for s in m.samples
        )
        logs = np.array([v for _, _, v in timed])
        keys = [k for _, k, _ in timed]
        for k in set(keys):
            mask = np.array([x == k for x in keys])
            logs[mask] -= logs[mask].mean()
        plain.append(logs)
    r = sum(np.dot(s[:-1], s[1:]) for s in plain) / sum(np.dot(s, s) for s in plain)
    assert r > 0.1 and found.lag1 > 0.1
    assert found.sd > 0.02 and 0.3 <= found.phi < 0.98
    assert gap == found.seconds_per_request and 0.1 < gap < 2.0
    assert "one block after another" in drift_text(found)


def test_interleaved_starts_are_not_blocked(tmp_path: Path) -> None:
    host = SimHost(start_sd=0.02, drift_sd=0.05)
    (blocked,) = aa_entries(host, Route(aa_runs=1, aa_repeats=2), runs=1, seed=1, tmp=tmp_path)
    (mixed,) = aa_entries(
        host, Route(aa_runs=1, aa_repeats=2, design="interleaved"), runs=1, seed=1, tmp=tmp_path
    )
    assert blocked.drift and mixed.drift
    assert TimeDrift.from_dict(blocked.drift["throughput"]).blocked is True
    assert TimeDrift.from_dict(mixed.drift["throughput"]).blocked is False
    assert sent_in_blocks([]) is None


@pytest.mark.parametrize("design", ["blocked", "interleaved"])
def test_an_aa_run_writes_restart_noise_and_drift_apart(design: str, tmp_path: Path) -> None:
    """Simulated A/A runs of 8 starts on a host with 4.6% restart noise and 8% drift (phi
    0.75), each read back from the host profile it wrote: the drift pooled over 12 runs is
    within 20% of the truth, its phi within 0.15."""
    host = SimHost(start_sd=0.046, drift_sd=0.08)
    entries = aa_entries(
        host, Route(aa_runs=1, aa_repeats=4, design=design), runs=12, seed=2, tmp=tmp_path
    )
    drifts = [TimeDrift.from_dict(e.drift["throughput"]) for e in entries if e.drift]
    assert len(drifts) == 12 and all(e.noise["throughput"]["df"] == 7 for e in entries)
    pooled = noise.pooled_drift(drifts)
    assert pooled.sd == pytest.approx(0.08, rel=0.2)
    assert pooled.phi == pytest.approx(0.75, abs=0.15)


def test_a_profile_entry_keeps_its_drift_and_an_older_one_reads_without(tmp_path: Path) -> None:
    drift = TimeDrift(0.06, 0.7, 0.4, 0.08, 192, 4, 0.5, True)
    restart = {"sd": 0.05, "df": 7.0, "source": "8 server starts", "measured": True}
    written = ProfileEntry(
        run="aa", date="2026-12-02T14:00:00+00:00", vllm_version="0.26.0", gpus=None,
        starts=8, noise={"throughput": restart}, drift={"throughput": drift.to_dict()},
    )  # fmt: skip
    h200 = Accelerator("gpu", "NVIDIA H200", 1)
    path = add_entry(tmp_path, "gpu-host", h200, "m", written)
    back = read_profile(tmp_path, "gpu-host", h200, "m")
    assert back == HostProfile("gpu-host", "m", h200, (written,))
    assert TimeDrift.from_dict(back.entries[0].drift["throughput"]) == drift
    assert noise.drift_from_profile(back, version="0.26.0")["throughput"] == drift
    # a file written before drift was measured: the same version number, no "drift" key
    data = json.loads(path.read_text())
    del data["entries"][0]["drift"]
    path.write_text(json.dumps(data))
    old = read_profile(tmp_path, "gpu-host", h200, "m")
    assert old is not None and old.entries[0].drift is None
    assert old.entries[0].noise == written.noise
    assert noise.drift_from_profile(old, version="0.26.0") == {}


def test_the_reports_check_states_restart_noise_and_drift_apart() -> None:
    """The H200 A/A run's report: its restart noise (start effects), then its drift within a
    start, and that the blocked order counted drift as restart noise."""
    record = RunRecord.from_json(json.loads(H200_AA.read_text()))
    analysis = analyze(record)
    assert set(analysis.time_drift) == {"throughput", "tpot"}
    (line,) = [
        c.text for c in checks(record, analysis) if c.text.startswith("Restart noise measured "
        "by this run, throughput")
    ]  # fmt: skip
    assert "(start effects); drift " in line and "lag-1 r = 0.6" in line
    assert "counted as restart noise" in line
    assert (
        analysis.to_json()["time_drift"]["throughput"]["sd"] == analysis.time_drift["throughput"].sd
    )
