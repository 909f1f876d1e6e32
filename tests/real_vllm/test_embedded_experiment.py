"""The experiment end to end on the real CPU vLLM (minutes each): the tests that matter.

One run (baseline, ngram, its control arm with --spec-control, and the original again with
--spec-aba; four prompt types; outputs of 16 tokens: what is read is the mechanics, not a
verdict) serves the end-to-end test and the report test, and its stored baseline the failing
candidate's run, which starts no original; the signals each start a server of their own.
"""

from __future__ import annotations

import html
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.cli import compare_runs as compare
from pytest_specdecode.record.store import load_run

from ..support.embedded import (
    STEP_SUMMARY,
    EmbeddedExperiment,
    all_samples,
    require_embedded,
    run_suite,
    write_experiment,
)
from ..support.pipes import finish
from ..support.terminal import default_signals

PROMPT_TYPES = ["coding", "math", "structured", "explanatory"]
PLOTS = ("throughput", "tpot", "acceptance", "time")
RUN = {"max_tokens": 16}  # short outputs: every request half as long as the default 32
UNDECIDED_VERDICTS = {"inconclusive", "insufficient samples", "contaminated"}


@dataclass(frozen=True)
class NgramRun:
    exp: EmbeddedExperiment
    out: str
    err: str
    returncode: int
    data: dict


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory: pytest.TempPathFactory) -> NgramRun:
    # An impossible TPOT ceiling on one prompt type: exactly those tests must fail.
    require_embedded()
    exp = write_experiment(
        tmp_path_factory.mktemp("ngram-run"),
        run=RUN,
        thresholds="min_tokens_per_s = 1.0\nmax_tpot_ms = 5000",
    )
    text = exp.config.read_text().replace(
        "[prompt_types.structured]\n", "[prompt_types.structured]\nmax_tpot_ms = 0.5\n"
    )
    exp.config.write_text(text)
    done = run_suite(exp, "--spec-config", "ngram", "--spec-control", "--spec-aba", "-rA")
    assert exp.reports.exists(), (done.stdout + done.stderr)[-3000:]  # refused: no run folder
    return NgramRun(exp, done.stdout, done.stderr, done.returncode, exp.results())


