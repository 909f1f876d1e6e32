"""Another client on the real CPU vLLM while the candidate is measured: never a clean verdict."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from ..support.embedded import MODEL, require_embedded, write_experiment
from ..support.pipes import finish

NEIGHBOUR_PROMPT = "Repeat this line four times: the cat sat on the mat by the door."


def neighbour(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Ordinary chat requests, one after another, as a colleague's client would send; this
    one repeats itself, so n-gram speculation drafts on it too."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": NEIGHBOUR_PROMPT}],
        "max_tokens": 32,
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
            # The neighbour never stops: each wait for quiet runs to its limit, then the round is
            # measured anyway. One look (traffic_watch_s) is all the wait needs to show that; 8 s
            # cost 5 rounds x ~8 s more (a CI run: 160 s).
            "quiet_wait_s": 2.0,
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
        out, rest = finish(proc, 900)
    finally:
        stop.set()
    err = "".join(lines) + rest
    assert sent, "the neighbour sent nothing:\n" + "".join(lines)[-3000:]
    assert proc.returncode == pytest.ExitCode.TESTS_FAILED, out + err
    # Caught in a round of the window, sent again, still busy: kept and marked, never a verdict.
    round_ = r"\[ngram\] round \d+: "
    assert re.search(round_ + "other clients used the server during the window", err), err
    assert re.search(round_ + r"measuring again \(attempt 2 of 2\) once the server is quiet", err)
    assert re.search(round_ + "kept, marked contaminated", err), err
    assert "no verdict for ngram (contaminated)" in out
    data = exp.results()
    m = data["phases"]["ngram"]["measurements"]["coding"]
    assert m["foreign"] and len(m["discarded"]) == 5
    verdict = data["analysis"]["verdicts"]["ngram"]["coding"]
    assert verdict["verdict"] == "contaminated" and verdict["contaminated"]
    assert_own_acceptance_unchanged(data, verdict)
    # The baseline's window, before the neighbour began, was clean.
    assert data["phases"]["baseline"]["measurements"]["coding"]["foreign"] is None
    assert exp.leftover_servers() == []


def assert_own_acceptance_unchanged(data: dict, verdict: dict) -> None:
    """The neighbour's requests move the counters, not the candidate's own figures: each timed
    request (kept or set aside) reports its own drafts, and they are exactly what the replay of
    its own output gives, step by step, as on a quiet server."""
    m = data["phases"]["ngram"]["measurements"]["coding"]
    for s in [*m["samples"], *m["discarded"]]:
        assert s["spec_decode"] is not None and s["output_ids"], s["index"]
    own = m["summary"]["request_acceptance"]
    assert own is not None and m["summary"]["request_check"] is None  # no check: not quiet
    # The verdict's acceptance is the requests' own, although the window is contaminated...
    for name in ("drafts", "draft_tokens", "accepted"):
        assert verdict["acceptance"][name] == own[name]
    # ... while the counters over the window also counted the neighbour's drafts.
    assert m["acceptance"]["drafts"] > own["drafts"], (m["acceptance"], own)
    (entry,) = [
        e for e in data["analysis"]["acceptance_by_level"]["levels"] if e["key"] == "coding"
    ]
    assert entry["source"] == "requests"
    assert entry["own_steps"]["agreeing"] == entry["own_steps"]["requests"] == len(m["samples"])
