"""Benchmark: the rel-pos attention core alone, forward + backward (d_rel_h / d_rel_w included).

SAM-B global layer: batch 1 x 12 heads, 64x64 grid (N = 4096), head_dim 64, in one run against
  (a) F.scaled_dot_product_attention, memory-efficient backend, with a dense [1, 12, N, N] bias built
      from rel_h / rel_w that requires grad (autograd reduces the bias grad back to rel_h / rel_w);
  (b) FlexAttention (torch.compile'd) with a score_mod reading captured rel_h / rel_w (grads too);
  (c) our Triton kernels (samhq_fx.kernels.rel_pos_attention forward + backward).
Modes: bf16, fp32 with TF32 ("high"), fp32 "highest". Then our kernels alone on the SOL-ExecBench
L2/076 attention shapes (fp32 "high"; "medium" runs the same TF32 kernels).

Timing: triton.testing.do_bench, median, warm-up 25 ms / rep 100 ms, L2 flushed before each call by
do_bench, over replays of a CUDA graph of the call (GPU time; the eager column times plain calls and so
adds Python dispatch: eager wrap_triton launches cost tens of microseconds each on the host). Peak memory: torch.cuda.max_memory_allocated over one fwd+bwd call, inputs included.
FLOPs counted per head: forward 4*N*N*D (QK^T and PV), backward 10*N*N*D (FA convention: dV, dP,
dS^T Q, dS K plus the QK^T recompute); our backward actually executes 14*N*N*D (P recomputed in both
backward kernels to stay atomic-free), which the TFLOP/s column does not credit.

Usage: python benchmarks/bench_attention_core.py [--out FILE] [--skip-baselines] [--skip-sol] [--sam-sizes]
(block-config and variant sweeps: benchmarks/tools/sweep_kernels.py)
Appends one row per measurement to benchmarks/results/bench_attention_core.jsonl (or --out: a .jsonl file, or a
directory for <dir>/bench_attention_core.jsonl), each starting with common.row_meta (commit, date, GPU, versions)
and naming its section: host_us, sam_b_global, sol_076 or sam_sizes.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import image_size  # noqa: E402

try:
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # run from the repo root without the package installed
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from kernels import rel_pos_attention as K

HARNESS = "bench_attention_core"  # its rows: benchmarks/results/bench_attention_core.jsonl
HEADS, D = 12, 64
MODES = {"bf16": (torch.bfloat16, "highest"), "fp32-tf32": (torch.float32, "high"),
         "fp32-highest": (torch.float32, "highest")}
# SOL-ExecBench L2/076 workloads: (grid side, batch); sol076/definition.py
SOL = [(7, 1), (7, 64), (14, 1), (14, 2), (14, 8), (16, 1), (16, 32), (28, 4), (32, 1), (32, 2),
       (32, 4), (32, 8), (48, 1), (48, 2), (56, 1), (64, 4)]


def bench(fn):
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def graph_bench(fn):
    """do_bench median over replays of a CUDA graph of fn: GPU time without Python launch overhead
    (eager wrap_triton dispatch costs tens of microseconds per launch; inside torch.compile the
    launches are Inductor's)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    ms = bench(g.replay)
    del g
    return ms


def host_overhead_us(fn, n=200):
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def peak_mem(fn):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def flops(b, n, d):
    return 4 * b * n * n * d, 10 * b * n * n * d


def make(b, side, dtype, requires_grad=False, d=D):
    n = side * side
    g = torch.Generator(device="cuda").manual_seed(0)
    r = lambda *s, sc=1.0: (torch.randn(*s, device="cuda", generator=g) * sc).to(dtype)  # noqa: E731
    q, k, v = r(b, n, d), r(b, n, d), r(b, n, d)
    rh, rw = r(b, n, side, sc=0.5), r(b, n, side, sc=0.5)
    do = r(b, n, d)
    for t in (q, k, v, rh, rw):
        t.requires_grad_(requires_grad)
    return q, k, v, rh, rw, do


def ours_fns(q, k, v, rh, rw, do, scale, kernels=K):
    """(forward, backward, both) closures over one kernels module (another revision's, for before/after)."""
    def fwd():
        return kernels.forward(q, k, v, rh, rw, scale)

    out, lse = fwd()

    def bwd():
        return kernels.backward(do, q, k, v, rh, rw, out, lse, scale)

    def both():
        o, l = kernels.forward(q, k, v, rh, rw, scale)
        return kernels.backward(do, q, k, v, rh, rw, o, l, scale)

    return fwd, bwd, both


def sdpa_fn(q, k, v, rh, rw, do, scale, side):
    b, n, _ = q.shape
    q4, k4, v4 = (t.detach().view(b // HEADS, HEADS, n, D).requires_grad_() for t in (q, k, v))
    rh4 = rh.detach().view(b // HEADS, HEADS, n, side).requires_grad_()
    rw4 = rw.detach().view(b // HEADS, HEADS, n, side).requires_grad_()
    do4 = do.view(b // HEADS, HEADS, n, D)

    def both():
        bias = (rh4[..., :, None] + rw4[..., None, :]).view(b // HEADS, HEADS, n, n)
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION):
            o = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias, scale=scale)
        return torch.autograd.grad(o, (q4, k4, v4, rh4, rw4), do4)

    return both


def flex_fn(q, k, v, rh, rw, do, scale, side):
    from torch.nn.attention.flex_attention import flex_attention

    b, n, _ = q.shape
    q4, k4, v4 = (t.detach().view(b // HEADS, HEADS, n, D).requires_grad_() for t in (q, k, v))
    rh4 = rh.detach().view(b // HEADS, HEADS, n, side).requires_grad_()
    rw4 = rw.detach().view(b // HEADS, HEADS, n, side).requires_grad_()
    do4 = do.view(b // HEADS, HEADS, n, D)

    def score_mod(score, bi, hi, qi, ki):
        return score + rh4[bi, hi, qi, ki // side] + rw4[bi, hi, qi, ki % side]

    flex = torch.compile(flex_attention, dynamic=False)

    def both():
        o = flex(q4, k4, v4, score_mod=score_mod, scale=scale)
        return torch.autograd.grad(o, (q4, k4, v4, rh4, rw4), do4)

    return both


def load_module(path: str):
    """A kernels module from one file (e.g. `git show REV:kernels/rel_pos_attention.py` of a revision when
    the kernels were one file), to time an older revision beside this one in the same process."""
    spec = importlib.util.spec_from_file_location("baseline_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def sam_b_global(results, skip_baselines):
    side, b = 64, HEADS
    n = side * side
    scale = D ** -0.5
    f_fwd, f_bwd = flops(b, n, D)
    rows = []
    for mode in ("bf16", "fp32-tf32", "fp32-highest"):
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        q, k, v, rh, rw, do = make(b, side, dtype)
        impls = {}
        fwd, bwd, both = ours_fns(q, k, v, rh, rw, do, scale)
        impls["ours"] = both
        t_f, t_b = graph_bench(fwd), graph_bench(bwd)
        if not skip_baselines:
            impls["sdpa-mem-eff"] = sdpa_fn(q, k, v, rh, rw, do, scale, side)
            impls["flex"] = flex_fn(q, k, v, rh, rw, do, scale, side)
        for name, fn in impls.items():
            try:
                fn()
                eager = bench(fn)
                mem = peak_mem(fn)
                try:
                    ms = graph_bench(fn)
                except Exception as e:  # not capturable: report eager
                    print(f"{name}: graph capture failed ({type(e).__name__}); using eager", flush=True)
                    torch.cuda.synchronize()
                    ms = eager
                row = dict(mode=mode, impl=name, ms=ms, eager_ms=eager, peak_gb=mem / 1e9,
                           tflops=(f_fwd + f_bwd) / ms / 1e9)
                if name == "ours":
                    row.update(fwd_ms=t_f, bwd_ms=t_b, fwd_tflops=f_fwd / t_f / 1e9, bwd_tflops=f_bwd / t_b / 1e9)
            except Exception as e:  # a baseline that cannot run is reported, not fatal
                row = dict(mode=mode, impl=name, error=f"{type(e).__name__}: {str(e)[:200]}")
            print(row, flush=True)
            rows.append(row)
        del impls, fwd, bwd, both
        torch.cuda.empty_cache()
    results["sam_b_global"] = rows
    return rows


def sol_shapes(results, modes=("bf16", "fp32-tf32"), baseline=None):
    """Our kernels on the 076 attention shapes: forward, backward and both, each its own CUDA graph;
    with `baseline` (another revision's kernels module) the same cells for it, in the same process."""
    rows = []
    scale = D ** -0.5
    impls = [("ours", K)] + ([("baseline", baseline)] if baseline is not None else [])
    for mode in modes:  # fp32 "medium" runs the same TF32 kernels as "high"
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        for side, batch in SOL:
            b = batch * HEADS
            q, k, v, rh, rw, do = make(b, side, dtype)
            f_fwd, f_bwd = flops(b, side * side, D)
            for impl, mod in impls:
                fwd, bwd, both = ours_fns(q, k, v, rh, rw, do, scale, mod)
                t_f, t_b, ms = graph_bench(fwd), graph_bench(bwd), graph_bench(both)
                rows.append(dict(impl=impl, mode=mode, grid=side, batch=batch, ms=ms, fwd_ms=t_f, bwd_ms=t_b,
                                 tflops=(f_fwd + f_bwd) / ms / 1e9, fwd_tflops=f_fwd / t_f / 1e9,
                                 bwd_tflops=f_bwd / t_b / 1e9))
                print(rows[-1], flush=True)
    results["sol_076"] = rows
    return rows


# SAM's encoders (samhq_fx.models.VIT_SIZES), batch 1: (name, heads, head dim); the 128 row is a reference point
# (a head dim with no padding)
SAM_SIZES = [("vit-b", 12, 64), ("vit-l", 16, 64), ("vit-h", 16, 80), ("d128", 16, 128)]
SAM_IMAGES = (1024, 512, 256)  # image sizes whose grid classes --sam-sizes times (image_size.grid_classes)


def sam_sizes(results, modes=("bf16", "fp32-tf32"), imgs=SAM_IMAGES):
    """Our kernels at each SAM size's global and window layers at each image size of `imgs` (1024: a 64x64 global
    grid, 25 windows of 14x14; 512: 32x32 and 9 windows over the grid padded to 42x42; 256: 16x16 and 4 windows
    over 28x28), batch 1: forward and forward + backward, each its own CUDA graph; cuDNN / flash SDPA with no bias
    beside them (a floor: the same attention without the rel-pos terms)."""
    rows = []
    for mode in modes:
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        for name, heads, d in SAM_SIZES:
            for img, (layer, side, windows) in ((img, c) for img in imgs for c in image_size.grid_classes(img)):
                b = heads * windows
                q, k, v, rh, rw, do = make(b, side, dtype, d=d)
                fwd, _bwd, both = ours_fns(q, k, v, rh, rw, do, d ** -0.5)
                row = dict(model=name, img=img, mode=mode, layer=layer, heads=heads, head_dim=d, grid=side,
                           batch=windows, fwd_ms=graph_bench(fwd), ms=graph_bench(both))
                f_fwd, f_bwd = flops(b, side * side, d)
                row.update(fwd_tflops=f_fwd / row["fwd_ms"] / 1e9, tflops=(f_fwd + f_bwd) / row["ms"] / 1e9)
                if dtype != torch.float32:
                    q4, k4, v4 = (t.detach().view(windows, heads, side * side, d).requires_grad_() for t in (q, k, v))
                    do4 = do.view(windows, heads, side * side, d)

                    def sdpa():
                        o = F.scaled_dot_product_attention(q4, k4, v4)
                        return torch.autograd.grad(o, (q4, k4, v4), do4)

                    try:
                        row["sdpa_nobias_ms"] = graph_bench(sdpa)
                    except Exception as e:  # noqa: BLE001 - a floor that cannot run is reported, not fatal
                        row["sdpa_nobias_error"] = f"{type(e).__name__}: {str(e)[:120]}"
                rows.append(row)
                print(row, flush=True)
                del q, k, v, rh, rw, do, fwd, both
        torch.cuda.empty_cache()
    results["sam_sizes"] = rows
    return rows


def print_sam_sizes(rows):
    print("\nSAM sizes, batch 1, ms, CUDA-graph replay (do_bench median); ratio = fwd+bwd / the same layer at head dim 64")
    print(f"{'mode':<11}{'model':<7}{'D':>4}{'img':>6}{'layer':>8}{'grid':>8}{'fwd':>8}{'fwd+bwd':>9}{'TFLOP/s':>8}"
          f"{'sdpa nb':>8}{'vs D64':>7}")
    for r in rows:
        base = next((x for x in rows if x["mode"] == r["mode"] and x["layer"] == r["layer"] and x["head_dim"] == 64
                     and x["heads"] == r["heads"] and x["img"] == r["img"]), None)
        ratio = f"{r['ms'] / base['ms']:7.2f}" if base else "      -"
        sd = f"{r['sdpa_nobias_ms']:8.3f}" if "sdpa_nobias_ms" in r else "       -"
        grid = f"{r['grid']}x{r['batch']}"
        print(f"{r['mode']:<11}{r['model']:<7}{r['head_dim']:>4}{r['img']:>6}{r['layer']:>8}{grid:>8}"
              f"{r['fwd_ms']:8.3f}{r['ms']:9.3f}{r['tflops']:8.1f}{sd}{ratio}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help=f"append the rows to this .jsonl file (a directory: "
                                                f"<dir>/{HARNESS}.jsonl) instead of benchmarks/results/{HARNESS}.jsonl")
    ap.add_argument("--skip-baselines", action="store_true")
    ap.add_argument("--skip-sol", action="store_true")
    ap.add_argument("--sam-sizes", action="store_true",
                    help="only the SAM sizes table: head dims 64 / 80 / 128 at the global and window layers")
    ap.add_argument("--img", default=",".join(map(str, SAM_IMAGES)),
                    help="with --sam-sizes: comma list of image sizes whose grid classes to time (default 1024,512,256)")
    ap.add_argument("--baseline", help="a one-file kernels module (an older revision) timed beside ours on the 076 shapes")
    ap.add_argument("--warm-only", action="store_true",
                    help="run each 076 cell once (compiles into Triton's disk cache), time nothing, write nothing")
    ap.add_argument("--shard", default="0/1", help="i/n: with --warm-only, this process's share of the 076 shapes")
    args = ap.parse_args()
    if args.warm_only:  # several such processes at once, then one timing run that compiles nothing
        global graph_bench, SOL
        graph_bench = lambda fn: (fn(), 1.0)[1]  # noqa: E731
        i, n = map(int, args.shard.split("/"))
        SOL = SOL[i::n]
        args.skip_baselines = True
    env = common.env_info()
    meta = common.row_meta(env, torch.device("cuda"))
    path = common.results_path(HARNESS, args.out)
    results: dict = {}

    def save(section: str):
        if not args.warm_only:
            common.append_rows(path, [{**meta, "section": section, **r} for r in results[section]])

    if args.sam_sizes:
        sam_sizes(results, imgs=tuple(image_size.check(int(i)) for i in args.img.split(",")))
        save("sam_sizes")
        print_sam_sizes(results["sam_sizes"])
        return
    q, k, v, rh, rw, do = make(HEADS, 7, torch.bfloat16)
    f, b_, both = ours_fns(q, k, v, rh, rw, do, 0.125)
    results["host_us"] = [dict(shape="7x7x1", fwd_us=host_overhead_us(f), bwd_us=host_overhead_us(b_),
                               fwd_bwd_us=host_overhead_us(both))]
    print("host time per call (us), tiny shape:", results["host_us"][0], flush=True)
    save("host_us")
    rows = [] if args.warm_only else sam_b_global(results, args.skip_baselines)
    if rows:
        save("sam_b_global")
    baseline = load_module(args.baseline) if args.baseline else None
    sol = [] if args.skip_sol else sol_shapes(results, baseline=baseline)
    if args.warm_only:
        return
    if sol:
        save("sol_076")

    print(f"\n{env['device']}  torch {env['torch']}  triton {env['triton']}")
    print("SAM-B global layer (12 heads, 64x64, D=64), fwd+bwd, do_bench median:")
    print("ms = CUDA-graph replay (GPU time); eager = plain calls (adds Python launch overhead)")
    print(f"{'mode':<13}{'impl':<14}{'ms':>8}{'eager':>8}{'peak GB':>9}{'TFLOP/s':>9}{'fwd ms':>8}{'bwd ms':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['mode']:<13}{r['impl']:<14} ERROR {r['error'][:60]}")
            continue
        extra = f"{r['fwd_ms']:>8.3f}{r['bwd_ms']:>8.3f}" if "fwd_ms" in r else ""
        print(f"{r['mode']:<13}{r['impl']:<14}{r['ms']:>8.3f}{r['eager_ms']:>8.3f}{r['peak_gb']:>9.3f}"
              f"{r['tflops']:>9.1f}{extra}")
    print("\n076 attention shapes (12 heads, D=64), us, CUDA-graph replay; TFLOP/s credited (fwd 4, bwd 10 N^2 D)")
    print(f"{'mode':<11}{'shape':<10}{'fwd+bwd':>9}{'fwd':>8}{'bwd':>8}{'fwd TF':>8}{'bwd TF':>8}{'before':>9}{'speedup':>8}")
    for mode in ("bf16", "fp32-tf32"):
        for side, batch in SOL:
            cell = {r["impl"]: r for r in sol if (r["mode"], r["grid"], r["batch"]) == (mode, side, batch)}
            if "ours" not in cell:
                continue
            r = cell["ours"]
            before = cell.get("baseline")
            extra = f"{before['ms'] * 1e3:9.1f}{before['ms'] / r['ms']:8.2f}" if before else ""
            print(f"{mode:<11}{f'{side}x{side}x{batch}':<10}{r['ms'] * 1e3:9.1f}{r['fwd_ms'] * 1e3:8.1f}"
                  f"{r['bwd_ms'] * 1e3:8.1f}{r['fwd_tflops']:8.1f}{r['bwd_tflops']:8.1f}{extra}")


if __name__ == "__main__":
    main()
