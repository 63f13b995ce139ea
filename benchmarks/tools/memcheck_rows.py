"""Each cell's fused forward + backward once, for compute-sanitizer: a config row's build checked for memory faults.

Triton lays out shared memory itself, and a build can read out of bounds where its results still look right (a
1-stage forward did on the H100: benchmarks/DECISIONS.md, "A fault"). So a row that brings a launch the table had not
run (a stage count, a block shape) runs under memcheck before it is timed or taken:

    compute-sanitizer --tool memcheck python benchmarks/tools/memcheck_rows.py --arch sm_90 --mode tf32x3 \\
        --shape B-global H-global-1280 --rows cand.py

Cells as time_arch_rows.py names them (--arch emulates that class's configs on the GPU at hand, SAMHQ_FX_ARCH; --shape
SHAPES names or MODEL-LAYER-PX[-bBATCH]; --mode bf16 / tf32 / tf32x3), with --rows' candidate rows after the table's.
Each cell prints its launches, then "done" and whether every gradient is finite (or "skip" where a launch does not fit
the GPU at hand); the sanitizer's "ERROR SUMMARY" closes the run. Set PYTORCH_NO_CUDA_MEMORY_CACHING=1 too, so that a
global read past a tensor falls outside the caching allocator's blocks and memcheck sees it. Exit status 1: a gradient
is not finite; 2: every cell was skipped (nothing ran under the sanitizer), or every cell that --rows changes. The
kernels' outputs are filled with NaN before they write them (as the tests poison them), so "finite" means every output
element was written; whether the values are right is tests/test_gpu_arch.py's float64 check. Where --rows changes none
of the cells' launches it says so: a candidate that never applies is not checked.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))  # benchmarks/: bench_attention_core
from time_arch_rows import (MODES, _described, _misfit, _shape_arg, arch, fit, load_rows, shape_of,  # noqa: E402
                            shape_spec, table_with)

from bench_attention_core import K, make  # noqa: E402


def run_cell(name: str, shape: str, mode: str, real: arch.Arch) -> str:
    """Forward + backward of one cell under the table in use, synchronised after each: "finite" if every gradient
    is, "skip" if the cell's launches do not fit the GPU at hand (`real`, as time_arch_rows.py skips it), else
    "not finite"."""
    dtype, prec = MODES[mode]
    torch.set_float32_matmul_precision(prec)
    b, side, d = shape_spec(shape)
    launches = fit.launches(arch.ARCHS[name], dtype, prec, shape_of(shape))
    print(f"{name} {shape} {mode}:", *_described(launches), sep="\n  ", flush=True)
    misfit = _misfit(launches, real)
    if misfit:
        print(f"  skip: {misfit}", flush=True)
        return "skip"
    os.environ["SAMHQ_FX_ARCH"] = name
    q, k, v, rel_h, rel_w, dout = make(b, side, dtype, d=d)  # q: [b, side*side, d]
    out, lse = K.forward(q, k, v, rel_h, rel_w, d ** -0.5)
    torch.cuda.synchronize()
    grads = K.backward(dout, q, k, v, rel_h, rel_w, out, lse, d ** -0.5)
    torch.cuda.synchronize()
    finite = all(bool(torch.isfinite(g).all()) for g in grads)
    print(f"  done, gradients finite: {finite}", flush=True)
    return "finite" if finite else "not finite"


def changed_cells(rows: list, cells: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The cells (arch, shape, mode) whose launches candidate `rows`, after the table's, change."""
    def described(name, shape, mode):
        return _described(fit.launches(arch.ARCHS[name], *MODES[mode], shape_of(shape)))
    before = [described(*cell) for cell in cells]
    with table_with(rows):
        return [cell for cell, was in zip(cells, before) if described(*cell) != was]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", nargs="+", default=["sm_90"], choices=list(arch.ARCHS))
    p.add_argument("--shape", nargs="+", required=True, type=_shape_arg, metavar="SHAPE",
                   help="time_arch_rows.py's SHAPES names or MODEL-LAYER-PX[-bBATCH]")
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--rows", help="a Python file whose ROWS (candidate table rows) go after the table's")
    args = p.parse_args(argv)
    rows = load_rows(args.rows) if args.rows else None  # checked as the table is, before anything runs
    if os.environ.get("SAMHQ_FX_ARCH"):
        raise SystemExit("unset SAMHQ_FX_ARCH: memcheck_rows.py sets it per cell (--arch)")
    if not torch.cuda.is_available():
        raise SystemExit("memcheck_rows.py runs the kernels: it needs a CUDA GPU")
    real = arch.of(torch.device("cuda"))
    K._POISON_OUTPUTS = True  # NaN in every output before the kernels write it
    cells = list(itertools.product(args.arch, args.shape, args.mode))
    changed = changed_cells(rows, cells) if rows else []
    if rows and not changed:
        print(f"--rows {args.rows}: the rows change no launch of these classes, shapes and modes", file=sys.stderr)
    try:
        with table_with(rows):
            verdicts = [run_cell(*cell, real) for cell in cells]
    finally:
        os.environ.pop("SAMHQ_FX_ARCH", None)
    skipped = verdicts.count("skip")
    print(f"{len(cells) - skipped} of {len(cells)} cells ran ({skipped} skipped: their launches do not fit this GPU)")
    if "not finite" in verdicts:
        return 1
    if changed and all(verdict == "skip" for cell, verdict in zip(cells, verdicts) if cell in changed):
        print(f"--rows {args.rows}: every cell whose launches the rows change was skipped: none checked",
              file=sys.stderr)
        return 2
    return 2 if skipped == len(cells) else 0


if __name__ == "__main__":
    sys.exit(main())