def test_baseline_vs_ngram_end_to_end(ngram_run: NgramRun) -> None:
    exp, out, err, data = ngram_run.exp, ngram_run.out, ngram_run.err, ngram_run.data
    verdicts = data["analysis"]["verdicts"]["ngram"]
    regressed = {w for w, v in verdicts.items() if v["verdict"] == "regressed"}
    undecided = {w for w, v in verdicts.items() if v["verdict"] in UNDECIDED_VERDICTS}
    # The suite's own example test (suites/test_time_to_first_token.py) fails where the
    # candidate's median TTFT is over 1.5 times the baseline's: on a busy machine, it can be.
    ttft = {
        phase: {
            w: statistics.median(s["ttft_s"] for s in m["samples"])
            for w, m in data["phases"][phase]["measurements"].items()
        }
        for phase in ("baseline", "ngram")
    }
    slow_first_token = {w for w in PROMPT_TYPES if ttft["ngram"][w] > 1.5 * ttft["baseline"][w]}
    expected_failures = {
        "test_tpot_threshold[baseline-structured]",
        "test_tpot_threshold[ngram-structured]",
        *(f"test_speculation_does_not_regress[ngram-{w}]" for w in regressed),
        *(["test_baseline_did_not_drift"] if data["analysis"]["drift"]["unreliable"] else []),
        *(f"test_speculation_keeps_the_first_token_prompt[ngram-{w}]" for w in slow_first_token),
    }
    failed = set(re.findall(r"^FAILED \S+::(\S+)", out, re.M))
    assert failed == expected_failures, out
    # No verdict is pytest's own outcome: listed, and counted in pytest's summary line as
    # "N undecided"; the session still fails.
    expected_undecided = {f"test_speculation_does_not_regress[ngram-{w}]" for w in undecided}
    assert set(re.findall(r"^UNDECIDED \S+::(\S+)", out, re.M)) == expected_undecided, out
    summary = out.strip().splitlines()[-1]
    if expected_undecided:
        assert re.search(rf"\b{len(expected_undecided)} undecided\b", summary), summary
    else:
        assert "undecided" not in summary, summary
    assert ngram_run.returncode == pytest.ExitCode.TESTS_FAILED
    assert "median TPOT" in out and "above the threshold 0.5 ms" in out

    # The original, the candidate, its control, the original again (ABA); restored to "not
    # running".
    assert err.count("starting local vLLM process") == 4, err
    assert err.count("starting local vLLM process 'candidate-ngram-control'") == 1, err
    assert err.count("starting local vLLM process 'original'") == 2, err
    assert "drift check (ABA): measuring the original again" in err
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
    assert len(samples) == 4 * 4 * (6 + 1)
    assert sum(not s["warmup"] for s in samples) == 4 * 4 * 6

    # The interleaved order: each start's requests in rounds, every prompt type once a round,
    # sent one after another in the recorded slot order.
    assert err.count("4 cells in rounds, one slot each (shuffled, seed ") == 4, err
    for name, phase in data["phases"].items():
        assert phase["order"] == "interleaved" and phase["order_seed"] is not None, name
        timed = sorted(
            (s for m in phase["measurements"].values() for s in m["samples"]),
            key=lambda s: s["slot"],
        )
        assert [s["slot"] for s in timed] == list(range(4 * 6)), name
        kinds = [s["prompt_type"] for s in timed]
        rounds = [kinds[i : i + 4] for i in range(0, len(kinds), 4)]
        assert all(sorted(r) == sorted(PROMPT_TYPES) for r in rounds), (name, rounds)
        assert [s["started_at"] for s in timed] == sorted(s["started_at"] for s in timed)
    # TPOT as the client saw it: 0 where a starved API server sent every token in one chunk (a
    # CI run with a core kept busy: 3 of 112 requests)
    assert all(s["output_tokens"] > 1 and s["tpot_s"] >= 0 for s in samples)
    assert sum(s["tpot_s"] > 0 for s in samples) > len(samples) // 2
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

    # What each start ran with, read from its own log: the CPU vLLM 0.32 turns async scheduling
    # off at every start; only n-gram's log says so. The control turns it off too.
    engines = {name: data["phases"][name]["engine"] for name in ("baseline", "ngram")}
    assert engines["ngram"]["async_scheduling"] is False and engines["ngram"]["async_said"]
    assert "Async scheduling not supported with ngram" in engines["ngram"]["async_evidence"]
    assert engines["baseline"]["async_scheduling"] is False
    assert not engines["baseline"]["async_said"]
    command = data["target"]["command"]
    max_model_len = int(command[command.index("--max-model-len") + 1])
    assert engines["baseline"]["non_default_args"]["max_model_len"] == max_model_len
    control = data["phases"]["ngram-control"]
    assert control["control_of"] == "ngram" and control["spec"] == {}
    assert control["extra_args"] == ["--no-async-scheduling"]
    assert control["engine"]["non_default_args"]["async_scheduling"] is False
    assert "ngram-control" not in data["candidates"]  # no verdict test gates on it
    split = data["analysis"]["control_splits"]["ngram"]
    for part in ("flag", "speculation", "side"):
        assert set(split["parts"][part]) == set(PROMPT_TYPES)
    assert split["parts"]["flag"] == data["analysis"]["verdicts"]["ngram"]


def side_change_shown(text: str) -> None:
    """The side change named beside the verdict, and the change split in three, each with its
    interval, on every prompt type."""
    assert "ngram also changed:" in text, text[-3000:]
    assert "async scheduling disabled (vLLM: Async scheduling not supported with ngram" in text
    assert "split by its control arm ngram-control (the original + --no-async-scheduling; " in text
    assert re.search(
        r"ngram-control \(the original \+ --no-async-scheduling; it ran with: [^)]*"
        r"async scheduling disabled",
        text,
    ), text[-3000:]
    pct = r"[+-][\d.]+%"
    interval = rf"{pct} \[{pct}, {pct}\] \(\w[\w ]*\)"
    for w in PROMPT_TYPES:
        assert re.search(
            rf"{w}: the flag as turned on {interval} · speculation itself {interval} · "
            rf"the side changes {interval}",
            text,
        ), w


