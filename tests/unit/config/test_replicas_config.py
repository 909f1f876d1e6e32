"""A target of several replicas (issue 43): `[[target.replicas]]` parsed and validated per entry,
the alike check over each replica's facts (on real nvidia-smi output), the crossover's periods,
and the dry run through the plugin, which reads each replica and touches none. The run itself:
tests/unit/run/test_crossover_run.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_specdecode.analysis.replicas.alike import ReplicaFacts, alike
from pytest_specdecode.config.replicas import crossover_periods, restarts_of
from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.report.replicas.lines import schedule_lines
from pytest_specdecode.targets.facts.gpu import gpus_and_driver, parse_gpus

REPO = Path(__file__).resolve().parents[3]
QUERY_GPU = (REPO / "tests" / "data" / "nvidia-smi-h200" / "query-gpu.csv").read_text()
REAL_DRIVER = "580.159.04"  # as captured (tests/data/nvidia-smi-h200/README.md)

HEAD = """
[target]
model = "kimi"
command = ["vllm", "serve", "/models/kimi"]
{extra}
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 }}
[prompt_types.coding]
prompt = "coding"
"""

TWO = """
[[target.replicas]]
name = "a"
api_base = "http://10.0.0.1:8000"
drain = ["lbctl", "drain", "a"]
undrain = ["lbctl", "undrain", "a"]

[[target.replicas]]
name = "b"
api_base = "http://10.0.0.2:8000"
"""


def settings_of(tmp_path: Path, replicas: str, extra: str = "", **kw: object):
    path = tmp_path / "specdecode.toml"
    path.write_text(HEAD.format(extra=extra) + replicas)
    return load_settings(path, **kw)  # type: ignore[arg-type]


# -- the config ---------------------------------------------------------------------------------


def test_each_replica_reads_as_a_target_over_the_shared_keys(tmp_path: Path) -> None:
    settings = settings_of(tmp_path, TWO)
    a, b = settings.replicas
    assert (a.name, b.name) == ("a", "b")
    assert a.target.api_base == "http://10.0.0.1:8000" and b.target.api_base.endswith(".2:8000")
    assert a.target.model == b.target.model == "kimi"  # from [target]
    assert a.target.command == ("vllm", "serve", "/models/kimi")
    assert a.drain == ("lbctl", "drain", "a") and b.drain == () and b.undrain == ()
    assert settings.target == a.target  # what a plain plan reads


def test_systemd_replicas_on_hosts_reached_over_ssh(tmp_path: Path) -> None:
    replicas = """
[[target.replicas]]
name = "gpu-a"
host = "ssh://deploy@10.0.0.1:22"
unit = "vllm.service"
api_base = "http://10.0.0.1:8000"
sudo = true

