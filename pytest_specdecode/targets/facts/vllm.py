"""The target's own vLLM says what is valid: its version, speculative methods and config keys.

The Python that runs the server (the interpreter of the unit's ExecStart, or of the local
command) imports `vllm.config.speculative` and prints them as JSON, without loading a model.
Candidates are then checked against that vLLM, before anything is stopped. Where it cannot be
asked, the offline list of vLLM 0.32 (config/specconfig.py) stands in, and says so.
"""

from __future__ import annotations

import json
import posixpath
import shlex
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ...config.specconfig import (
    KINDS,
    OFFLINE_FACTS,
    SpecConfig,
    VllmFacts,
    validate_spec_values,
)
from ...config.vllm_argv import REQUEST_METRICS_FLAG, REQUEST_METRICS_LEVEL, ServerCommand
from ...errors import ConfigError, HostError, SpecDecodeError
from ..base import Progress
from ..hosts.base import Host
from ..hosts.container import container_host, first_process
from . import cache as facts_cache
from .vllm_snippet import MARKER, SNIPPET

if TYPE_CHECKING:
    from ..base import Target

TIMEOUT_S = 180.0  # importing vllm took 6 s here (2 cores, warm cache); cold and busy, far more


class VllmFactsError(SpecDecodeError):
    """The target's vLLM could not be asked (no interpreter, import failed, no answer)."""


# --------------------------------------------------------------------------------- pure parts


def interpreter_from_script(path: str, head: str, *, where: str) -> list[str]:
    """The argv that runs the Python of a console script such as `vllm`, from its first lines.

    Handles `#!/path/python`, `#!/usr/bin/env python3` and pip's `#!/bin/sh` + `'''exec'`
    form for long paths.
    """
    lines = head.splitlines()
    if not lines or not lines[0].startswith("#!"):
        raise VllmFactsError(f"{where}: {path} has no #! line, so which Python runs it is unknown")
    interpreter, _, arg = lines[0][2:].strip().partition(" ")
    arg = arg.strip()
    name = posixpath.basename(interpreter)
    if name == "env":
        return [interpreter, *arg.split()]
    if name in ("sh", "bash") and len(lines) > 1 and lines[1].startswith("'''exec'"):
        try:
            words = shlex.split(lines[1])
        except ValueError:
            words = []
        if len(words) >= 2 and words[0] == "exec":
            return [words[1]]
    if not name.startswith("python"):
        raise VllmFactsError(
            f"{where}: {path} runs {interpreter!r}, not a Python this tool can ask"
        )
    return [interpreter, arg] if arg else [interpreter]


def answer_line(stdout: str) -> str | None:
    """The snippet's last marked line: vLLM logs to stdout too."""
    return next((ln for ln in reversed(stdout.splitlines()) if ln.startswith(MARKER)), None)


def parse_facts(
    stdout: str, *, host: str, interpreter: str, seconds: float | None = None
) -> VllmFacts:
    """The snippet's marked JSON line as VllmFacts; VllmFactsError where it tells an error."""
    line = answer_line(stdout)
    where = f"{host}: {interpreter}"
    if line is None:
        raise VllmFactsError(f"{where} printed no answer: {_tail(stdout)}")
    try:
        data: dict[str, Any] = json.loads(line[len(MARKER) :])
    except json.JSONDecodeError as exc:
        raise VllmFactsError(f"{where} printed an unreadable answer ({exc.msg})") from None
    if "error" in data:
        raise VllmFactsError(f"{where} could not import vLLM's speculative config: {data['error']}")
    keys = data.get("keys")
    if not isinstance(keys, dict) or not keys:
        raise VllmFactsError(f"{where} listed no speculative config keys")
    methods = data.get("methods")
    levels = data.get("per_request_spec_decode_metrics")
    rules = data.get("side_rules") if isinstance(data.get("side_rules"), dict) else {}
    return VllmFacts(
        version=str(data.get("version") or "unknown"),
        methods=frozenset(map(str, methods)) if isinstance(methods, list) else None,
        keys={str(k): (v if v in KINDS else "any") for k, v in keys.items()},
        choices={str(k): tuple(map(str, v)) for k, v in (data.get("choices") or {}).items()},
        per_request_metrics=tuple(map(str, levels)) if isinstance(levels, list) else None,
        per_request_note=str(data["per_request_note"]) if data.get("per_request_note") else None,
        synthetic_note=str(data["synthetic_note"]) if data.get("synthetic_note") else None,
        async_kept=_names(rules.get("async_kept")),
        v2_unsupported=_names(rules.get("v2_unsupported")),
        triton=rules["triton"] if isinstance(rules.get("triton"), bool) else None,
        async_never=str(rules["async_never"]) if rules.get("async_never") else None,
        architectures=_names(data.get("architectures")),
        moe_routing=_routing(data.get("moe_routing")),
        shape_note=str(data["shape_note"]) if data.get("shape_note") else None,
        host=host,
        interpreter=interpreter,
        seconds=seconds,
    )


