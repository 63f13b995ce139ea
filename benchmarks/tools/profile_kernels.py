"""One forward + backward of the SAM-B global layer through our kernels, for a profiler to wrap.

    ncu --set full --clock-control none -k regex:"_fwd_kernel|_bwd_kernel" -c 3 -o prof \\
        python benchmarks/tools/profile_kernels.py --mode bf16 [--overrides '{"bwd": {"FUSED": true}}']

Runs the call twice (the first compiles; ncu's -c counts launches, so skip the first call's with
--launch-skip 3 for a split backward) and nothing else, so the profile holds only our launches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/: bench_attention_core
from bench_attention_core import D, HEADS, K, MODES, make, ours_fns  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", default="bf16", choices=list(MODES))
    ap.add_argument("--grid", type=int, default=64)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--overrides", default="{}", help="JSON for kernels.configs.OVERRIDES")
    args = ap.parse_args()
    dtype, prec = MODES[args.mode]
    torch.set_float32_matmul_precision(prec)
    K.configs.OVERRIDES = json.loads(args.overrides)
    q, k, v, rh, rw, do = make(args.batch * HEADS, args.grid, dtype)
    _, _, both = ours_fns(q, k, v, rh, rw, do, D ** -0.5)
    for _ in range(2):
        both()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
