"""The shape target on the real CPU vLLM: Llama-3.1-8B's geometry (`--spec-shape llama-3.1-8b`)
cut to 2 layers, served with dummy weights and SmolLM2's tokenizer, measured as a baseline and as
an n-gram candidate: about 1.5B parameters (the 128256 x 4096 embedding and head), 3 GB in bf16,
ready in about a minute on 2 cores. test_shape_real.py has the other shape."""

from __future__ import annotations

import pytest

from ..support.shape_run import ShapeRun, measured, says, shape_run


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> ShapeRun:
    where = tmp_path_factory.mktemp("shape-llama")
    return shape_run(where, "--spec-shape", "llama-3.1-8b", "--spec-shape-layers", "2")


def test_a_llama_geometry_cut_to_two_layers_is_measured(llama: ShapeRun) -> None:
    measured(llama)
    says(llama, "the layers: 32 → 2")
    shape = llama.data["shape"]
    assert shape["shape"]["source"] == "llama-3.1-8b"
    assert (shape["layers"], shape["full"]) == (2, 32)
    assert shape["overrides"] == {"num_hidden_layers": 2}
    assert shape["fit"]["depths"] == [2]
    log = (llama.exp.run_dir() / "server-candidate-ngram.log").read_text()
    assert "'hf_overrides': {'num_hidden_layers': 2}" in log and "load_format=dummy" in log
