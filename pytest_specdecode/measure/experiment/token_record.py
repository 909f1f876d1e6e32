"""The n-gram replay's input, recorded after a start's timed requests: each prompt's token ids."""

from __future__ import annotations

from collections.abc import Sequence

from ...config.arms import BASELINE, BASELINE_AFTER
from ...config.prompts import RequestPlan
from ...config.settings import PromptType
from ...record.measurement import Measurement
from ...record.requests.samples import RequestSample
from ...record.schema import Phase
from ..requests.token_ids import TokenIds, record_token_ids
from .context import RunContext
from .windows import Window


class TokenIdRecorder:
    """Each prompt type's ids once per run (an A/A run's at its first start); the first baseline
    start's for every prompt of the plan."""

    def __init__(self, ctx: RunContext) -> None:
        self._ctx = ctx
        self._recorded: set[str] = set()  # prompt types whose token ids this run recorded
        self._plan_recorded: set[str] = set()  # ... for every prompt of the plan

    def after_start(
        self, phase: Phase, prompt_type: PromptType, windows: Sequence[Window], plan: RequestPlan
    ) -> None:
        """A prompt type's token ids, after the start's timed requests (none for a control)."""
        first = windows[0] if windows else None
        if first is None or phase.arm == BASELINE_AFTER or phase.control_of:
            return  # a control's outputs are the original's: nothing to replay
        settings = self._ctx.settings
        if not settings.run.record_token_ids:
            first.m.token_ids = TokenIds(missing="not recorded: [run] record_token_ids = false")
            return
        if settings.aa_only and prompt_type.name in self._recorded:
            # An A/A run starts one configuration again and again: its ids, at temperature 0,
            # are the first start's: recording them again would only repeat them.
            first.m.token_ids = TokenIds(missing="an A/A run records them at its first start")
            return
        # The first baseline start also records every prompt a longer window may send: an
        # adaptive candidate can be timed on prompts this start stopped short of.
        whole_plan = phase.arm == BASELINE and prompt_type.name not in self._plan_recorded
        later = [w.m for w in windows[1:]]
        self._record(first, later, plan.levels if whole_plan else ())
        self._recorded.add(prompt_type.name)
        if whole_plan:
            self._plan_recorded.add(prompt_type.name)

    def _record(
        self,
        window: Window,
        later: Sequence[Measurement] = (),
        plan: Sequence[Sequence[int]] = (),
    ) -> None:
        """The n-gram replay's input (analysis/prediction/predict.py), after the timed windows:
        each distinct prompt measured at the first level, from its first timed request.

        `plan`: every prompt the plan's windows may send (a baseline's, so that a candidate that
        sends more requests than it did is predicted too). A prompt timed at a later level gives
        its own streamed ids there (only the look-ahead is asked); one never timed, an untimed
        request, one at a time. At most the prompt set's size, over all levels.
        """
        ctx = self._ctx
        m, prompts = window.m, window.prompt_type.prompts
        timed: dict[str, RequestSample | None] = {}
        for sample in m.samples:
            timed.setdefault(prompts[sample.prompt_index or 0].text, sample)
        if plan:
            for sample in (s for other in later for s in other.samples):
                timed.setdefault(prompts[sample.prompt_index or 0].text, sample)
            for index in (i for indices in plan for i in indices):
                timed.setdefault(prompts[index].text, None)
        untimed = sum(sample is None for sample in timed.values())
        ctx.step(f"recording token ids of {window.where}")
        start = ctx.clock.now()
        m.token_ids = record_token_ids(
            window.base, timed, headers=ctx.headers, transport=ctx.transports.sync
        )
        ids = m.token_ids
        ids.recorded_s = ctx.clock.now() - start
        ctx.store.flush()
        share = f" ({ids.recorded_s / m.wall_s:.0%} of the timed window)" if m.wall_s > 0 else ""
        beyond = f" ({untimed} not timed here: a candidate may send more)" if untimed else ""
        ctx.progress(
            f"{window.where}: token ids of {len(ids.prompts)} prompt(s){beyond} recorded in "
            f"{ids.recorded_s:.1f}s, untimed{share}"
            if ids.missing is None
            else f"{window.where}: no token ids ({ids.missing})"
        )