def _html_data(text: str) -> dict:
    """The JSON blob pytest-html renders its environment and results from."""
    blob = re.search(r'data-jsonblob="([^"]*)"', text)
    assert blob, "no data-jsonblob in report.html"
    return json.loads(html.unescape(blob.group(1)))


def test_report_html_summary_and_plots_of_a_real_run(ngram_run: NgramRun) -> None:
    exp, out, err = ngram_run.exp, ngram_run.out, ngram_run.err
    step_summary = exp.dir / STEP_SUMMARY
    run = exp.run_dir()
    data = json.loads((run / "results.json").read_text())
    analysis = data["analysis"]
    print(f"run folder: {run}")  # kept under pytest's base folder, for a look at report.html

    # The run folder holds everything a reviewer needs, and nothing else was overwritten.
    for name in ("report.html", "summary.md", "results.json", *(f"{p}.png" for p in PLOTS)):
        assert (run / name).is_file(), f"{name} missing in {sorted(p.name for p in run.iterdir())}"
    for plot in PLOTS:
        assert (run / f"{plot}.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")

    # ABA: the original was started a second time, measured, and compared with the first.
    assert err.count("starting local vLLM process 'original'") == 2, err
    assert "drift check (ABA): measuring the original again" in err
    assert "restored to stopped" in err
    assert exp.leftover_servers() == []
    assert set(data["phases"]) == {"baseline", "ngram", "ngram-control", "baseline-after"}
    assert analysis["drift"]["status"] in {"consistent", "drifted", "undecided"}
    assert analysis["drift"]["unreliable"] is (analysis["drift"]["status"] == "drifted")
    equivalence = analysis["equivalence"]["ngram"]["coding"]
    assert equivalence["n"] == 6 and equivalence["status"] in {"identical", "differs"}
    environment = {"gpus", "cpu", "accelerator", "git_commit", "vllm", "host_before_run"}
    environment |= {"machine", "planned_s", "run_s"}  # which machine; the plan's pace and the run's
    environment |= {"pace"}  # its starts and slots as it timed them, for the next plan
    assert set(data["environment"]) - {"suite_content"} == environment  # content: outside git
    assert data["environment"]["accelerator"]["kind"] == "cpu"
    assert data["environment"]["vllm"]["version"] == "0.32.0"  # what the candidates were checked by
    assert data["environment"]["gpus"] is None  # no nvidia-smi on this machine

    # report.html: title, the seed-style table with its verdict, the three plots, the checks.
    page = (run / "report.html").read_text()
    assert '<title id="head-title">Speculative decoding: baseline vs ngram' in page
    summary = page[page.index("id='specdecode-summary'") :]
    for column in ("Prompt", "Baseline tok/s", "Candidate tok/s", "Change", "p", "Verdict"):
        assert f"<th>{column}</th>" in summary
    assert "<th>TPOT baseline → candidate</th>" in summary
    verdict = analysis["verdicts"]["ngram"]["coding"]["verdict"]
    # the verdict names the metric that decided it, with its interval (none: contaminated)
    assert re.search(rf"<td class='verdict [^']*'[^>]*>{verdict}(?: \([^<]*\))?</td>", summary)
    assert verdict in {"improved", "regressed", "equivalent", "inconclusive"}
    for plot in PLOTS:
        assert (
            f"<img id='specdecode-plot-{plot}' alt='{plot} plot' src='data:image/png;base64,"
            in (summary)
        )
    assert "(aba)" in summary.lower() and "Output, ngram/coding" in summary
    side_change_shown(html.unescape(re.sub(r"<[^>]+>", "\n", summary)))

    # The environment table: what was tested, where.
    blob = _html_data(page)
    env = blob["environment"]
    assert env["Model"] == "smollm2-135m-instruct"
    assert env["vLLM version"] == "0.32.0"
    assert env["Host"] == "localhost" and env["Backend"] == "local"
    assert env["GPUs"].startswith("none listed")
    assert set(env["Speculation configs"]) == {"ngram"}
    assert env["pytest-specdecode"] == "0.1.0"
    assert "Suite commit" in env and "Python" in env  # ours first, then pytest-metadata's

    # Per-test extras, attached in the call phase: the prompt type's row and acceptance.
    tests = blob["tests"]
    extras = {
        nodeid.split("::")[-1]: " ".join(
            e["content"] for t in entries for e in t["extras"] if e["format_type"] == "html"
        )
        for nodeid, entries in tests.items()
    }
    regress = extras["test_speculation_does_not_regress[ngram-coding]"]
    assert "specdecode-table" in regress and verdict in regress
    assert "<th>draft position</th>" in regress and "Output:" in regress
    assert "Median tok/s" in extras["test_throughput_threshold[baseline-coding]"]

    # summary.md, fit for a PR comment, and the same text in $GITHUB_STEP_SUMMARY.
    md = (run / "summary.md").read_text()
    assert (
        "| Prompt | Baseline tok/s | Candidate tok/s | Change | TPOT baseline → candidate |" in md
    )
    assert re.search(r"^\| coding \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% ", md, re.M), md
    assert verdict in md and "drift" in md.lower()
    assert step_summary.read_text().strip() == md.strip()
    side_change_shown(md)

    # The terminal: table, checks and where the files are.
    assert re.search(r"^coding\s+ngram\s+[\d.]+\s+[\d.]+\s+[+-][\d.]+%", out, re.M), out
    assert f"summary: {run / 'summary.md'}" in out
    assert "report.html" in out  # pytest-html's own line
    side_change_shown(out)
    # foreseen from the serving vLLM's own source: its CPU platform turns async scheduling off
    # at every start, the original's too, so the plan foresees no change (the log then tells)
    assert (
        "plan: side changes of ngram: none foreseen (vLLM 0.32.0's CPU platform turns async "
        "scheduling off at every start (vllm/platforms/cpu.py), the original's too)" in err
    ), err

    # The stored run serves as a baseline: a dry run with it plans one phase, starts nothing.
    dry = run_suite(
        exp,
        "--spec-config",
        "ngram",
        "--spec-workload",
        "coding",
        "--spec-dry-run",
        "--spec-baseline-from",
        str(run / "results.json"),
    )
    dry_out = dry.stdout
    assert dry.returncode == pytest.ExitCode.OK, dry_out + dry.stderr
    assert f"baseline: reused from {run / 'results.json'}" in dry_out
    assert "requests: 7 = 1 phases x 1 prompt types x (6 measured + 1 warm-up)" in dry_out
    assert f"from the stored run {run.name}" in dry_out  # the estimate uses this run's timings
    assert [p for p in exp.reports.iterdir() if p.is_dir()] == [run]

    # And two stored runs compare (here: the run with itself).
    assert compare.main([str(run / "results.json"), str(run)]) == 0
    # The verdicts computed live are those recomputed from results.json.
    live = ngram_run.data["analysis"]
    again = analyze(load_run(run / "results.json"))
    assert again.outcome == live["outcome"] and again.passed == live["passed"]
    assert {c: {t: (v.verdict.value, v.reason) for t, v in per.items()}
            for c, per in again.verdicts.items()} == {
        c: {t: (v["verdict"], v["reason"]) for t, v in per.items()}
        for c, per in live["verdicts"].items()}  # fmt: skip


