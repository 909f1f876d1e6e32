"""targets/facts/vllm_snippet.py: the snippet, run by this Python over a stand-in vLLM package
(no vLLM imported), reads the side changes per method from that vLLM's own source, in the
shape vLLM 0.32 writes them or in another version's. The real vLLM answers it in
tests/real_vllm/test_vllm_facts_real.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pytest_specdecode.config.specconfig import VllmFacts
from pytest_specdecode.targets.facts.vllm import parse_facts
from pytest_specdecode.targets.facts.vllm_snippet import SNIPPET

# A stand-in vLLM package: its speculative config, and vllm/config/vllm.py with the two rules
# the snippet reads, in the shape vLLM 0.32 writes them (`get_args` of its Literal types, then
# `!=` a method) or in another version's shape.
SPECULATIVE = """
import dataclasses
from typing import Literal
MTPModelTypes = Literal["deepseek_mtp", "mtp"]
EagleModelTypes = Literal["eagle", "eagle3", MTPModelTypes]
NgramGPUTypes = Literal["ngram_gpu"]
SpeculativeMethod = Literal["ngram", "draft_model", "suffix", "medusa", EagleModelTypes,
                            NgramGPUTypes]

@dataclasses.dataclass
class SpeculativeConfig:
    method: SpeculativeMethod = "ngram"
    num_speculative_tokens: int = 1
"""
CONFIG = """
import logging
from typing import get_args
from .speculative import EagleModelTypes, NgramGPUTypes
{triton}
logger = logging.getLogger(__name__)

class VllmConfig:
    def _async(self):
        if self.scheduler_config.async_scheduling:
            if self.speculative_config.method not in get_args(EagleModelTypes):
                raise ValueError("Currently, async scheduling is only supported with EAGLE")
        elif self.scheduler_config.async_scheduling is None:
            if self.speculative_config is not None and {kept}:
                logger.warning("Async scheduling not supported with %s-based speculative "
                               "decoding and will be disabled.", self.speculative_config.method)
                self.scheduler_config.async_scheduling = False
            else:
                self.scheduler_config.async_scheduling = True

    def _get_v2_model_runner_unsupported_features(self):
        unsupported = []
        spec = self.speculative_config
        if spec is not None:
            if spec.method in {v2}:
                unsupported.append(f"speculative method '{{spec.method}}'")
            if spec.parallel_drafting and spec.method not in ("dflash", "dspark"):
                unsupported.append("parallel drafting")
        return unsupported
