"""The map on a shape through pytest's dry run (fast: nothing is started): its carrier, depths,
servers, starts and time in the plan, and nothing written."""

from __future__ import annotations

import json

import pytest

from ...support.inprocess import run_in_process
from ..targets.test_shape_target import SMOL
from .test_report_options import CONFIG


def test_the_dry_run_plans_the_map_on_an_8b_shape_at_two_depths(pytester: pytest.Pytester) -> None:
    model = pytester.path / "models" / "smol"  # the target's own: its tokenizer's vocabulary
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps(SMOL))
    path = pytester.path / "experiment.toml"
    path.write_text(
        CONFIG.format(reports=pytester.path / "reports").replace(
            '"/m"', f'"{model}", "--max-model-len", "2048"'
        )
    )
    pytester.makepyfile(test_never="def test_never():\n    raise AssertionError('ran')\n")
    result = run_in_process(pytester,
        "--spec-file", str(path), "--spec-dry-run", "--spec-break-even", "3,5",
        "--spec-shape", "llama-3.1-8b", "--spec-shape-layers", "2,4",
        "--spec-arms", "one-at-a-time",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out + result.stderr.str()
    assert "map on the shape: eagle3 (" in out and "eagle3-d2): auto: vLLM has EAGLE-3" in out
    assert "measured at 2 and 4 of 32 layers (served: 4)" in out
    assert "an extrapolation" in out
    assert "5 starts at 2, 5 starts at 4; 10 starts in all" in out
    assert "map-d2-baseline" in out and "map-d2-k5-L6" in out  # its servers in the plan's steps
    start = next(ln for ln in out.splitlines() if "start candidate map-d2-k3-L1:" in ln)
    assert start.endswith("""--hf-overrides '{"num_hidden_layers": 2}'""")  # given last: taken
    assert "map-d2-baseline (the original's configuration with --hf-overrides" in out
    assert "about " in out.split("10 starts in all")[1].splitlines()[0]  # the map's time
    assert not (pytester.path / "reports").exists()  # nothing written: no head, no folder
