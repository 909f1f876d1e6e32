"""The crossover run across two replicas (issue 43), over scripted replicas (no server): the
periods' order and which replica serves what, each replica started at most twice, both restored
at once after an exception or a Ctrl-C in period 2, drain before and undrain after whatever
happens, and through the plugin: a refused alike check touches nothing, a whole run reports the
change, the replica effect and the period effect."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pytest_specdecode.analysis.replicas.model import measured_of
from pytest_specdecode.config.arms import BASELINE
from pytest_specdecode.errors import HostError
from pytest_specdecode.run.crossover import periods as crossover_module
from pytest_specdecode.run.crossover.periods import CrossoverRun
from pytest_specdecode.run.crossover_known import stored_crossovers
from pytest_specdecode.targets.interrupts import INTERRUPTS, Interrupts
from pytest_specdecode.targets.replicas import Replica, all_of, replica_services

from ...support.scripted_target import Script, ScriptedTarget, Speed
from ...support.sigint import own_interrupts, plugin_sigint
from ...support.synthetic import settings, store
from ...support.terminal import SIGINT_AS_IN_A_TERMINAL
from ..config.test_replicas_config import CONFTEST, HEAD, smi

PROMPT = "the coding prompt"
DIED = "RuntimeError: Engine core initialization failed. See root cause above."
FAST = Script(speeds={PROMPT: Speed(gap_s=0.008)})


def two(
    tmp_path: Path,
    *,
    drains: bool = False,
    prompt_types: tuple[str, ...] = ("coding",),
    candidates: tuple[str, ...] = ("ngram",),
    speeds: dict[str, Speed] | None = None,
):
    """Two scripted replicas, each running its original, on one virtual time; every candidate
    streams FAST, or as `speeds` say (by prompt)."""
    s = settings(tmp_path, samples=3, prompt_types=prompt_types, candidates=candidates)
    scripts = {name: Script(speeds={**FAST.speeds, **(speeds or {})}) for name in candidates}
    a = ScriptedTarget(Script(), scripts, running=True)
    b = ScriptedTarget(Script(), scripts, running=True)
    b.time = a.time
    log: list[str] = []
    replicas = [
        Replica(
            name,
            target,
            drain=("lbctl", "drain", name) if drains else (),
            undrain=("lbctl", "undrain", name) if drains else (),
            unit="vllm.service",
        )
        for name, target in (("a", a), ("b", b))
    ]
    run = CrossoverRun(s, replicas, store(tmp_path, s), progress=log.append, headers=None)
    return run, a, b, log


def hold(run: CrossoverRun, log: list[str], runner=None, restore_s: float = 2.0, **more):
    kwargs = {"runner": runner} if runner else {}
    return replica_services(
        run.replicas,
        ready_timeout_s=2.0,
        restore_timeout_s=restore_s,
        progress=log.append,
        **kwargs,
        **more,
    )


def starts_and_stops(target: ScriptedTarget) -> list[str]:
    return [e for e in target.events if e.startswith(("start", "stop"))]


def journal(run: CrossoverRun) -> list[dict]:
    text = (run.store.run_dir / "samples.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines()]


def test_period_1_keeps_a_original_and_b_candidate_then_swaps_and_restores_a(
    tmp_path: Path,
) -> None:
    run, a, b, log = two(tmp_path)
    with hold(run, log) as held:
        run.held = held
        run.measure_all()
    # a: never restarted in period 1; the candidate in period 2; back at the end
    assert starts_and_stops(a) == ["stop original", "start ngram", "stop ngram", "start original"]
    # b: the candidate in period 1, its original in period 2, untouched at the end
    assert starts_and_stops(b) == ["stop original", "start ngram", "stop ngram", "start original"]
    assert a.events.index("start ngram") > 0 and a.events[-1] == b.events[-1] == "close"
    samples = journal(run)
    served = {(s["period"], s["replica"], s["phase"]) for s in samples}
    assert served == {(1, "a", BASELINE), (1, "b", "ngram"), (2, "a", "ngram"), (2, "b", BASELINE)}
    assert [s["period"] for s in samples] == sorted(s["period"] for s in samples)  # in order
    # each slot's prompt went to both replicas: every slot has one sample from each
    slots = {(s["period"], s["slot"]) for s in samples}
    assert len(samples) == 2 * len(slots) == 2 * 2 * 3
    first = next(i for i, line in enumerate(log) if "period 1 of 2: a serves" in line)
    second = next(i for i, line in enumerate(log) if "period 2 of 2: a serves" in line)
    assert log[first].endswith("[crossover] period 1 of 2: a serves baseline, b serves ngram")
    assert log[second].endswith("[crossover] period 2 of 2: a serves ngram, b serves baseline")
    assert first < second


def test_each_replica_is_started_at_most_twice_and_left_as_it_was(tmp_path: Path) -> None:
    run, a, b, log = two(tmp_path)
    with hold(run, log) as held:
        run.held = held
        run.measure_all()
    for replica, target in zip(run.replicas, (a, b), strict=True):
        assert replica.starts == sum(e.startswith("start") for e in target.events) == 2
        assert (replica.was, replica.left) == ("active", "active, serving")
    found, why = run.analysed()
    assert why is None and found is not None
    entry = found["ngram"]
    assert entry["verdict"] in {"improved", "equivalent", "inconclusive", "regressed"}
    for key in ("change", "replica_effect", "period_effect"):
        assert set(entry["throughput"][key]) >= {"estimate", "low", "high", "df"}
        low, high = entry["throughput"][key]["low"], entry["throughput"][key]["high"]
        assert low <= entry["throughput"][key]["estimate"] <= high
    assert entry["throughput"]["change"]["estimate"] > 0  # the candidate streams faster here


def test_the_family_counts_each_candidate_and_each_metric_every_slot_has(
    tmp_path: Path,
) -> None:
    """docs/statistics.md: each change at 1 - 2 alpha / m, m = candidates x metrics. A slot
    whose candidate's output is one token long has no TPOT on that replica (the baseline's has
    one): TPOT leaves the family; a second candidate (a rotation of three periods) doubles it."""
    alpha = 0.05

    def analysed(path: Path, **kwargs) -> dict:
        path.mkdir()
        run, _, _, log = two(path, **kwargs)
        with hold(run, log) as held:
            run.held = held
            run.measure_all()
        found, why = run.analysed()
        assert why is None and found is not None
        return found

    both = analysed(tmp_path / "both")["ngram"]
    assert both["throughput"]["confidence"] == pytest.approx(1 - 2 * alpha / 2)
    assert both["tpot"]["confidence"] == pytest.approx(1 - 2 * alpha / 2)
    one_token = analysed(tmp_path / "one", prompt_types=("coding", "math"),
                         speeds={"the math prompt": Speed(tokens=1)})["ngram"]  # fmt: skip
    assert "tpot" not in one_token
    assert one_token["throughput"]["confidence"] == pytest.approx(1 - 2 * alpha / 1)
    assert one_token["slots"] == 2 * 6  # the math slots are analysed for their throughput
    rotated = analysed(tmp_path / "rotated", candidates=("ngram", "eagle"))
    assert set(rotated) == {"ngram", "eagle"}
    for entry in rotated.values():
        assert entry["periods"] == 3
        for metric in ("throughput", "tpot"):
            assert entry[metric]["confidence"] == pytest.approx(1 - 2 * alpha / 4)


def test_repeated_crossovers_look_after_each_and_stop_once_decided(tmp_path: Path) -> None:
    """Three crossovers planned, the restart noise only assumed: the look after the first is
    not taken (one crossover cannot measure its starts); after the second, the candidate's
    steady gain is decided on the run's own starts, and no third crossover is made."""
    s = settings(tmp_path, samples=6, prompt_types=("coding",), candidates=("ngram",))
    a = ScriptedTarget(Script(), {"ngram": FAST}, running=True)
    b = ScriptedTarget(Script(), {"ngram": FAST}, running=True)
    b.time = a.time
    log: list[str] = []
    replicas = [Replica(n, t, unit="vllm.service") for n, t in (("a", a), ("b", b))]
    run = CrossoverRun(s, replicas, store(tmp_path, s), progress=log.append, headers=None,
                       planned=3)  # fmt: skip
    assert [p.number for p in run.periods] == [1, 2, 3, 4, 5, 6]
    assert [p.crossover for p in run.periods] == [1, 1, 2, 2, 3, 3]
    with hold(run, log) as held:
        run.held = held
        run.measure_all()
    assert {s["period"] for s in journal(run)} == {1, 2, 3, 4}  # two crossovers, not three
    assert [r.starts for r in run.replicas] == [4, 4]  # twice into the candidate, twice back
    assert starts_and_stops(a)[-1] == "start original" and a.original().is_active()
    assert any(line == "[crossover] crossover 2 of 3" for line in log)
    (first,) = [line for line in log if "look after crossover 1 of 3" in line]
    assert first.endswith("not taken (the restart noise is not measured yet): crossover 2")
    (second,) = [line for line in log if "look after crossover 2 of 3" in line]
    assert "ngram throughput +" in second and second.endswith("decided: no more crossovers")
    assert [look["decided"] for look in run.looks] == [False, True]
    assert run.store.extra["crossover_looks"] == run.looks
    found, why = run.analysed()
    assert why is None and found is not None
    entry = found["ngram"]
    assert (entry["crossovers"], entry["planned"], entry["periods"]) == (2, 3, 4)
    assert entry["stopped"] == "decided after crossover 2 of 3"
    assert entry["verdict"] == "improved"
    assert (
        "measured by this run's starts (2 crossovers"
        in entry["throughput"]["restart_noise"]["source"]
    )
    # the next run's plan reads this one's slots: the same replicas, model and output length
    run.store.extra["replicas"] = run.replicas_json()
    run.store.flush()
    later = dataclasses.replace(s, reports_dir=tmp_path)
    identities = [(r.name, r.target.host_name, r.unit) for r in run.replicas]
    ((name, slots),) = stored_crossovers(later, identities)
    assert name == run.store.run_dir.name and len(slots) == len(run.slots)
    _, _, starts = measured_of(slots, "throughput")
    assert starts is not None and starts.df == 2  # its two crossovers measured the starts
    assert stored_crossovers(later, [*identities[:1], ("c", "elsewhere", None)]) == []


