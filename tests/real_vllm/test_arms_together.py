"""Two embedded vLLM servers side by side (`--spec-arms together`), requests alternating
between them, then Ctrl-C: nothing of either is left, and the restore says what it stopped.

Until the interleave branch's Experiment sends the arms together, the run is
tests/support/arms_together_run.py (Switchboard.together and plain requests). Afterwards the
full run replaces it: `RUN` becomes `[sys.executable, "-m", "pytest",
*exp.args("--spec-config", "ngram", "--spec-arms", "together")]`, the only change; every
line and file this test reads (the plan, the readiness and restore lines, the servers' logs in
the run folder) is the plugin's own in both.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..support.embedded import (
    EmbeddedExperiment,
    processes_mentioning,
    require_embedded,
    write_experiment,
)
from ..support.pipes import finish

DRIVER = Path(__file__).resolve().parents[1] / "support" / "arms_together_run.py"
REQUEST_LINE = "POST /v1/chat/completions HTTP/1.1"
SERVERS = ("original", "beside-ngram")


def run_command(exp: EmbeddedExperiment) -> list[str]:
    return [sys.executable, str(DRIVER), str(exp.config), "ngram"]


def port_free(port: int) -> bool:
    """Nothing listens there. SO_REUSEADDR, as uvicorn binds: a connection the killed server
    closed stays in TIME_WAIT on its port for a minute, and a plain bind fails on it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def requests_served(log: Path) -> int:
    return log.read_text(errors="replace").count(REQUEST_LINE)


def test_two_servers_side_by_side_then_ctrl_c_stops_both(pytester: pytest.Pytester) -> None:
    require_embedded()
    exp = write_experiment(pytester)
    proc = subprocess.Popen(
        run_command(exp),
        cwd=pytester.path,
        stderr=subprocess.PIPE,
        text=True,
        stdout=subprocess.DEVNULL,
        # as a terminal's Ctrl-C finds it: an xdist worker's children inherit SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    lines: list[str] = []
    deadline = time.monotonic() + 600
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if re.search(r"'beside-ngram' \(pid \d+\) ready after", line):
            break
        assert time.monotonic() < deadline, "".join(lines)
    logs = exp.run_dir()
    while min(requests_served(logs / f"server-{name}.log") for name in SERVERS) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(1)  # requests go to one, then the other
    proc.send_signal(signal.SIGINT)
    _, rest = finish(proc, 120)  # killed at the limit
    err = "".join(lines) + rest
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err

    plan = re.search(
        r"plan: arms side by side for ngram: the original on port (\d+), cores (\S+) .*"
        r"the candidate on port (\d+), cores (\S+) ",
        err,
    )
    assert plan is not None, err
    ports = [int(plan[1]), int(plan[3])]
    assert ports[0] == exp.port and ports[1] != exp.port
    assert plan[2] != plan[4]  # a core each
    second = re.search(r"local vLLM process 'beside-ngram' \(pid (\d+)\) ready after", err)
    assert second is not None, err

    # both served, each its own share of the alternating requests
    served = {name: requests_served(logs / f"server-{name}.log") for name in SERVERS}
    assert min(served.values()) >= 2, served
    assert abs(served["original"] - served["beside-ngram"]) <= 1, served  # alternating

    # the signal stopped both; the restore says what it stopped and how the original was left
    assert "interrupted by SIGINT" in err, err
    assert f"stopped the second server local vLLM process 'beside-ngram' (pid {second[1]})" in err
    assert f"at http://127.0.0.1:{ports[1]}" in err
    assert "restored to stopped" in err, err
    for port in ports:
        assert processes_mentioning(f"--port {port}") == [], err
        assert port_free(port)
