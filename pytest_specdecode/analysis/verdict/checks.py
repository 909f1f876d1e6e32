"""The checks beside the verdict: acceptance counted twice, outputs, and whether runs compare.

Pure functions over the run record.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ...config.arms import BASELINE
from ...record.counters import Acceptance, Traffic
from ...record.schema import RunRecord


def acceptance_cross_check(
    server: Acceptance,
    traffic: Traffic,
    *,
    requests: int,
    client_accepted: int | None,
    num_speculative_tokens: int | None,
) -> str | None:
    """Where the server's accepted-token count disagrees with the tokens it delivered, or None.

    Exact where the server exports its token and decode-step counters (vLLM 0.32 does): every
    decode step of a request delivers one token plus the draft tokens it accepted, so over a
    window of this run's requests alone

        delivered accepted = generation tokens - requests - decode steps

    The server's own count may exceed it only by tokens accepted past max_tokens or EOS, which
    are verified but cut from the stream: at most num_speculative_tokens per request. The
    client's count (tokens beyond one per chunk) may exceed it only where the API server merged
    the output of consecutive steps into one chunk, which a slow reader causes: the client
    never sees fewer. Without those counters the check falls back on the client's count, with
    both allowances.
    """
    if not server.present or num_speculative_tokens is None:
        return None
    # k per request, not the replay's k - 1 (analysis.ngram_types.ReplayStats): that bound is
    # on draft tokens checked past the known output. vLLM 0.32 counts a step's accepted tokens
    # before check_stop trims the step's tokens at max_tokens or EOS (Scheduler.
    # update_from_output), so a last step that starts one token before max_tokens delivers
    # that one token, the step's "one", and cuts all it accepted: k when every draft token was
    # (reached in tests/unit/measure/test_metrics.py).
    slack = requests * num_speculative_tokens
    if traffic.generation_tokens is not None and traffic.decode_steps is not None:
        delivered = traffic.generation_tokens - requests - traffic.decode_steps
        cut = server.accepted - delivered
        if not 0 <= cut <= slack:
            return (
                f"the server counted {server.accepted:.0f} accepted tokens, but its token "
                f"counters say {delivered:.0f} were delivered beyond one per step: the "
                f"{cut:+.0f} difference is outside what truncation at max_tokens explains "
                f"(0 to {slack})"
            )
        if client_accepted is not None and client_accepted < delivered:
            return (
                f"the client received {client_accepted} tokens beyond one per chunk, fewer than "
                f"the {delivered:.0f} the server delivered beyond one per step"
            )
        return None
    if client_accepted is None:
        return "the server sent no per-chunk usage, so acceptance could not be cross-checked"
    if not client_accepted - slack <= server.accepted <= client_accepted + slack:
        return (
            f"the server counted {server.accepted:.0f} accepted tokens but the client received "
            f"{client_accepted} beyond one per chunk; truncation at max_tokens and merged "
            f"chunks explain at most {slack} either way (this vLLM exports no decode-step "
            "counter for an exact check)"
        )
    return None


# --------------------------------------------------------------------------- outputs


@dataclass(frozen=True)
class Equivalence:
    """A candidate's outputs against the baseline's, for one prompt type."""

    n: int
    identical: int
    min_common_prefix_chars: int
    reference_chars: int
    baseline_consistent: bool
    divergence: dict[str, Any] | None = None  # the first difference, with context

    @property
    def status(self) -> str:
        return "identical" if self.identical == self.n else "differs"

    def text(self) -> str:
        if self.status == "identical":
            out = f"identical to the baseline ({self.identical}/{self.n} outputs)"
        else:
            out = (
                f"differs from the baseline: {self.identical}/{self.n} outputs identical, "
                f"common prefix at least {self.min_common_prefix_chars} of "
                f"{self.reference_chars} characters"
            )
        if not self.baseline_consistent:
            out += " (the baseline's own outputs were not all equal)"
        return out

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status}


def common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


Output = tuple[int | None, str]  # (the prompt's index in its prompt type, the output text)


def equivalence(baseline: Sequence[Output], candidate: Sequence[Output]) -> Equivalence | None:
    """With greedy decoding speculation should not change the text.

    Each candidate output is compared with the baseline's most common output of the same
    prompt, exactly and by the length of the common prefix in characters. A difference is a
    warning, not a failure: small numeric differences are real (and batching at a higher
    concurrency changes them). Outputs of prompts the baseline did not send are left out.
    """
    references: dict[int | None, str] = {}
    by_prompt: dict[int | None, list[str]] = {}
    for prompt, text in baseline:
        by_prompt.setdefault(prompt, []).append(text)
    for prompt, texts in by_prompt.items():
        references[prompt] = Counter(texts).most_common(1)[0][0]
    pairs = [(references[p], text) for p, text in candidate if p in references]
    if not pairs:
        return None
    first_diff = next(((ref, t) for ref, t in pairs if t != ref), None)
    divergence = None
    if first_diff is not None:
        reference, text = first_diff
        at = common_prefix(reference, text)
        divergence = {
            "at_char": at,
            "baseline": reference[max(0, at - 40) : at + 40],
            "candidate": text[max(0, at - 40) : at + 40],
        }
    worst = min(pairs, key=lambda pair: common_prefix(*pair))
    return Equivalence(
        n=len(pairs),
        identical=sum(t == ref for ref, t in pairs),
        min_common_prefix_chars=common_prefix(*worst),
        reference_chars=len(worst[0]),
        baseline_consistent=all(len(set(texts)) == 1 for texts in by_prompt.values()),
        divergence=divergence,
    )


def output_texts(record: RunRecord, arm: str, key: str) -> list[Output]:
    """An arm's outputs of one measurement key, each with the prompt it answered."""
    return [
        (s.prompt_index, s.text)
        for p in record.arm_phases(arm)
        if key in p.measurements
        for s in p.measurements[key].samples
    ]


