"""Other clients and other work per replica through the crossover (issue 43, item 4), over
scripted replicas: a foreign request on one replica is caught and its slot sent again, a busy
host is named per replica, and nothing seen says only 'none seen'."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from pytest_specdecode.measure.crossover_watch import slot_action, watch_lines
from pytest_specdecode.run.crossover.periods import CrossoverRun
from pytest_specdecode.targets.host_env import HostSample
from pytest_specdecode.targets.replicas import Replica, replica_services

from ...support.scripted_target import Script, ScriptedTarget, Speed
from ...support.synthetic import settings, store

PROMPT = "the coding prompt"
FAST = Script(speeds={PROMPT: Speed(gap_s=0.008)})
PERIOD_2 = "[crossover] period 2 of 2: a serves ngram, b serves baseline"


class HostProbe:
    """A scripted host: each sample 10 s of CPU time; busy: all of it other work."""

    def __init__(self) -> None:
        self.busy = False
        self.ticks = 0
        self.idle = 0

    def __call__(self, service: object) -> HostSample:
        self.ticks += 1000
        self.idle += 0 if self.busy else 1000
        return HostSample(
            cpus=4, tick_s=0.01, total_ticks=self.ticks, idle_ticks=self.idle, server_s=0.0
        )


def run_two(tmp_path: Path, *, probes=None, at_period_2=None, **run_options):
    """Both periods over two scripted replicas; `at_period_2` runs as period 2's first
    measured slot is about to be sent."""
    s = settings(tmp_path, samples=3, prompt_types=("coding",), candidates=("ngram",))
    s = replace(s, run=replace(s.run, quiet_wait_s=10.0, **run_options))
    a = ScriptedTarget(Script(), {"ngram": FAST}, running=True)
    b = ScriptedTarget(Script(), {"ngram": FAST}, running=True)
    b.time = a.time
    log: list[str] = []

    def progress(line: str) -> None:
        log.append(line)
        if line.endswith(PERIOD_2) and at_period_2 is not None:
            at_period_2(a, b)

    replicas = [Replica(n, t, unit="vllm.service") for n, t in (("a", a), ("b", b))]
    run = CrossoverRun(
        s, replicas, store(tmp_path, s), progress=progress, headers=None, probes=probes
    )
    with replica_services(
        run.replicas, ready_timeout_s=2.0, restore_timeout_s=2.0, progress=log.append
    ) as held:
        run.held = held
        run.measure_all()
    return run, a, b, log


def journal(run: CrossoverRun) -> list[dict]:
    text = (run.store.run_dir / "samples.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def served(target: ScriptedTarget) -> int:
    return len(target.streams)


def test_a_foreign_request_on_b_in_period_2_is_caught_and_its_slot_sent_again(
    tmp_path: Path,
) -> None:
    def neighbour(a: ScriptedTarget, b: ScriptedTarget) -> None:
        b.neighbour = 1  # another client's request finishes beside b's next one

    run, a, b, log = run_two(tmp_path, at_period_2=neighbour)
    b_seen, a_seen = run.watch.seen["b"], run.watch.seen["a"]
    assert b_seen.traffic == [
        "[crossover] period 2, slot 1: 1 other requests finished; "
        "7 tokens were generated for others"
    ]
    assert b_seen.sent_again == ["[crossover] period 2, slot 1"] and b_seen.marked == []
    assert not a_seen.traffic and not a_seen.sent_again
    assert "[crossover] period 2, slot 1: other clients used replica b" in "\n".join(log)
    assert "[crossover] period 2, slot 1: sending it again, once each replica is quiet" in log
    # the slot went once more to both replicas; only the clean try is journalled and analysed
    assert served(b) == served(a)  # sent at once to both, each time
    samples = journal(run)
    assert len(samples) == 2 * 2 * 3
    assert sum(1 for s in samples if (s["period"], s["slot"]) == (2, 0)) == 2
    assert not any("contaminated" in slot for slot in run.slots)
    found, why = run.analysed()
    assert why is None and found is not None
    b_json = run.replicas_json()[1]
    assert b_json["name"] == "b" and b_json["traffic"]["quiet"] is False
    assert b_json["slots_sent_again"] == ["[crossover] period 2, slot 1"]
    assert run.replicas_json()[0]["traffic"] == {"seen": [], "quiet": True}
    lines = watch_lines([run.watch.seen[n] for n in ("a", "b")])
    assert lines[1] == (
        "replica b: other clients in 1 slot(s); 1 sent again, 0 kept marked contaminated"
    )


def test_with_on_traffic_mark_a_foreign_request_is_kept_and_marked(tmp_path: Path) -> None:
    def neighbour(a: ScriptedTarget, b: ScriptedTarget) -> None:
        b.neighbour = 1

    run = run_two(tmp_path, at_period_2=neighbour, on_traffic="mark")[0]
    assert run.watch.seen["b"].marked == ["[crossover] period 2, slot 1"]
    assert run.watch.seen["b"].sent_again == []
    (slot,) = [s for s in run.slots if "contaminated" in s]
    assert (slot["period"], slot["slot"]) == (2, 0)
    assert set(slot["contaminated"]) == {"b"} and "1 other requests" in slot["contaminated"]["b"]
    assert len(journal(run)) == 2 * 2 * 3


def test_a_busy_host_is_named_per_replica(tmp_path: Path) -> None:
    probes = [HostProbe(), HostProbe()]

    def busy(a: ScriptedTarget, b: ScriptedTarget) -> None:
        probes[1].busy = True  # b's host: other work through all of period 2

    run = run_two(tmp_path, probes=probes, at_period_2=busy)[0]
    b_seen, a_seen = run.watch.seen["b"], run.watch.seen["a"]
    assert a_seen.host_watched and b_seen.host_watched
    assert not a_seen.other_work and not a_seen.traffic
    assert len(b_seen.other_work) == 3  # each of period 2's slots
    assert all("other work took 100% of the host's CPU time" in n for n in b_seen.other_work)
    # sent again once each, still busy: kept, marked, naming b alone
    assert len(b_seen.sent_again) == len(b_seen.marked) == 3
    marked = [s for s in run.slots if "contaminated" in s]
    assert [s["period"] for s in marked] == [2, 2, 2]
    assert all(set(s["contaminated"]) == {"b"} for s in marked)
    lines = watch_lines([a_seen, b_seen])
    assert lines[0] == "replica a: other clients and other work: none seen"
    assert lines[1].startswith("replica b: other work on its host in 3 slot(s)")
    assert run.replicas_json()[1]["other_work"]["quiet"] is False


def test_nothing_seen_says_none_seen_and_nothing_else(tmp_path: Path) -> None:
    run, *_, log = run_two(tmp_path, probes=[HostProbe(), HostProbe()])
    assert watch_lines([run.watch.seen[n] for n in ("a", "b")]) == [
        "replica a: other clients and other work: none seen",
        "replica b: other clients and other work: none seen",
    ]
    assert not any("again" in line or "contaminated" in line for line in log)
    assert not any("contaminated" in s for s in run.slots) and len(journal(run)) == 12
    for entry in run.replicas_json():
        assert entry["traffic"]["quiet"] and entry["other_work"]["quiet"]
        assert entry["slots_sent_again"] == entry["slots_marked"] == []


def test_slot_action_follows_the_single_host_run(tmp_path: Path) -> None:
    s = settings(tmp_path, samples=3, prompt_types=("coding",)).run
    clean: dict[str, str | None] = {"a": None, "b": None}
    other = {"a": None, "b": "1 other requests finished"}
    assert slot_action(clean, clean, attempt=1, run=s) == "keep"
    assert slot_action(other, clean, attempt=1, run=s) == "again"
    assert slot_action(other, clean, attempt=2, run=s) == "mark"  # sent again once only
    assert slot_action(other, clean, attempt=1, run=replace(s, on_traffic="mark")) == "mark"
    assert slot_action(clean, other, attempt=1, run=replace(s, allow_busy_host=True)) == "keep"
    assert slot_action(clean, other, attempt=1, run=replace(s, traffic_attempts=1)) == "mark"