class Cut(Exception):
    pass


def cut_in_period_2(monkeypatch: pytest.MonkeyPatch, exc: BaseException) -> None:
    """send_period raises `exc` as period 2 sends (after its switch)."""
    real = crossover_module.send_period
    calls = []

    def send(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            if isinstance(exc, KeyboardInterrupt):
                INTERRUPTS.signalled(signal.SIGINT)  # as the plugin's handler does
            raise exc
        return real(*args, **kwargs)

    monkeypatch.setattr(crossover_module, "send_period", send)


def parallel_closes(a: ScriptedTarget, b: ScriptedTarget) -> threading.Barrier:
    """Each target's close (the end of its restore) waits for the other's: one after the
    other, the barrier breaks and the restore reports it."""
    barrier = threading.Barrier(2, timeout=5)
    for target in (a, b):
        real = target.close

        def close(real=real) -> None:
            barrier.wait()
            real()

        target.close = close  # type: ignore[method-assign]
    return barrier


@pytest.mark.parametrize("exc", [Cut("a fault in period 2"), KeyboardInterrupt()])
def test_both_replicas_are_restored_at_once_after_a_fault_in_period_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    run, a, b, log = two(tmp_path, drains=True)
    commands: list[tuple[str, list[str]]] = []

    def runner(argv, timeout_s):
        target = a if argv[-1] == "a" else b
        commands.append((" ".join(argv), starts_and_stops(target)))

    cut_in_period_2(monkeypatch, exc)
    barrier = parallel_closes(a, b)
    with pytest.raises(type(exc)), hold(run, log, runner) as held:
        run.held = held
        run.measure_all()
    assert not barrier.broken  # both restores reached their end together
    assert starts_and_stops(a)[-1] == "start original" and a.original().is_active()
    assert starts_and_stops(b)[-1] == "start original" and b.original().is_active()
    assert [r.starts for r in run.replicas] == [2, 2]
    assert [r.left for r in run.replicas] == ["active, serving", "active, serving"]
    # drain before each candidate period, undrain once the original serves again (period 2
    # switches both at once, so only each replica's own order is fixed)
    assert sorted(c for c, _ in commands) == sorted(
        ["lbctl drain b", "lbctl undrain b", "lbctl drain a", "lbctl undrain a"]
    )
    for name in ("a", "b"):
        (drained,) = [seen for c, seen in commands if c == f"lbctl drain {name}"]
        (undrained,) = [seen for c, seen in commands if c == f"lbctl undrain {name}"]
        assert "start ngram" not in drained  # before it was restarted into the candidate
        assert undrained[-1] == "start original" and "start ngram" in undrained  # after
    assert [c for c, _ in commands].index("lbctl drain b") == 0  # period 1's, first
    assert any("restoring replica a (unit vllm.service on scripted-host)" in line for line in log)
    assert not run.done and {s["period"] for s in journal(run)} == {1}


def test_a_failed_drain_names_the_replica_and_both_are_restored(tmp_path: Path) -> None:
    run, a, b, log = two(tmp_path, drains=True)

    def runner(argv, timeout_s):
        if argv[1] == "drain" and argv[-1] == "a":
            raise HostError("lbctl exited with 3: no such backend")

    with pytest.raises(HostError) as raised, hold(run, log, runner) as held:
        run.held = held
        run.measure_all()
    text = str(raised.value)
    assert "replica a (unit vllm.service on scripted-host)" in text and "drain" in text
    assert "no such backend" in text and "served its original" in text
    assert "start ngram" not in a.events  # a drain that failed: a was never restarted
    assert b.original().is_active() and a.original().is_active()


def sigint_as_it_starts(target: ScriptedTarget, interrupts: Interrupts) -> None:
    """The target's candidate start (in its replica's thread, during a switch) sends SIGINT to
    this process, as a Ctrl-C would, and goes on once the main thread's handler noted it; it
    ends a while after (0.2 s of real time), as a start does."""
    made = target.candidate

    def candidate(spec):
        service = made(spec)
        real = service.start

        def start() -> None:
            os.kill(os.getpid(), signal.SIGINT)
            deadline = time.monotonic() + 5.0
            while not interrupts.signals and time.monotonic() < deadline:
                time.sleep(0.001)
            time.sleep(0.2)
            real()

        service.start = start  # type: ignore[method-assign]
        return service

    target.candidate = candidate  # type: ignore[method-assign]


@pytest.mark.parametrize("dies", [False, True], ids=["starts", "dies-with-the-signal"])
def test_a_sigint_during_a_replicas_switch_restores_both_and_keeps_period_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies: bool
) -> None:
    """Period 2's switch: a is restarted into the candidate while b goes back to its original,
    each in its own thread; a Ctrl-C comes as a's candidate starts (`dies`: and its engine dies
    with it, as a local server's process group gets the Ctrl-C too). The restore waits for the
    switch, puts a's original back, and the candidate is never started a second time."""
    interrupts = own_interrupts(monkeypatch)
    run, a, b, log = two(tmp_path)
    if dies:
        script = dataclasses.replace(FAST, crash_at_start=DIED, crash_starts=1)
        a._scripts = {"ngram": script}  # a's own: b's candidate started in period 1
    sigint_as_it_starts(a, interrupts)
    with (
        plugin_sigint(),
        pytest.raises(KeyboardInterrupt),
        hold(run, log, retry_failed_start=True) as held,
    ):
        run.held = held
        run.measure_all()
    assert interrupts.signals == ["SIGINT"]
    # a: its original in period 1, the candidate started once in period 2's switch, back
    assert starts_and_stops(a) == ["stop original", "start ngram", "stop ngram", "start original"]
    assert starts_and_stops(b) == ["stop original", "start ngram", "stop ngram", "start original"]
    assert a.original().is_active() and b.original().is_active()
    assert not any("once more" in line for line in log)
    assert [r.starts for r in run.replicas] == [2, 2]
    assert [r.left for r in run.replicas] == ["active, serving", "active, serving"]
    for replica in run.replicas:
        assert replica.board is not None and replica.board.ending.how == "interrupted"
    # nothing measured is lost: period 1's slots, in the journal and results.json
    assert not run.done and {s["period"] for s in journal(run)} == {1}
    assert len(journal(run)) == 2 * 3
    stored = json.loads(run.store.path.read_text())["crossover_slots"]
    assert [(s["period"], s["slot"]) for s in stored] == [(1, 0), (1, 1), (1, 2)]