"""
KEPT_032 = (
    "self.speculative_config.method not in get_args(EagleModelTypes) "
    "and self.speculative_config.method not in get_args(NgramGPUTypes) "
    'and self.speculative_config.method != "draft_model"'
)
KEPT_EAGLE_ONLY = "self.speculative_config.method not in get_args(EagleModelTypes)"


def _ask_stand_in(tmp_path: Path, *, kept: str, v2: str, triton: str) -> VllmFacts:
    """The snippet, run by this Python over the stand-in vLLM (no vLLM imported)."""
    pkg = tmp_path / "vllm"
    (pkg / "config").mkdir(parents=True)
    (pkg / "__init__.py").write_text('__version__ = "9.9.0"\n')
    (pkg / "config" / "__init__.py").write_text("")
    (pkg / "config" / "speculative.py").write_text(SPECULATIVE)
    (pkg / "config" / "vllm.py").write_text(CONFIG.format(kept=kept, v2=v2, triton=triton))
    done = subprocess.run(
        [sys.executable, "-"],
        input=SNIPPET,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        timeout=60,
    )
    return parse_facts(done.stdout, host="localhost", interpreter=sys.executable)


def test_the_side_rules_of_a_vllm_shaped_as_0_32_are_read_from_its_source(tmp_path: Path):
    facts = _ask_stand_in(
        tmp_path,
        kept=KEPT_032,
        v2='("suffix", "medusa", "mlp_speculator", "custom_class")',
        triton="HAS_TRITON = True",
    )
    assert facts.version == "9.9.0"
    # kept on: the EAGLE family with its MTPs (nested Literals), ngram_gpu, the draft model
    assert facts.async_kept == {"eagle", "eagle3", "deepseek_mtp", "mtp", "ngram_gpu",
                                "draft_model"}  # fmt: skip
    # `in (…)` only: the `not in ("dflash", "dspark")` of parallel drafting is no method's rule
    assert facts.v2_unsupported == {"suffix", "medusa", "mlp_speculator", "custom_class"}
    assert facts.triton is True
    assert facts.async_never is None  # no vllm.platforms in the stand-in: not said
    assert facts.record()["async_kept"] == sorted(facts.async_kept)


def test_the_side_rules_of_a_vllm_of_another_shape_are_its_own(tmp_path: Path):
    """A version whose async scheduling stays on with EAGLE alone, and whose Model Runner V2
    lacks n-gram and the draft model: read as it is written, not as 0.32 has it."""
    facts = _ask_stand_in(
        tmp_path, kept=KEPT_EAGLE_ONLY, v2='("ngram", "draft_model", "suffix")', triton=""
    )
    assert facts.async_kept == {"eagle", "eagle3", "deepseek_mtp", "mtp"}
    assert facts.v2_unsupported == {"ngram", "draft_model", "suffix"}
    assert facts.triton is None  # not said by this source


def test_a_source_without_the_rules_tells_none(tmp_path: Path):
    facts = _ask_stand_in(tmp_path, kept="False", v2="()", triton="")
    assert facts.async_kept is None and facts.v2_unsupported is None


# The shape target's facts: the model registry and the MoE routing simulation, as vLLM 0.32 has
# them (vllm/model_executor/models/registry.py, vllm/envs.py, the router's simulator module).
REGISTRY = """
class _Registry:
    def get_supported_archs(self):
        return {"LlamaForCausalLM": 1, "DeepseekV3ForCausalLM": 2}.keys()
ModelRegistry = _Registry()
"""
ROUTER = """
class RoutingSimulator:
    _routing_strategies = {"uniform_random": 1, "normal_routing": 2}
"""


def _with_shape_facts(tmp_path: Path, *, routing: bool) -> VllmFacts:
    pkg = tmp_path / "vllm"
    router = pkg / "model_executor" / "layers" / "fused_moe" / "router"
    router.mkdir(parents=True)
    for folder in (pkg / "model_executor", router.parent.parent, router.parent, router):
        (folder / "__init__.py").write_text("")
    (pkg / "model_executor" / "models").mkdir()
    (pkg / "model_executor" / "models" / "__init__.py").write_text(REGISTRY)
    (router / "routing_simulator_router.py").write_text(ROUTER)
    names = '"VLLM_MOE_ROUTING_SIMULATION_STRATEGY": None' if routing else ""
    (pkg / "envs.py").write_text(f"environment_variables = {{{names}}}\n")
    return _ask_stand_in(tmp_path, kept="False", v2="()", triton="")


def test_the_shape_targets_facts_are_the_registrys_architectures_and_moe_routing(tmp_path):
    facts = _with_shape_facts(tmp_path, routing=True)
    assert facts.architectures == {"LlamaForCausalLM", "DeepseekV3ForCausalLM"}
    assert facts.moe_routing == ("normal_routing", "uniform_random")
    assert facts.record()["architectures"] == 2 and facts.shape_note is None


def test_a_vllm_without_the_routing_simulation_says_so(tmp_path):
    facts = _with_shape_facts(tmp_path, routing=False)
    assert facts.moe_routing == () and facts.architectures is not None


def test_a_vllm_without_a_model_registry_tells_why(tmp_path):
    facts = _ask_stand_in(tmp_path, kept="False", v2="()", triton="")
    assert facts.architectures is None and facts.moe_routing is None
    assert facts.shape_note and "ModuleNotFoundError" in facts.shape_note
