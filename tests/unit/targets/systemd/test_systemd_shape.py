"""The shape on a systemd unit (targets/systemd/shape.py): read where the unit loads its model,
served by the unit's own drop-in in its window, and put back as found; each refusal before
anything is touched.

The drop-ins are rendered from unit files of both command forms (pure). The run is walked on a
stand-in host whose systemd is a small state machine (the unit, its drop-in, files in memory)
and whose model folder is a real one read by the real reader script; the real systemd host runs
the same paths in tests/real_host/test_shape_host.py.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest

from pytest_specdecode.config.shape.named import named_shape
from pytest_specdecode.config.shape.served import MOE_ROUTING_ENV, ServedShape
from pytest_specdecode.config.shape.table import ShapeConfig
from pytest_specdecode.config.specconfig import OFFLINE_FACTS, SpecConfig
from pytest_specdecode.config.target import TargetConfig
from pytest_specdecode.config.vllm_argv import option_value
from pytest_specdecode.errors import ConfigError, ShapeRefused
from pytest_specdecode.targets.facts import model_config
from pytest_specdecode.targets.hosts.base import CommandResult, LocalHost
from pytest_specdecode.targets.lifecycle import experiment_services
from pytest_specdecode.targets.shaped import ShapedTarget, resolve_shape, shaped_target
from pytest_specdecode.targets.systemd.target import SystemdTarget
from pytest_specdecode.targets.systemd.unitfile import (
    SHAPE_ROOT,
    checked_path,
    effective_exec_start,
    render_dropin,
    run_folder,
    shape_folder,
    split_exec,
)
from pytest_specdecode.targets.systemd.watchdog import RESTORE_SCRIPT

SMOL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
    "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}  # fmt: skip
API_UNIT = """# /etc/systemd/system/vllm.service
[Service]
Environment=VLLM_PORT=8000
ExecStart=/opt/venv/bin/python -m vllm.entrypoints.openai.api_server --model {model} \\
    --served-model-name smol --host 127.0.0.1 --port ${{VLLM_PORT}} --enforce-eager
"""
SERVE_UNIT = """# /etc/systemd/system/vllm@.service
[Service]
ExecStart=/opt/venv/bin/vllm serve /models/%i --port 8000 --hf-overrides '{"rope_theta": 5e5}' \\
    --speculative-config '{"method": "ngram"}'
"""
PODMAN_UNIT = """# /etc/systemd/system/vllm-podman.service
[Service]
ExecStart=/usr/bin/podman run --rm --name vllm-ctr -p 18123:8000 \\
    -v /srv/models:/models:ro docker.io/vllm/vllm-openai:v0.32.0 --model /models/smol --port 8000
"""
FACTS = dataclasses.replace(
    OFFLINE_FACTS,
    host="root@gpu:22",
    interpreter="/opt/venv/bin/python",
    architectures=frozenset({"LlamaForCausalLM", "DeepseekV3ForCausalLM"}),
    moe_routing=("normal_routing", "uniform_random"),
)
NGRAM = SpecConfig("ngram", {"method": "ngram", "num_speculative_tokens": 3})
FOLDER = shape_folder("20261207T120000Z-ngram")  # the run's reports folder's name
RUN_FOLDER = f"{SHAPE_ROOT}/20261207T120000Z-ngram"


def shape(name: str = "llama-3.1-8b", *, tokenizer: str = "/models/smol") -> ServedShape:
    moe = named_shape(name).is_moe
    return ServedShape(
        shape=named_shape(name),
        layers=4,
        overrides={"num_hidden_layers": 4},
        env={MOE_ROUTING_ENV: "uniform_random"} if moe else {},
        tokenizer=tokenizer,
        served_name="smol",
        folder=FOLDER,
        engine="vLLM 0.32.0 on root@gpu:22",
    )


def exec_words(dropin: str) -> list[str]:
    """The drop-in's ExecStart, as systemd splits it (quotes removed, `$$` still doubled)."""
    line = [x for x in dropin.splitlines() if x.startswith("ExecStart=") and x != "ExecStart="]
    return [t.value for t in split_exec(line[0].split("=", 1)[1])]


# -- the drop-ins (pure) ---------------------------------------------------------------------


