"""The experiment end to end on the real CPU vLLM (minutes each): the tests that matter."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import pytest

from ..support.embedded import all_samples, write_experiment

PROMPT_TYPES = ["coding", "math", "structured", "explanatory"]


def test_baseline_vs_ngram_end_to_end(pytester: pytest.Pytester) -> None:
    # An impossible TPOT ceiling on one prompt type: exactly those tests must fail.
    exp = write_experiment(
        pytester,
        thresholds="min_tokens_per_s = 1.0\nmax_tpot_ms = 5000",
    )
    text = exp.config.read_text().replace(
        "[prompt_types.structured]\n", "[prompt_types.structured]\nmax_tpot_ms = 0.5\n"
    )
    exp.config.write_text(text)

    result = pytester.runpytest_subprocess(*exp.args("--spec-config", "ngram", "-rA"))
    out = result.stdout.str()
    err = result.stderr.str()
    data = exp.results()

    verdicts = data["analysis"]["verdicts"]["ngram"]
    not_passed = {w for w, v in verdicts.items() if v["verdict"] not in ("improved", "equivalent")}
    expected_failures = {
        "test_tpot_threshold[baseline-structured]",
        "test_tpot_threshold[ngram-structured]",
        *(f"test_speculation_does_not_regress[ngram-{w}]" for w in not_passed),
    }
    failed = set(re.findall(r"^FAILED \S+::(\S+)", out, re.M))
    assert failed == expected_failures, out
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "median TPOT" in out and "above the threshold 0.5 ms" in out

    # One swap per phase: the original, then the candidate; restored to "not running".
    assert err.count("starting local vLLM process") == 2, err
    assert "waiting for local vLLM process 'original'" in err
    assert re.search(r"ready after \d+s", err)
    assert "restored to stopped" in err
    assert exp.leftover_servers() == []

    # The terminal table: one row per prompt type, with a verdict.
    for w in PROMPT_TYPES:
        assert re.search(rf"^{w}\s+ngram\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+%", out, re.M), out
    assert "per-position acceptance [" in out

    # results.json: every request, configs, version, metric deltas, verdicts.
    samples = all_samples(data)
    assert len(samples) == 2 * 4 * (6 + 1)
    assert sum(not s["warmup"] for s in samples) == 2 * 4 * 6
    assert all(s["output_tokens"] > 1 and s["tpot_s"] > 0 for s in samples)
    assert data["candidates"]["ngram"] == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 4,
    }
    assert data["phases"]["baseline"]["server_version"] == "0.32.0"
    assert data["phases"]["baseline"]["acceptance"]["present"] is False
    ngram_acc = data["phases"]["ngram"]["acceptance"]
    assert ngram_acc["present"] is True and ngram_acc["drafts"] > 0
    assert len(ngram_acc["per_position_rates"]) == 5
    for w in PROMPT_TYPES:
        v = verdicts[w]
        assert v["verdict"] in {"improved", "regressed", "equivalent", "inconclusive"}
        assert 0 < v["throughput"]["p_value"] <= 1
        assert (
            v["throughput"]["ratio_ci"][0]
            <= v["throughput"]["ratio"]
            <= v["throughput"]["ratio_ci"][1]
        )
        assert v["acceptance_note"] is None, v
    assert data["restore"]["is_active"] is False


def test_sigterm_mid_measurement_restores_and_keeps_samples(pytester: pytest.Pytester) -> None:
    """A cancelled job's SIGTERM; Ctrl-C's SIGINT is sent on the systemd host
    (real_host/test_remote_host.py, test_production_units.py), through the same handler."""
    sig = signal.SIGTERM
    exp = write_experiment(pytester, run={"samples": 6})
    cmd = [sys.executable, "-m", "pytest", *exp.args("--spec-config", "ngram")]
    proc = subprocess.Popen(
        cmd, cwd=pytester.path, stderr=subprocess.PIPE, text=True, stdout=subprocess.DEVNULL
    )
    lines = []
    deadline = time.monotonic() + 400
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "[baseline] math:" in line:  # coding is measured, math is under way
            break
        assert time.monotonic() < deadline, "".join(lines)
    time.sleep(2)
    proc.send_signal(sig)
    try:
        _, rest = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    err = "".join(lines) + rest
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err
    assert "restored to stopped" in err, err
    assert exp.leftover_servers() == []
    samples = all_samples(exp.results())
    assert sum(s["prompt_type"] == "coding" for s in samples) == 7  # 1 warm-up + 6, all kept
    assert "candidate-ngram" not in err  # interrupted before any swap


def test_candidate_that_dies_at_startup_fails_fast_with_its_log(pytester: pytest.Pytester) -> None:
    # vLLM accepts the JSON but the suffix method needs a package the server lacks: it exits.
    exp = write_experiment(pytester, run={"samples": 5, "warmup": 0})
    result = pytester.runpytest_subprocess(
        *exp.args("--spec-config", "suffix", "--spec-workload", "coding")
    )
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret != 0
    assert "local vLLM process 'candidate-suffix'" in out
    assert "failed while starting" in out and "exited with status" in out
    assert "Arctic Inference is required for suffix decoding" in out  # the log tail
    assert "restored to stopped" in err
    assert exp.leftover_servers() == []


def session_members(sid: int) -> list[str]:
    """Live processes of a session: the server and every worker it started."""
    out = subprocess.run(["ps", "-eo", "pid,sid,stat,args"], capture_output=True, text=True)
    rows = [line.split(None, 3) for line in out.stdout.splitlines()[1:]]
    return [" ".join(r) for r in rows if int(r[1]) == sid and not r[2].startswith("Z")]


def test_sigkilled_controller_leaves_nothing_running(pytester: pytest.Pytester) -> None:
    """The original was not running before the run, so nothing may remain when the controller
    dies without any teardown: not the server, not its engine workers, not the port."""
    exp = write_experiment(pytester, run={"samples": 20})
    cmd = [sys.executable, "-m", "pytest", *exp.args("--spec-workload", "coding")]
    proc = subprocess.Popen(
        cmd, cwd=pytester.path, stderr=subprocess.PIPE, text=True, stdout=subprocess.DEVNULL
    )
    lines = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "[baseline] coding:" in line:
            break
    pid = int(re.search(r"local vLLM process 'original' \(pid (\d+)\)", "".join(lines))[1])
    assert len(session_members(pid)) >= 2, "".join(lines)  # the server and its engine core
    proc.kill()
    proc.wait(30)
    deadline = time.monotonic() + 60
    while session_members(pid) and time.monotonic() < deadline:
        time.sleep(1)
    assert session_members(pid) == [], "".join(lines)
    assert exp.leftover_servers() == []
