"""A host profile belongs to one host, accelerator, model and vLLM version (issue 28).

On an H200 with vLLM 0.26, the plan once quoted the committed CPU profile (vLLM 0.32) while the
verdicts assumed 5%, and the GPU's A/A run was appended to the CPU's file with its GPUs as a
Python list string. These tests pin the key, the typed fields, and one noise for the plan and
the verdicts.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from pytest_specdecode.analysis.run import analyze
from pytest_specdecode.analysis.verdict import noise
from pytest_specdecode.config.arms import AA_ARM, BASELINE
from pytest_specdecode.measure.environment import machine, parse_cpu_model
from pytest_specdecode.measure.served_speed import seconds_per_output_token
from pytest_specdecode.record.profile import (
    Accelerator,
    EngineSpeed,
    HostProfile,
    ProfileEntry,
    ProfileKey,
    accelerator_of,
    add_entry,
    lookup,
    read_profile,
    with_held_version,
)
from pytest_specdecode.record.schema import RunRecord
from pytest_specdecode.report import plan
from pytest_specdecode.targets.hosts.base import LocalHost

from ...support.inprocess import run_in_process
from ...support.synthetic import aa_entry as entry
from ...support.synthetic import add_phase, record, settings, store

REPO = Path(__file__).resolve().parents[3]
CPU = Accelerator("cpu", "AMD EPYC")
H200 = Accelerator("gpu", "NVIDIA H200", 1)
H200_LINE = "0: NVIDIA H200, 143771 MiB, driver 570.86.15"
MODEL = "smollm2-135m-instruct"


def test_a_profile_round_trips_its_typed_fields(tmp_path: Path) -> None:
    written = entry("aa-gpu", "0.26.0", 0.11, gpus=(H200_LINE,), speed=EngineSpeed(61.0, 0.004))
    path = add_entry(tmp_path, "localhost", H200, MODEL, written)
    data = json.loads(path.read_text())
    assert data["accelerator"] == {"kind": "gpu", "model": "NVIDIA H200", "count": 1}
    assert data["entries"][0]["gpus"] == [H200_LINE]  # a list, not a Python list's repr
    back = read_profile(tmp_path, "localhost", H200, MODEL)
    assert back == HostProfile("localhost", MODEL, H200, (written,))
    # An earlier version stored the list's repr: read back as the list it was.
    old = {**written.to_json(), "gpus": str([H200_LINE])}
    assert ProfileEntry.from_json(old).gpus == (H200_LINE,)


def test_the_accelerator_is_the_gpus_model_and_count_else_the_cpu_model() -> None:
    two = [H200_LINE, "1: NVIDIA H200, 143771 MiB, driver 570.86.15"]
    assert accelerator_of(two, "AMD EPYC") == Accelerator("gpu", "NVIDIA H200", 2)
    assert accelerator_of(None, "AMD EPYC") == CPU
    assert accelerator_of(None, None) is None
    assert parse_cpu_model("model name\t: AMD EPYC 9654 96-Core Processor\n") == (
        "AMD EPYC 9654 96-Core Processor"
    )
    assert parse_cpu_model("Architecture: x86_64\nModel name:   Intel(R) Xeon(R)\n") == (
        "Intel(R) Xeon(R)"
    )
    found = machine(LocalHost())  # read on the serving host, through the Host interface
    assert found["accelerator"] == (
        accelerator_of(found["gpus"], found["cpu"]).to_json()  # type: ignore[union-attr]
    )


def test_a_profile_of_another_accelerator_or_vllm_version_is_not_used_as_measured(
    tmp_path: Path,
) -> None:
    cpu_path = add_entry(tmp_path, "localhost", CPU, MODEL, entry("aa-cpu", "0.32.0", 0.071))
    # The GPU run of vLLM 0.26: the CPU's profile is named, not used.
    gpu = ProfileKey("localhost", H200, MODEL, "0.26.0")
    found = lookup(tmp_path, gpu)
    assert found.profile is None and noise.known(found, []) == {}
    unused = noise.not_used(found, [])
    assert unused is not None and str(cpu_path) in unused and "CPU AMD EPYC, vLLM 0.32.0" in unused
    # The same CPU, another vLLM version: its entries are not used either.
    other_version = lookup(tmp_path, ProfileKey("localhost", CPU, MODEL, "0.26.0"))
    assert noise.known(other_version, []) == {}
    assert "entries of vLLM 0.32.0" in (noise.not_used(other_version, []) or "")
    # The key it was measured for: used, as measured, and named by its version.
    same = noise.known(lookup(tmp_path, ProfileKey("localhost", CPU, MODEL, "0.32.0")), [])
    assert same["throughput"].measured and same["throughput"].sd == pytest.approx(0.071)
    assert same["throughput"].source.endswith("vLLM 0.32.0")
    # Before the server starts its version is unknown: the one version the profile holds.
    unknown = ProfileKey("localhost", CPU, MODEL, None)
    assert noise.known(lookup(tmp_path, unknown), []) == {}
    assert with_held_version(tmp_path, unknown).vllm_version == "0.32.0"


def test_an_unkeyed_profile_of_an_earlier_version_is_named_not_used(tmp_path: Path) -> None:
    old = tmp_path / f"localhost--{MODEL}.json"
    data = HostProfile("localhost", MODEL, None, (entry("aa", "0.32.0", 0.071),)).to_json()
    old.write_text(json.dumps({**data, "pytest_specdecode_host_profile": 1}))
    found = lookup(tmp_path, ProfileKey("localhost", CPU, MODEL, "0.32.0"))
    assert noise.known(found, []) == {}
    assert f"host profile {old} (unkeyed: any accelerator, vLLM 0.32.0)" in (
        noise.not_used(found, []) or ""
    )


def aa_record(tmp_path: Path, environment: dict) -> RunRecord:
    """An A/A run of four starts of the original's configuration."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    rec = record(settings(tmp_path, candidates=("ngram",)))
    rec.candidates = {AA_ARM: {}}
    rec.environment = {**rec.environment, **environment}
    rates = {"coding": 20.0, "math": 16.0}
    for i, (name, arm) in enumerate(
        [
            (BASELINE, BASELINE),
            (AA_ARM, AA_ARM),
            (f"{BASELINE}#2", BASELINE),
            (f"{AA_ARM}#2", AA_ARM),
        ]
    ):
        scaled = {w: r * (1 + 0.04 * (-1) ** i) for w, r in rates.items()}
        add_phase(rec, name, scaled, arm=arm, seed=i).startup_s = 60.0
    return rec