def test_the_api_server_form_serves_the_shape_with_the_units_own_words_kept() -> None:
    unit = API_UNIT.format(model="/models/smol")
    text = render_dropin("vllm.service", unit, None, run_id="r1", shape=shape())
    assert text.splitlines()[0] == (
        "# Written by pytest-specdecode (run r1): the shape's baseline "
        "llama-3.1-8b (LlamaForCausalLM), 4 of 32 layers for vllm.service."
    )
    words = exec_words(text)
    original = effective_exec_start(unit, where="u").argv
    # what the shape's argv says, word for word: the unit's ${VLLM_PORT} left to systemd
    assert words == shape().argv(original, where="u")
    assert words[3:5] == ["--model", FOLDER] and "${VLLM_PORT}" in words
    assert option_value(words, "--load-format") == "dummy"
    assert option_value(words, "--tokenizer") == "/models/smol"  # prompts as in production
    assert words.count("--served-model-name") == 1  # the API's name kept
    assert json.loads(option_value(words, "--hf-overrides") or "") == {"num_hidden_layers": 4}
    assert "--speculative-config" not in words and "Environment=" not in text  # dense


def test_a_candidate_on_the_shape_is_the_baseline_plus_its_speculative_config() -> None:
    unit = API_UNIT.format(model="/models/smol")
    base = exec_words(render_dropin("vllm.service", unit, None, run_id="r", shape=shape()))
    text = render_dropin("vllm.service", unit, NGRAM, run_id="r", shape=shape())
    assert "candidate 'ngram' on the shape llama-3.1-8b" in text.splitlines()[0]
    assert exec_words(text) == [*base, "--speculative-config", NGRAM.to_json()]


def test_the_vllm_serve_form_keeps_its_specifier_and_replaces_its_speculative_config() -> None:
    moe = dataclasses.replace(shape("deepseek-v3"), overrides={"rope_theta": 5e5, "x": 1})
    text = render_dropin("vllm@smol.service", SERVE_UNIT, NGRAM, run_id="r", shape=moe)
    line = next(x for x in text.splitlines() if x.startswith("ExecStart=/"))
    assert line.startswith(f"ExecStart=/opt/venv/bin/vllm serve {FOLDER} --port 8000 ")
    assert "/models/%i" not in line  # the model replaced; its tokenizer is the one resolved
    words = exec_words(text)
    assert words.count("--speculative-config") == 1 and words[-1] == NGRAM.to_json()
    assert words.count("--hf-overrides") == 1  # the unit's merged into the shape's
    assert f"Environment={MOE_ROUTING_ENV}=uniform_random" in text.splitlines()  # a MoE's
    assert text.index("Environment=") < text.index("ExecStart=")


def test_new_words_are_quoted_so_that_systemd_expands_nothing_in_them() -> None:
    unit = API_UNIT.format(model="/models/smol")
    odd = shape(tokenizer="/models/a$HOME%n b")
    line = next(
        x
        for x in render_dropin("vllm.service", unit, None, run_id="r", shape=odd).splitlines()
        if x.startswith("ExecStart=/")
    )
    assert '--tokenizer "/models/a$$HOME%%n b"' in line
    assert '"{\\"num_hidden_layers\\": 4}"' in line  # the JSON, one quoted word
    with pytest.raises(ConfigError, match="control character"):
        render_dropin("vllm.service", unit, None, run_id="r", shape=shape(tokenizer="/m\nx"))


def test_a_container_unit_mounts_the_folder_and_passes_the_routing_with_dash_e() -> None:
    images = ("docker.io/vllm/vllm-openai",)
    text = render_dropin(
        "vllm-podman.service", PODMAN_UNIT, None, run_id="r", images=images,
        shape=shape("deepseek-v3"),
    )  # fmt: skip
    words = exec_words(text)
    at = words.index("docker.io/vllm/vllm-openai:v0.32.0")
    assert words[at - 4 : at] == [
        "-v", f"{RUN_FOLDER}:{RUN_FOLDER}:ro", "-e", f"{MOE_ROUTING_ENV}=uniform_random"
    ]  # fmt: skip
    assert words[at + 1 : at + 3] == ["--model", FOLDER]
    assert "Environment=" not in text  # the container's server would not see it


def test_only_plain_paths_in_one_runs_folder_under_the_shape_root_are_written_or_removed():
    assert f"{RUN_FOLDER}/shape" == FOLDER and run_folder(FOLDER) == RUN_FOLDER
    assert shape_folder("$(reboot) x") == f"{SHAPE_ROOT}/__reboot__x/shape"  # made plain
    assert shape_folder("..") == f"{SHAPE_ROOT}/run/shape"
    for bad in (
        "/run/systemd/system/x",
        f"{SHAPE_ROOT}/run",  # the run's folder itself is never a file's place
        f"{SHAPE_ROOT}/run/../../etc",
        f"{SHAPE_ROOT}/run/a b",
        f"{SHAPE_ROOT}/run/$x",
        f"{SHAPE_ROOT}//x",
    ):
        with pytest.raises(ValueError):
            checked_path(bad)


