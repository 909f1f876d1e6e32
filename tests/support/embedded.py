"""Helpers: an experiment against the embedded CPU vLLM, written into a pytester dir."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_specdecode.targets.base import wait_until_ready
from pytest_specdecode.targets.local_process import LocalProcessService

REPO = Path(__file__).resolve().parents[2]
EMBEDDED = Path(os.environ.get("SPECDECODE_EMBEDDED_DIR", REPO / ".embedded"))
SERVER_PYTHON = EMBEDDED / "server-venv" / "bin" / "python"
MODEL_DIR = EMBEDDED / "models" / "SmolLM2-135M-Instruct"
MODEL = "smollm2-135m-instruct"
# The CPU vLLM binds its worker to cores: "auto" takes all but the last. The test host's vLLM
# does, so the embedded one takes the last core and the two suites run side by side (make test).
CPUS = os.cpu_count() or 1
CPU_BIND = str(CPUS - 1) if CPUS > 1 else "auto"
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": CPU_BIND}
SERVER_ENV_TOML = "\n".join(f"{k} = {json.dumps(v)}" for k, v in SERVER_ENV.items())
# Asks for the engine's worker in the engine core's process, not a third one. vLLM 0.32's CPU
# platform turns "uni" back into "mp" unless VLLM_ENABLE_V1_MULTIPROCESSING=0 (platforms/cpu.py:
# the worker's OpenMP binding is set only when it is spawned), so a VLLM::Worker process still
# starts. With that variable set a start took 19.5 s, not 30.6 (2026-12-04, this machine), but
# by vLLM's code the engine's threads would then not be bound to their core (its OpenMP binding
# is set up only for a spawned worker), which make test's two lanes rely on: not checked yet.
UNIPROC = ("--distributed-executor-backend", "uni")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (e.g. a unique port)."""
    out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines()[1:] if text in line and "ps -eo" not in line]


@dataclass
class EmbeddedExperiment:
    """A copy of the suite plus a config for the embedded vLLM on a port of its own."""

    dir: Path
    config: Path
    reports: Path
    port: int

    def results(self) -> dict:
        (run,) = [p for p in self.reports.iterdir() if p.is_dir()]
        return json.loads((run / "results.json").read_text())

    def run_dir(self) -> Path:
        (run,) = [p for p in self.reports.iterdir() if p.is_dir()]
        return run

    def args(self, *extra: str) -> list[str]:
        return [
            str(self.dir / "suites"),
            "--spec-file",
            str(self.config),
            "-p",
            "no:cacheprovider",
            *extra,
        ]

    def leftover_servers(self) -> list[str]:
        return processes_mentioning(f"--port {self.port}")


STEP_SUMMARY = "github-step-summary.md"  # $GITHUB_STEP_SUMMARY of the runs, in their folder


def run_suite(exp: EmbeddedExperiment, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest on the experiment's suite copy, in its folder: host profiles and the step summary
    there too, never the user's (a module fixture runs before the autouse ones)."""
    profiles = exp.dir / "host-profiles"
    profiles.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "SPECDECODE_HOST_PROFILES": str(profiles),
        "GITHUB_STEP_SUMMARY": str(exp.dir / STEP_SUMMARY),
    }
    return subprocess.run(
        [sys.executable, "-m", "pytest", *exp.args(*args)],
        cwd=exp.dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )


def require_embedded() -> None:
    """For tests that start the embedded vLLM: fail clearly when it is not set up."""
    if not (SERVER_PYTHON.exists() and (MODEL_DIR / "model.safetensors").exists()):
        pytest.fail(f"the embedded vLLM is not set up under {EMBEDDED}: run scripts/setup-embedded")


def write_experiment(
    into: pytest.Pytester | Path,
    *,
    run: dict[str, object] | None = None,
    thresholds: str = "",
    prompt_types: str = "",
) -> EmbeddedExperiment:
    where = into if isinstance(into, Path) else into.path
    port = free_port()
    # No token ids unless a test asks (test_prediction_real): a few untimed requests fewer.
    # make test runs two servers side by side on two cores, each the other's "other work": the
    # host's CPU is recorded but not judged (busy_host_share 1.0); the GPU rules still apply
    run_values = {"samples": 6, "max_samples": 6, "warmup": 1, "max_tokens": 32,
                  "record_token_ids": False, "busy_host_share": 1.0, **(run or {})}  # fmt: skip
    run_table = "\n".join(f"{k} = {json.dumps(v)}" for k, v in run_values.items())
    shutil.copytree(
        REPO / "suites",
        where / "suites",
        ignore=shutil.ignore_patterns("*.toml", "__pycache__"),
    )
    seed = (REPO / "suites" / "specdecode.toml").read_text()
    prompts = seed[seed.index("[prompt_types.coding]") :]
    reports = where / "reports"
    config = where / "experiment.toml"
    config.write_text(f"""
reports_dir = "{reports}"
[target]
api_base = "http://127.0.0.1:{port}"
model = "{MODEL}"
command = ["{SERVER_PYTHON}", "-m", "vllm.entrypoints.openai.api_server",
  "--model", "{MODEL_DIR}", "--served-model-name", "{MODEL}", "--host", "127.0.0.1",
  "--port", "{port}", "--enforce-eager", "--max-model-len", "1024", "--seed", "0",
  "{UNIPROC[0]}", "{UNIPROC[1]}"]
startup_timeout_s = 400
[target.env]
{SERVER_ENV_TOML}
[run]
{run_table}
[thresholds]
{thresholds}
[presets]
ngram = {{ method = "ngram", num_speculative_tokens = 5, prompt_lookup_max = 4 }}
suffix = {{ method = "suffix", num_speculative_tokens = 3 }}
{prompt_types or prompts}
""")
    return EmbeddedExperiment(where, config, reports, port)


def all_samples(data: dict) -> list[dict]:
    """Every request of a results.json, warm-ups included, each with its phase."""
    return [
        {**s, "phase": phase["name"]}
        for phase in data["phases"].values()
        for m in phase["measurements"].values()
        for s in [*m["warmup"], *m["samples"]]
    ]


@contextmanager
def embedded_server(name: str, log_path: Path, *args: str) -> Iterator[LocalProcessService]:
    """The embedded CPU vLLM on a free port, started as the plugin starts a local one, with
    `args` after the common ones; stopped after, and checked to be gone."""
    require_embedded()
    port = free_port()
    argv = [
        str(SERVER_PYTHON), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(MODEL_DIR), "--served-model-name", MODEL,
        "--host", "127.0.0.1", "--port", str(port), "--enforce-eager", "--seed", "0",
        *UNIPROC, *args,
    ]  # fmt: skip
    service = LocalProcessService(
        name=name,
        argv=argv,
        api_base=f"http://127.0.0.1:{port}",
        model=MODEL,
        workdir=REPO,
        env=SERVER_ENV,
        log_path=log_path,
    )
    service.start()
    try:
        wait_until_ready(service, timeout_s=400, progress=lambda line: None)
        yield service
    finally:
        service.stop()
        assert not processes_mentioning(f"--port {port}")
