"""Drafters with a model on the embedded CPU vLLM 0.32, end to end, in one run: SmolLM2-135M
drafting for itself (`draft_model`: near-full acceptance at temperature 0) is measured as any
candidate, and a draft model cut to its first 6 layers by `specdecode-drafter cut` (near none)
is stopped by the drafter check before its timed windows. The original is restored after both.

One prompt type, outputs of 16 tokens, 5 requests a start (the least a verdict allows): what is
read is the mechanics and the counters, not a verdict (three starts: the cheapest run that holds
both drafters).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from pytest_specdecode.cli.drafter import main as drafter_main

from ..support.embedded import MODEL_DIR, require_embedded, run_suite, write_experiment

RUN = {"samples": 5, "max_samples": 5, "warmup": 0, "max_tokens": 16}
K = 3


def test_a_working_drafter_is_measured_and_a_cut_one_is_stopped_before_its_windows(
    tmp_path: Path,
) -> None:
    require_embedded()
    cut = tmp_path / "smol-6"
    assert drafter_main(["cut", str(MODEL_DIR), str(cut), "--layers", "6"]) == 0
    exp = write_experiment(tmp_path / "run", run=RUN)
    presets = (
        f'itself = {{ method = "draft_model", model = "{MODEL_DIR}", '
        f"num_speculative_tokens = {K} }}\n"
        f'cut = {{ method = "draft_model", model = "{cut}", num_speculative_tokens = {K} }}\n'
    )
    exp.config.write_text(exp.config.read_text().replace("[presets]\n", f"[presets]\n{presets}"))
    began = time.monotonic()
    done = run_suite(
        exp, "--spec-config", "itself", "--spec-config", "cut", "--spec-workload", "coding", "-rA"
    )
    wall = time.monotonic() - began
    out, err = done.stdout, done.stderr
    # shown with -s: the cost CI pays, and the table README.md quotes ("Will a drafter pay?")
    table = out[out.find("speculative decoding: baseline vs candidates") :]
    print(f"one run, three starts: {wall:.0f} s\n{table[: table.find('summary: ')]}")
    assert exp.reports.exists(), (out + err)[-3000:]
    data = exp.results()

    # Before anything restarted: both drafters read and named in the plan.
    assert "candidate itself: draft_model drafter" in out + err, out + err
    assert "candidate cut: draft_model drafter" in out + err and "6 layers" in out + err

    # Three starts, in order; the cut one's check stopped it; restored to "not running".
    starts = re.findall(r"starting local vLLM process '(\S+)'", err)
    assert starts == ["original", "candidate-itself", "candidate-cut"], err
    assert "restored to stopped" in err, err[-3000:]
    assert exp.leftover_servers() == []
    assert data["restore"]["is_active"] is False

    checks = data["drafter_checks"]
    itself, broken = checks["itself"], checks["cut"]
    # The target drafting for itself: near-full acceptance at temperature 0, over enough drafts
    assert itself["verdict"] == "healthy", itself
    assert itself["acceptance"]["draft_tokens"] >= 100, itself
    assert itself["acceptance"]["draft_acceptance_rate"] > 0.8, itself
    # The cut: below the floor, the message names what was accepted and what to check.
    assert broken["verdict"] == "broken", broken
    assert broken["acceptance"]["draft_acceptance_rate"] < broken["floor"], broken
    message = data["failures"]["cut"]
    assert "stopped by the drafter check before its timed windows" in message, message
    assert re.search(r"\d+ of \d+ draft tokens accepted", message), message
    assert "same vocabulary" in out, out  # what to check, in the failed test's message

    # Measured: the working drafter's windows, with its own acceptance; the cut has no window
    phases = data["phases"]
    assert set(phases) == {"baseline", "itself"}, set(phases)
    timed = [s for s in phases["itself"]["measurements"]["coding"]["samples"]]
    assert len(timed) == RUN["samples"], timed
    measured = phases["itself"]["acceptance"]
    assert measured["present"] and measured["draft_acceptance_rate"] > 0.8, measured
    assert len(measured["per_position_rates"]) == K
    assert "[cut] coding" not in err  # no window of the cut one was sent
    check_at = err.index("[cut] drafter check: broken")
    assert err.index("starting local vLLM process 'candidate-cut'") < check_at

    # The cut one's tests error with the check's message; the working one's are the run's.
    errored = set(re.findall(r"^ERROR \S+::(\S+)", out, re.M))
    assert "test_speculation_does_not_regress[cut-coding]" in errored, out
    assert not any("itself" in name for name in errored), out
    assert "itself" not in data["failures"], data["failures"]
    assert done.returncode == pytest.ExitCode.TESTS_FAILED, out[-3000:]
