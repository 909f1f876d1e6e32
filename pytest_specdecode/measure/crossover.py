"""The crossover's requests: each slot's prompt sent to every replica at the same moment.

Each request is timed where every request of the project is (measure/requests/loadgen.py →
`timed_request`), built as the run builds any (measure/experiment/windows.py → `request_base`),
and handed to `on_slot` as soon as the slot's requests are all back, so the caller stores them
at once. The slots are the same in every period: each prompt type's planned prompts
(config/prompts.py → `request_plan`), the prompt types taken in turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import httpx

from ..clock import MACHINE, Clock
from ..config.prompts import request_plan
from ..config.settings import PromptType, RunConfig, Settings
from ..record.requests.samples import RequestSample
from ..targets.base import Service
from .experiment.windows import request_base
from .requests.loadgen import make_client, timed_request


@dataclass(frozen=True)
class Slot:
    """One slot of a period: a prompt type's prompt, sent to every replica at once."""

    index: int  # within the period, from 0
    prompt_type: PromptType
    prompt_index: int
    warmup: bool = False

    @property
    def prompt(self) -> str:
        """The prompt's key for the analysis: the same prompt in every period."""
        return f"{self.prompt_type.name}/{self.prompt_index}"


def crossover_slots(settings: Settings) -> tuple[list[Slot], list[Slot]]:
    """The warm-up slots and the measured slots of each period: each prompt type's planned
    prompts (`samples` of them), the prompt types in turn, so each slot's moment is shared."""
    run = settings.run
    warm: list[Slot] = []
    measured: list[list[Slot]] = []
    for prompt_type in settings.prompt_types.values():
        plan = request_plan(len(prompt_type.prompts), samples=run.samples, warmup=run.warmup)
        warm += [Slot(0, prompt_type, i, warmup=True) for i in plan.warmup]
        measured.append([Slot(0, prompt_type, i) for i in plan.measured])
    out: list[Slot] = []
    for turn in range(max((len(m) for m in measured), default=0)):
        out += [m[turn] for m in measured if turn < len(m)]
    return (
        [replace(s, index=i) for i, s in enumerate(warm[: max(run.warmup, 0)])],
        [replace(s, index=i) for i, s in enumerate(out)],
    )


SlotDone = Callable[[Slot, list[RequestSample]], "bool | None"]


def send_period(
    services: Sequence[Service],
    arms: Sequence[str],
    slots: Sequence[Slot],
    *,
    run: RunConfig,
    headers: dict[str, str] | None = None,
    transports: Sequence[httpx.AsyncBaseTransport | None] = (),
    clock: Clock = MACHINE,
    on_slot: SlotDone,
    first_sent: Callable[[], None] = lambda: None,
    before_slot: Callable[[Slot], None] = lambda slot: None,
) -> None:
    """Every slot's prompt to every replica's service at once (`arms`: what each serves, the
    samples' phase); `on_slot` gets each slot's samples, in replica order, as they come back;
    `first_sent` is called as the first measured slot is sent, `before_slot` before each (and
    before each sending again: where `on_slot` returns True, the slot is sent again)."""
    ways = list(transports) or [None] * len(services)

    async def period() -> None:
        clients = [make_client(1, headers=headers, transport=t) for t in ways]
        try:
            told = False
            for slot in slots:
                if not slot.warmup and not told:
                    first_sent()
                    told = True
                again = True
                while again:
                    before_slot(slot)
                    samples = await _together(clients, services, arms, slot, run, clock)
                    again = bool(on_slot(slot, samples))
        finally:
            for client in clients:
                await client.aclose()

    clock.run(period())


async def _together(
    clients: Sequence[httpx.AsyncClient],
    services: Sequence[Service],
    arms: Sequence[str],
    slot: Slot,
    run: RunConfig,
    clock: Clock,
) -> list[RequestSample]:
    prompt = slot.prompt_type.prompts[slot.prompt_index]
    specs = [
        replace(
            request_base(run, s, slot.prompt_type), prompt=prompt.text, messages=prompt.messages
        )
        for s in services
    ]
    found = await asyncio.gather(
        *(
            timed_request(
                client,
                spec,
                prompt_type=slot.prompt_type.name,
                phase=arm,
                index=slot.index,
                warmup=slot.warmup,
                prompt_index=slot.prompt_index,
                clock=clock,
            )
            for client, spec, arm in zip(clients, specs, arms, strict=True)
        )
    )
    for sample in found:
        sample.slot = slot.index
    return list(found)
