"""The drafter check: each refusal before anything is touched, the missing-key warning with what
vLLM will guess, and a drafter's path read on the host where it is loaded.

The configs are written to disk and read through a real shell (LocalHost), as on a host; the
target records every start and stop, so "nothing was touched" is what it saw.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from pytest_specdecode.analysis.drafters.check import check_drafter, describe_drafter
from pytest_specdecode.config.specconfig import SpecConfig
from pytest_specdecode.config.vllm_argv import parse_server_command, served_model
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.report.markdown import drafter_lines
from pytest_specdecode.report.plan import drafter_plan
from pytest_specdecode.run.drafters import check_drafters
from pytest_specdecode.targets.facts.model_config import ModelSite
from pytest_specdecode.targets.hosts.base import CommandResult, LocalHost
from pytest_specdecode.targets.systemd.target import SystemdTarget
from tests.support.scripted_target import Script, ScriptedTarget

# SmolLM2-135M's shape (the embedded target): 30 layers, hidden 576, vocabulary 49152.
TARGET = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
}
# An EAGLE-3 head for it, as SpecForge writes one.
HEAD = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 576,
    "target_hidden_size": 576,
    "num_hidden_layers": 1,
    "vocab_size": 49152,
    "draft_vocab_size": 49152,
    "max_position_embeddings": 8192,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 27]},
}
CUT = {**TARGET, "num_hidden_layers": 6}  # a draft model cut from the target


def model_dir(
    root: Path, name: str, config: dict[str, Any], tensors: dict[str, list[int]] | None = None
) -> Path:
    """A model folder: its config.json, and a model.safetensors whose header lists `tensors`
    (the weights themselves are left out: only the header is read)."""
    path = root / name
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    header = {
        n: {"dtype": "BF16", "shape": s, "data_offsets": [0, 0]} for n, s in (tensors or {}).items()
    }
    raw = json.dumps(header).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    return path


class DrafterTarget(ScriptedTarget):
    """A scripted target whose models are loaded on this machine, from `root`."""

    def __init__(self, root: Path) -> None:
        super().__init__(Script())
        self.site = ModelSite(LocalHost(), "the scripted server on scripted-host", str(root))

    def model_site(self) -> ModelSite:
        return self.site


def spec(method: str, model: Path | str, name: str = "drafter") -> SpecConfig:
    return SpecConfig(name, {"method": method, "model": str(model), "num_speculative_tokens": 3})


def refused(
    tmp_path: Path,
    method: str,
    drafter: dict[str, Any],
    tensors: dict[str, list[int]] | None = None,
) -> tuple[str, DrafterTarget]:
    """The refusal of `drafter` against TARGET, and the target, which must be untouched."""
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    path = model_dir(tmp_path, "head", drafter, tensors)
    with pytest.raises(ConfigError) as caught:
        check_drafters(target, [spec(method, path)])
    assert_untouched(target)
    return str(caught.value), target


def assert_untouched(target: ScriptedTarget) -> None:
    assert target.events == [] and target.candidates == []
    assert not target.original().active


def test_a_draft_model_with_another_vocabulary_is_refused(tmp_path: Path):
    message, _ = refused(tmp_path, "draft_model", {**CUT, "vocab_size": 32000})
    assert "candidate drafter: the drafter" in message
    assert "vocab_size 32000 in the drafter, 49152 in the target" in message
    assert "the scripted server on scripted-host" in message


def test_a_head_whose_fc_takes_another_hidden_size_is_refused(tmp_path: Path):
    message, _ = refused(tmp_path, "eagle3", {**HEAD, "target_hidden_size": 4096})
    # the fc takes 4096 x 3 inputs; the target's three aux states give 576 x 3
    assert "target_hidden_size 4096 in the drafter, hidden_size 576 in the target" in message
    assert "takes 4096 x 3 = 12288 inputs, the target gives 576 x 3 = 1728" in message


def test_aux_layer_ids_past_the_targets_layers_are_refused(tmp_path: Path):
    ids = [2, 16, 31]  # a head trained on a 32-layer model, on SmolLM2's 30
    head = {**HEAD, "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids}}
    message, _ = refused(tmp_path, "eagle3", head)
    assert "eagle_aux_hidden_state_layer_ids [2, 16, 31] against the target's 30 layers" in message
    assert "[31] outside 0..30" in message


def test_a_missing_aux_key_is_a_warning_naming_vllms_guess(tmp_path: Path):
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    head = {k: v for k, v in HEAD.items() if k != "eagle_config"}
    path = model_dir(tmp_path, "head", head)
    said: list[str] = []
    found = check_drafters(target, [spec("eagle3", path, "e3")], progress=said.append)
    assert_untouched(target)
    (drafter,) = found
    assert drafter.check.ok  # served, and healthy: the warning is what tells
    (warning,) = drafter.check.warnings
    assert warning.startswith("eagle_aux_hidden_state_layer_ids is missing")
    assert (
        "vLLM will guess the target's default aux layers [2, 15, 27] for its 30 layers" in warning
    )
    lines = drafter_plan(found)
    assert lines[0].startswith(f"candidate e3: eagle3 drafter {path}, LlamaForCausalLMEagle3")
    assert lines[1] == f"  warning: {warning}"


def test_a_drafter_missing_on_the_host_is_refused_naming_the_host(tmp_path: Path):
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    gone = tmp_path / "no-such-head"
    with pytest.raises(ConfigError) as caught:
        check_drafters(target, [spec("eagle3", gone)])
    assert_untouched(target)
    assert str(caught.value) == (
        f"candidate drafter on the scripted server on scripted-host: the drafter {gone} is not "
        "on localhost; it is loaded there, and read there before anything is touched"
    )


# -- on a unit, over SSH --------------------------------------------------------------------

UNIT = """# /etc/systemd/system/vllm.service
[Service]
ExecStart=/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model {model} --port 8000
"""


class SshHost:
    """A unit's host: systemd's answers scripted, every other command run by a real shell here
    (what sshd would do), each recorded."""

    name = "root@gpu:22"

    def __init__(self, model: Path | str, shown: str = "Environment=\n") -> None:
        self.unit = UNIT.format(model=model)
        self.shown = shown  # what `systemctl show` says of the unit's environment
        self.seen: list[tuple[str, ...]] = []

    def run(self, argv, *, timeout=60.0, stdin=None, privileged=True):
        argv = tuple(argv)
        self.seen.append(argv)
        if argv[:2] == ("systemctl", "cat"):
            return CommandResult(self.name, argv, 0, self.unit, "")
        if argv[:2] == ("systemctl", "show-environment"):
            return CommandResult(self.name, argv, 0, "PATH=/usr/bin:/bin\n", "")
        if argv[:2] == ("systemctl", "show"):
            return CommandResult(self.name, argv, 0, self.shown, "")
        if argv[0] == "busctl":
            return CommandResult(self.name, argv, 127, "", "busctl: not found")
        if argv[:2] == ("sh", "-c"):
            done = LocalHost().run(argv, timeout=timeout, privileged=False)
            return CommandResult(self.name, argv, done.exit_status, done.stdout, done.stderr)
        raise AssertionError(f"not a read-only command: {argv}")

    check = run

    def close(self) -> None:
        pass


def test_a_units_drafter_is_read_on_its_host_and_refused_there(tmp_path: Path):
    host = SshHost(model_dir(tmp_path, "target", TARGET))
    unit = SystemdTarget(host, "vllm.service", api_base="", model="smol")  # type: ignore[arg-type]
    odd = tmp_path / "head $(touch pwned); 'x'"  # handed over as an argument, never as shell
    with pytest.raises(ConfigError) as caught:
        check_drafters(unit, [spec("eagle3", odd, "e3")])
    message = str(caught.value)
    assert message.startswith("candidate e3 on unit vllm.service on root@gpu:22: the drafter")
    assert "is not on root@gpu:22" in message
    assert not (Path.cwd() / "pwned").exists() and not (tmp_path / "pwned").exists()
    # only reads: the unit's text and environment, then the two configs
    assert {argv[0] for argv in host.seen} <= {"systemctl", "busctl", "sh"}
    assert all(
        argv[1] in ("cat", "show", "show-environment")
        for argv in host.seen
        if argv[0] == "systemctl"
    )
    readers = [argv[4:6] for argv in host.seen if argv[0] == "sh"]
    assert readers == [(str(tmp_path / "target"), ""), (str(odd), "weights")]


def test_a_units_drafter_that_fits_is_named_with_its_size(tmp_path: Path):
    host = SshHost(model_dir(tmp_path, "target", TARGET))
    unit = SystemdTarget(host, "vllm.service", api_base="", model="smol")  # type: ignore[arg-type]
    cut = model_dir(tmp_path, "cut", CUT)
    (found,) = check_drafters(unit, [spec("draft_model", cut, "cut")])
    assert found.check.ok and found.check.warnings == ()
    assert found.description == (
        f"draft_model drafter {cut}, LlamaForCausalLM, 6 layers, hidden 576, vocab 49152, "
        f"{found.description.rsplit(', ', 1)[1]}"
    )
    assert found.description.endswith("KiB on disk")


# -- what vLLM does with the keys (pure) ------------------------------------------------------


def test_a_head_that_fits_passes_with_nothing_to_say():
    check = check_drafter("eagle3", HEAD, TARGET)
    assert check.ok and check.warnings == ()


def test_top_level_aux_ids_that_the_fc_does_not_count_are_refused():
    # vLLM captures four states (the top-level key), its fc counts only eagle_config's (3)
    head = {**HEAD, "eagle_config": {}, "eagle_aux_hidden_state_layer_ids": [1, 8, 16, 27]}
    (refusal,) = check_drafter("eagle3", head, TARGET).refusals
    assert "fc takes 3 aux states" in refusal and "vLLM captures 4" in refusal


def test_an_eagle_head_as_a_draft_model_and_an_unknown_mapping_are_refused():
    (as_model,) = check_drafter("draft_model", HEAD, TARGET).refusals
    assert "is an EAGLE head" in as_model and "method eagle3" in as_model
    qwen2 = {**HEAD, "architectures": ["Qwen2ForCausalLM"]}
    (unknown,) = check_drafter("eagle3", qwen2, TARGET).refusals
    assert "map to ['Eagle3Qwen2ForCausalLM'] for method eagle3" in unknown


def test_a_shorter_head_and_a_smaller_draft_vocabulary_are_warnings():
    head = {**HEAD, "max_position_embeddings": 2048, "draft_vocab_size": 32000}
    check = check_drafter("eagle3", head, TARGET)
    assert check.ok
    assert [w.split(":")[0] for w in check.warnings] == [
        "draft_vocab_size 32000 is smaller than the target's vocab_size 49152",
        "max_position_embeddings 2048 in the drafter, 8192 in the target",
    ]
    assert "(drafts over 32000)" in describe_drafter("eagle3", "/h", head)


def test_mtp_needs_the_models_own_layers():
    (refusal,) = check_drafter("deepseek_mtp", TARGET, TARGET).refusals
    assert "method deepseek_mtp drafts with the model's own MTP layers" in refusal
    assert check_drafter("mtp", {**TARGET, "num_nextn_predict_layers": 1}, TARGET).ok


def test_the_served_model_is_read_from_the_server_command():
    for argv, model in [
        (["vllm", "serve", "/m/smol", "--port", "1"], "/m/smol"),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--model=/m/x"], "/m/x"),
        (["python", "-m", "vllm.entrypoints.openai.api_server", "--port", "1"], None),
    ]:
        assert served_model(argv, parse_server_command(argv, where="w")) == model


def test_a_hub_id_is_found_in_the_hosts_hugging_face_cache(tmp_path: Path):
    snapshot = tmp_path / "hub" / "models--org--head" / "snapshots" / "abc123"
    model_dir(snapshot.parent, snapshot.name, HEAD)
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    target.site = ModelSite(
        LocalHost({"HF_HUB_CACHE": str(tmp_path / "hub")}), "here", target.site.model
    )
    (found,) = check_drafters(target, [spec("eagle3", "org/head")])
    assert found.check.ok and found.check.path == "org/head"
    with pytest.raises(ConfigError, match="org/gone is not on localhost \\(nor in its Hugging"):
        check_drafters(target, [spec("eagle3", "org/gone")])


# -- through the plugin: refused at configure, before the run; named in the dry run -----------

REPO = Path(__file__).resolve().parents[3]
RUN_CONFIG = """
reports_dir = "{reports}"
[target]
api_base = "http://scripted.invalid:8000"
model = "smollm2-135m-instruct"
command = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{target}"]
startup_timeout_s = 5
[run]
samples = 5
warmup = 1
max_tokens = 8
[presets]
e3 = {{ method = "eagle3", model = "{head}", num_speculative_tokens = 3 }}
[prompt_types.coding]
prompt = "coding"
"""
RUN_CONFTEST = """
import json
import struct
from pathlib import Path
from pytest_specdecode.targets.facts.model_config import ModelSite
from pytest_specdecode.targets.hosts.base import LocalHost
from tests.support.scripted_target import Script, ScriptedTarget

