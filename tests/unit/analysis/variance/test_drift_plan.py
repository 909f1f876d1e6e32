"""The plan's lever where the host's drift is known (analysis/verdict/design.py → levers,
report/plan_reach.py → lever_lines): a longer window, interleaving or arms side by side where drift
dominates, more starts where restarts do; each with its cost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_specdecode.analysis.variance.restarts import RestartNoise
from pytest_specdecode.analysis.variance.time_drift import TimeDrift, block_sd
from pytest_specdecode.analysis.verdict.design import drift_variance, levers, start_only
from pytest_specdecode.analysis.verdict.noise import as_prior
from pytest_specdecode.report.plan_reach import design_lines
from pytest_specdecode.report.schedule import Timing

from ....support.synthetic import settings

SIDE = "arms side by side (where the host holds both servers)"
TYPES = ("coding", "math", "structured", "explanatory")


def _seconds(starts: int, requests: int, together: bool) -> float:
    """60 s per server start (two per start per arm, none extra side by side's second) and
    0.5 s per request of 4 prompt types."""
    per_start = 60.0 * (1 if together else 2)
    return starts * (per_start + 2 * len(TYPES) * requests * 0.5)


def _drift(sd: float, *, blocked: bool = True) -> TimeDrift:
    # an A/A run of 8 starts, 4 prompt types x 12 requests: 48 per start
    return TimeDrift(sd, 0.75, 0.4, (sd**2 + 0.04**2) ** 0.5, 384, 8, 0.4, blocked)


def _plan(s, noise: dict[str, RestartNoise], drift: TimeDrift | None) -> list[str]:
    """The plan's design lines for these settings, from one stored run's timing."""
    return design_lines(
        s, noise, detect=None, timing=Timing(60.0, 0.01, "stored runs"),
        baseline=True, aba=False, adopts_original=False, drift=drift,
    )  # fmt: skip


def _measured(sd: float) -> dict[str, RestartNoise]:
    found = RestartNoise(sd, 7.0, "an A/A run of 8 starts", residual=0.04**2)
    return {"throughput": found, "tpot": found}


def test_a_blocked_aa_runs_restart_noise_loses_the_drift_it_counted() -> None:
    drift = _drift(0.10)
    counted = block_sd(0.10, 0.75, 12) ** 2
    assert start_only(_measured(0.12)["throughput"], drift, keys=4) == pytest.approx(
        0.12**2 - counted
    )
    assert start_only(_measured(0.12)["throughput"], _drift(0.10, blocked=False), keys=4) == (
        pytest.approx(0.12**2)
    )
    # interleaved, a key's requests are 4 apart: far less of the drift stays in its mean
    assert drift_variance(drift, 12, order="interleaved", keys=4) < 0.5 * counted
    # side by side: the analysis by pairs takes the drift the pair shares out of each slot
    assert drift_variance(drift, 12, order="together", keys=4) == 0.0


def test_where_drift_dominates_the_lever_is_not_more_starts(tmp_path: Path) -> None:
    """Restart noise 1% beside a 10% drift (phi 0.75), blocked: interleaving or arms side by
    side call a 20% change at fewer starts than more starts of the blocked order; side by side
    at no more starts than interleaved, and cheaper (a pair's servers start at once)."""
    s = settings(tmp_path, prompt_types=TYPES, samples=12, run_extra='order = "blocked"')
    noise = _measured((0.01**2 + block_sd(0.10, 0.75, 12) ** 2) ** 0.5)
    found = {lever.what: lever for lever in levers(s, noise, _drift(0.10), 0.2, seconds=_seconds)}
    cheapest = min(found.values(), key=lambda lever: lever.seconds)
    assert cheapest.what in ("the prompt types interleaved", SIDE)
    assert found[SIDE].starts < found["more starts"].starts
    interleaved = found["the prompt types interleaved"]
    assert found[SIDE].starts <= interleaved.starts and found[SIDE].seconds < interleaved.seconds
    assert all(lever.detectable <= 0.2 for lever in found.values())


def test_where_restarts_dominate_a_longer_window_does_not_help(tmp_path: Path) -> None:
    """Restart noise 8% and hardly any drift: a longer window cannot call 20% at one start per
    arm, and side by side needs as many starts as one at a time."""
    s = settings(tmp_path, prompt_types=TYPES, samples=12)
    found = {
        lever.what: lever
        for lever in levers(s, _measured(0.08), _drift(0.005), 0.2, seconds=_seconds)
    }
    assert "a longer window" not in found
    assert found[SIDE].starts == found["more starts"].starts > 1


def test_the_plan_states_restarts_drift_and_the_cheapest_lever(tmp_path: Path) -> None:
    s = settings(tmp_path, prompt_types=TYPES, samples=12)
    text = "\n".join(_plan(s, _measured(0.05), _drift(0.10)))
    assert "restart noise 5.0% (start effects), drift 10.0% within a start (lag-1 r = 0.40" in text
    assert "cheapest lever to call a 20% change with 80% power: " in text
    assert "lever" not in "\n".join(_plan(s, _measured(0.05), None))
    assert text.startswith("this host: restart noise 5.0%") or "\nthis host: restart" in text


def test_another_machines_noise_and_drift_are_named_a_prior(tmp_path: Path) -> None:
    s = settings(tmp_path, prompt_types=TYPES, samples=12)
    prior = {metric: as_prior(noise) for metric, noise in _measured(0.05).items()}
    text = "\n".join(_plan(s, prior, _drift(0.10)))
    assert "a prior from another machine: restart noise 5.0% (start effects), drift 10.0%" in text
    assert "restart noise: a prior of 5.0% from another machine (weighted as 7 df)" in text
    assert "this host:" not in text and "restart noise assumed" not in text


def test_a_design_that_already_calls_the_change_is_not_offered_as_a_lever(tmp_path: Path) -> None:
    """Three starts per arm at hardly any noise call 20% already: the plan says so, with the
    drift counted, and names no lever (a user would rerun what they just ran)."""
    s = settings(tmp_path, prompt_types=TYPES, samples=12, run_extra="repeats = 3")
    lines = _plan(s, _measured(0.01), _drift(0.02))
    text = "\n".join(lines)
    assert "this design calls a 20% change with 80% power, the drift counted: ±" in text
    assert "cheapest lever" not in text
    said = next(i for i, line in enumerate(lines) if line.startswith("this design calls"))
    assert all(line.startswith("  cheaper, ") for line in lines[said + 1 :])


def test_what_the_design_can_call_counts_the_drift_as_the_lever_line_does(tmp_path: Path) -> None:
    """The plan's first figure and its lever line are one figure where drift is known (they
    were ±17.9% and ±19.0% for one design), and the drift widens it."""
    s = settings(tmp_path, prompt_types=TYPES, samples=12, run_extra="repeats = 3")
    call = re.compile(r"can call with 80% power: throughput ±([\d.]+)%( \(the drift counted\))?")
    without = call.search("\n".join(_plan(s, _measured(0.03), None)))
    text = "\n".join(_plan(s, _measured(0.03), _drift(0.09)))
    counted = call.search(text)
    assert without and not without.group(2) and counted and counted.group(2), text
    assert float(counted.group(1)) > float(without.group(1))
    lever = re.search(r"this design calls a 20% change .*the drift counted: ±([\d.]+)%", text)
    assert lever and lever.group(1) == counted.group(1), text