def test_a_gpu_aa_run_writes_its_own_profile_not_the_cpus(tmp_path: Path) -> None:
    cpu_path = add_entry(tmp_path, "localhost", CPU, MODEL, entry("aa-cpu", "0.32.0", 0.071))
    before = cpu_path.read_text()
    gpu = machine_facts([H200_LINE], None)
    rec = aa_record(tmp_path / "run", gpu)
    written = noise.profile_entry(rec, run="aa-gpu", date="2026-12-02")
    assert written is not None and written.gpus == (H200_LINE,)
    assert written.speed is not None and written.speed.start_s == 60.0
    key = noise.key_of(rec)
    assert (key.accelerator, key.vllm_version) == (H200, "0.32.0")
    path = add_entry(tmp_path, key.host, key.accelerator, key.model, written)
    assert path != cpu_path and "1x-NVIDIA_H200" in path.name
    assert cpu_path.read_text() == before
    assert json.loads(path.read_text())["entries"][0]["gpus"] == [H200_LINE]


def test_another_machines_noise_is_a_prior_in_the_runs_warning_not_assumed(tmp_path: Path) -> None:
    """The fresh clone's main job of 2026-12-04: the plan named the committed profile a prior of
    2.8%, and the warning under the table said "its prior: assumed 3%"."""
    rec = aa_record(tmp_path, machine_facts(None, "AMD EPYC"))
    source = "a prior of 2.8%, weighted as 7 degrees of freedom: measured on another machine"
    rec.restart_noise_prior = {
        m: {"sd": 0.028, "df": 7.0, "source": source, "measured": False}
        for m in ("throughput", "tpot")
    }
    text = " ".join(analyze(rec).warnings)
    assert "its prior: a prior from another machine, 2.8%, weighted as 7" in text, text
    assert "assumed" not in text, text