def test_a_ctrl_c_that_another_thread_receives_ends_the_wait_for_the_switches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The kernel hands a process's SIGINT to any thread that does not block it; its handler
    runs in the main thread only once that one runs. One that lands on a replica's thread (or
    on the main thread just as it falls asleep) while the main thread waits for the switches
    must end the wait then, not once the switch is done: a start can take an hour."""
    interrupts = own_interrupts(monkeypatch)
    sent, done = threading.Event(), threading.Event()
    pool = ThreadPoolExecutor(1, thread_name_prefix="specdecode-a")

    def switch() -> None:
        sent.wait(5.0)
        os.kill(os.getpid(), signal.SIGINT)  # the main thread blocks it: this thread gets it
        done.wait(5.0)  # a start still under way

    with plugin_sigint():
        future = pool.submit(switch)  # its thread starts with SIGINT unblocked
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        began = time.monotonic()
        try:
            sent.set()
            with pytest.raises(KeyboardInterrupt):
                all_of([future])
            waited = time.monotonic() - began
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            done.set()
            pool.shutdown()
    assert waited < 2.0 and interrupts.signals == ["SIGINT"]


# -- through the plugin ---------------------------------------------------------------------


TWO = """
[[target.replicas]]
name = "a"
api_base = "http://10.0.0.1:8000"

