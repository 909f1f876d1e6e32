"""What the plan reads from this host's stored runs: the planned candidates' prediction, and
the search's first reload, each from the newest stored baseline with token ids."""

from __future__ import annotations

from dataclasses import replace

from ..analysis.search.policy import plan_search
from ..config.arms import BASELINE
from ..config.settings import Settings
from ..record.store import stored_runs
from .sections import prediction
from .sections.search import plan_lines

__all__ = ["stored_prediction", "stored_search_plan"]


def stored_prediction(settings: Settings, *, host: str) -> list[str]:
    """The planned candidates predicted from the newest stored baseline with token ids."""
    if not settings.candidates:
        return []
    for folder, record in stored_runs(settings.reports_dir, host=host, model=settings.target.model):
        if any(
            m.token_ids is not None and m.token_ids.missing is None
            for p in record.arm_phases(BASELINE)
            for m in p.measurements.values()
        ):
            return prediction.dry_run_lines(settings, record, folder.name)
    return [
        "prediction: no stored baseline with token ids of this model on this host in "
        f"{settings.reports_dir}"
    ]


def stored_search_plan(settings: Settings, *, host: str) -> list[str]:
    """--spec-search: what it would reload first, from the newest stored baseline with token ids
    of this host and model (coverage and cost prior from every stored run of them)."""
    stored = list(stored_runs(settings.reports_dir, host=host, model=settings.target.model))
    for folder, record in stored:
        if not any(
            m.token_ids is not None and m.token_ids.missing is None
            for p in record.arm_phases(BASELINE)
            for m in p.measurements.values()
        ):
            continue
        same = [n for n, t in settings.prompt_types.items() if n in record.prompt_types
                and record.prompt_types[n].prompt == t.prompt]  # fmt: skip
        base = replace(
            record,
            candidates={},
            phases={k: p for k, p in record.phases.items() if p.arm == BASELINE},
            prompt_types={n: record.prompt_types[n] for n in same},
        )
        plan = plan_search(base, {}, [(f.name, r) for f, r in stored])  # its configs: the prior
        return [
            f"the search's first reload, predicted from the stored baseline of {folder.name} "
            f"(prompt types with the same prompts: {', '.join(same) or 'none'}):",
            *(f"  {line}" for line in plan_lines(plan, budget=settings.run.max_reloads)),
        ]
    return [
        "the search's first reload: no stored baseline with token ids of this model on this "
        f"host in {settings.reports_dir} (it is chosen once this run's baseline is measured)"
    ]