def _routing(value: object) -> tuple[str, ...] | None:
    return tuple(map(str, value)) if isinstance(value, list) else None


def _names(value: object) -> frozenset[str] | None:
    return frozenset(map(str, value)) if isinstance(value, list) else None


def check_candidates(specs: Sequence[SpecConfig], facts: VllmFacts) -> None:
    """Each candidate against one vLLM's facts; ConfigError naming that vLLM on refusal.

    The A/A candidate has no values: it is the original's own configuration."""
    for spec in specs:
        if not spec.is_original:
            validate_spec_values(spec.values, source=spec.name, facts=facts)
        if facts.synthetic_note and spec.values.get("rejection_sample_method") == "synthetic":
            raise ConfigError(
                f"{spec.name}: synthetic acceptance cannot run on {facts.host or 'this host'}: "
                f"{facts.synthetic_note}. The break-even map needs a GPU build of vLLM; "
                "nothing was started"
            )


def request_metrics_args(facts: VllmFacts) -> tuple[tuple[str, ...], str | None]:
    """The server arguments that make each request report its own speculative metrics
    (record/requests/request_metrics.py), and None; or no arguments and why not.

    Only where the target's own vLLM was asked and knows the option at its `detailed` level:
    an option unknown to the server would stop the candidate from starting.
    """
    flag, level = REQUEST_METRICS_FLAG, REQUEST_METRICS_LEVEL
    if facts.offline:
        return (), f"not asked for: the target's vLLM could not be asked whether it knows {flag}"
    levels = facts.per_request_metrics
    if levels is None and facts.per_request_note:
        return (), (
            f"not asked for: whether {facts.describe()} knows {flag} could not be told "
            f"({facts.per_request_note})"
        )
    if levels is None or level not in levels:
        known = f" (it knows {flag} {'|'.join(levels)})" if levels else ""
        return (), (
            f"{facts.describe()} has no {flag} {level}{known}: acceptance comes from the "
            "server's counters alone"
        )
    return (flag, level), None


def request_metrics_plan(facts: VllmFacts) -> str:
    """The plan's line: per-request metrics asked for, or why not."""
    args, why = request_metrics_args(facts)
    if why:
        return f"per-request speculative metrics: {why}"
    return (
        f"per-request speculative metrics: each speculative candidate gets {' '.join(args)} "
        "(each timed request then reports its own drafts and accepted tokens, step by step)"
    )


def with_request_metrics(specs: Sequence[SpecConfig], facts: VllmFacts) -> tuple[SpecConfig, ...]:
    """The candidates, each speculative one asking for per-request metrics where it can (its
    other extra arguments kept: a map server's depth, `--hf-overrides`)."""
    args, _ = request_metrics_args(facts)
    return tuple(
        spec if spec.is_original else replace(spec, extra_args=(*_others(spec.extra_args), *args))
        for spec in specs
    )


def _others(extra: Sequence[str]) -> tuple[str, ...]:
    """Extra arguments without a per-request metrics flag and its level."""
    out: list[str] = []
    skip = False
    for arg in extra:
        if skip:
            skip = False
        elif arg == REQUEST_METRICS_FLAG:
            skip = True
        elif not arg.startswith(REQUEST_METRICS_FLAG + "="):
            out.append(arg)
    return tuple(out)


def _tail(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()][-3:]
    return " | ".join(lines)[-400:] or "(nothing)"


# --------------------------------------------------------------------------------- host seams

_RESOLVE = r"""
p=$1
case "$p" in
  */*) ;;
  *) p=$(command -v "$p") || { echo "not found on PATH: $1" >&2; exit 127; } ;;
esac
printf '%s\n' "$p"
head -c 2048 "$p"
"""


def interpreter_for(host: Host, exec_argv: Sequence[str], *, where: str) -> list[str]:
    """The argv of the Python that runs `exec_argv` (python -m … or a `vllm` script)."""
    program = exec_argv[0]
    if posixpath.basename(program).startswith("python"):
        return [program]
    try:
        result = host.run(["sh", "-c", _RESOLVE, "sh", program], timeout=30, privileged=False)
    except HostError as exc:
        raise VllmFactsError(f"{where}: {exc}") from None
    if not result.ok:
        raise VllmFactsError(f"{where}: cannot read {program}: {result.describe()}")
    path, _, head = result.stdout.partition("\n")
    return interpreter_from_script(path, head, where=where)