# -- the run, on a stand-in host --------------------------------------------------------------


class UnitHost:
    """A unit's host: the unit (active or not, its drop-in) and every file written in memory;
    the model reader script run by a real shell here (what sshd would do); every command kept."""

    name = "root@gpu:22"

    def __init__(self, unit_text: str, *, active: bool = True, smi: str | None = None) -> None:
        self.unit_text = unit_text
        self.active = active
        self.smi = smi  # nvidia-smi's answer; None: no nvidia-smi on the host
        self.files: dict[str, str] = {}
        self.dirs: set[str] = {"/", "/run/systemd/system"}
        self.ran: list[tuple[str, ...]] = []
        self.started: list[str] = []  # the unit's ExecStart at each start

    def dropin(self) -> str | None:
        return next(
            (t for p, t in self.files.items() if p.endswith(".d/zz-pytest-specdecode.conf")), None
        )

    def run(
        self,
        argv: Sequence[str],
        *,
        timeout: float = 60.0,
        stdin: str | None = None,
        privileged: bool = True,
    ) -> CommandResult:
        argv = tuple(argv)
        self.ran.append(argv)
        ok, out = True, ""
        match argv:
            case ("systemctl", "cat", _):
                dropin = self.dropin()
                out = self.unit_text
                if dropin is not None:
                    out += "\n# /run/systemd/system/vllm.service.d/zz-pytest-specdecode.conf\n"
                    out += dropin
            case ("systemctl", "show-environment"):
                out = "PATH=/usr/bin:/bin\n"
            case ("systemctl", "show", "vllm.service", *_):
                state = (
                    "active\nSubState=running\nMainPID=42"
                    if self.active
                    else ("inactive\nSubState=dead\nMainPID=0")
                )
                out = f"Id=vllm.service\nActiveState={state}\nNRestarts=0\n"
                out += "Environment=VLLM_PORT=8000\n"
            case ("systemctl", "start", "vllm.service"):
                self.active = True
                line = [x for x in self.unit_text_now().splitlines() if x.startswith("ExecStart=")]
                self.started.append(line[-1])
            case ("systemctl", "stop", "vllm.service"):
                self.active = False
            case ("nvidia-smi", *_):
                ok, out = self.smi is not None, self.smi or ""
            case ("sh", "-c", model_config._READ, *_):
                done = LocalHost().run(argv, timeout=timeout, privileged=False)
                return CommandResult(self.name, argv, done.exit_status, done.stdout, "")
            case ("sh", "-c", script, *_) if "MemAvailable" in script:
                out = "MemAvailable:   23000000 kB\n"
            case ("sh" | "busctl", *_):
                ok = False  # the GPU snapshot, systemd's words over D-Bus: not here
            case ("install", "-m", _, "-D", "/dev/stdin", tmp):
                self.files[tmp] = stdin or ""
            case ("mv", "-f", tmp, path):
                self.files[path] = self.files.pop(tmp)
            case ("cat", *paths) if paths[0].startswith("/"):
                out = "".join(self.files.get(p, "") for p in paths)
                ok = all(p in self.files for p in paths)
            case ("test", _, path):
                ok = (
                    path in self.files
                    or path in self.dirs
                    or any(f.startswith(path + "/") for f in self.files)
                )
            case ("mkdir", "-p", "-m", _, path):
                self.dirs.add(path)
            case ("mkdir", path) if path.startswith("/"):
                ok = path not in self.dirs
                self.dirs.add(path)
            case ("rm", "-rf", "--", *paths):
                for gone in paths:
                    self.dirs = {d for d in self.dirs if d != gone and not d.startswith(gone + "/")}
                    self.files = {f: t for f, t in self.files.items() if not f.startswith(gone)}
            case ("rmdir", "--ignore-fail-on-non-empty", "--", path):
                if not any(x.startswith(path + "/") for x in (*self.files, *self.dirs)):
                    self.dirs.discard(path)
        return CommandResult(self.name, argv, 0 if ok else 1, out, "")

    def unit_text_now(self) -> str:
        return self.run(("systemctl", "cat", "vllm.service")).stdout

    check = run

    def close(self) -> None:
        pass

    def left(self) -> list[str]:
        """What of the run's is still on the host (its state folder aside, as on a real one)."""
        kept = {"/", "/run/systemd/system", "/run/pytest-specdecode"}
        return sorted(self.files) + sorted(self.dirs - kept)