[[target.replicas]]
name = "gpu-b"
host = "ssh://deploy@10.0.0.2:2200"
unit = "vllm@kimi.service"
"""
    path = tmp_path / "specdecode.toml"
    path.write_text('[target]\nmodel = "kimi"\n' + replicas + '[prompt_types.c]\nprompt = "c"\n')
    a, b = load_settings(path).replicas
    assert a.target.backend == b.target.backend == "systemd"
    assert (a.target.unit, b.target.unit) == ("vllm.service", "vllm@kimi.service")
    assert a.target.sudo is True and b.target.sudo is None
    assert b.target.api_base == ""  # reached through its SSH connection
    assert "unit vllm@kimi.service on ssh://deploy@10.0.0.2:2200" in b.describe()


def test_without_replicas_the_target_is_as_before(tmp_path: Path) -> None:
    path = tmp_path / "specdecode.toml"
    path.write_text(HEAD.format(extra='api_base = "http://127.0.0.1:8000"').replace("[[", "[["))
    settings = load_settings(path)
    assert settings.replicas == () and settings.target.api_base == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("replicas", "message"),
    [
        (
            TWO.split("[[target.replicas]]")[1].join(["[[target.replicas]]", ""]),
            re.escape("1 [[target.replicas]] entry: a crossover needs at least 2"),
        ),
        (
            TWO.replace('name = "b"', 'name = "a"'),
            re.escape("entry 2 ('a') and entry 1 ('a') share the name"),
        ),
        (
            TWO.replace("10.0.0.2", "10.0.0.1"),
            re.escape("entry 2 ('b') and entry 1 ('a') share the api_base 'http://10.0.0.1:8000'"),
        ),
        (TWO.replace('name = "b"', 'name = "b c"'), "entry 2: name must be a short name"),
        (TWO.replace('name = "b"\n', ""), "entry 2: name must be a short name"),
        (
            TWO.replace('api_base = "http://10.0.0.2:8000"', 'api_base = "ftp://x"'),
            r"entry 2 \('b'\) \[target\]: api_base must be an http\(s\) URL",
        ),
        (TWO + "unknown_key = 1\n", r"entry 2 \('b'\) \[target\]: unknown key\(s\) unknown_key"),
        (
            TWO.replace('drain = ["lbctl", "drain", "a"]', 'drain = "lbctl drain a; rm -rf /"'),
            r"entry 1 \('a'\): drain must be a command as a list of words",
        ),
        (
            TWO.replace('drain = ["lbctl", "drain", "a"]', "drain = []"),
            r"entry 1 \('a'\): drain must be a non-empty list",
        ),
        (
            TWO.replace('undrain = ["lbctl", "undrain", "a"]', 'undrain = ["lbctl", 3]'),
            r"entry 1 \('a'\): undrain holds 3, which is not a string",
        ),
        (
            TWO.replace('undrain = ["lbctl", "undrain", "a"]', 'undrain = ["lbctl", "a\\nb"]'),
            r"entry 1 \('a'\): undrain holds 'a\\nb', which is not a word",
        ),
        (TWO + 'command = ["sh", "-c", "vllm serve /m"]\n', r"entry 2 \('b'\) \[target\]"),
    ],
)
def test_each_validation_error_names_the_entry(tmp_path: Path, replicas: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_of(tmp_path, replicas)


def test_systemd_replicas_validate_unit_and_host_as_a_target_does(tmp_path: Path) -> None:
    base = '[target]\nmodel = "m"\n[prompt_types.c]\nprompt = "c"\n'
    for bad, message in [
        ('unit = "x;rm -rf /.service"', "is not a plain systemd service name"),
        ('unit = "vllm.service"\nsudo = "yes"', "sudo must be true or false"),
    ]:
        replicas = (
            f'[[target.replicas]]\nname = "a"\nhost = "ssh://r@h1:22"\n{bad}\n'
            '[[target.replicas]]\nname = "b"\nhost = "ssh://r@h2:22"\nunit = "vllm.service"\n'
        )
        path = tmp_path / "specdecode.toml"
        path.write_text(base.replace("[prompt_types", replicas + "[prompt_types"))
        with pytest.raises(ConfigError, match=message):
            load_settings(path)
    same = (
        '[[target.replicas]]\nname = "a"\nhost = "ssh://r@h1:22"\nunit = "vllm.service"\n'
        '[[target.replicas]]\nname = "b"\nhost = "ssh://r@h1:22"\nunit = "vllm.service"\n'
    )
    path.write_text(base.replace("[prompt_types", same + "[prompt_types"))
    with pytest.raises(
        ConfigError, match=re.escape("share the unit 'vllm.service on ssh://r@h1:22'")
    ):
        load_settings(path)


def test_command_line_target_options_are_refused_with_replicas(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the command line's host, unit would apply"):
        settings_of(tmp_path, TWO, target_overrides={"host": "gpu", "unit": "v.service"})


# -- the alike check ----------------------------------------------------------------------------


def h200s(count: int, driver: str = REAL_DRIVER) -> ReplicaFacts:
    """A replica's GPU facts from the real capture: `count` rows, its driver line as given."""
    header, row = QUERY_GPU.splitlines()[:2]
    assert REAL_DRIVER in row
    rows = [row.replace("0, ", f"{i}, ", 1).replace(REAL_DRIVER, driver) for i in range(count)]
    names, found = gpus_and_driver(parse_gpus("\n".join([header, *rows])))
    return ReplicaFacts("?", "kimi", vllm_version="0.11.0", gpus=names, driver=found)


def named(facts: ReplicaFacts, name: str, **changes: object) -> ReplicaFacts:
    from dataclasses import replace

    return replace(facts, name=name, **changes)  # type: ignore[arg-type]


def test_alike_replicas_have_no_findings() -> None:
    found = alike([named(h200s(8), "a"), named(h200s(8), "b")])
    assert found.refusals == found.differences == found.unknown == ()
    assert not found.refused