def ask_vllm(
    host: Host,
    exec_argv: Sequence[str],
    *,
    where: str,
    progress: Progress | None = None,
    timeout_s: float = TIMEOUT_S,
    report_every_s: float = 15.0,
) -> VllmFacts:
    """Run the snippet in the server's Python on `host`; bounded, with progress while it runs."""
    interpreter = interpreter_for(host, exec_argv, where=where)
    shown = shlex.join(interpreter)
    say = progress or (lambda _message: None)
    key = facts_cache.fingerprint(host, interpreter)
    kept = facts_cache.recall(key)
    # an answer kept by an older snippet lacks the side rules or the architectures, which it
    # never read: ask again
    if kept is not None and all(f'"{key}"' in kept[0] for key in ("side_rules", "architectures")):
        answer, path = kept
        try:
            facts = parse_facts(answer, host=host.name, interpreter=shown)
        except VllmFactsError:
            pass  # a damaged entry: ask again
        else:
            say(_told(facts, f"remembered from an earlier ask of this installation ({path})"))
            return replace(facts, remembered=str(path))
    say(f"asking the vLLM of {where} ({shown} on {host.name}) for its speculative methods and keys")
    start = time.monotonic()
    with ThreadPoolExecutor(1, thread_name_prefix="specdecode-vllm-facts") as pool:
        # The program goes by stdin (`python -`): short argv, in messages and in `ps`.
        future = pool.submit(
            host.run, [*interpreter, "-"], timeout=timeout_s, stdin=SNIPPET, privileged=False
        )
        while True:
            try:
                result = future.result(timeout=report_every_s)
                break
            except FutureTimeout:
                say(f"  … {time.monotonic() - start:.0f}s: still importing vLLM on {host.name}")
            except HostError as exc:  # could not start, or did not finish in time
                raise VllmFactsError(f"{where}: {exc}") from None
    seconds = time.monotonic() - start
    if not result.ok and MARKER not in result.stdout:
        raise VllmFactsError(f"{where}: {result.describe()}")
    facts = parse_facts(result.stdout, host=host.name, interpreter=shown, seconds=seconds)
    facts_cache.remember(key, answer_line(result.stdout) or "")
    say(_told(facts, f"asked in {seconds:.0f}s"))
    return facts


def _told(facts: VllmFacts, how: str) -> str:
    """The progress line of an answer: what it holds, and how it came."""
    methods, keys = len(facts.methods or ()), len(facts.keys)
    return f"{facts.describe()}: {methods} speculative methods, {keys} keys, {how}"


def ask_in_container(
    host: Host, server: ServerCommand, *, where: str, progress: Progress | None = None
) -> VllmFacts:
    """Ask the vLLM inside the unit's running container (its first process's Python)."""
    box = container_host(host, server)
    if box is None:
        raise VllmFactsError(
            f"{where} runs vLLM in a container ({server.image}) without --name, so the running "
            "container cannot be found to ask its vLLM; give it a --name"
        )
    try:
        found = box.run(["cat", "/proc/1/cmdline"], timeout=60)
    except HostError as exc:
        raise VllmFactsError(f"{where}: {exc}") from None
    if not found.ok:
        raise VllmFactsError(f"{where}: cannot read the container's command: {found.describe()}")
    argv = first_process(found.stdout)
    if not argv:
        raise VllmFactsError(f"{where}: {box.name} runs no command that could be read")
    return ask_vllm(box, argv, where=where, progress=progress)


def facts_or_offline(target: Target, *, progress: Progress | None = None) -> VllmFacts:
    """The target's vLLM facts; the offline list, with a note saying why, where it cannot tell.

    Errors that stop the run anyway (the host cannot be reached, a unit that is not there)
    are not hidden behind the fallback: only VllmFactsError falls back.
    """
    try:
        return target.vllm_facts(progress=progress)
    except VllmFactsError as exc:
        note = f"the target's vLLM could not be asked: {exc}"
        if progress is not None:
            progress(f"{note}; using {OFFLINE_FACTS.describe()}")
        return replace(OFFLINE_FACTS, note=note)


def validated_against_target(
    target: Target, specs: Sequence[SpecConfig], *, progress: Progress | None = None
) -> VllmFacts:
    """Ask the target's vLLM (or fall back), check every candidate, return the facts used."""
    facts = facts_or_offline(target, progress=progress)
    check_candidates(specs, facts)
    return facts