def machine_facts(gpus: list[str] | None, cpu: str | None) -> dict:
    found = accelerator_of(gpus, cpu)
    return {"gpus": gpus, "cpu": cpu, "accelerator": found.to_json() if found else None}


def test_an_aa_run_says_what_it_measured_not_unmeasured(tmp_path: Path) -> None:
    rec = aa_record(tmp_path, machine_facts(None, "AMD EPYC"))
    analysis = analyze(rec)  # no prior: nothing measured before this run
    assert analysis.measured_noise  # the run measured it: four starts
    text = " ".join(analysis.warnings)
    assert "unmeasured" not in text, text
    assert "this A/A run's 4 starts measured it" in text, text
    undecided = [v for per in analysis.verdicts.values() for v in per.values() if v.undecided]
    assert undecided  # two starts per arm at an assumed 5%: nothing decided
    for v in undecided:
        assert "an A/A run" not in v.reason, v.reason
    # An ordinary candidate's run with one start per arm measured nothing: said as before.
    (tmp_path / "plain").mkdir()
    plain = record(settings(tmp_path / "plain"))
    add_phase(plain, BASELINE, {"coding": 20.0})
    add_phase(plain, "ngram", {"coding": 20.0}, seed=1)
    assert any(w.startswith("restart noise unmeasured") for w in analyze(plain).warnings)


CONFIG = """
reports_dir = "{reports}"
[target]
api_base = "http://scripted.invalid:8000"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]
startup_timeout_s = 5
[run]
samples = 5
warmup = 1
max_tokens = 8
max_samples = 5
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompt = "coding"
"""

CONFTEST = """
from tests.support.scripted_target import Script, ScriptedTarget

def pytest_specdecode_open_target(config, settings, log_dir):
    return ScriptedTarget(Script(), {"ngram": Script(), "baseline-again": Script()})
"""


def scripted_run(
    pytester: pytest.Pytester, profiles: Path, *args: str, spec: str = "ngram"
) -> tuple[str, dict]:
    """The suite over a scripted service (its /version: 0.32.0) on this machine, with these
    host profiles; pytest's output and the run's results.json."""
    shutil.copytree(
        REPO / "suites", pytester.path / "suites", ignore=shutil.ignore_patterns("*.toml", "host-*")
    )
    (pytester.path / "suites" / "conftest.py").write_text(CONFTEST)
    config = pytester.path / "experiment.toml"
    config.write_text(CONFIG.format(reports=pytester.path / "reports"))
    result = run_in_process(pytester,
        str(pytester.path / "suites"), "--spec-file", str(config), "--spec-config", spec,
        "--spec-host-profiles", str(profiles), "-p", "no:cacheprovider", *args,
    )  # fmt: skip
    out = result.stdout.str() + result.stderr.str()
    (run,) = (pytester.path / "reports").iterdir()
    return out, json.loads((run / "results.json").read_text())


