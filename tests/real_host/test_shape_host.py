"""The shape on the real systemd test host: SmolLM2's own config.json, read over SSH where the
production unit loads its model (`--spec-shape unit`), cut to 4 of its 30 layers and served
with dummy weights by the unit's own drop-in in its window, as the baseline and as an n-gram
candidate; the original put back as found. Short on purpose (CI's budget): one prompt type,
5 requests of 16 tokens an arm, three starts of the unit on the CPU.
"""

from __future__ import annotations

import re

import pytest

from pytest_specdecode.targets.systemd.unitfile import SHAPE_ROOT

from ..support.testbed import (
    Testbed,
    results_of,
    results_path,
    suite_args,
    write_remote_experiment,
)

# 5 requests: the fewest whose verdict the design check lets a run start (no warm-up: the
# servers run 4 layers of random weights)
RUN = {"samples": 5, "max_samples": 5, "warmup": 0, "max_tokens": 16, "repeats": 1}


@pytest.fixture(autouse=True)
def original_serving_before_and_after(testbed: Testbed):
    testbed.wait_serving()
    assert testbed.settled_traces() == []
    etc = testbed.persistent_units()
    yield
    testbed.wait_serving(timeout_s=120)  # the restore already waited for it to serve
    testbed.assert_original_restored()  # active, serving, no drop-in, no shape folder, no lock
    assert testbed.persistent_units() == etc  # nothing written to /etc/systemd/system


def test_the_units_shape_is_served_by_its_dropin_and_the_original_put_back(
    pytester: pytest.Pytester, testbed: Testbed
) -> None:
    config = write_remote_experiment(pytester, testbed, run=RUN)
    since = testbed.ssh("date", "+%s").stdout.strip()
    before = testbed.state()
    shape_args = ["--spec-shape", "unit", "--spec-shape-layers", "4"]
    result = pytester.runpytest_subprocess(
        *suite_args(pytester, testbed, config, "--spec-config", "ngram", *shape_args)
    )
    err = result.stderr.str()
    data = results_of(pytester)
    assert set(data["phases"]) == {"baseline", "ngram"}, result.stdout.str()[-3000:] + err[-3000:]
    for phase in data["phases"].values():
        (cell,) = phase["measurements"].values()
        assert len(cell["samples"]) == RUN["samples"]
    assert data["phases"]["ngram"]["acceptance"]["present"] is True

    # The shape: the unit's own config.json, read on its host, 4 of 30 layers, in a run's folder
    shape = data["shape"]
    model = next(w for w in testbed.exec_start() if "SmolLM2" in w)
    assert shape["shape"]["source"] == "unit" and (shape["layers"], shape["full"]) == (4, 30)
    assert shape["shape"]["origin"].startswith(f"the served model's config.json, {model} on ")
    run = results_path(pytester).parent.name  # the run's folder on the host is named as its own
    assert shape["folder"] == f"{SHAPE_ROOT}/{run}/shape" and shape["tokenizer"] == model
    assert data["target"]["model"].endswith("[shape unit (LlamaForCausalLM), 4 of 30 layers]")
    log = (results_path(pytester).parent / "run.log").read_text()
    assert f"in the window of unit {testbed.unit}, which is stopped for it" in log

    # The unit's drop-in served it: the baseline and the candidate started with dummy weights
    # from the run's folder, the original stopped once for the window and started once after.
    journal = testbed.ssh(
        "journalctl", "-u", testbed.unit, "--since", f"@{since}", "-o", "cat", "--no-pager"
    ).stdout
    dummy = [line for line in journal.splitlines() if "load_format=dummy" in line]
    assert len(dummy) >= 2, journal[-3000:]  # vLLM's engine config, once a start
    assert all(f"model='{shape['folder']}'" in line for line in dummy), dummy
    assert all(f"tokenizer='{model}'" in line for line in dummy), dummy
    assert err.count(f"stopping unit {testbed.unit} on") == 1, err
    assert "(the shape serves in its place)" in err
    assert err.count(f"restore: starting unit {testbed.unit}") == 1, err
    assert re.search(r"restored to active and serving in \d+s", err), err
    restore = data["restore"]
    assert restore["was_active"] and restore["is_active"] and restore["serving"]
    assert restore["errors"] == [] and restore["original"].startswith(f"unit {testbed.unit} on")
    assert testbed.state()["MainPID"] != before["MainPID"]
