"""The crossover across two real replicas: the test host (A) and its copy (B), both serving.

Period 1: A serves its original (the baseline), B the n-gram candidate; period 2 swapped. Each
test ends by checking, on both hosts, that the production unit is active, serves its model,
and that nothing of the tool's is left. The two hosts are shared by both tests and by the
other real-host tests; nothing here restarts a unit but the run under test. Kept short: the
fewest samples and tokens that still give each period its own slots.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_specdecode.record.store import JOURNAL_FILE

from ..support.pipes import finish
from ..support.terminal import default_signals
from ..support.testbed import (
    Testbed,
    replica_args,
    results_of,
    results_path,
    write_remote_experiment,
)

PERIOD_1 = "[crossover] period 1 of 2: A serves baseline, B serves ngram"
PERIOD_2 = "[crossover] period 2 of 2: A serves ngram, B serves baseline"
INTERVAL = ("estimate", "low", "high", "df")


@pytest.fixture
def hosts(testbed: Testbed, second_testbed: Testbed):
    """A and B, each serving its original before and after, with nothing of the tool's left;
    the host's clock at the start, from which each unit's starts are counted."""
    beds = {"A": testbed, "B": second_testbed}
    etc = {}
    for bed in beds.values():
        bed.wait_serving()
        assert bed.settled_traces() == []
        etc[bed.host] = bed.persistent_units()
    # Two hosts of one name are alike, but are they two? Their own host keys.
    assert (
        testbed.known_hosts.read_text().split()[1:]
        != (second_testbed.known_hosts.read_text().split()[1:])
    )
    since = testbed.ssh("date", "+%s").stdout.strip()
    before = {name: bed.state()["MainPID"] for name, bed in beds.items()}
    yield beds, since, before
    for bed in beds.values():
        bed.wait_serving(timeout_s=120)  # a restore must already have waited for health
        bed.assert_original_restored()
        assert bed.persistent_units() == etc[bed.host]  # nothing written to /etc/systemd/system


def crossover_config(
    pytester: pytest.Pytester, beds: dict[str, Testbed], samples: int, crossovers: int = 1
) -> Path:
    """One crossover unless asked (the test bed's noise would plan many: docs/replicas.md,
    "Repeated crossovers and the stop"), so each unit restarts at most twice."""
    return write_remote_experiment(
        pytester,
        beds["A"],
        run={
            "samples": samples,
            "max_samples": samples,
            "warmup": 1,
            "max_tokens": 16,
            "crossovers": crossovers,
        },
        replicas=beds,
    )


def start(pytester: pytest.Pytester, config: Path) -> subprocess.Popen[str]:
    """The run in a subprocess: its progress (stderr) piped, its report into stdout.log (a
    pipe nobody reads while the test waits for progress could fill and stop the run)."""
    with (pytester.path / "stdout.log").open("w") as stdout:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                *replica_args(pytester, config, "--spec-config", "ngram"),
            ],
            cwd=pytester.path,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=default_signals,  # the test sends it Ctrl-C, as a terminal would
        )


def stdout_of(pytester: pytest.Pytester) -> str:
    return (pytester.path / "stdout.log").read_text()


def read_until(
    pytester: pytest.Pytester, proc: subprocess.Popen[str], marker: str, seen: list[str]
) -> None:
    """Progress (stderr) until `marker`; fails with what was seen if it never comes."""
    deadline = time.monotonic() + 900
    assert proc.stderr is not None
    for line in proc.stderr:
        seen.append(line)
        if marker in line:
            return
        if time.monotonic() > deadline:
            break
    proc.kill()
    _, rest = finish(proc, 60)
    pytest.fail(f"never saw {marker!r}:\n{''.join(seen)}{rest}\n{stdout_of(pytester)[-4000:]}")


def wait_for_period_sample(pytester: pytest.Pytester, period: int, timeout_s: float = 300) -> None:
    """Until a request of `period` has finished: in the run's journal, written as it comes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if any(s.get("period") == period for s in journal_samples(pytester)):
                return
        except ValueError:  # the line being written
            pass
        time.sleep(0.25)
    raise AssertionError(f"no request of period {period} finished within {timeout_s:.0f}s")


def journal_samples(pytester: pytest.Pytester) -> list[dict]:
    """Every request the run journalled as it finished (samples.jsonl): its period and replica."""
    reports = pytester.path / "reports"
    lines = "\n".join(p.read_text() for p in reports.glob(f"*/{JOURNAL_FILE}")).splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def new_invocations(bed: Testbed, since: str, first: str) -> dict[str, float]:
    """The unit's starts since `since`, seen in its own journal: each a new invocation."""
    return {inv: at for inv, at in bed.invocations_since(since).items() if inv != first}