[[target.replicas]]
name = "b"
api_base = "http://10.0.0.2:8000"
"""

CUT_IN_PERIOD_2 = """    async def _stream(self, request):
        import os, signal
        original = self.original()
        if os.environ.get("SPEC_CUT") and self.api_base.endswith(".2:8000") and (
            original.starts == 2 and original.active
        ):  # b serves its original again: period 2; after its warm-up, Ctrl-C as a user would
            self.sent_in_2 = getattr(self, "sent_in_2", 0) + 1
            if self.sent_in_2 == 2:
                os.kill(os.getpid(), signal.SIGINT)
        return await super()._stream(request)

    def close(self):"""

RUN = """
[run]
samples = 3
max_samples = 3
warmup = 1
crossovers = 1
"""


@pytest.fixture
def _importable_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))


# Ctrl-C as a's candidate starts (period 2's switch)
CUT_IN_A_SWITCH = """    def candidate(self, spec):
        import os, signal
        service = super().candidate(spec)
        if self.api_base.endswith(".1:8000"):
            start = service.start

            def cut_as_it_starts():
                os.kill(os.getpid(), signal.SIGINT)
                start()

            service.start = cut_as_it_starts
        return service

    def close(self):"""


def crossover(
    pytester: pytest.Pytester, replicas: str, *args: str, cut_switch: bool = False
) -> pytest.RunResult:
    facts = {
        "http://10.0.0.1:8000": {"vllm": "0.11.0", "nvidia_smi": smi(1)},
        "http://10.0.0.2:8000": {"vllm": "0.11.0", "nvidia_smi": smi(1)},
    }
    (pytester.path / "facts.json").write_text(json.dumps(facts))
    conftest = CONFTEST.replace("super().__init__(Script())",
                                "super().__init__(Script(), running=True)")  # fmt: skip
    conftest = conftest.replace("    def close(self):", CUT_IN_PERIOD_2, 1)
    if cut_switch:
        conftest = conftest.replace("    def close(self):", CUT_IN_A_SWITCH, 1)
    pytester.makeconftest(SIGINT_AS_IN_A_TERMINAL + conftest)  # the Ctrl-C tests send SIGINT
    text = 'reports_dir = "reports"\n' + HEAD.format(extra="") + RUN + replicas
    pytester.makefile(".toml", specdecode=text)
    return pytester.runpytest_subprocess("--spec-config", "ngram", "-rs", *args)


@pytest.mark.usefixtures("_importable_support")
def test_a_refused_alike_check_touches_nothing(pytester: pytest.Pytester) -> None:
    other_model = TWO.replace('name = "b"', 'name = "b"\nmodel = "llama"')
    result = crossover(pytester, other_model)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "refused: replica b serves the model llama, replica a kimi" in out
    events = [json.loads(e) for e in (pytester.path / "events.jsonl").read_text().splitlines()]
    assert len(events) == 2 and all(e[1] == ["close"] for e in events)  # read, and closed
    assert not list((pytester.path / "reports").glob("*/results.json"))


@pytest.mark.usefixtures("_importable_support")
def test_a_run_across_replicas_reports_the_change_and_both_effects(
    pytester: pytest.Pytester,
) -> None:
    result = crossover(pytester, TWO)
    out = result.stdout.str() + result.stderr.str()
    assert "[crossover] period 1 of 2: a serves baseline, b serves ngram" in out
    assert "[crossover] period 2 of 2: a serves ngram, b serves baseline" in out
    assert out.index("period 1 of 2: a serves") < out.index("period 2 of 2: a serves")
    # the plan, before anything is touched: the noise it plans by, what 1 crossover calls, and
    # that this run (crossovers = 1) makes one
    assert "plan: crossovers (docs/replicas.md" in out
    assert "plan:   restart noise, throughput: unmeasured: assumed 5%" in out
    assert "plan:   what 1 crossover (2 periods of 3 slots" in out
    assert "plan:   this run makes up to 1 crossover, one AB/BA" in out
    assert out.index("plan: crossovers") < out.index("period 1 of 2: a serves")
    (path,) = (pytester.path / "reports").glob("*/results.json")
    results = json.loads(path.read_text())
    assert results["crossover_plan"]["planned"] == 1 and results["crossover_plan"]["most"] == 1
    assert set(results["crossover"]) == {"ngram"}  # per candidate, nothing else
    entry = results["crossover"]["ngram"]
    assert entry["scale"] == "log-ratio" and entry["verdict"]
    assert (entry["slots"], entry["periods"], entry["replicas"]) == (6, 2, 2)
    for key in ("change", "replica_effect", "period_effect"):
        assert set(entry["throughput"][key]) >= {"estimate", "low", "high", "df"}
    assert [(r["name"], r["starts"], r["was"], r["left"]) for r in results["replicas"]] == [
        ("a", 2, "active", "active, serving"),
        ("b", 2, "active", "active, serving"),
    ]
    summary = (path.parent / "summary.md").read_text()
    assert "replica effect" in summary and "period effect" in summary
    assert "replica a" in summary and "left active, serving" in summary
    for r in results["replicas"]:  # watched per replica; nothing seen: nothing said but that
        assert r["traffic"] == {"seen": [], "quiet": True} and r["other_work"]["quiet"]
        assert f"- replica {r['name']}: other clients and other work: none seen" in summary
    assert "contaminated" not in summary and "sent again" not in summary
    html = (path.parent / "report.html").read_text()
    assert "Across replicas: the crossover" in html and "period effect" in html
    # the per-arm and per-prompt-type tests skip, saying why; the crossover's test decides
    assert "decides each candidate over the whole prompt set" in out
    assert "test_crossover_does_not_regress" in out or "crossover" in out
    samples = [json.loads(s) for s in (path.parent / "samples.jsonl").read_text().splitlines()]
    assert {(s["period"], s["replica"]) for s in samples} == {
        (1, "a"), (1, "b"), (2, "a"), (2, "b")
    }  # fmt: skip


@pytest.mark.usefixtures("_importable_support")
def test_a_ctrl_c_in_period_2_restores_both_and_says_the_run_was_cut(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPEC_CUT", "1")
    result = crossover(pytester, TWO)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret not in (pytest.ExitCode.OK, pytest.ExitCode.USAGE_ERROR), out
    assert "[crossover] period 2 of 2: a serves ngram, b serves baseline" in out
    assert "[crossover] restoring replica a (scripted-host), replica b (scripted-host)" in out
    (path,) = (pytester.path / "reports").glob("*/results.json")
    results = json.loads(path.read_text())
    assert [(r["name"], r["starts"], r["left"]) for r in results["replicas"]] == [
        ("a", 2, "active, serving"),
        ("b", 2, "active, serving"),
    ]
    assert results["cut"] is not None and results["crossover"] is None
    assert results["crossover_missing"] == "period 2 not measured"
    assert results["cut"]["step"] == "crossover period 2: sending slot 1 to every replica"
    assert "Run cut short" in (path.parent / "summary.md").read_text()
    events = [json.loads(e) for e in (pytester.path / "events.jsonl").read_text().splitlines()]
    started = [[e for e in ev[1] if e.startswith("start")] for ev in events if len(ev[1]) > 1]
    assert sorted(started) == [["start ngram", "start original"]] * 2  # each: twice, back


@pytest.mark.usefixtures("_importable_support")
def test_a_ctrl_c_during_period_2_s_switch_restores_both_and_says_so(
    pytester: pytest.Pytester,
) -> None:
    result = crossover(pytester, TWO, cut_switch=True)
    out = result.stdout.str() + result.stderr.str()
    assert result.ret not in (pytest.ExitCode.OK, pytest.ExitCode.USAGE_ERROR), out
    assert "[crossover] period 2 of 2: switching the replicas" in out
    assert "[crossover] period 2 of 2: a serves ngram, b serves baseline" not in out  # no slot
    (path,) = (pytester.path / "reports").glob("*/results.json")
    results = json.loads(path.read_text())
    cut = results["cut"]
    assert cut["by"] == "SIGINT" and cut["kind"] == "signal", cut
    assert cut["step"] == (
        "crossover period 2: switching the replicas (a serves ngram, b serves baseline)"
    )
    assert cut["design_complete"] is False
    assert results["crossover"] is None
    assert results["crossover_missing"] == "period 2 not measured"
    # nothing measured is lost: period 1's slots, each to both replicas
    assert [(s["period"], s["slot"]) for s in results["crossover_slots"]] == [(1, 0), (1, 1),
                                                                            (1, 2)]  # fmt: skip
    samples = (path.parent / "samples.jsonl").read_text().splitlines()
    assert {(json.loads(x)["period"], json.loads(x)["replica"]) for x in samples} == {
        (1, "a"), (1, "b")
    }  # fmt: skip
    assert [(r["name"], r["starts"], r["left"]) for r in results["replicas"]] == [
        ("a", 2, "active, serving"),
        ("b", 2, "active, serving"),
    ]
    assert results["ending"]["how"] == "interrupted"
    summary = (path.parent / "summary.md").read_text()
    assert "Run cut short" in summary and "switching the replicas" in summary
    events = [json.loads(e) for e in (pytester.path / "events.jsonl").read_text().splitlines()]
    started = [[e for e in ev[1] if e.startswith("start")] for ev in events if len(ev[1]) > 1]
    assert sorted(started) == [["start ngram", "start original"]] * 2  # each: once, and back


@pytest.mark.usefixtures("_importable_support")
def test_what_a_crossover_does_not_run_is_refused_before_anything_is_touched(
    pytester: pytest.Pytester,
) -> None:
    result = crossover(pytester, TWO, "--spec-aba")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--spec-aba is not run across replicas" in result.stderr.str()
    assert not (pytester.path / "events.jsonl").exists()  # no replica was even opened
    result = crossover(pytester, TWO, "--spec-repeats", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--spec-repeats is not used across replicas" in result.stderr.str()
    assert "--spec-crossovers N" in result.stderr.str()
    assert not (pytester.path / "events.jsonl").exists()


def test_a_host_away_at_the_restore_is_waited_for_while_the_other_is_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, a, b, log = two(tmp_path)
    cut_in_period_2(monkeypatch, Cut("the link to a dropped"))
    original = a.original()
    real_start, away = original.start, [2]

    def start() -> None:  # a's SSH connection is gone for its first two tries
        if away[0]:
            away[0] -= 1
            raise HostError("ssh: connect to host gpu-a port 22: Connection refused")
        real_start()

    original.start = start  # type: ignore[method-assign]
    a.reachable = lambda: away[0] == 0  # type: ignore[method-assign]
    barrier = parallel_closes(a, b)
    with pytest.raises(Cut), hold(run, log, restore_s=60.0) as held:
        run.held = held
        run.measure_all()
    assert not barrier.broken and original.is_active() and b.original().is_active()
    assert [r.left for r in run.replicas] == ["active, serving", "active, serving"]
    retries = [line for line in log if line.startswith("[a] restore: starting the original")]
    assert len(retries) == 2 and "the host is unreachable, retrying" in retries[0]
    assert not any(line.startswith("[b] restore: starting") for line in log)


def test_each_replica_s_servers_are_started_by_a_thread_that_outlives_its_period(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local server dies with the thread that started it (PR_SET_PDEATHSIG): the thread that
    started a replica's server must still run while that server is measured."""
    run, a, b, log = two(tmp_path)
    starters: list[threading.Thread] = []
    for target in (a, b):
        made = target.candidate

        def candidate(spec, made=made):
            service = made(spec)
            real = service.start

            def start() -> None:
                starters.append(threading.current_thread())
                real()

            service.start = start  # type: ignore[method-assign]
            return service

        target.candidate = candidate  # type: ignore[method-assign]
    alive: list[bool] = []
    real_send = crossover_module.send_period

    def send(*args, **kwargs):
        alive.append(all(t.is_alive() for t in starters))
        return real_send(*args, **kwargs)

    monkeypatch.setattr(crossover_module, "send_period", send)
    with hold(run, log) as held:
        run.held = held
        run.measure_all()
    assert len(starters) == 2 and starters[0] is not threading.main_thread()
    assert alive == [True, True]  # both periods measured while their starters lived