def test_different_models_are_refused_naming_both_replicas_and_both_models() -> None:
    found = alike([named(h200s(8), "a"), named(h200s(8), "b", model="llama")])
    assert found.refused
    (line,) = found.refusals
    assert "replica b serves the model llama, replica a kimi" in line
    paths = alike([named(h200s(1), "a", model_path="/m/kimi"),
                   named(h200s(1), "b", model_path="/m/kimi-int4")])  # fmt: skip
    assert paths.refused and "/m/kimi-int4" in paths.refusals[0] and "/m/kimi" in paths.refusals[0]


def test_different_vllm_versions_are_refused() -> None:
    found = alike([named(h200s(8), "a"), named(h200s(8), "b", vllm_version="0.12.0")])
    assert found.refused
    assert "replica b runs vLLM 0.12.0, replica a 0.11.0" in found.refusals[0]


def test_a_different_driver_and_gpu_count_are_named_not_refused() -> None:
    a, b = named(h200s(8), "a"), named(h200s(4, driver="570.86.15"), "b")
    assert a.driver == REAL_DRIVER and a.gpus == ("NVIDIA H200",) * 8  # read from the capture
    found = alike([a, b])
    assert not found.refused
    assert any(
        "replica b runs the NVIDIA driver 570.86.15, replica a 580.159.04" in line
        for line in found.differences
    )
    assert any("replica b has 4 GPUs, replica a 8 GPUs" in line for line in found.differences)
    assert not any("has the GPUs" in line for line in found.differences)  # both H200


def test_what_could_not_be_read_is_said_not_judged() -> None:
    found = alike([named(h200s(1), "a"), named(h200s(1), "b", vllm_version=None, gpus=None,
                                                driver=None)])  # fmt: skip
    assert not found.refused and found.differences == ()
    assert found.unknown == ("b: its vLLM version, its GPUs could not be read",)
    cpu = alike([named(h200s(1), "a", gpus=(), driver=None), named(h200s(1), "b", gpus=(),
                                                                   driver=None)])  # fmt: skip
    assert cpu.unknown == ()  # no GPU, so no driver to read


# -- the crossover's periods --------------------------------------------------------------------


def test_two_replicas_two_arms_is_the_ab_ba_crossover_with_two_restarts_each() -> None:
    periods = crossover_periods(["a", "b"], ["baseline", "ngram"])
    assert [p.serving for p in periods] == [
        (("a", "baseline"), ("b", "ngram")),
        (("a", "ngram"), ("b", "baseline")),
    ]
    assert restarts_of(periods, "a", "baseline") == restarts_of(periods, "b", "baseline") == 2
    text = "\n".join(schedule_lines(["a", "b"], "baseline", ["ngram"]))
    assert "period 1: a the baseline (its original, not restarted), b candidate ngram" in text
    assert "period 2: a candidate ngram, b the baseline (its original, restarted back)" in text


def test_repeated_crossovers_repeat_the_periods_each_a_new_start() -> None:
    periods = crossover_periods(["a", "b"], ["baseline", "ngram"], crossovers=3)
    assert [p.number for p in periods] == [1, 2, 3, 4, 5, 6]
    assert [p.crossover for p in periods] == [1, 1, 2, 2, 3, 3]
    assert [p.serving for p in periods[2:4]] == [p.serving for p in periods[:2]]
    assert restarts_of(periods, "a", "baseline") == restarts_of(periods, "b", "baseline") == 6
    text = "\n".join(schedule_lines(["a", "b"], "baseline", ["ngram"], 3))
    assert "then again, up to 3 crossovers in all (6 periods" in text
    assert "restarts at most, each back to its original at the end: a 6, b 6" in text


def test_the_most_crossovers_is_a_positive_run_key(tmp_path: Path) -> None:
    assert settings_of(tmp_path, TWO).run.crossovers == 4  # the default
    path = tmp_path / "specdecode.toml"
    path.write_text(HEAD.format(extra="") + TWO + "[run]\ncrossovers = 2\n")
    assert load_settings(path).run.crossovers == 2
    path.write_text(HEAD.format(extra="") + TWO + "[run]\ncrossovers = 0\n")
    with pytest.raises(ConfigError, match="crossovers"):
        load_settings(path)
    assert load_settings(path, run_overrides={"crossovers": 3}).run.crossovers == 3


