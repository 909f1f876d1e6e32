"""The shape target on the real CPU vLLM: two shapes served with dummy weights, each measured as
a baseline and as an n-gram candidate, the real model never started.

- SmolLM2's own config.json (`--spec-shape unit`, read where the server loads its model): all
  30 layers fit, nothing is cut;
- Llama-3.1-8B's geometry (`--spec-shape llama-3.1-8b`) cut to 2 layers: about 1.5B parameters
  (the 128256 x 4096 embedding and head), 3 GB in bf16, ready in about a minute on 2 cores.
Short on purpose (CI's budget): one prompt type, 5 requests of 16 tokens an arm, one start each.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_specdecode.config.shape.named import NAMED

from ..support.embedded import (
    MODEL_DIR,
    SERVER_PYTHON,
    EmbeddedExperiment,
    require_embedded,
    run_suite,
    write_experiment,
)

RUN = {"samples": 5, "max_samples": 5, "warmup": 1, "max_tokens": 16, "repeats": 1}


@dataclass
class ShapeRun:
    exp: EmbeddedExperiment
    done: subprocess.CompletedProcess[str]
    data: dict
    log: str  # run.log
    summary: str  # summary.md


def _run(where: Path, *shape: str) -> ShapeRun:
    require_embedded()
    exp = write_experiment(where, run=RUN)
    done = run_suite(
        exp,
        "--spec-config",
        "ngram",
        "--spec-prompt-type",
        "coding",
        "--spec-arms",
        "one-at-a-time",
        *shape,
    )
    assert exp.reports.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    folder = exp.run_dir()
    return ShapeRun(
        exp,
        done,
        exp.results(),
        (folder / "run.log").read_text(),
        (folder / "summary.md").read_text(),
    )


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> ShapeRun:
    return _run(tmp_path_factory.mktemp("shape-unit"), "--spec-shape", "unit")


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> ShapeRun:
    where = tmp_path_factory.mktemp("shape-llama")
    return _run(where, "--spec-shape", "llama-3.1-8b", "--spec-shape-layers", "2")


def _measured(run: ShapeRun) -> None:
    """Baseline and n-gram each measured on the shape server, the original left as found."""
    phases = run.data["phases"]
    assert set(phases) == {"baseline", "ngram"}, run.done.stdout[-3000:]
    for phase in phases.values():
        (cell,) = phase["measurements"].values()
        assert len(cell["samples"]) == RUN["samples"]
    assert phases["ngram"]["acceptance"]["present"] is True
    restore = run.data["restore"]
    assert restore["was_active"] is False and restore["is_active"] is False
    assert restore["errors"] == []
    assert run.exp.leftover_servers() == []


def _says(run: ShapeRun, cut: str) -> None:
    """The plan (run.log, before anything started) and the report name what is random and
    what is cut."""
    plan = [line for line in run.log.splitlines() if "plan:" in line]
    first_start = next(i for i, line in enumerate(run.log.splitlines()) if "starting " in line)
    assert any("random: the weights (--load-format dummy)" in line for line in plan)
    assert any(f"cut: {cut}" in line for line in plan)
    assert max(i for i, line in enumerate(run.log.splitlines()) if "plan: " in line) < first_start
    assert "Measured on the shape, not the model" in run.summary
    assert "- Random: the weights (--load-format dummy)" in run.summary
    assert f"- Cut: {cut}" in run.summary
    page = (run.exp.run_dir() / "report.html").read_text()
    assert "Measured on the shape, not the model" in page and "Random: the weights" in page
    assert "Measured on the shape, not the model" in run.done.stdout  # the terminal
    assert f"  Cut: {cut}" in run.done.stdout


def test_the_served_models_own_shape_is_measured_with_dummy_weights(served: ShapeRun) -> None:
    _measured(served)
    _says(served, "nothing: all 30 layers are served")
    shape = served.data["shape"]
    assert shape["shape"]["source"] == "unit" and shape["layers"] == shape["full"] == 30
    config = json.loads((MODEL_DIR / "config.json").read_text())
    written = served.exp.run_dir() / "shape" / "config.json"
    assert json.loads(written.read_text()) == config == shape["shape"]["config"]
    label = "[shape unit (LlamaForCausalLM), 30 of 30 layers]"
    assert served.data["target"]["model"].endswith(label)
    log = (served.exp.run_dir() / "server-original.log").read_text()
    assert "load_format=dummy" in log and f"tokenizer='{MODEL_DIR}'" in log


def test_a_llama_geometry_cut_to_two_layers_is_measured(llama: ShapeRun) -> None:
    _measured(llama)
    _says(llama, "the layers: 32 → 2")
    shape = llama.data["shape"]
    assert shape["shape"]["source"] == "llama-3.1-8b"
    assert (shape["layers"], shape["full"]) == (2, 32)
    assert shape["overrides"] == {"num_hidden_layers": 2}
    assert shape["fit"]["depths"] == [2]
    log = (llama.exp.run_dir() / "server-candidate-ngram.log").read_text()
    assert "'hf_overrides': {'num_hidden_layers': 2}" in log and "load_format=dummy" in log


def test_the_dry_run_says_what_is_real_random_and_cut_and_touches_nothing(tmp_path: Path) -> None:
    require_embedded()
    exp = write_experiment(tmp_path, run=RUN)
    done = run_suite(
        exp, "--spec-config", "ngram", "--spec-prompt-type", "coding", "--spec-shape",
        "llama-3.1-8b", "--spec-shape-layers", "2", "--spec-dry-run",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "shape: llama-3.1-8b (LlamaForCausalLM), 2 of 32 layers" in out
    assert "  random: the weights (--load-format dummy)" in out
    assert "  cut: the layers: 32 → 2 (--hf-overrides num_hidden_layers 2); 2 of 32 layers:" in out
    assert "--load-format dummy --hf-overrides '{\"num_hidden_layers\": 2}'" in out
    assert not exp.reports.exists() and exp.leftover_servers() == []


def test_the_named_shapes_read_as_transformers_own_config_classes(tmp_path: Path) -> None:
    """Where transformers is importable (the embedded server's venv): each named shape loads
    into its config class, which reads the same figures."""
    require_embedded()
    program = """
import json, sys
from transformers import AutoConfig
out = {}
for name, config in json.load(sys.stdin).items():
    c = AutoConfig.for_model(**config)
    text = c.get_text_config()
    out[name] = {"class": type(c).__name__, "hidden": text.hidden_size,
                 "layers": text.num_hidden_layers, "vocab": text.vocab_size,
                 "heads": text.num_attention_heads, "kv": text.num_key_value_heads,
                 "experts": getattr(text, "n_routed_experts", None)}
print(json.dumps(out))
"""
    done = subprocess.run(
        [str(SERVER_PYTHON), "-c", program],
        input=json.dumps({name: config for name, (_, config) in NAMED.items()}),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    assert read["llama-3.1-8b"] == {
        "class": "LlamaConfig", "hidden": 4096, "layers": 32, "vocab": 128256, "heads": 32,
        "kv": 8, "experts": None,
    }  # fmt: skip
    assert read["deepseek-v3"]["class"] == read["kimi-k2"]["class"] == "DeepseekV3Config"
    assert (read["deepseek-v3"]["experts"], read["kimi-k2"]["experts"]) == (256, 384)
    assert (read["kimi-k2"]["heads"], read["kimi-k2"]["vocab"]) == (64, 163840)
