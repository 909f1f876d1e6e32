"""Stored runs: the facts that make two runs comparable, a reused baseline, two runs compared.

- `run_facts` records, at the start of a run, what makes it comparable with another: the GPUs
  (nvidia-smi on the serving host, where present) and the git commit of the suite.
- `--spec-baseline-from PATH/results.json` reuses a stored baseline instead of measuring it
  (`use_stored_baseline`) and warns where model, vLLM version, GPU or prompts differ.
- `specdecode-compare A/results.json B/results.json` compares two stored runs phase by phase.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import statistics
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..analysis.stats import Verdict
from ..errors import ConfigError
from ..measure.experiment import BASELINE, PhaseResult, WorkloadMeasurement
from ..measure.loadgen import RequestSample
from ..measure.server_metrics import Acceptance
from ..report.summary import Timing, compare_phases, fmt_num, fmt_p, fmt_pct, tokens_per_s
from ..targets.gpu import GpuOutputError, parse_gpus
from ..targets.hosts import Host, LocalHost

if TYPE_CHECKING:
    from ..config.settings import Settings
    from ..measure.experiment import Experiment

Doc = Mapping[str, Any]

_GPU_FIELDS = ("index", "name", "memory.total", "driver_version")
_GPU_QUERY = (
    "command -v nvidia-smi >/dev/null || exit 3; nvidia-smi "
    f"--query-gpu={','.join(_GPU_FIELDS)} --format=csv,noheader"
)


class StoredBaselineWarning(UserWarning):
    """The stored baseline was measured under different conditions than the candidates."""


# --------------------------------------------------------------------------- facts of a run


def gpu_list(host: Host) -> list[str] | None:
    """`index: name, memory, driver` per GPU; None where nvidia-smi is absent or fails."""
    try:
        result = host.run(["sh", "-c", _GPU_QUERY], timeout=30)
    except Exception:  # a fact, not a precondition: never stop a run over it
        return None
    if not result.ok:
        return None
    try:
        gpus = [g.describe() for g in parse_gpus(result.stdout, _GPU_FIELDS)]
    except GpuOutputError:
        gpus = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    return gpus or None


def git_commit(path: Path) -> str | None:
    """The commit checked out where the suite lives, with '-dirty' for uncommitted changes."""
    where = path if path.is_dir() else path.parent
    try:
        head = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_facts(target: object, settings: Settings) -> dict[str, Any]:
    """Recorded in results.json as `environment` before anything is measured."""
    host = getattr(target, "host", None)  # the systemd backend's SSH host; local otherwise
    return {
        "gpus": gpu_list(host if host is not None else LocalHost()),
        "git_commit": git_commit(settings.source),
    }


# --------------------------------------------------------------------------- loading


def load_results(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"stored run {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"stored run {path} is not a readable results.json: {exc}") from None
    if not isinstance(doc, dict) or "phases" not in doc or "samples" not in doc:
        raise ConfigError(f"{path} is not a pytest-specdecode results.json (no phases/samples)")
    return doc


def stored_phase(doc: Doc, phase: str, workloads: Sequence[str]) -> PhaseResult:
    """A measured phase of a stored run, rebuilt as the experiment keeps it."""
    info = doc.get("phases", {}).get(phase)
    if info is None:
        raise ConfigError(f"the stored run has no {phase!r} phase")
    fields = {f.name for f in dataclasses.fields(RequestSample)}
    acc_fields = {f.name for f in dataclasses.fields(Acceptance)}
    measurements = {}
    for w in workloads:
        summary = info.get("workloads", {}).get(w)
        samples = [
            RequestSample(**{k: v for k, v in s.items() if k in fields})
            for s in doc["samples"]
            if s.get("phase") == phase and s.get("workload") == w and not s.get("warmup")
        ]
        if summary is None or not samples:
            raise ConfigError(
                f"the stored run has no measured {phase!r} requests for the prompt type {w!r}; "
                f"it has: {', '.join(info.get('workloads', {})) or 'none'}"
            )
        acc = summary.get("acceptance") or {"present": False}
        measurements[w] = WorkloadMeasurement(
            w,
            samples,
            float(summary.get("wall_s") or sum(s.e2e_s for s in samples)),
            Acceptance(**{k: v for k, v in acc.items() if k in acc_fields}),
        )
    return PhaseResult(
        name=phase, spec=None, measurements=measurements, server_version=info.get("server_version")
    )


def facts(doc: Doc, *, phase: str | None = None) -> dict[str, Any]:
    """What must agree for two measurements to be comparable."""
    target = doc.get("target", {})
    phases = doc.get("phases", {})
    versions = {
        name: p.get("server_version")
        for name, p in phases.items()
        if p.get("server_version") and not p.get("reused_from")
    }
    run = doc.get("run", {})
    return {
        "model": target.get("model"),
        "host": target.get("host"),
        "vllm_version": phases.get(phase, {}).get("server_version")
        if phase
        else next(iter(versions.values()), None),
        "gpus": doc.get("environment", {}).get("gpus"),
        "prompts": {
            w: {"prompt": spec.get("prompt"), "max_tokens": spec.get("max_tokens")}
            for w, spec in doc.get("workloads", {}).items()
        },
        "decoding": {k: run.get(k) for k in ("endpoint", "ignore_eos", "concurrency")},
        "git_commit": doc.get("environment", {}).get("git_commit"),
    }


def differences(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    keys: Sequence[str] = ("model", "vllm_version", "gpus", "prompts", "decoding"),
    only_prompts: Sequence[str] | None = None,
) -> list[str]:
    """How the facts of run A differ from those of run B, one sentence each."""
    out: list[str] = []
    for key in keys:
        va, vb = a.get(key), b.get(key)
        if key == "prompts":
            names = only_prompts if only_prompts is not None else sorted(set(va or {}) | set(vb))
            for w in names:
                pa, pb = (va or {}).get(w), (vb or {}).get(w)
                if pa is None or pb is None:
                    continue
                if pa.get("prompt") != pb.get("prompt"):
                    out.append(f"the prompt of {w!r} differs")
                if pa.get("max_tokens") != pb.get("max_tokens"):
                    out.append(
                        f"max_tokens of {w!r}: {pa.get('max_tokens')} vs {pb.get('max_tokens')}"
                    )
        elif va != vb and not (key == "vllm_version" and (va is None or vb is None)):
            label = {"vllm_version": "vLLM version", "gpus": "GPU", "decoding": "decoding"}.get(
                key, key
            )
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


# --------------------------------------------------------------------------- reused baseline


def check_stored_baseline(path: str, settings: Settings) -> dict[str, Any]:
    """Before anything starts: the file is a run with a baseline for every prompt type."""
    if not settings.candidates:
        raise ConfigError(
            "--spec-baseline-from reuses a baseline to compare candidates with: pass --spec-config"
        )
    doc = load_results(path)
    stored_phase(doc, BASELINE, list(settings.workloads))
    return doc


def use_stored_baseline(experiment: Experiment, path: str | None) -> None:
    """The baseline phase from a stored run, so that it is not measured again."""
    if not path:
        return
    stored = load_results(path)
    names = list(experiment.settings.workloads)
    experiment.phases[BASELINE] = stored_phase(stored, BASELINE, names)
    results = experiment.results
    results.data["samples"].extend(
        s for s in stored["samples"] if s.get("phase") == BASELINE and s.get("workload") in names
    )
    info = dict(stored["phases"][BASELINE])
    info["workloads"] = {w: info["workloads"][w] for w in names}
    results.set_phase(BASELINE, {**info, "reused_from": str(Path(path).resolve())})
    results.set(
        "baseline_from", {"path": str(Path(path).resolve()), **facts(stored, phase=BASELINE)}
    )
    experiment.progress(f"baseline: reused from {path}, not measured")
    for text in stored_baseline_warnings(results.data):
        experiment.progress(f"warning: {text}")
        warnings.warn(StoredBaselineWarning(text), stacklevel=1)


def stored_baseline_warnings(doc: dict[str, Any]) -> list[str]:
    """Differences between a reused baseline and this run; kept in doc['warnings'] once each."""
    stored = doc.get("baseline_from")
    if not stored:
        return []
    current = facts(doc)
    new = [
        f"the stored baseline differs: {d}"
        for d in differences(stored, current, only_prompts=list(doc.get("workloads", {})))
    ]
    kept = doc.setdefault("warnings", [])
    fresh = [w for w in new if w not in kept]
    kept.extend(fresh)
    return fresh


# --------------------------------------------------------------------------- timing


def previous_timing(settings: Settings, *, default_start_s: float | None = None) -> Timing:
    """Timings of the newest stored run of the same model and host, or stated assumptions."""
    host = settings.target.host or "localhost"
    if settings.target.backend == "systemd" and settings.target.host:
        host = settings.target.host.removeprefix("ssh://")
    start_default = default_start_s or (60.0 if settings.target.backend == "local" else 300.0)
    folders = (
        sorted((p for p in settings.reports_dir.iterdir() if p.is_dir()), reverse=True)
        if settings.reports_dir.is_dir()
        else []
    )
    for folder in folders:
        try:
            doc = json.loads((folder / "results.json").read_text())
        except (OSError, ValueError):
            continue
        target = doc.get("target", {})
        if target.get("model") != settings.target.model or target.get("host") not in (
            host,
            settings.target.host,
        ):
            continue
        per_token = [
            s["e2e_s"] / s["output_tokens"]
            for s in doc.get("samples", [])
            if not s.get("warmup") and s.get("output_tokens") and s.get("e2e_s")
        ]
        if not per_token:
            continue
        starts = _ready_times(folder / "run.log")
        return Timing(
            start_s=statistics.median(starts) if starts else start_default,
            s_per_token=statistics.median(per_token),
            source=f"from the stored run {folder.name}",
        )
    return Timing(
        start_s=start_default,
        s_per_token=0.05,
        source="assumed: no stored run of this model on this host in " + str(settings.reports_dir),
    )


def _ready_times(log: Path) -> list[float]:
    try:
        text = log.read_text()
    except OSError:
        return []
    return [float(m) for m in re.findall(r" ready after (\d+(?:\.\d+)?)s", text)]


# --------------------------------------------------------------------------- two runs


@dataclasses.dataclass(frozen=True)
class RunComparison:
    phase: str
    prompt: str
    a_tps: float
    b_tps: float
    change: float
    ratio_ci: tuple[float, float]
    a_tpot: float
    b_tpot: float
    p: float
    verdict: str


def compare_runs(
    a: Doc, b: Doc, *, alpha: float = 0.05, min_effect: float = 0.03
) -> list[RunComparison]:
    """Each phase both runs measured, prompt by prompt: run B against run A (Holm per phase)."""
    rows: list[RunComparison] = []
    for phase in [p for p in a.get("phases", {}) if p in b.get("phases", {})]:
        names = [
            w
            for w in a.get("workloads", {}) or a["phases"][phase].get("workloads", {})
            if tokens_per_s(a, phase, w) and tokens_per_s(b, phase, w)
        ]
        if not names:
            continue
        tput, tpot = compare_phases(a, phase, b, phase, names, alpha=alpha, min_effect=min_effect)
        for w in names:
            t, p = tput[w], tpot.get(w)
            verdicts = {t.verdict, p.verdict if p else Verdict.NO_DIFFERENCE}
            verdict = next(
                (
                    v.value
                    for v in (Verdict.REGRESSED, Verdict.INSUFFICIENT, Verdict.IMPROVED)
                    if v in verdicts
                ),
                Verdict.NO_DIFFERENCE.value,
            )
            rows.append(
                RunComparison(
                    phase=phase,
                    prompt=w,
                    a_tps=t.baseline_median,
                    b_tps=t.candidate_median,
                    change=t.change,
                    ratio_ci=t.ratio_ci,
                    a_tpot=p.baseline_median if p else float("nan"),
                    b_tpot=p.candidate_median if p else float("nan"),
                    p=t.p_adjusted,
                    verdict=verdict,
                )
            )
    return rows


def comparison_lines(
    a: Doc, b: Doc, rows: Sequence[RunComparison], *, names: tuple[str, str], markdown: bool
) -> list[str]:
    diffs = differences(facts(a), facts(b), keys=("model", "host", "vllm_version", "gpus"))
    diffs += differences(facts(a), facts(b), keys=("prompts", "decoding", "git_commit"))
    for name in [c for c in a.get("candidates", {}) if c in b.get("candidates", {})]:
        if a["candidates"][name] != b["candidates"][name]:
            diffs.append(f"the candidate {name!r} has another config")
    header = ("phase", "prompt", "A tok/s", "B tok/s", "change", "TPOT A → B ms", "p", "verdict")
    lines: list[str] = []
    if markdown:
        lines += [
            "## pytest-specdecode: run B against run A",
            "",
            f"- A: `{names[0]}`",
            f"- B: `{names[1]}`",
            *(f"- ⚠ {d}" for d in diffs),
            "",
            "| " + " | ".join(header) + " |",
            "|:--|:--|--:|--:|--:|:--|--:|:--|",
        ]
    else:
        lines += [f"A: {names[0]}", f"B: {names[1]}"]
        lines += [f"differs: {d}" for d in diffs] or ["no differences in model, host, vLLM, GPU"]
        lines.append(
            f"{'phase':<14} {'prompt':<12} {'A tok/s':>8} {'B tok/s':>8} {'change':>8} "
            f"{'TPOT A → B ms':>17} {'p_adj':>7}  verdict"
        )
    for r in rows:
        tpot = f"{fmt_num(r.a_tpot)} → {fmt_num(r.b_tpot)}"
        if markdown:
            cells = (r.phase, r.prompt, fmt_num(r.a_tps), fmt_num(r.b_tps), fmt_pct(r.change), tpot)
            lines.append("| " + " | ".join((*cells, fmt_p(r.p), r.verdict)) + " |")
        else:
            lines.append(
                f"{r.phase:<14} {r.prompt:<12} {fmt_num(r.a_tps):>8} {fmt_num(r.b_tps):>8} "
                f"{fmt_pct(r.change):>8} {tpot:>17} {fmt_p(r.p):>7}  {r.verdict}"
            )
    if not rows:
        lines.append("no phase and prompt type was measured in both runs")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """specdecode-compare: run B against run A, phase by phase and prompt by prompt."""
    parser = argparse.ArgumentParser(
        prog="specdecode-compare",
        description="Compare two stored pytest-specdecode runs: each phase both measured, "
        "prompt by prompt, run B against run A (Mann-Whitney U, Holm per phase).",
    )
    parser.add_argument("a", help="run A: results.json or its run folder")
    parser.add_argument("b", help="run B: results.json or its run folder")
    parser.add_argument("--alpha", type=float, default=None, help="default: run A's alpha")
    parser.add_argument("--min-effect", type=float, default=None, help="default: run A's")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    parser.add_argument(
        "--fail-on-regression",
        action="store_true",
        help="exit 1 when run B is significantly and materially slower on any row",
    )
    args = parser.parse_args(argv)
    try:
        a, b = load_results(args.a), load_results(args.b)
    except ConfigError as exc:
        print(f"specdecode-compare: {exc}", file=sys.stderr)
        return 2
    run = a.get("run", {})
    rows = compare_runs(
        a,
        b,
        alpha=args.alpha if args.alpha is not None else float(run.get("alpha", 0.05)),
        min_effect=args.min_effect
        if args.min_effect is not None
        else float(run.get("min_effect", 0.03)),
    )
    for line in comparison_lines(a, b, rows, names=(args.a, args.b), markdown=args.markdown):
        print(line)
    regressed = any(r.verdict == Verdict.REGRESSED.value for r in rows)
    return 1 if args.fail_on_regression and regressed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
