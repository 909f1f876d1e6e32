"""specdecode-drafter: a drafter of the intended shape before one exists (no torch needed).

`specdecode-drafter eagle3 TARGET OUT`: an EAGLE-3 head with random weights, from a
Llama-architecture target's config. `specdecode-drafter cut TARGET OUT --layers N`: a draft model
of the target's first N layers, their weights as they are. Both are checked against the target
by the drafter check (`analysis/drafters/check.py`) before anything is written, and written to a
folder beside OUT that is renamed at the end: a refused or failed command leaves nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..analysis.drafters.check import check_drafter, describe_drafter
from ..errors import ConfigError
from ..record.safetensors_io import TensorOut, write_safetensors
from .drafter_make import (
    WEIGHTS,
    Made,
    copy_tokenizer,
    cut_config,
    cut_tensors,
    eagle3_config,
    eagle3_tensors,
    read_target,
    target_weights,
)

METHODS = {"eagle3": "eagle3", "cut": "draft_model"}


def _aux_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a list of layer ids like 2,15,27"
        ) from None


def make_drafter(
    kind: str,
    target: Path,
    out: Path,
    *,
    aux_layers: Sequence[int] | None = None,
    draft_vocab: int | None = None,
    layers: int | None = None,
    seed: int = 0,
) -> tuple[Made, list[str]]:
    """Make the drafter; returns what was written and the check's warnings. A ConfigError, and
    nothing written, where the check refuses it or OUT already holds files."""
    method = METHODS[kind]
    tconfig = read_target(target)
    tensors: list[TensorOut]
    if kind == "eagle3":
        config = eagle3_config(
            tconfig, aux_layers=aux_layers, draft_vocab=draft_vocab, where=target
        )
        tensors = eagle3_tensors(config, seed)
    else:
        if layers is None:
            raise ConfigError("cut needs --layers N: how many of the target's layers to keep")
        config = cut_config(tconfig, layers, where=target)
        tensors = cut_tensors(target_weights(target), layers)
    shapes = {t.name: t.shape for t in tensors}
    check = check_drafter(method, config, tconfig, path=str(out), tensors=shapes)
    if not check.ok:
        raise ConfigError(
            f"the {method} drafter for {target} does not fit it, nothing written to {out}: "
            + "; ".join(check.refusals)
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} already exists and is not an empty folder: nothing written")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}-"))
    try:
        (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        size = write_safetensors(work / WEIGHTS, tensors)
        copy_tokenizer(target, work)
        work.chmod(0o755)  # mkdtemp's 0700 would keep a server of another user out
        if out.exists():
            out.rmdir()
        work.rename(out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Made(config, shapes, size), list(check.warnings)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="specdecode-drafter",
        description="Make a drafter of the intended shape with random (or the target's own) "
        "weights, checked against the target before anything is written.",
    )
    sub = parser.add_subparsers(dest="kind", required=True)
    e3 = sub.add_parser("eagle3", help="an EAGLE-3 head with random weights (Llama targets)")
    cut = sub.add_parser("cut", help="a draft model: the target's first N layers")
    for p in (e3, cut):
        p.add_argument("target", type=Path, help="the target's folder (config.json, weights)")
        p.add_argument(
            "out", type=Path, help="the drafter's folder, made here (must not hold files)"
        )
    e3.add_argument(
        "--aux-layers",
        type=_aux_ids,
        default=None,
        help="the target's hidden states the head reads, vLLM's ids (0: the embeddings, i: "
        "after layer i-1); default vLLM's own guess 2,L//2,L-3",
    )
    e3.add_argument(
        "--draft-vocab", type=int, default=None, help="the head's draft vocabulary (d2t/t2d)"
    )
    e3.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    cut.add_argument("--layers", type=int, required=True, help="how many layers to keep")
    args = parser.parse_args(argv)
    try:
        made, warnings = make_drafter(
            args.kind,
            args.target,
            args.out,
            aux_layers=getattr(args, "aux_layers", None),
            draft_vocab=getattr(args, "draft_vocab", None),
            layers=getattr(args, "layers", None),
            seed=getattr(args, "seed", 0),
        )
    except ConfigError as exc:
        print(f"specdecode-drafter: {exc}", file=sys.stderr)
        return 2
    method = METHODS[args.kind]
    print(describe_drafter(method, str(args.out), made.config, size_bytes=made.size_bytes))
    for w in warnings:
        print(f"  warning: {w}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
