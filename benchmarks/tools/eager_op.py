"""The fused op called eagerly (`samhq_fx.rel_pos_attention`, forward + backward): wall time against GPU time.

    python benchmarks/tools/eager_op.py [--iters 200] [--dtype bf16] [--profile OUT.txt] [--parts] [--out FILE]

Results: benchmarks/results/eager_op.jsonl (or --out), rows starting with common.row_meta.

Method: SAM-B's global layer (12 heads, 64x64 keys) and windows (300 = 25 windows x 12 heads, 14x14), head dim 64, batch
1. Wall time: the mean of `iters` back-to-back forward + backward calls between two synchronizations (so the host's
issue rate and the GPU's work overlap as in a training loop). GPU time: the sum of the kernels' durations per call
(torch.profiler, CUPTI). `--profile` adds cProfile's top host functions of the same loop, by own and by cumulative time.
`--parts` times pieces of the call the same way (wall per call): the forward alone, the kernels' host functions
(forward, backward: their allocations, copies and launches), the eight allocations a call makes, and an autograd
Function of the same five inputs that launches nothing. A call is host-bound when wall > GPU time. Each row says whether
the kernels were launched directly (kernels/launcher.py, the default) or through Triton's JITFunction.run
(SAMHQ_FX_DIRECT_LAUNCH=0).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time

import torch

import samhq_fx
from samhq_fx.kernels import launcher

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402

SHAPES = {"global": (12, 64, 64), "windows": (300, 14, 14)}  # (batch * heads, key-grid rows, columns)


def inputs(b: int, h: int, w: int, dtype: torch.dtype, d: int = 64):
    g = torch.Generator(device="cuda").manual_seed(0)
    n = h * w
    shapes = [(b, n, d), (b, n, d), (b, n, d), (b, n, h), (b, n, w)]
    return [torch.randn(s, device="cuda", dtype=dtype, generator=g).requires_grad_() for s in shapes]


def step(ts, dout):
    out = samhq_fx.rel_pos_attention(*ts)
    torch.autograd.grad(out, ts, dout)  # the five gradients, none accumulated into .grad


def wall_ms(f, iters: int) -> float:
    """Wall ms per call of `iters` back-to-back f() between two synchronizations."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / iters


def gpu_ms(ts, dout, iters: int) -> tuple[float, int]:
    """(kernel time per call in ms, launches per call)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            step(ts, dout)
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in events)
    return total_us / 1e3 / iters, round(len(events) / iters)


class _NoKernels(torch.autograd.Function):
    """The autograd around the op without the op: what torch.autograd.grad costs a call of five inputs."""

    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w):
        ctx.save_for_backward(q, k, v, rel_h, rel_w)
        return torch.empty_like(v)

    @staticmethod
    def backward(ctx, dout):
        return tuple(torch.empty_like(t) for t in ctx.saved_tensors)


def parts_ms(ts, dout, iters: int) -> dict[str, float]:
    """Wall ms per call of pieces of the op's forward + backward (the best of 3 means of `iters` calls)."""
    from samhq_fx import op
    from samhq_fx.kernels import rel_pos_attention as K

    det = [t.detach() for t in ts]
    scale = det[0].shape[-1] ** -0.5
    out, lse = K.forward(*det, scale)

    def direct(f):
        def run():
            with op._direct_triton_launch():  # as the op launches: kernels/launcher.py, not wrap_triton
                f()
        return run

    def allocations():
        for t in (*det, det[0], lse, lse):  # out, dq, dk, dv, d_rel_h, d_rel_w, lse, delta
            torch.empty_like(t)

    def no_kernels():
        torch.autograd.grad(_NoKernels.apply(*ts), ts, dout)

    def forward_only():
        with torch.no_grad():
            samhq_fx.rel_pos_attention(*det)

    pieces = {
        "op fwd + bwd": lambda: step(ts, dout),
        "op fwd (no grad)": forward_only,
        "kernels fwd": direct(lambda: K.forward(*det, scale)),
        "kernels bwd": direct(lambda: K.backward(dout, *det, out, lse, scale)),
        "8 allocations": allocations,
        "autograd, no kernels": no_kernels,
    }
    result = {}
    for name, f in pieces.items():
        for _ in range(10):
            f()
        result[name] = round(min(wall_ms(f, iters) for _ in range(3)), 4)
    return result


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--profile", help="write cProfile's top host functions here")
    ap.add_argument("--parts", action="store_true", help="time pieces of the call too (wall ms per call)")
    ap.add_argument("--out", default=None, help="append the rows to this .jsonl file instead of benchmarks/results/")
    args = ap.parse_args(argv)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    rows, report = [], io.StringIO()
    meta = common.row_meta(common.env_info(), torch.device("cuda"))
    path = common.results_path("eager_op", args.out)
    for name, (b, h, w) in SHAPES.items():
        ts = inputs(b, h, w, dtype)
        dout = torch.randn_like(ts[2])
        for _ in range(10):  # compile, allocate, warm the caches
            step(ts, dout)
        gpu, launches = gpu_ms(ts, dout, 20)
        wall = min(wall_ms(lambda: step(ts, dout), args.iters) for _ in range(3))
        rows.append(dict(meta, shape=name, dtype=args.dtype, wall_ms=round(wall, 4), gpu_ms=round(gpu, 4),
                         ratio=round(wall / gpu, 3), launches=launches, direct_launch=launcher.ENABLED))
        if args.parts:
            rows[-1]["parts_ms"] = parts_ms(ts, dout, args.iters)
        rows[-1]["method"] = "torch.autograd.grad"
        common.append_rows(path, rows[-1:])
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            wall_ms(lambda: step(ts, dout), args.iters)
            prof.disable()
            report.write(f"== {name}, {args.iters} calls\n")
            pstats.Stats(prof, stream=report).sort_stats("tottime").print_stats(25)
            pstats.Stats(prof, stream=report).sort_stats("cumulative").print_stats(40)
    if args.profile:
        with open(args.profile, "w") as f:
            f.write(report.getvalue())
    print(f"{'shape':8s} {'dtype':5s} {'wall ms':>8s} {'GPU ms':>8s} {'wall/GPU':>8s} {'launches':>8s}")
    for r in rows:
        print(f"{r['shape']:8s} {r['dtype']:5s} {r['wall_ms']:8.3f} {r['gpu_ms']:8.3f} {r['ratio']:8.2f} "
              f"{r['launches']:8d}")
    for r in rows:
        for name, ms in r.get("parts_ms", {}).items():
            print(f"  {r['shape']:8s} {name:22s} {ms:8.3f} ms")


if __name__ == "__main__":
    main()
