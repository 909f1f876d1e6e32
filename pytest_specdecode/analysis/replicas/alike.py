"""Whether replicas are alike enough to compare across (pure): the crossover's precondition.

A crossover cancels what makes one replica faster than another (docs/replicas.md); it cannot
cancel a different model or a different vLLM, which change what is measured, so those are
refused. Different GPUs, GPU counts or drivers are named: the crossover cancels them as the
replica effect, but the reader should know the replicas are not twins.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplicaFacts:
    """What one replica runs, as read before anything is touched; None: could not be read."""

    name: str
    model: str  # the served model name
    model_path: str | None = None  # the model its server command loads
    model_config: str | None = None  # a fingerprint of that model's config.json
    vllm_version: str | None = None
    gpus: tuple[str, ...] | None = None  # each GPU's name, from nvidia-smi
    driver: str | None = None
    cuda: str | None = None
    host: str | None = None  # where its servers run
    devices: tuple[int | None, ...] | None = None  # the indices of the GPUs it sees

    def describe(self) -> str:
        """One line for the plan: `a: model m, vLLM 0.11.0, 8 x NVIDIA H200, driver 580`."""
        loaded = [
            x
            for x in (self.model_path, self.model_config and f"config.json {self.model_config}")
            if x
        ]
        parts = [f"model {self.model}" + (f" ({', '.join(loaded)})" if loaded else "")]
        parts.append(f"vLLM {self.vllm_version or 'unknown'}")
        parts.append(_gpus_text(self.gpus) + _indices(self.devices))
        if self.gpus != ():  # no GPU, no driver to name
            parts.append(f"driver {self.driver or 'unknown'}")
        if self.cuda:
            parts.append(f"CUDA {self.cuda}")
        return f"{self.name}: {', '.join(parts)}"


@dataclass(frozen=True)
class Alike:
    """The check's findings, each a sentence naming both replicas and both values."""

    refusals: tuple[str, ...] = ()  # the crossover cannot compare these replicas
    differences: tuple[str, ...] = ()  # compared anyway, named in the plan and the report
    unknown: tuple[str, ...] = ()  # what could not be compared, and why

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


def alike(replicas: Sequence[ReplicaFacts]) -> Alike:
    """Each replica against the first: refusals (model, vLLM version; two replicas on one
    host that see one GPU), differences (GPU model, GPU count, driver, CUDA) and what could not
    be compared."""
    refusals: list[str] = []
    differences: list[str] = []
    unknown: list[str] = []
    if not replicas:
        return Alike()
    first = replicas[0]
    for other in replicas[1:]:
        pair = (first, other)
        refusals += _differ(pair, "serves the model", lambda r: r.model)
        refusals += _differ(pair, "loads the model", lambda r: r.model_path)
        refusals += _differ(pair, "loads a model whose config.json is", lambda r: r.model_config)
        refusals += _differ(pair, "runs vLLM", lambda r: r.vllm_version)
        differences += _differ(pair, "has the GPUs", lambda r: _names(r.gpus))
        differences += _differ(pair, "has", lambda r: _count(r.gpus))
        differences += _differ(pair, "runs the NVIDIA driver", lambda r: r.driver)
        differences += _differ(pair, "runs CUDA", lambda r: r.cuda)
    for replica in replicas:
        missing = [
            what
            for what, value in (
                ("its vLLM version", replica.vllm_version),
                ("its GPUs", replica.gpus),
                ("its driver", replica.driver if replica.gpus else ""),
            )
            if value is None
        ]
        if missing:
            unknown.append(f"{replica.name}: {', '.join(missing)} could not be read")
    refused = [f"{line}: a crossover compares one model on one vLLM" for line in refusals]
    return Alike(tuple(refused + _shared(replicas)), tuple(differences), tuple(unknown))


def _shared(replicas: Sequence[ReplicaFacts]) -> list[str]:
    """Two replicas on one host that see one GPU: their servers would share its memory, and
    each replica's speed would be the other's load."""
    out = []
    for i, a in enumerate(replicas):
        for b in replicas[i + 1 :]:
            both = sorted(
                {d for d in a.devices or () if d is not None} & set(b.devices or ()),
            )
            if a.host is not None and a.host == b.host and both:
                out.append(
                    f"replica {b.name} and replica {a.name} both see GPU"
                    f"{'s' if len(both) > 1 else ''} {','.join(map(str, both))} on {a.host}: "
                    "each replica needs GPUs of its own (devices in its [[target.replicas]] "
                    "entry)"
                )
    return out


def _differ(
    pair: tuple[ReplicaFacts, ReplicaFacts], what: str, get: Callable[[ReplicaFacts], str | None]
) -> list[str]:
    """A sentence where both replicas' values are known and differ; [] otherwise."""
    a, b = pair
    va, vb = get(a), get(b)
    if va is None or vb is None or va == vb:
        return []
    return [f"replica {b.name} {what} {vb}, replica {a.name} {va}"]


def _names(gpus: tuple[str, ...] | None) -> str | None:
    return None if not gpus else " + ".join(sorted(set(gpus)))


def _count(gpus: tuple[str, ...] | None) -> str | None:
    return None if gpus is None else f"{len(gpus)} GPU{'s' if len(gpus) != 1 else ''}"


def _indices(devices: tuple[int | None, ...] | None) -> str:
    """` (GPU 0)`, ` (GPUs 0,1)`; '' where none is known."""
    if not devices:
        return ""
    shown = ",".join("?" if d is None else str(d) for d in devices)
    return f" (GPU{'s' if len(devices) > 1 else ''} {shown})"


def _gpus_text(gpus: tuple[str, ...] | None) -> str:
    if gpus is None:
        return "GPUs unknown"
    if not gpus:
        return "no GPU"
    return f"{len(gpus)} x {_names(gpus)}"
