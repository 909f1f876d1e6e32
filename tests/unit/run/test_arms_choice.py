"""`[run] arms = "auto"` (run/arms.py): side by side where the host holds both servers; the plan
says which was chosen, and why."""

from __future__ import annotations

from pathlib import Path

from pytest_specdecode.record.profile import HostProfile
from pytest_specdecode.run.arms import choose_arms

from ...support.synthetic import aa_entry, settings


class Room:
    """A target that answers only whether a second server fits (targets/base.py)."""

    def __init__(self, why: str | None = None) -> None:
        self.why = why

    def room_beside(self, spec) -> str | None:
        return self.why


GPU = {"gpus": ["0: NVIDIA H200, 143771 MiB, driver 580.159.04"], "machine": "gpus:aaaa"}
CPU = {"gpus": None, "cpu": "AMD EPYC", "machine": "machine-id:bbbb"}


def choose(tmp_path: Path, machine, *, target=None, profile=None, run_extra=""):
    s = settings(tmp_path, run_extra=run_extra)
    return choose_arms(s, target or Room(), machine=machine, profile=profile, version="0.32.0")  # type: ignore[arg-type]


def test_a_gpu_with_room_for_both_serves_them_side_by_side(tmp_path: Path) -> None:
    mode, why = choose(tmp_path, GPU)
    assert mode == "together" and "holds both" in why


def test_without_room_one_at_a_time_and_why(tmp_path: Path) -> None:
    mode, why = choose(tmp_path, GPU, target=Room("GPU 0 has 1000 MiB free of 143771 MiB"))
    assert mode == "one-at-a-time"
    assert why == "ngram does not fit beside the original: GPU 0 has 1000 MiB free of 143771 MiB"


def test_a_cpu_waits_for_its_places_to_be_measured_side_by_side(tmp_path: Path) -> None:
    mode, why = choose(tmp_path, CPU)
    assert mode == "one-at-a-time" and "--spec-arms together --spec-repeats 4" in why
    bias = {"throughput": {"estimate": 0.085, "pairs": 4}}
    elsewhere = aa_entry("aa-x", "0.32.0", 0.02, design="together", position_bias=bias,
                         machine="machine-id:cccc")  # fmt: skip
    here = aa_entry("aa-here", "0.32.0", 0.02, design="together", position_bias=bias,
                    machine=CPU["machine"])  # fmt: skip
    other = HostProfile("localhost", "m", None, (elsewhere,))
    assert choose(tmp_path, CPU, profile=other)[0] == "one-at-a-time"  # another machine's
    mode, why = choose(tmp_path, CPU, profile=HostProfile("localhost", "m", None, (here,)))
    assert mode == "together" and "aa-here" in why


def test_as_asked_and_the_search_one_at_a_time(tmp_path: Path) -> None:
    assert choose(tmp_path, GPU, run_extra='arms = "one-at-a-time"') == (
        "one-at-a-time",
        "as asked ([run] arms, --spec-arms)",
    )
    assert choose(tmp_path, CPU, run_extra='arms = "together"')[0] == "together"