def test_sigterm_mid_measurement_restores_and_keeps_samples(pytester: pytest.Pytester) -> None:
    """A cancelled job's SIGTERM; Ctrl-C's SIGINT is sent on the systemd host
    (real_host/test_remote_host.py, test_production_units.py), through the same handler. The
    cut run says so at the top of summary.md, report.html and the terminal, and in results.json
    (the scripted SIGINT's: unit/report/test_cut_run.py)."""
    sig = signal.SIGTERM
    exp = write_experiment(pytester, run={**RUN, "samples": 6})
    cmd = [sys.executable, "-m", "pytest", *exp.args("--spec-config", "ngram")]
    terminal = pytester.path / "stdout.txt"  # a file: a pipe nobody reads could fill and block
    with terminal.open("w") as stdout:  # the child keeps its own copy
        proc = subprocess.Popen(
            cmd, cwd=pytester.path, stderr=subprocess.PIPE, text=True, stdout=stdout,
            preexec_fn=default_signals,  # SIGTERM as a CI runner's job gets it
        )  # fmt: skip
    lines = []
    deadline = time.monotonic() + 400
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if "[baseline]: 5 rounds, 20 slots sent" in line:  # the sixth and last round under way
            break
        assert time.monotonic() < deadline, "".join(lines)
    time.sleep(2)
    proc.send_signal(sig)
    _, rest = finish(proc, 90)  # killed at the limit
    err = "".join(lines) + rest
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, err
    assert "restored to stopped" in err, err
    assert exp.leftover_servers() == []
    data = exp.results()
    samples = all_samples(data)
    for prompt_type in PROMPT_TYPES:  # each 1 warm-up + 5 rounds at least, all kept
        assert sum(s["prompt_type"] == prompt_type for s in samples) >= 6, prompt_type
    assert "candidate-ngram" not in err  # interrupted before any swap

    # The cut, said first: in the sixth round of the baseline's 24 slots (or, if that round
    # ended before the signal, recording its token ids), before any test ran.
    cut = data["cut"]
    assert cut["by"] == "SIGTERM" and cut["kind"] == "signal", cut
    step = (
        r"measuring slot 2[1-4] of 24 \(\w+\) on baseline|recording token ids of \[baseline\] \w+"
    )
    assert re.fullmatch(step, cut["step"]), cut
    assert cut["tests"]["ran"] == [] and cut["tests"]["collected"] > 0, cut
    assert cut["design_complete"] is False and cut["exit_code"] == pytest.ExitCode.INTERRUPTED
    measured = cut["measured"]
    assert (measured["starts"], measured["starts_planned"]) == (1, 2), measured
    assert measured["samples"] == sum(not s["warmup"] for s in samples), measured
    summary = (exp.run_dir() / "summary.md").read_text()
    top = summary.splitlines()[0]
    assert top.startswith("> **⚠ Cut short by SIGTERM (a cancelled job"), summary
    assert f"while {cut['step']}." in top, top
    assert "no tests ran (none of" in summary.split("## ")[0]
    assert "**Result (partial: cut by SIGTERM" in summary
    page = (exp.run_dir() / "report.html").read_text()
    assert "Cut short by SIGTERM" in page, page[-3000:]
    section = terminal.read_text().split("speculative decoding: baseline vs candidates")[-1]
    assert section.lstrip(" =\n").startswith("CUT SHORT: Cut short by SIGTERM"), section


