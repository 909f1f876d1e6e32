"""Another client on the real CPU vLLM while the candidate is measured: never a clean verdict."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import httpx
import pytest

from ..support.embedded import MODEL, require_embedded, write_experiment


def neighbour(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Ordinary chat requests, one after another, as a colleague's client would send."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Name three rivers in Europe."}],
        "max_tokens": 16,
    }
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            try:
                client.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body)
                sent.append(1)
            except httpx.HTTPError:
                time.sleep(0.5)  # between two servers: the next one comes up


def test_a_second_client_during_the_candidates_window_is_caught(pytester: pytest.Pytester):
    require_embedded()
    exp = write_experiment(
        pytester,
        run={
            "samples": 5,
            "max_samples": 5,
            "traffic_attempts": 2,
            "traffic_watch_s": 2.0,
            "quiet_wait_s": 8.0,
        },
    )
    cmd = [
        sys.executable, "-m", "pytest",
        *exp.args("--spec-config", "ngram", "--spec-prompt-type", "coding"),
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=pytester.path, stderr=subprocess.PIPE, text=True,
                            stdout=subprocess.PIPE)  # fmt: skip
    stop, sent = threading.Event(), []
    lines: list[str] = []
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "[ngram] coding:" in line and "warm-up" in line:  # the candidate is up: start
            threading.Thread(target=neighbour, args=(exp.port, stop, sent), daemon=True).start()
            break
    try:
        out, rest = proc.communicate(timeout=900)
    finally:
        stop.set()
    err = "".join(lines) + rest
    assert sent, "the neighbour sent nothing:\n" + "".join(lines)[-3000:]
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out + err
    # Caught in the window, measured again, still busy: kept and marked, never a verdict.
    assert "[ngram] coding: other clients used the server during the window" in err
    assert "[ngram] coding: measuring again (attempt 2 of 2) once the server is quiet" in err
    assert "[ngram] coding: kept, marked contaminated" in err
    assert "no verdict for ngram (contaminated)" in out
    data = exp.results()
    m = data["phases"]["ngram"]["measurements"]["coding"]
    assert m["foreign"] and len(m["discarded"]) == 5
    verdict = data["analysis"]["verdicts"]["ngram"]["coding"]
    assert verdict["verdict"] == "contaminated" and verdict["contaminated"]
    # The baseline's window, before the neighbour began, was clean.
    assert data["phases"]["baseline"]["measurements"]["coding"]["foreign"] is None
    assert exp.leftover_servers() == []