def test_a_rotation_has_each_replica_serve_each_arm_once() -> None:
    replicas, arms = ["a", "b", "c"], ["baseline", "x", "y"]
    periods = crossover_periods(replicas, arms)
    assert len(periods) == 3
    for replica in replicas:
        assert sorted(dict(p.serving)[replica] for p in periods) == sorted(arms)
    for period in periods:  # each period serves every arm once
        assert sorted(arm for _, arm in period.serving) == sorted(arms)


# -- the dry run through the plugin -------------------------------------------------------------

CONFTEST = """
import json
from pathlib import Path

from pytest_specdecode.config.specconfig import VllmFacts
from pytest_specdecode.targets.hosts.base import CommandResult
from tests.support.scripted_target import Script, ScriptedTarget

HERE = Path(__file__).parent
FACTS = json.loads((HERE / "facts.json").read_text())
KEYS = {"method": "str", "num_speculative_tokens": "int", "prompt_lookup_max": "int"}


class SmiHost:
    name = "scripted-host"

    def __init__(self, text):
        self.text = text
        self.commands = []

    def run(self, argv, timeout=None, stdin=None, privileged=True):
        self.commands.append(" ".join(argv))
        return CommandResult(self.name, tuple(argv), 0, self.text, "")


class Replica(ScriptedTarget):
    def __init__(self, settings):
        super().__init__(Script())
        self.api_base = settings.target.api_base
        self.facts = FACTS[self.api_base]
        self.host = SmiHost(self.facts["nvidia_smi"])

    def vllm_facts(self, progress=None):
        return VllmFacts(self.facts["vllm"], None, self.facts.get("keys", KEYS), host=self.api_base)

    def close(self):
        super().close()
        with (HERE / "events.jsonl").open("a") as out:
            out.write(json.dumps([self.api_base, self.events, self.host.commands]) + "\\n")


def pytest_specdecode_open_target(config, settings, log_dir):
    return Replica(settings)
"""


def dry_run(pytester: pytest.Pytester, facts: dict[str, dict[str, str]], replicas: str = TWO,
            *args: str) -> pytest.RunResult:  # fmt: skip
    (pytester.path / "facts.json").write_text(json.dumps(facts))
    pytester.makeconftest(CONFTEST)
    pytester.makefile(".toml", specdecode=HEAD.format(extra="") + replicas)
    return pytester.runpytest_subprocess("--spec-config", "ngram", *args)


def smi(count: int, driver: str = REAL_DRIVER) -> str:
    """nvidia-smi's answer as captured (header and row), `count` rows, its driver as given."""
    header, row = QUERY_GPU.splitlines()[:2]
    row = row.replace(REAL_DRIVER, driver)
    return "\n".join([header, *(row.replace("0, ", f"{i}, ", 1) for i in range(count))])