def model_dir(tmp_path: Path, config: dict = SMOL) -> Path:
    folder = tmp_path / "models" / "smol"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def unit_config(**values: object) -> TargetConfig:
    return TargetConfig(
        backend="systemd", host="root@gpu", unit="vllm.service", model="smol",
        api_base="http://127.0.0.1:9", command=(), workdir=Path("."), env={},
        startup_timeout_s=5, restore_timeout_s=5, api_key_env=None,
        **values,  # type: ignore[arg-type]
    )  # fmt: skip


def resolved(host: UnitHost, asked: ShapeConfig, facts=FACTS) -> ServedShape:
    target = SystemdTarget(host, "vllm.service", api_base="http://127.0.0.1:9", model="smol")  # type: ignore[arg-type]
    return resolve_shape(target, unit_config(), asked, facts, folder=Path("/nowhere/shape"))


def test_the_unit_source_is_read_where_the_unit_loads_its_model(tmp_path: Path) -> None:
    model = model_dir(tmp_path)
    host = UnitHost(API_UNIT.format(model=model))
    served = resolved(host, ShapeConfig("unit", (4,)))
    assert served.shape.config == SMOL and served.shape.source == "unit"
    assert served.shape.origin == f"the served model's config.json, {model} on root@gpu:22"
    assert served.tokenizer == str(model) and served.layers == 4
    readers = [argv for argv in host.ran if argv[:3] == ("sh", "-c", model_config._READ)]
    assert [argv[4] for argv in readers] == [str(model)]
    # only reads: nothing written, nothing started or stopped
    assert not host.files and host.active and not host.started
    assert not [a for a in host.ran if a[:2] in (("systemctl", "stop"), ("systemctl", "start"))]


def test_an_architecture_the_units_vllm_lacks_is_refused_naming_the_unit(tmp_path) -> None:
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)))
    lacking = dataclasses.replace(FACTS, architectures=frozenset({"LlamaForCausalLM"}))
    with pytest.raises(ShapeRefused) as refused:
        resolved(host, ShapeConfig("deepseek-v3"), lacking)
    text = str(refused.value)
    assert text.startswith("unit vllm.service on root@gpu:22: ")
    assert "has no DeepseekV3ForCausalLM in its model registry" in text
    assert text.endswith("Nothing was touched") and not host.files and host.active


def test_a_shape_that_cannot_fit_the_units_gpus_even_cut_is_refused_with_its_numbers(
    tmp_path: Path,
) -> None:
    smi = (
        "index, name, memory.total [MiB], memory.used [MiB], driver_version, uuid\n"
        "0, Tesla T4, 15360 MiB, 0 MiB, 535.1, GPU-1\n"
    )
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)), smi=smi)
    with pytest.raises(ShapeRefused) as refused:
        resolved(host, ShapeConfig("kimi-k2"))
    text = str(refused.value)
    assert text.startswith("unit vllm.service on root@gpu:22: ") and "GiB" in text
    assert "Tesla T4 (15360 MiB)" in text and text.endswith("Nothing was touched")
    assert not host.files and host.active


HEAD = f"{SHAPE_ROOT}/nowhere/map-drafters/eagle3-d4/config.json"  # the map's carrier


def shaped(tmp_path: Path, host: UnitHost, progress=None) -> ShapedTarget:
    served = resolved(host, ShapeConfig("unit", (4,)))
    # what is built on the shape (run/map_on_shape.py): a drafter's config.json beside it
    served = dataclasses.replace(served, extras={"files": {HEAD: '{"draft": 1}'}})

    def open_unit(config: TargetConfig, *, progress=None, **_: object) -> SystemdTarget:
        return SystemdTarget(
            host,  # type: ignore[arg-type]
            config.unit or "",
            api_base=config.api_base,
            model="smol",
            progress=progress,
        )

    return shaped_target(
        unit_config(), served, open_target=open_unit, log_dir=tmp_path, progress=progress
    )


def serving(request: httpx.Request) -> httpx.Response:
    """The unit's API, whichever server serves it: healthy, serving `smol`."""
    if request.url.path == "/health":
        return httpx.Response(200)
    return httpx.Response(200, json={"data": [{"id": "smol"}]})


