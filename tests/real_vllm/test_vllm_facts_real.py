"""The embedded CPU vLLM tells its own speculative methods and keys; a candidate it does not
know is refused before anything starts."""

from __future__ import annotations

import shutil

import pytest

from pytest_specdecode.config.specconfig import OFFLINE_FACTS, validate_spec_values
from pytest_specdecode.errors import ConfigError
from pytest_specdecode.targets.facts.vllm import ask_vllm
from pytest_specdecode.targets.hosts.base import LocalHost

from ..support.embedded import EMBEDDED, REPO, SERVER_PYTHON, require_embedded, write_experiment

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}


@pytest.mark.parametrize("program", ["python", "vllm"])
def test_the_embedded_vllm_tells_its_facts(program, tmp_path, monkeypatch):
    require_embedded()
    monkeypatch.setenv("SPECDECODE_CACHE_DIR", str(tmp_path))  # nothing remembered yet
    # Both command forms: `python -m vllm.entrypoints…` and the `vllm` script's #! line.
    argv = (
        [str(SERVER_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
        if program == "python"
        else [str(SERVER_PYTHON.parent / "vllm"), "serve", "m"]
    )
    said: list[str] = []
    facts = ask_vllm(LocalHost(), argv, where="the local server command", progress=said.append)
    assert facts.version == "0.32.0" and facts.host == "localhost"
    assert facts.interpreter.endswith(
        "server-venv/bin/python" + ("" if program == "python" else "3")
    )
    # The offline list is a faithful copy of this vLLM's: same methods, same keys and kinds.
    assert facts.methods == OFFLINE_FACTS.methods
    assert dict(facts.keys) == dict(OFFLINE_FACTS.keys)
    assert facts.choices["rejection_sample_method"] == ("block", "standard", "synthetic")
    assert facts.per_request_metrics == ("detailed", "none", "summary")
    # vLLM 0.32's CPU sampler asserts on synthetic acceptance: the break-even map cannot run
    assert facts.synthetic_note and "Synthetic acceptance not supported" in facts.synthetic_note
    assert said[-1].startswith(f"vLLM 0.32.0 on localhost ({facts.interpreter}): 39 speculative")
    # The side changes per method, from its own vllm/config/vllm.py: async scheduling stays on
    # for draft_model, eagle3 and ngram_gpu, not ngram; V2 lacks suffix; no Triton on a CPU.
    kept = facts.async_kept or frozenset()
    assert {"draft_model", "eagle3", "ngram_gpu", "mtp", "dspark", "dflash"} <= kept, kept
    assert not {"ngram", "suffix", "medusa"} & kept and kept <= (facts.methods or set())
    assert facts.v2_unsupported == {"suffix", "medusa", "mlp_speculator", "custom_class"}
    assert facts.triton is False
    assert facts.async_never and "CPU platform turns async scheduling off" in facts.async_never
    # the shape target's: its model registry, and the MoE routing simulation it balances with
    assert {"LlamaForCausalLM", "DeepseekV3ForCausalLM"} <= (facts.architectures or set())
    assert facts.moe_routing == ("normal_routing", "uniform_random")
    with pytest.raises(ConfigError, match=r"on localhost \(vLLM 0.32.0\): unknown key\(s\) 'x'"):
        validate_spec_values({**NGRAM, "x": 1}, source="n", facts=facts)

    # Asked again, the same installation answers from the cache, without importing vLLM.
    again = ask_vllm(LocalHost(), argv, where="the local server command", progress=said.append)
    assert again.digest() == facts.digest() and again.version == facts.version
    assert again.remembered and again.remembered.startswith(str(tmp_path / "vllm-facts"))
    assert "remembered from an earlier ask of this installation" in said[-1], said
    assert facts.remembered is None and facts.seconds and facts.seconds > 0


def test_local_backend_refuses_a_key_its_vllm_does_not_know_before_anything_starts(pytester):
    require_embedded()
    experiment = write_experiment(pytester)
    spec = '{"method":"ngram","num_speculative_tokens":3,"lookahead":2}'
    result = pytester.runpytest_subprocess(*experiment.args("--spec-config", spec))
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    assert (
        "ERROR: speculative config 'ngram-k3' on localhost (vLLM 0.32.0): unknown key(s) "
        "'lookahead'; this vLLM knows: " in err
    )
    assert f"] vLLM 0.32.0 on localhost ({EMBEDDED}" in err  # a progress line
    assert experiment.leftover_servers() == []
    assert not experiment.reports.exists() or not any(experiment.reports.iterdir())


def test_the_break_even_map_is_refused_on_a_cpu_vllm_before_anything_starts(pytester):
    """vLLM 0.32's CPU build accepts `rejection_sample_method: synthetic` at start, then its
    sampler asserts at the first speculative step: the map says so before anything starts."""
    require_embedded()
    experiment = write_experiment(pytester)
    result = pytester.runpytest_subprocess(
        *experiment.args("--spec-config", "ngram", "--spec-break-even", "auto")
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
    err = result.stderr.str()
    said = "ERROR: map-k3-L1: synthetic acceptance cannot run on localhost: vLLM 0.32.0 on a CPU"
    assert said in err
    assert "Synthetic acceptance not supported with CPU sampling" in err
    assert "nothing was started" in err
    assert experiment.leftover_servers() == []
    assert not experiment.reports.exists() or not any(experiment.reports.iterdir())


def test_the_search_plans_on_the_shipped_suite_as_it_is(pytester):
    """`pytest suites/ --spec-search ngram` on the shipped suite, unchanged (its own design
    starts each arm three times): the plan, each config in one server start; nothing starts."""
    require_embedded()
    shutil.copytree(REPO / "suites", pytester.path / "suites")
    (pytester.path / ".embedded").symlink_to(EMBEDDED)
    pytester.makeini("[pytest]\nspecdecode_file = suites/specdecode.toml\n")  # as pyproject's
    result = pytester.runpytest_subprocess("suites/", "--spec-search", "ngram", "--spec-dry-run")
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "each in one server start" in out
    assert "drop --spec-repeats" not in out + result.stderr.str()
    assert not (pytester.path / "reports").exists() or not any(
        (pytester.path / "reports").iterdir()
    )