@pytest.fixture()
def _importable_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests.support` for the copied conftest


def plan_line(out: str) -> str:
    found = re.search(r"plan: restart noise: (.*)", out)
    assert found, out
    return found.group(1)


@pytest.mark.usefixtures("_importable_support")
def test_the_plan_and_the_verdicts_quote_the_same_noise(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    found = machine(LocalHost())  # the scripted host's: this machine
    here = Accelerator.from_json(found["accelerator"])
    profiles = tmp_path / "profiles"
    this = entry("aa-here", "0.32.0", 0.03, machine=found["machine"])
    own = add_entry(profiles, "scripted-host", here, MODEL, this)
    add_entry(profiles, "scripted-host", H200, MODEL, entry("aa-gpu", "0.32.0", 0.20))
    out, results = scripted_run(pytester, profiles)
    line = plan_line(out)
    assert line.startswith("3.0% [") and f"host profile {own}" in line, line
    prior = results["restart_noise_prior"]["throughput"]
    used = results["analysis"]["verdicts"]["ngram"]["coding"]["throughput"]["restart_noise"]
    assert prior["measured"] and prior["sd"] == pytest.approx(0.03)
    assert used["sd"] == pytest.approx(0.03) and used["source"] == prior["source"]


@pytest.mark.usefixtures("_importable_support")
@pytest.mark.parametrize("measured_on", ["gpus:0123456789ab", None])
def test_another_machines_profile_is_only_a_prior_and_the_plan_says_so(
    pytester: pytest.Pytester, tmp_path: Path, measured_on: str | None
) -> None:
    """The same accelerator and vLLM, measured on another machine (or one that did not record
    which): the plan and the verdicts use it as a prior of its own weight, named as such."""
    here = Accelerator.from_json(machine(LocalHost())["accelerator"])
    profiles = tmp_path / "profiles"
    other = entry("aa-elsewhere", "0.32.0", 0.03, machine=measured_on)
    path = add_entry(profiles, "scripted-host", here, MODEL, other)
    out, results = scripted_run(pytester, profiles)
    line = plan_line(out)
    assert line.startswith("a prior of 3.0%, weighted as 7 degrees of freedom: measured on "
                           "another machine of this accelerator"), line  # fmt: skip
    assert f"host profile {path}" in line, line
    # the design's reach names it a prior too, not an assumption
    assert "restart noise: a prior of 3.0% from another machine (weighted as 7 df)" in out, out
    assert "restart noise assumed" not in out, out
    prior = results["restart_noise_prior"]["throughput"]
    used = results["analysis"]["verdicts"]["ngram"]["coding"]["throughput"]["restart_noise"]
    assert prior["measured"] is False and prior["sd"] == pytest.approx(0.03)
    assert used["sd"] == pytest.approx(0.03) and used["source"].startswith("a prior of 3.0%")


@pytest.mark.usefixtures("_importable_support")
def test_only_another_accelerators_profile_the_plan_and_verdicts_assume_and_name_it(
    pytester: pytest.Pytester, tmp_path: Path
) -> None:
    profiles = tmp_path / "profiles"
    gpu = add_entry(profiles, "scripted-host", H200, MODEL, entry("aa-gpu", "0.32.0", 0.20))
    out, results = scripted_run(pytester, profiles)
    line = plan_line(out)
    assert line.startswith("unmeasured: assumed 5%"), line
    assert f"host profile {gpu} (1 x NVIDIA H200, vLLM 0.32.0)" in line, line
    used = results["analysis"]["verdicts"]["ngram"]["coding"]["throughput"]["restart_noise"]
    assert used["measured"] is False and used["sd"] == pytest.approx(0.05)
    assert f"host profile {gpu}" in used["source"]  # named where the verdict is, too
    # issue 50: the plan says the run's whole time, the run its own once after its first
    # round, and it keeps its starts and slots as it timed them for the next plan
    assert re.search(r"plan: estimated duration: .*server starts at ~\d+ s", out), out
    assert out.count("estimate after the first start and round: about ") == 1, out
    pace = results["environment"]["pace"]
    assert pace["slots"] > 0 and pace["slot_s"] > 0 and pace["start_s"] >= 0


def stored_run(s, name: str, environment: dict, tokens_per_s: float) -> None:
    """A stored run of this host and model at this speed, its starts taking 61 s."""
    st = store(s.reports_dir / "x", s)
    st.record.environment = {**st.record.environment, **environment}
    add_phase(st.record, BASELINE, {"coding": tokens_per_s}).startup_s = 61.0
    (s.reports_dir / name).mkdir(parents=True)
    st.path = s.reports_dir / name / "results.json"
    st.flush()


def test_the_dry_run_estimate_on_a_gpu_is_never_a_cpu_guess(tmp_path: Path) -> None:
    s = settings(tmp_path)
    a100 = Accelerator("gpu", "NVIDIA A100-SXM4-80GB", 1)  # a kind whose pace is not known
    on_gpu = {"host": "localhost", "default_start_s": 60.0, "accelerator": a100}
    found = plan.previous_timing(s, **on_gpu)  # nothing measured on this GPU or its kind
    # the table's GPUs' middle, said as such, never a CPU's guess (report/test_plan_time.py)
    assert "no pace is stored for this machine or its kind" in found.source
    assert found.s_per_token is not None and found.s_per_token < plan.CPU_S_PER_TOKEN / 5
    # On an H200 with nothing of this machine's stored: the H200's own pace, named as assumed.
    h200 = plan.previous_timing(s, **{**on_gpu, "accelerator": H200})
    assert h200.source.startswith("assumed for 1 x NVIDIA H200") and h200.s_per_token
    assert h200.s_per_token < plan.CPU_S_PER_TOKEN / 5  # never the CPU's guess
    on_gpu["accelerator"] = H200
    # A stored run of the CPU on the same host name is another accelerator's: not used.
    stored_run(s, "20261201T000000Z-cpu", machine_facts(None, "AMD EPYC"), tokens_per_s=20.0)
    assert plan.previous_timing(s, **on_gpu).source == h200.source
    cpu = plan.previous_timing(s, **{**on_gpu, "accelerator": CPU})
    assert cpu.s_per_token == pytest.approx(1 / 20, rel=0.05)
    # The GPU's host profile holds the engine's speed: another machine's (or one not
    # recorded) yields to the H200's own pace; this machine's entry is its own pace.
    profiles = tmp_path / "profiles"
    speed = EngineSpeed(58.0, 0.004)
    add_entry(profiles, "localhost", H200, MODEL, entry("aa-gpu", "0.26.0", 0.1, speed=speed))
    key = ProfileKey("localhost", H200, MODEL, "0.26.0")
    other = plan.previous_timing(s, **on_gpu, profile=lookup(profiles, key), machine="m-1")
    assert other.source == h200.source
    mine = entry("aa-here", "0.26.0", 0.1, speed=speed, machine="m-1")
    add_entry(profiles, "localhost", H200, MODEL, mine)
    from_profile = plan.previous_timing(s, **on_gpu, profile=lookup(profiles, key), machine="m-1")
    assert (from_profile.start_s, from_profile.s_per_token) == (58.0, 0.004)
    assert from_profile.source.startswith("from the host profile")
    # And a stored run of the GPU, newer knowledge of this host, comes first.
    stored_run(s, "20261202T000000Z-gpu", machine_facts([H200_LINE], None), tokens_per_s=250.0)
    gpu = plan.previous_timing(s, **on_gpu, profile=lookup(profiles, key))
    assert gpu.s_per_token == pytest.approx(1 / 250, rel=0.05)
    assert gpu.source == "from the stored run 20261202T000000Z-gpu"


def test_on_a_cpu_with_nothing_stored_the_assumption_says_it_is_for_a_cpu(tmp_path: Path) -> None:
    s = settings(tmp_path)
    found = plan.previous_timing(s, host="localhost", default_start_s=60.0, accelerator=CPU)
    assert found.s_per_token == plan.CPU_S_PER_TOKEN
    assert found.source.startswith("assumed for a CPU: no stored run or host profile")


def test_a_running_servers_metrics_give_the_engines_speed(tmp_path: Path) -> None:
    text = (REPO / "tests/data/vllm-0.32-cpu-baseline.metrics.txt").read_text()
    # The captured server finished one request: 8 tokens in 1.789 s end to end.
    per_token = seconds_per_output_token(text)
    assert per_token == pytest.approx(1.789334774017334 / 8.0)
    assert seconds_per_output_token("not prometheus {") is None
    s = settings(tmp_path)
    found = plan.previous_timing(
        s, host="localhost", default_start_s=60.0, accelerator=H200, served=per_token
    )
    assert found.s_per_token == per_token and "/metrics" in found.source


@pytest.mark.usefixtures("_importable_support")
def test_a_scripted_aa_run_says_what_it_measured(pytester: pytest.Pytester, tmp_path: Path) -> None:
    out, results = scripted_run(
        pytester, tmp_path / "profiles", "--spec-repeats", "2", spec="baseline"
    )
    assert results["analysis"]["measured_restart_noise"]["throughput"]["df"] == 3, out
    assert "Restart noise measured by this run, throughput: " in out, out
    assert "warning: restart noise unmeasured" not in out, out
    assert "restart noise of throughput before this run: none measured for " in out, out
    assert "this A/A run's starts measure it" in out, out
    assert "an A/A run (--spec-config baseline" not in out, out


def test_a_baseline_far_from_its_profiles_speed_is_named(tmp_path: Path) -> None:
    """The same accelerator, model and vLLM, a machine that runs 2.4 times slower (seen on a
    second "AMD EPYC"): the run says so in its progress and its warnings."""
    from pytest_specdecode.record.profile import EngineSpeed
    from pytest_specdecode.run.host_noise import HostNoise

    s = settings(tmp_path)
    profiles = tmp_path / "profiles"
    st = store(tmp_path, s)
    rec = st.record
    rec.environment.update({"cpu": "AMD EPYC", "machine": "machine-id:aaaaaaaaaaaa"})
    add_phase(rec, BASELINE, {"coding": 10.0, "math": 10.0})  # 64 tokens at 10 tok/s
    fast = EngineSpeed(30.0, 1 / 24.0)  # the profile's runs: 24 tok/s
    key = noise.key_of(rec)
    measured = entry("aa", "0.32.0", 0.03, speed=fast, machine="machine-id:bbbbbbbbbbbb")
    add_entry(profiles, key.host, key.accelerator, key.model, measured)
    lines: list[str] = []
    host = HostNoise(s, profiles=profiles, run_dir=st.path.parent, progress=lines.append,
                     facts=lambda: None)  # type: ignore[arg-type]  # fmt: skip
    assert host.record_prior(rec)
    note = rec.environment["speed_against_profile"]
    assert note.startswith("this machine's baseline ran 2.4 times slower than the host profile")
    assert "(measured on another machine, or one not recorded)" in note and note in lines
    assert note in analyze(rec).warnings
    # within 20% of the stored speed: nothing said
    rec.restart_noise_prior = None
    rec.environment.pop("speed_against_profile")
    rec.phases.clear()
    add_phase(rec, BASELINE, {"coding": 22.0, "math": 22.0})
    assert host.record_prior(rec) and "speed_against_profile" not in rec.environment


def test_a_machine_is_told_by_its_gpus_uuids_else_its_machine_id() -> None:
    from pytest_specdecode.measure.environment import machine_of

    two = "GPU-695d5997-a103-0d89-580b-71c5e61fbbe2\nGPU-11111111-2222-3333-4444-555555555555\n"
    found = machine_of(two)
    assert found is not None and found.startswith("gpus:") and len(found) == len("gpus:") + 12
    assert machine_of("\n".join(reversed(two.split("\n")))) == found  # whatever their order
    assert machine_of(two.replace("GPU-1", "GPU-2")) != found  # another lease's GPUs
    mid = machine_of("4b3c2a1f0e9d8c7b6a5f4e3d2c1b0a99\n")
    assert mid is not None and mid.startswith("machine-id:") and "4b3c2a" not in mid
    assert machine_of("") is None
    assert machine(LocalHost())["machine"] is not None  # this machine tells one or the other
