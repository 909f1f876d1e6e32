"""The drafter check at run time: a candidate whose drafter has a model sends a few requests
before its timed windows, between two reads of the counters; a drafter that accepts almost
nothing stops the candidate (`BrokenDrafter`), as a failed start does. The rule is pure:
analysis/drafters/health.py. The check's requests are kept in no window and no verdict."""

from __future__ import annotations

from collections.abc import Sequence

from ...analysis.drafters.health import MOST_ROUNDS, drafter_health, first_prompts, judged
from ...config.load import LoadLevel
from ...config.specconfig import SpecConfig
from ...errors import BrokenDrafter
from ...record.counters import Acceptance
from ...record.drafter_check import DrafterCheck
from ...targets.base import Service
from ..requests.loadgen import planned_specs, run_level
from ..server_metrics import acceptance_between
from .context import RunContext
from .windows import request_base

ONE_AT_A_TIME = LoadLevel(concurrency=1)


def check_drafter(ctx: RunContext, start: str, spec: SpecConfig, service: Service) -> None:
    """Send the check's requests to a candidate that serves; record the figures; raise
    BrokenDrafter where its drafter is broken. A drafter without a model is never checked."""
    run = ctx.settings.run
    if not judged(spec.values) or run.drafter_check_requests == 0:
        return
    method = spec.method
    k = spec.values.get("num_speculative_tokens")
    k = k if isinstance(k, int) else None
    ctx.step(f"checking the drafter of {start}")
    where = f"[{start}] drafter check"
    counts = [(p.name, len(p.prompts)) for p in ctx.settings.prompt_types.values()]
    batch = first_prompts(counts, run.drafter_check_requests)
    ctx.progress(
        f"{where}: {len(batch)} requests ({method}, k = {k}) before the timed windows, on the "
        "counters"
    )
    before = ctx.counters(service)
    sent = 0
    acc = Acceptance(present=False)
    for _ in range(MOST_ROUNDS):
        _send(ctx, start, service, batch)
        sent += len(batch)
        acc = acceptance_between(before, ctx.counters(service))
        health = drafter_health(method, k, acc, floor=run.drafter_floor)
        if not health.more:
            break
        ctx.progress(f"{where}: {health.text}; {len(batch)} more")
    check = DrafterCheck(
        start=start,
        method=method,
        k=k,
        requests=sent,
        acceptance=acc,
        floor=run.drafter_floor,
        verdict=health.verdict,
        text=health.text,
        per_position=list(health.per_position),
    )
    ctx.record.drafter_checks[start] = check
    ctx.store.flush()
    if check.stopped:
        ctx.progress(f"{where}: broken: {check.text}")
        host = getattr(service, "label", service.api_base)
        raise BrokenDrafter(
            f"candidate {spec.name!r} stopped by the drafter check before its timed windows, "
            f"on {host} (serving, its drafter {spec.values.get('model', method)!r} accepting "
            f"almost nothing over {sent} requests): {check.text} The candidate was stopped; "
            "the original is restored at the end of the run.",
            check=check,
        )
    ctx.progress(f"{where}: {check.verdict}: {check.text}")


def check_beside(
    ctx: RunContext,
    group: Sequence[tuple[str, str]],
    specs: Sequence[SpecConfig],
    seconds: Sequence[Service],
) -> tuple[list[tuple[int, tuple[str, str], SpecConfig, Service]], dict[str, BrokenDrafter]]:
    """Each candidate of a group served beside the original, checked: those that passed, each
    with its place (1: the first beside the original), and the broken ones' errors by arm. A
    broken one fails its own arm only; the others are measured beside the original as planned,
    its server left idle, as every server is between its turns."""
    live = []
    broken: dict[str, BrokenDrafter] = {}
    for place, ((name, arm), spec, second) in enumerate(
        zip(group, specs, seconds, strict=True), start=1
    ):
        try:
            check_drafter(ctx, name, spec, second)
        except BrokenDrafter as exc:
            broken[arm] = exc
            continue
        live.append((place, (name, arm), spec, second))
    return live, broken


def _send(ctx: RunContext, start: str, service: Service, batch: list[tuple[str, int]]) -> None:
    """The batch's requests, one at a time, untimed for any verdict."""
    run = ctx.settings.run
    for name, index in batch:
        prompt_type = ctx.settings.prompt_types[name]
        base = request_base(run, service, prompt_type)
        ctx.clock.run(
            run_level(
                planned_specs(base, prompt_type.prompts, [index]),
                ONE_AT_A_TIME,
                prompt_type=name,
                phase=f"{start}@drafter-check",
                prompt_indices=[index],
                warmup=True,
                headers=ctx.headers,
                transport=ctx.transports.async_,
                clock=ctx.clock,
            )
        )