class Target(ScriptedTarget):
    def model_site(self):
        return ModelSite(LocalHost(), "the scripted server on scripted-host", {target!r})

    def close(self):
        super().close()
        with open({events!r}, "a") as f:
            f.write(json.dumps(self.events) + "\\n")

def pytest_specdecode_open_target(config, settings, log_dir):
    return Target(Script())
"""


def run_suite(pytester: pytest.Pytester, head: dict[str, Any], *args: str) -> pytest.RunResult:
    target = model_dir(pytester.path, "target", TARGET)
    path = model_dir(pytester.path, "head", head)
    events = pytester.path / "events.jsonl"
    suite = pytester.path / "suites"
    suite.mkdir()
    (suite / "conftest.py").write_text(RUN_CONFTEST.format(target=str(target), events=str(events)))
    config = pytester.path / "experiment.toml"
    config.write_text(
        RUN_CONFIG.format(reports=pytester.path / "reports", target=target, head=path)
    )
    return pytester.runpytest_subprocess(
        str(suite),
        "--spec-file",
        str(config),
        "--spec-config",
        "e3",
        "-p",
        "no:cacheprovider",
        *args,
    )


def test_a_run_with_a_drafter_that_does_not_fit_is_refused_before_it_starts(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    result = run_suite(pytester, {**HEAD, "vocab_size": 32000})
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    assert "candidate e3: the drafter" in out and "vocab_size 32000 in the drafter" in out
    # opened to read, closed: no start, no stop of anything
    events = (pytester.path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in events] == [["close"]]
    assert not (pytester.path / "reports").exists()


def test_the_dry_run_names_the_drafter_and_its_warning(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    head = {k: v for k, v in HEAD.items() if k != "eagle_config"}
    result = run_suite(pytester, head, "--spec-dry-run")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "checked the drafters:" in out
    assert "candidate e3: eagle3 drafter " in out and "LlamaForCausalLMEagle3, 1 layer," in out
    assert "warning: eagle_aux_hidden_state_layer_ids is missing" in out


def test_summary_names_the_drafter_the_run_checked():
    environment = {"drafters": {"e3": ["eagle3 drafter /h, 1 layer", "aux ids missing"]}}
    assert drafter_lines(environment, "e3") == [
        "Drafter: eagle3 drafter /h, 1 layer",
        "- ⚠ aux ids missing",
        "",
    ]
    assert drafter_lines(environment, "ngram") == [] == drafter_lines({}, "e3")


# -- the head's weights: its fc's real input, its draft vocabulary's map ----------------------

FC = {"midlayer.self_attn.q_proj.weight": [576, 1152], "fc.weight": [576, 1728]}


def test_a_head_whose_weights_fit_passes(tmp_path: Path):
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    path = model_dir(tmp_path, "head", HEAD, FC)
    (found,) = check_drafters(target, [spec("eagle3", path)])
    assert found.check.ok and found.check.warnings == ()


def test_a_head_whose_fc_weight_takes_another_input_is_refused(tmp_path: Path):
    # the config says 576 x 3, the weights were trained on a 4096-wide target
    message, _ = refused(tmp_path, "eagle3", HEAD, {"fc.weight": [576, 3 * 4096]})
    assert "fc.weight in the head's weights is [576, 12288]: it takes 12288 inputs" in message
    assert "its config builds an fc of 1728" in message
    assert "the target gives 1728 (hidden_size 576 x 3 aux states)" in message


def test_a_smaller_draft_vocabulary_without_its_map_is_refused(tmp_path: Path):
    head = {**HEAD, "draft_vocab_size": 32000}
    message, _ = refused(tmp_path, "eagle3", head, FC)
    assert (
        "draft_vocab_size 32000 is smaller than the target's vocab_size 49152, and the " in message
    )
    assert "no `d2t`" in message
    target = DrafterTarget(model_dir(tmp_path / "b", "target", TARGET))
    path = model_dir(tmp_path / "b", "head", head, {**FC, "d2t": [32000]})
    (found,) = check_drafters(target, [spec("eagle3", path)])
    assert found.check.ok and found.check.warnings == ()


def test_a_units_hub_ids_are_looked_for_in_the_cache_its_environment_names(tmp_path: Path):
    hf_home = tmp_path / "srv-hf"  # the unit's HF_HOME, not the SSH user's
    for name, config in (("org--smol", TARGET), ("org--head", HEAD)):
        model_dir(hf_home / "hub" / f"models--{name}" / "snapshots", "rev1", config, FC)
    host = SshHost("org/smol", shown=f"Environment=HF_HOME={hf_home}\n")
    unit = SystemdTarget(host, "vllm.service", api_base="", model="smol")  # type: ignore[arg-type]
    said: list[str] = []
    (found,) = check_drafters(unit, [spec("eagle3", "org/head", "e3")], progress=said.append)
    assert found.check.ok and found.check.warnings == () and said == []
    assert [argv[-1] for argv in host.seen if argv[0] == "sh"] == [str(hf_home / "hub")] * 2


def test_an_mtp_candidate_is_checked_against_the_targets_own_layers(tmp_path: Path):
    mtp = SpecConfig("mtp", {"method": "mtp", "num_speculative_tokens": 1})
    target = DrafterTarget(model_dir(tmp_path, "target", TARGET))
    with pytest.raises(ConfigError, match="method mtp drafts with the model's own MTP layers"):
        check_drafters(target, [mtp])
    assert_untouched(target)
    with_layers = DrafterTarget(
        model_dir(tmp_path / "b", "target", {**TARGET, "num_nextn_predict_layers": 1})
    )
    (found,) = check_drafters(with_layers, [mtp])
    assert found.check.ok and found.description.startswith(
        f"mtp drafter {tmp_path / 'b' / 'target'}"
    )