def test_the_shape_serves_in_the_units_window_and_the_restore_puts_the_unit_back(
    tmp_path: Path,
) -> None:
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)))
    lines: list[str] = []
    target = shaped(tmp_path, host, lines.append)
    folder = target.served.folder
    assert folder == f"{SHAPE_ROOT}/nowhere/shape"  # on the host, named as the run's folder
    assert target.adopts_running_original is False
    assert target.room_beside(NGRAM).startswith("unit vllm.service on root@gpu:22 serves the")
    target.preflight()
    script = host.files[RESTORE_SCRIPT]
    assert f"rm -rf -- {SHAPE_ROOT}/nowhere\n" in script  # the watchdog's restore removes it too
    seen: dict[str, str | None] = {}
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lines.append,
        transport=httpx.MockTransport(serving),
    ) as board:  # fmt: skip
        assert board.was_active and board.active is None  # the unit is not the baseline
        board.activate(None)
        seen["baseline"] = host.dropin()
        assert json.loads(host.files[f"{folder}/config.json"]) == SMOL
        assert host.files[HEAD] == '{"draft": 1}'  # the drafter beside it, on the host too
        made = [a[-1] for a in host.ran if a[:4] == ("mkdir", "-p", "-m", "0755")][:5]
        assert made == [
            SHAPE_ROOT,
            f"{SHAPE_ROOT}/nowhere",
            folder,
            *[HEAD.rsplit("/", 2)[0]],
            HEAD.rsplit("/", 1)[0],
        ]
        board.activate(NGRAM)
        seen["ngram"] = host.dropin()
    baseline, candidate = (exec_words(seen[k] or "") for k in ("baseline", "ngram"))
    assert option_value(baseline, "--load-format") == "dummy"
    assert option_value(baseline, "--model") == folder
    assert candidate == [*baseline, "--speculative-config", NGRAM.to_json()]
    # the unit: stopped once for the window, started with each drop-in, then as it was found
    assert [s.count("--load-format") for s in host.started] == [1, 1, 0]
    assert [s.count("--speculative-config") for s in host.started] == [0, 1, 0]
    assert "stopping unit vllm.service on root@gpu:22 (the shape serves in its place)" in lines
    report = board.restore_report
    assert report is not None and report.original == "unit vllm.service on root@gpu:22"
    assert report.was_active and report.is_active and report.serving and not report.errors
    assert not report.never_stopped
    assert host.active and host.dropin() is None and host.left() == []  # no folder, no lock


def test_a_stopped_unit_serves_the_shape_and_is_left_stopped(tmp_path: Path) -> None:
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)), active=False)
    target = shaped(tmp_path, host)
    target.preflight()
    script = host.files[RESTORE_SCRIPT]
    assert "systemctl start vllm.service" not in script and "ss -Htln" not in script
    with experiment_services(
        target, ready_timeout_s=5, restore_timeout_s=5, progress=lambda _: None,
        transport=httpx.MockTransport(serving),
    ) as board:  # fmt: skip
        board.activate(None)
        assert host.active and host.dropin() is not None
    report = board.restore_report
    assert report is not None and not report.was_active and report.is_active is False
    assert not host.active and host.left() == []


def test_a_unit_serving_no_model_the_shape_can_take_the_place_of_is_refused(tmp_path) -> None:
    host = UnitHost("[Service]\nExecStart=/opt/venv/bin/vllm serve --port 8000\n")
    target = SystemdTarget(host, "vllm.service", api_base="http://127.0.0.1:9", model="s")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"names no model whose config\.json could be read"):
        resolve_shape(target, unit_config(), ShapeConfig("unit"), FACTS, folder=tmp_path)


def test_the_restore_script_removes_the_folder_before_the_unit_starts_again(tmp_path) -> None:
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)))
    target = shaped(tmp_path, host)
    target.preflight()
    try:
        text = host.files[RESTORE_SCRIPT]
        script = text.splitlines()
        folder = target.served.folder
        removed = script.index(f"rm -rf -- {run_folder(folder)}")
        dropin = script.index(
            "  rm -f /run/systemd/system/vllm.service.d/zz-pytest-specdecode.conf"
        )
        assert dropin < removed < script.index("systemctl start vllm.service")
        assert script[removed + 1] == f"rmdir -- {SHAPE_ROOT} 2>/dev/null"  # if no other run's
        assert LocalHost().run(["sh", "-n", "-c", text]).ok  # it parses
    finally:
        target.close()
    assert host.left() == []


def test_a_file_built_on_the_shape_outside_the_runs_folder_is_refused(tmp_path: Path) -> None:
    host = UnitHost(API_UNIT.format(model=model_dir(tmp_path)))
    target = SystemdTarget(host, "vllm.service", api_base="http://127.0.0.1:9", model="smol")  # type: ignore[arg-type]
    served = resolved(host, ShapeConfig("unit", (4,)))
    for elsewhere in ("/etc/systemd/system/x.conf", f"{SHAPE_ROOT}/other-run/shape/config.json"):
        with pytest.raises(ValueError):
            target.serve_shape(dataclasses.replace(served, extras={"files": {elsewhere: "x"}}))
    assert target.shape is None and not host.files