@pytest.fixture
def _importable_support(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # `tests.support` for the conftest


@pytest.mark.usefixtures("_importable_support")
def test_the_dry_run_prints_the_replicas_the_findings_and_the_periods(
    pytester: pytest.Pytester,
) -> None:
    facts = {
        "http://10.0.0.1:8000": {"vllm": "0.11.0", "nvidia_smi": smi(8)},
        "http://10.0.0.2:8000": {"vllm": "0.11.0", "nvidia_smi": smi(8, "570.86.15")},
    }
    result = dry_run(pytester, facts, TWO, "--spec-dry-run")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "a: a local server (vllm serve /models/kimi …), API http://10.0.0.1:8000" in out
    assert "b: a local server" in out and "API http://10.0.0.2:8000" in out
    assert "out of its load balancer before its candidate period: lbctl drain a" in out
    assert "a: model kimi, vLLM 0.11.0, 8 x NVIDIA H200, driver 580.159.04" in out
    assert "replica b runs the NVIDIA driver 570.86.15, replica a 580.159.04" in out
    assert "period 1: a the baseline (its original, not restarted), b candidate ngram" in out
    # the crossovers a 10% change needs, at most [run] crossovers (4) of them, each restarting
    # both replicas twice; what 1 and 4 crossovers call, where the noise comes from
    assert "then again, up to 4 crossovers in all (8 periods" in out
    assert "restarts at most, each back to its original at the end: a 8, b 8" in out
    assert "restart noise, throughput: unmeasured: assumed 5%" in out
    assert "the first crossover's look is not taken" in out
    assert "what 1 crossover (2 periods of 6 slots, each replica restarted 2 times)" in out
    assert "what 4 crossovers can call with 80% power: throughput ±" in out
    assert "a 10% change needs about 7 crossovers of 6 slots a period" in out
    assert "this run makes up to 4 crossovers, looking after each" in out
    events = [json.loads(line) for line in (pytester.path / "events.jsonl").read_text().split("\n")
              if line]  # fmt: skip
    assert sorted(e[0] for e in events) == sorted(facts)  # each replica was read, and closed
    assert all(e[1] == ["close"] for e in events)  # nothing started, stopped or swapped
    # only reads: the GPUs (nvidia-smi), and for the plan's host profile the CPU and the
    # machine's fingerprint (measure/environment.py)
    reads = ("nvidia-smi", "/proc/cpuinfo", "machine-id")
    assert all(c.startswith("sh -c") and any(r in c for r in reads) for e in events for c in e[2])
    assert not (pytester.path / "reports").exists()


@pytest.mark.usefixtures("_importable_support")
def test_the_plan_refuses_replicas_with_different_models_and_names_a_different_driver(
    pytester: pytest.Pytester,
) -> None:
    facts = {
        "http://10.0.0.1:8000": {"vllm": "0.11.0", "nvidia_smi": smi(8)},
        "http://10.0.0.2:8000": {"vllm": "0.11.0", "nvidia_smi": smi(8, "570.86.15")},
    }
    other_model = TWO.replace('name = "b"', 'name = "b"\nmodel = "llama"')
    result = dry_run(pytester, facts, other_model, "--spec-dry-run")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out + result.stderr.str()
    assert "refused: replica b serves the model llama, replica a kimi" in out
    assert "replica b runs the NVIDIA driver 570.86.15, replica a 580.159.04" in out
    assert all(json.loads(e)[1] == ["close"]
               for e in (pytester.path / "events.jsonl").read_text().splitlines())  # fmt: skip


@pytest.mark.usefixtures("_importable_support")
def test_a_candidate_one_replicas_vllm_refuses_stops_the_plan_naming_that_replica(
    pytester: pytest.Pytester,
) -> None:
    facts = {
        "http://10.0.0.1:8000": {"vllm": "0.11.0", "nvidia_smi": smi(1)},
        "http://10.0.0.2:8000": {"vllm": "0.11.0", "nvidia_smi": smi(1), "keys": {"method": "str"}},
    }
    result = dry_run(pytester, facts, TWO, "--spec-dry-run")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "replica b: speculative config 'ngram'" in err and "unknown key(s)" in err
    assert "replica a:" not in err


# -- reading a replica's GPUs -------------------------------------------------------------------


class AnsweringHost:
    """nvidia-smi's answer, as a host returns it: exit status and stdout."""

    name = "root@gpu-b:22"

    def __init__(self, status: int, stdout: str) -> None:
        self.status, self.stdout = status, stdout

    def run(self, argv, timeout=None, stdin=None, privileged=True):
        from pytest_specdecode.targets.hosts.base import CommandResult

        assert "--format=csv" in argv[-1] and "noheader" not in argv[-1]  # read by its header
        return CommandResult(self.name, tuple(argv), self.status, self.stdout, "")


def test_a_replicas_gpus_are_read_from_nvidia_smi_by_their_header() -> None:
    from pytest_specdecode.targets.facts.gpu import read_gpus

    gpus = read_gpus(AnsweringHost(0, smi(2, "570.86.15")))  # type: ignore[arg-type]
    assert gpus is not None and gpus_and_driver(gpus) == (("NVIDIA H200",) * 2, "570.86.15")
    assert read_gpus(AnsweringHost(3, "")) == []  # type: ignore[arg-type]  # no nvidia-smi
    assert read_gpus(AnsweringHost(9, "NVIDIA-SMI has failed")) is None  # type: ignore[arg-type]


def test_a_replica_is_described_with_what_was_read() -> None:
    gpu = named(h200s(8), "a", model_path="/m/kimi", model_config="0123abcd")
    assert gpu.describe() == (
        "a: model kimi (/m/kimi, config.json 0123abcd), vLLM 0.11.0, 8 x NVIDIA H200, "
        "driver 580.159.04"
    )
    cpu = named(h200s(1), "c", gpus=(), driver=None, vllm_version=None)
    assert cpu.describe() == "c: model kimi, vLLM unknown, no GPU"