def equivalences(record: RunRecord) -> dict[str, dict[str, Equivalence]]:
    """Per measured candidate and measurement key (prompt type, and level when several)."""
    out: dict[str, dict[str, Equivalence]] = {}
    for arm in record.measured_candidates:
        for key in record.keys:
            entry = equivalence(output_texts(record, BASELINE, key), output_texts(record, arm, key))
            if entry is not None:
                out.setdefault(arm, {})[key] = entry
    return out


# --------------------------------------------------------------------------- comparability

COMPARABLE = ("model", "vllm_version", "gpus", "prompts", "decoding")


def facts(record: RunRecord, *, arm: str | None = None) -> dict[str, Any]:
    """What must agree for two measurements to be comparable."""
    phases = record.arm_phases(arm) if arm else list(record.phases.values())
    versions = [p.server_version for p in phases if p.server_version and not p.reused_from]
    run = record.run
    return {
        "model": record.target.model,
        "host": record.target.host,
        "vllm_version": versions[0] if versions else None,
        "gpus": record.environment.get("gpus"),
        "prompts": {
            name: {"prompts": [q.text for q in t.prompts], "max_tokens": t.max_tokens}
            for name, t in record.prompt_types.items()
        },
        "decoding": {
            "endpoint": run.endpoint,
            "ignore_eos": run.ignore_eos,
            "levels": [level.label for level in run.levels],
        },
        "git_commit": record.environment.get("git_commit"),
        "suite_content": record.environment.get("suite_content"),
    }


def differences(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    keys: Sequence[str] = COMPARABLE,
    only_prompts: Sequence[str] | None = None,
) -> list[str]:
    """How the facts of A differ from those of B, one sentence each."""
    out: list[str] = []
    for key in keys:
        va, vb = a.get(key), b.get(key)
        if key == "prompts":
            names = only_prompts if only_prompts is not None else sorted(set(va or {}) | set(vb))
            for name in names:
                pa, pb = (va or {}).get(name), (vb or {}).get(name)
                if pa is None or pb is None:
                    continue
                if pa.get("prompts") != pb.get("prompts"):
                    out.append(f"the prompts of {name!r} differ")
                if pa.get("max_tokens") != pb.get("max_tokens"):
                    out.append(
                        f"max_tokens of {name!r}: {pa.get('max_tokens')} vs {pb.get('max_tokens')}"
                    )
        elif va != vb and not (key == "vllm_version" and (va is None or vb is None)):
            label = {"vllm_version": "vLLM version", "gpus": "GPU"}.get(key, key)
            out.append(f"{label}: {_show(va)} vs {_show(vb)}")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "; ".join(map(str, value)) or "none"
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return str(value)