def test_candidate_that_dies_at_startup_fails_fast_with_its_log(
    pytester: pytest.Pytester, ngram_run: NgramRun
) -> None:
    """vLLM accepts the JSON but the suffix method needs a package the server lacks: it exits.
    The baseline is the shared run's stored one, so the candidate is the only start."""
    exp = write_experiment(pytester, run={**RUN, "warmup": 0})
    stored = ngram_run.exp.run_dir() / "results.json"
    result = pytester.runpytest_subprocess(
        *exp.args("--spec-config", "suffix", "--spec-workload", "coding"),
        "--spec-baseline-from",
        str(stored),
    )
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret != 0
    assert f"baseline: reused from {stored}, not measured" in err, err
    assert re.findall(r"starting local vLLM process '(\S+)'", err) == ["candidate-suffix"], err
    assert "local vLLM process 'candidate-suffix'" in out
    assert "failed while starting" in out and "exited with status" in out
    assert "Arctic Inference is required for suffix decoding" in out  # the log tail
    # Shown in full once; every later test that needed the arm points at it.
    # Counted above pytest's own summary, which repeats each message whole where CI is set.
    body = out.split("short test summary info")[0]
    shown = re.findall(r"--- last \d+ log lines of local vLLM process 'candidate-suffix", body)
    assert len(shown) == 1, out
    assert "the suffix arm failed to start (shown in full at specdecode::" in out, out
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
