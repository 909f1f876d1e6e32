"""Other work on the serving host during a timed window (issue 30), on the systemd test host.

An A/A run (the original, then its own configuration as the candidate) in the default,
interleaved order: rounds of one request. A CPU hog runs on the host from the candidate's start
until a round of it is seen busy: that round goes to `discarded` and is sent again once the host
is quiet, the verdict comes from the clean rounds and calls nothing, and summary.md and
report.html name the round sent again and why.

The hog. Nice does not reach across units here: with the kernel's autogroup (on this machine;
on a cgroup v2 host each unit's cgroup does the same) a core is shared fairly between the hog's
unit and the server's, whatever their nice. The first hog (3 loops at nice -5) took at most half
of the engine's core, and on a busy machine it displaced other work, not the server: it left no
trace. Now one SCHED_FIFO loop is pinned to each engine core (vLLM's "auto" binding: all but
the last). It preempts every ordinary task there, so the engine keeps only the 5% that
real-time throttling leaves (an 8-token request: 0.4 s, 7.8 s under the hog). It is bounded
by systemd (RuntimeMaxSec) and `timeout`, which run unpinned and not real-time (a real-time
`timeout` on the hog's core never ran), and the test stops it once seen: it runs about 10 s.

The bound. HostProbe counts as other work the host's CPU time (/proc/stat: the whole machine,
the test host is a container) less the unit's cgroup, against the host's usual: the least of
the host before the run and of the run's clean windows. In a clean round the engine holds its
core; under the hog it has none, so other work rises by the engine's share of the machine
(about half on 2 cores), whatever runs on the other core: the hog displaces only the server.
The bound, the default 25% beyond the usual, lies well below that (seen here: 49-50% against
1-2%; with a busy loop beside it, 95% against 50%).

Why a loaded 2-core machine cannot fail it by chance:
- A load that leaves the engine its core in clean rounds (make test's other worker binds its
  embedded vLLM to the last core; the scheduler moves one busy loop there) raises the usual and
  the hogged round alike: the hog still adds about half the machine.
- A load that itself moves by more than the bound (from a quiet usual) only sends rounds again
  once the host is quiet; the test finds the hog's round by its own line and accepts other
  rounds set aside. It would fail only if such a load lasted through every wait (120 s) and
  attempt (4) of one round.
- The hogged round, 20 times slower, never reaches the verdict; the clean rounds' A/A call
  rate is the calibrated false-alarm rate of every A/A test (docs/statistics.md).
Other work on both cores (make test's other worker starting a server, or installing) leaves
the engine part of its core in clean rounds, and the hog's rise falls below the bound: a CI run
saw the host 99% busy before the run and no round set aside. So the test starts on a free core
(the machine under 75% busy, waited for up to 4 min) and, where the host was busy before the run
all the same, runs once more on a free core. Where the host is full before that run too, it
skips: a hog cannot rise above a full host, so the test cannot check what it is for. It fails
where the hog goes unseen from a quiet start.
8 tokens a request, 6 rounds, one vLLM start pair (the candidate's and the restore): 122-137 s
here, with or without a busy loop beside it.

Alone (marker `alone`). Beside make test's other worker it failed all the same (a fresh-clone
CI, issue 48: "other work took 64% of the host's CPU time (its usual: 37% ...; bound: 25%
more)" in the A/A run that should flag nothing): that worker's real vLLM tests start servers
and send requests in bursts, which move other work on the machine by more than the bound
between the windows that are compared. Other work is what this test measures, so make test runs
it by itself after the two-worker run, on the test host that run left up; by hand, `pytest
tests/real_host` still runs it with the rest, and the waits above still apply.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from ..support.terminal import default_signals
from ..support.testbed import (
    Testbed,
    results_of,
    results_path,
    suite_args,
    write_remote_experiment,
)

pytestmark = pytest.mark.alone  # by itself in make test: other work is what it measures

HOG_UNIT = "specdecode-test-hog"
HOG_LIMIT_S = 40  # the hog's bound whatever happens to the test (it is stopped once seen)
BUSY_HOST_SHARE = 0.25  # the default
ATTEMPTS = 4
SAMPLES = 6  # rounds of one request each
FREE_CORE_SHARE = 0.75  # of the machine busy, less: the hog can rise above it by the bound
BEFORE = re.compile(r"the host before the run: other work (?P<share>\d+)% of (?:\d+|\?) CPUs")
CANDIDATE = "[baseline-again]"
# the progress line of a round of the candidate on which the host was seen busy
SEEN = re.compile(
    re.escape(CANDIDATE)
    + r" round (?P<round>\d+): the host was not quiet during the window \(other work took"
)


@pytest.fixture(autouse=True)
def original_serving_before_and_after(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.settled_traces() == []
    yield
    stop_hog(testbed)
    testbed.wait_serving(timeout_s=120)
    testbed.assert_original_restored()


def engine_cpus(bed: Testbed) -> list[int]:
    """The unit's engine cores: vLLM's "auto" binding, all but the last."""
    cpus = int(bed.ssh("nproc", "--all").stdout.strip() or 1)
    return list(range(cpus - 1)) or [0]


def start_hog(bed: Testbed, engine: list[int]) -> None:
    """A real-time busy loop on each of the unit's engine cores, in a transient unit of its own
    (not the server's cgroup), ended by systemd and by `timeout` at the latest. Only the loops
    are real-time and pinned: `timeout` and the unit's shell run on any core the host allows (the
    test host's container holds all but the last core: scripts/testbed/systemd-host)."""
    loop = "while :; do :; done"
    loops = " ".join(f"taskset -c {cpu} chrt -f 1 sh -c '{loop}' &" for cpu in engine) + " wait"
    started = bed.ssh(
        "systemd-run", "--unit", HOG_UNIT, "--collect", "--quiet",
        "-p", f"RuntimeMaxSec={HOG_LIMIT_S}", "timeout", str(HOG_LIMIT_S), "sh", "-c", loops,
    )  # fmt: skip
    assert started.ok, started.describe()
    # systemd-run returns once the unit is queued: a failure at exec shows only here
    state = bed.ssh("systemctl", "show", HOG_UNIT, "-p", "ActiveState,Result,ExecMainStatus")
    assert "ActiveState=active" in state.stdout, state.stdout


def stop_hog(bed: Testbed) -> None:
    bed.ssh("systemctl", "stop", HOG_UNIT)  # gone already: nothing to stop


def busy_share(bed: Testbed, *, over_s: float = 3.0) -> float:
    """The host's busy share of its CPU time over a few seconds (/proc/stat, the machine's)."""

    def ticks() -> tuple[int, int]:
        values = [int(v) for v in bed.ssh("head", "-n1", "/proc/stat").stdout.split()[1:]]
        return sum(values), values[3] + values[4]  # total, idle + iowait

    total0, idle0 = ticks()
    time.sleep(over_s)
    total1, idle1 = ticks()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_for_a_free_core(bed: Testbed, *, timeout_s: float = 240.0) -> float:
    """Until other work leaves the engine a core (under FREE_CORE_SHARE of the machine busy),
    or the timeout: the share last seen."""
    deadline = time.monotonic() + timeout_s
    while (share := busy_share(bed)) >= FREE_CORE_SHARE and time.monotonic() < deadline:
        pass
    return share


def hog_run(
    pytester: pytest.Pytester, testbed: Testbed, cmd: list[str]
) -> tuple[re.Match[str] | None, str, str, int]:
    """One run of the suite with the hog in the candidate's window: the round seen busy (None:
    none), stderr, stdout and the exit code."""
    engine = engine_cpus(testbed)
    # stdout to a file, stderr read line by line to its end: after a `break`, communicate()
    # reads the pipe's fd and loses the lines the text wrapper had read ahead (seen here).
    stdout_path = pytester.path / "suite-stdout.txt"
    lines: list[str] = []
    hogging = False
    seen: re.Match[str] | None = None
    with stdout_path.open("w") as stdout:
        proc = subprocess.Popen(
            cmd, cwd=pytester.path, stdout=stdout, stderr=subprocess.PIPE, text=True,
            preexec_fn=default_signals,
        )  # fmt: skip
        assert proc.stderr is not None
        try:
            for line in proc.stderr:
                lines.append(line)
                # The candidate serves: the hog starts before its warm-up and first round.
                if not hogging and f"{CANDIDATE} the engine ran with:" in line:
                    start_hog(testbed, engine)
                    hogging = True
                # A round of the candidate was seen: the hog stops, so the host can fall quiet.
                elif hogging and seen is None and (seen := SEEN.search(line)):
                    stop_hog(testbed)
            proc.wait(timeout=900)
        finally:
            stop_hog(testbed)
            if proc.poll() is None:
                proc.kill()
    err = "".join(lines)
    assert hogging, err
    return seen, err, stdout_path.read_text(), proc.returncode


def test_a_cpu_hog_in_the_candidates_window_is_measured_again_and_an_aa_run_calls_nothing(
    pytester: pytest.Pytester, testbed: Testbed
):
    config = write_remote_experiment(
        pytester,
        testbed,
        run={
            "busy_host_share": BUSY_HOST_SHARE,
            "traffic_attempts": ATTEMPTS,
            "quiet_wait_s": 120.0,
            "max_tokens": 8,
            # As tests/real_vllm/test_aa.py: a false alarm is a chance event even where the
            # noise model holds; alpha 0.01 and this machine's restart noise (7-9%, the
            # default 5% called +26% on an A/A here, its baseline slowed by other work below
            # the bound) keep this test's own chance of one under 1%.
            "alpha": 0.01,
            "assumed_restart_noise": 0.08,
            "samples": SAMPLES,  # the least the design accepts at alpha 0.01
            "max_samples": SAMPLES,
        },
    )
    cmd = [
        sys.executable, "-m", "pytest",
        *suite_args(pytester, testbed, config, "--spec-config", "baseline", "-rA"),
    ]  # fmt: skip
    wait_for_a_free_core(testbed)
    seen, err, out, returncode = hog_run(pytester, testbed, cmd)
    before = BEFORE.search(err)
    if seen is None and before is not None and int(before["share"]) >= FREE_CORE_SHARE * 100:
        # Busy before the run all the same: the hog had nothing to rise above. Once more.
        print(f"first run: {before[0]}; no round seen busy; once more on a free core")
        (pytester.path / "reports").rename(pytester.path / "reports-busy-before")
        testbed.wait_serving()
        wait_for_a_free_core(testbed)
        seen, err, out, returncode = hog_run(pytester, testbed, cmd)
    before = BEFORE.search(err)
    if seen is None and before is not None and int(before["share"]) >= FREE_CORE_SHARE * 100:
        # Full before both runs: a hog cannot rise above it, so nothing here can show whether
        # it would be seen. Not a failure of the product: the test cannot check what it is for.
        pytest.skip(f"the host was full before each run ({before[0]}): a hog cannot be seen")
    assert seen is not None, err  # the hog ran through every round unseen from a free core
    assert not testbed.ssh("systemctl", "is-active", "--quiet", HOG_UNIT).ok
    round_ = f"round {seen['round']}"

    # Seen, sent again once the host was quiet, and the round sent again was clean.
    assert (
        f"{CANDIDATE} {round_}: measuring again (attempt 2 of {ATTEMPTS}) once the host is quiet"
        in err
    ), err
    data = results_of(pytester)
    m = data["phases"]["baseline-again"]["measurements"]["coding"]
    env = m["environment"]
    assert env["remeasured"][0].startswith(f"{round_}: other work took"), env
    assert env["contaminated"] is None and env["off"] is None, env
    assert len(m["samples"]) == SAMPLES and m["discarded"], m  # the hog's round, set aside
    hogged = {x["slot"] for x in m["discarded"]}
    assert hogged <= {x["slot"] for x in m["samples"]}  # its slots, sent again

    # The A/A verdict comes from the clean rounds, and calls nothing.
    verdict = data["analysis"]["verdicts"]["baseline-again"]["coding"]
    assert not verdict["contaminated"], verdict
    assert verdict["verdict"] not in ("regressed", "improved", "contaminated"), verdict
    # Its own test passes (the suite's TTFT example may fail on its own rule on a busy machine)
    own = r"PASSED \S*specdecode::test_speculation_does_not_regress\[baseline-again-coding\]"
    assert re.search(own, out), out  # the node id is relative to the run's rootdir
    assert returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out + err

    # The reports name the round measured again, and why.
    why = f"baseline-again/coding: measured again after the host was busy ({round_}: other work"
    summary = (results_path(pytester).parent / "summary.md").read_text()
    assert why in summary and "sent again, each kept once clean" in summary, summary
    html = (results_path(pytester).parent / "report.html").read_text()
    assert re.search(r"coding: other work \d+% of \d+ CPUs[^<]*; measured again \d+ time", html), (
        html[-3000:]
    )

    # Shown with -rA: the hog seen, the round sent again and why, the verdict
    shown = [x for x in err.splitlines() if "round" in x or ("host" in x and "quiet" in x)]
    noted = [x for x in summary.splitlines() if why in x]
    print("\n".join([*shown, *noted, f"verdict: {verdict['verdict']}: {verdict.get('reason')}"]))