def test_crossover_on_two_hosts_restarts_each_at_most_twice_and_restores_both(
    pytester: pytest.Pytester, hosts
):
    beds, since, before = hosts
    first = {name: invocation(bed) for name, bed in beds.items()}
    config = crossover_config(pytester, beds, samples=5)
    seen: list[str] = []
    proc = start(pytester, config)
    read_until(pytester, proc, PERIOD_1, seen)
    # Period 1: A keeps serving its original, never restarted; B serves the candidate.
    assert invocation(beds["A"]) == first["A"], "A was restarted before period 2"
    assert invocation(beds["B"]) != first["B"], "B was not restarted into the candidate"
    read_until(pytester, proc, PERIOD_2, seen)
    _, rest = finish(proc, 900)
    out, err = stdout_of(pytester), "".join(seen) + rest
    assert proc.returncode in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED), out + err

    data = results_of(pytester)
    assert data["ending"]["how"] == "finished", data["ending"]
    # On the hosts themselves: each unit started at most twice (into the candidate, back), the
    # first start of A after B's (A kept its original through period 1), a new main process.
    started = {name: new_invocations(bed, since, first[name]) for name, bed in beds.items()}
    for name, bed in beds.items():
        assert 1 <= len(started[name]) <= 2, (name, started[name])
        assert invocation(bed) != first[name] and bed.state()["MainPID"] != before[name]
    assert min(started["A"].values()) > min(started["B"].values()), started
    # results.json: each replica, its starts as the host saw them, what it was and how it was left
    replicas = {r["name"]: r for r in data["replicas"]}
    assert set(replicas) == {"A", "B"}, data["replicas"]
    for name, bed in beds.items():
        r = replicas[name]
        assert r["host"] == bed.host.removeprefix("ssh://") or r["host"] == bed.host, r
        assert r["unit"] == bed.unit, r
        assert r["starts"] == len(started[name]), (r, started[name])
        assert r["was"].startswith("active"), r
        assert "active" in r["left"] and "serving" in r["left"], r
    # Each period's slots went to both replicas: journalled as they came, and in results.json.
    samples = journal_samples(pytester)
    assert {(s["period"], s["replica"]) for s in samples} >= {
        (1, "A"),
        (1, "B"),
        (2, "A"),
        (2, "B"),
    }, samples
    slots = data["crossover_slots"]
    assert {s["period"] for s in slots} == {1, 2}, slots
    assert all(s["replicas"] == ["A", "B"] and len(s["throughput"]) == 2 for s in slots), slots
    # The change, the replica effect and the period effect, each with its interval.
    for metric in ("throughput", "tpot"):
        result = data["crossover"]["ngram"][metric]
        assert result["scale"], result
        for effect in ("change", "replica_effect", "period_effect"):
            e = result[effect]
            assert set(INTERVAL) <= set(e), (metric, effect, e)
            assert e["low"] <= e["estimate"] <= e["high"], (metric, effect, e)
            assert e["df"] > 0, (metric, effect, e)
    assert data["crossover"]["ngram"]["verdict"], data["crossover"]["ngram"]
    summary = (results_path(pytester).parent / "summary.md").read_text().lower()
    for words in ("change", "replica effect", "period effect"):
        assert words in summary, summary


def test_ctrl_c_in_period_2_restores_both_replicas(pytester: pytest.Pytester, hosts):
    beds, since, _ = hosts
    first = {name: invocation(bed) for name, bed in beds.items()}
    # Enough slots that period 2 is still under way when the signal comes.
    config = crossover_config(pytester, beds, samples=12)
    seen: list[str] = []
    proc = start(pytester, config)
    read_until(pytester, proc, PERIOD_2, seen)
    wait_for_period_sample(pytester, 2)  # a period-2 request is done, more are under way
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signal.SIGINT)
    _, rest = finish(proc, 600)
    out, err = stdout_of(pytester), "".join(seen) + rest
    assert proc.returncode not in (None, pytest.ExitCode.OK), out + err
    # Both put back (the fixture checks each is active, serves, and holds nothing of the tool's).
    for name, bed in beds.items():
        bed.wait_serving(timeout_s=400, poll_s=1)
        started = new_invocations(bed, since, first[name])
        assert 1 <= len(started) <= 2, (name, started)
    data = results_of(pytester)
    ending = data["ending"]
    assert ending["how"] == "interrupted" and ending["signals"] == ["SIGINT"], ending
    # What was measured is kept: in the journal and in results.json.
    assert any(s["period"] == 2 for s in journal_samples(pytester))
    assert any(s["period"] == 2 for s in data["crossover_slots"]), data["crossover_slots"]


def invocation(bed: Testbed) -> str:
    """The unit's current InvocationID: a new one at each start."""
    return bed.ssh("systemctl", "show", "-p", "InvocationID", "--value", bed.unit).stdout.strip()
