"""The 076 entry's table-space pieces on the GPU: the rel-pos shift kernels against Inductor's torch forms, and
the table GEMMs at the natural width against the 8-aligned one (sol076/rel_pos_tables.py, sol076/entry.py).

Per 076 grid (12 heads, bf16 unless --dtype), us by CUDA-graph replay (do_bench median, L2 flushed):
  terms_torch / terms_kernel   rel = [rel_h | rel_w] out of T: rel_pos_ops.rel_terms compiled by Inductor / the kernel
  dt_torch / dt_kernel         dT out of d_rel_h, d_rel_w: rel_pos_ops.table_grad compiled / the kernel
  T_w, dqrel_w, dtab_w         q @ tables^T, dT @ tables, dT^T @ q at width w = 4H - 2 (natural) and w8 (aligned)
Each kernel's output is checked equal to the torch form's before it is timed.

    python benchmarks/tools/bench_rel_tables.py --out $OUT      # one row per grid, a table last

Appends one row per grid to benchmarks/results/bench_rel_tables.jsonl (or --out: a .jsonl file, or a directory for
<dir>/bench_rel_tables.jsonl), each starting with common.row_meta (commit, date, GPU, versions).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "sol076"))  # the entry's tables
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/: common, bench_attention_core
from bench_attention_core import graph_bench  # noqa: E402
import common  # noqa: E402

import rel_pos_ops  # noqa: E402  (the torch forms; registers the ops)
import rel_pos_tables  # noqa: E402

GRIDS = [(7, 7, 1), (7, 7, 64), (14, 14, 8), (16, 16, 32), (28, 28, 4), (32, 32, 4), (32, 32, 8), (48, 48, 1),
         (48, 48, 2), (56, 56, 1), (64, 64, 4)]


def us(fn) -> float:
    return graph_bench(fn) * 1e3


def run(grid, dtype) -> dict:
    h, w, b = grid
    bh, n, d = 12 * b, h * w, 64
    natural = 2 * h - 1 + 2 * w - 1
    w8 = -(-natural // 8) * 8
    dev = "cuda"
    t = torch.randn(bh * n, w8, device=dev, dtype=dtype)
    drh = torch.randn(bh, n, h, device=dev, dtype=dtype)
    drw = torch.randn(bh, n, w, device=dev, dtype=dtype)
    terms_torch = torch.compile(rel_pos_ops.rel_terms, fullgraph=True)
    dt_torch = torch.compile(rel_pos_ops.table_grad, fullgraph=True)
    assert torch.equal(rel_pos_tables.rel_terms(t, h, w), terms_torch(t, h, w))
    assert torch.equal(rel_pos_tables.table_grad(drh, drw, w8), dt_torch(drh, drw, w8))
    row = dict(grid=f"{h}x{w}x{b}", width=natural, width8=w8,
               terms_torch=us(lambda: terms_torch(t, h, w)), terms_kernel=us(lambda: rel_pos_tables.rel_terms(t, h, w)),
               dt_torch=us(lambda: dt_torch(drh, drw, natural)), dt_kernel=us(lambda: rel_pos_tables.table_grad(drh, drw, w8)))
    q = torch.randn(bh * n, d, device=dev, dtype=dtype)
    for tag, width in (("w", natural), ("w8", w8)):
        tables = torch.randn(width, d, device=dev, dtype=dtype)
        dt = torch.randn(bh * n, width, device=dev, dtype=dtype)
        row[f"T_{tag}"] = us(lambda: torch.mm(q, tables.t()))
        row[f"dqrel_{tag}"] = us(lambda: torch.mm(dt, tables))
        row[f"dtab_{tag}"] = us(lambda: torch.mm(dt.t(), q))
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="append the rows to this .jsonl file (a directory: "
                                                "<dir>/bench_rel_tables.jsonl) instead of benchmarks/results/")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"))
    args = ap.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    meta = common.row_meta(common.env_info(), torch.device("cuda"))
    path = common.results_path("bench_rel_tables", args.out)
    rows = []
    for grid in GRIDS:
        rows.append(run(grid, dtype))
        print(json.dumps(rows[-1]), flush=True)
        common.append_rows(path, [{**meta, "dtype": args.dtype, **rows[-1]}])
        torch._dynamo.reset()
    keys = [k for k in rows[0] if k not in ("grid", "width", "width8")]
    print(f"{'grid':<10}" + "".join(f"{k:>13}" for k in keys))
    for r in rows:
        print(f"{r['grid']:<10}" + "".join(f"{r[k]:13.1f}" for k in keys))


if __name__ == "__main__":
    main()
