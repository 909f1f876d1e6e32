"""Stands in for `pytest suites/ --spec-arms together` until the Experiment sends the arms
together (the interleave branch): the same lifecycle (`Switchboard.together`), the same plan
and restore lines on stderr, the servers' logs in a run folder under the experiment's reports,
and requests alternating between the two servers until a signal. Exits 2 when interrupted,
as pytest does.

    python tests/support/arms_together_run.py EXPERIMENT.toml CANDIDATE
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import httpx

from pytest_specdecode.config.settings import load_settings
from pytest_specdecode.report.plan import arms_plan
from pytest_specdecode.targets import open_target
from pytest_specdecode.targets.interrupts import interrupt_on_signals
from pytest_specdecode.targets.lifecycle import experiment_services


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(config: Path, candidate: str) -> int:
    interrupt_on_signals()
    settings = load_settings(config, spec_configs=[candidate], run_overrides={"arms": "together"})
    run_dir = settings.reports_dir / "arms-together"
    target = open_target(settings.target, log_dir=run_dir, progress=say)
    for line in arms_plan(settings, target):
        say(f"plan: {line}")
    target.preflight()
    (spec,) = settings.candidates
    t = settings.target
    try:
        with (
            experiment_services(
                target,
                ready_timeout_s=t.startup_timeout_s,
                restore_timeout_s=t.restore_timeout_s,
                progress=say,
            ) as board,
            board.together(spec, restart_original=False) as (one, two),
            httpx.Client(timeout=120) as client,
        ):
            for i, service in zip(itertools.count(), itertools.cycle((one, two))):
                body = {
                    "model": service.model,
                    "messages": [{"role": "user", "content": f"Count to {i}."}],
                    "max_tokens": 8,
                }
                response = client.post(f"{service.api_base}/v1/chat/completions", json=body)
                response.raise_for_status()
                say(f"request {i} answered by {service.label}")
    except KeyboardInterrupt:
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2]))
