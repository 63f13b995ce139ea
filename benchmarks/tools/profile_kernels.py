"""One forward + backward of a SAM global layer through our kernels, for a profiler to wrap.

    ncu --set full --clock-control none -k regex:"_fwd_kernel|_bwd_kernel" -c 3 -o prof \\
        python benchmarks/tools/profile_kernels.py --mode bf16 [--overrides '{"bwd": {"FUSED": true}}']

Runs the call twice (the first compiles; ncu's -c counts launches, so skip the first call's with
--launch-skip 3 for a split backward) and nothing else, so the profile holds only our launches. The default
shape is SAM-B's (12 heads, head dim 64); ViT-H's global layer is `--heads 16 --head-dim 80`
(SAMHQ_FX_SPLIT_HEAD_DIM=0 in the environment pads that head dim to 128 instead of running it as 64 + 16).

    python benchmarks/tools/profile_kernels.py --summarize prof.csv --mode bf16 [--heads 16 --head-dim 80 ...]

prints one line per launch of an `ncu --csv --page details` export: duration, registers, shared memory,
occupancy and throughputs, and appends them as rows to benchmarks/results/profile_kernels.jsonl (or --out), each
starting with common.row_meta (commit, date, GPU, versions: run it on the machine that profiled) and the profiled
call's flags (give the ones the profile ran with).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/: bench_attention_core

# ncu metric name -> column heading, in print order
SUMMARY = {"Duration": "us", "Registers Per Thread": "regs", "Dynamic Shared Memory Per Block": "smem KB",
           "Theoretical Occupancy": "occ theor %", "Achieved Occupancy": "occ %",
           "Compute (SM) Throughput": "SM %", "Memory Throughput": "mem %"}


# SUMMARY's headings as a results row names them
ROW_KEYS = {"us": "us", "regs": "regs", "smem KB": "smem_KB", "occ theor %": "occ_theor_pct", "occ %": "occ_pct",
            "SM %": "SM_pct", "mem %": "mem_pct"}


# to us and KB; ncu 2025.3 writes "ns" / "us" / "ms" and "byte/block" / "Kbyte/block", older ones "nsecond"
_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
          "byte": 1 / 1024, "Kbyte": 1.0, "Mbyte": 1024.0}


def summarize(path: str) -> list[dict]:
    """One dict per launch ("ID" of ncu's export) with the SUMMARY metrics, durations in us, shared memory in KB."""
    launches: dict[str, dict] = {}
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]  # ncu prints its own log lines before the CSV
    for row in csv.DictReader(lines):
        name = row["Metric Name"]
        if name not in SUMMARY:
            continue
        d = launches.setdefault(row["ID"], {"kernel": row["Kernel Name"].split("(")[0]})
        value, unit = float(row["Metric Value"].replace(",", "")), row["Metric Unit"].split("/")[0]  # "byte/block"
        value *= _SCALE.get(unit, 1.0)
        d[SUMMARY[name]] = value
    return list(launches.values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="bf16", choices=["bf16", "fp32-tf32", "fp32-highest"])
    ap.add_argument("--grid", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=None, help="default: SAM-B's 12")
    ap.add_argument("--head-dim", type=int, default=None, help="default: SAM-B's 64")
    ap.add_argument("--overrides", default="{}", help="JSON for kernels.configs.OVERRIDES")
    ap.add_argument("--summarize", metavar="CSV", help="print an `ncu --csv --page details` export, append its rows "
                                                       "and exit")
    ap.add_argument("--out", default=None, help="with --summarize: append the rows to this .jsonl file (a directory: "
                                                "<dir>/profile_kernels.jsonl) instead of benchmarks/results/")
    args = ap.parse_args()
    if args.summarize:
        import torch
        from bench_attention_core import D, HEADS

        import common

        cols = list(SUMMARY.values())
        print(f"{'kernel':<14}" + "".join(f"{c:>12}" for c in cols))
        launches = summarize(args.summarize)
        for d in launches:
            print(f"{d['kernel']:<14}" + "".join(f"{d.get(c, float('nan')):12.1f}" for c in cols))
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        call = {"mode": args.mode, "grid": args.grid, "batch": args.batch, "heads": args.heads or HEADS,
                "head_dim": args.head_dim or D, "overrides": json.loads(args.overrides)}
        common.append_rows(common.results_path("profile_kernels", args.out),
                           [{**common.row_meta(common.env_info(), device), **call, "launch": k, "kernel": d["kernel"],
                             **{ROW_KEYS[c]: d[c] for c in cols if c in d}} for k, d in enumerate(launches)])
        return

    import torch
    from bench_attention_core import D, HEADS, K, MODES, make, ours_fns

    heads, d = args.heads or HEADS, args.head_dim or D
    dtype, prec = MODES[args.mode]
    torch.set_float32_matmul_precision(prec)
    K.configs.OVERRIDES = json.loads(args.overrides)
    q, k, v, rh, rw, do = make(args.batch * heads, args.grid, dtype, d=d)
    _, _, both = ours_fns(q, k, v, rh, rw, do, d ** -0.5)
    for _ in range(2):
        both()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
