"""One SAM-HQ encoder layer at any image size, forward + backward: samhq against Inductor on both HF attention classes.

train_step.py and inference.py build whole encoders at 256, 512 or 1024 px. This times a single layer (layer norms,
qkv, rel-pos attention, projection, MLP; a global layer over the px/16-wide grid, or a windowed one over its 14x14
windows) at any multiple of 16 px, so that a size outside those (1280 px: 80-wide grids), or a GPU class emulated
with SAMHQ_FX_ARCH, can be held to "never slower than Inductor" layer by layer:

    python benchmarks/tools/layer_peers.py --model vit-h --img 1280 --layer global --dtype tf32 fp32
    SAMHQ_FX_ARCH=sm_86 python benchmarks/tools/layer_peers.py --img 1024 --dtype bf16
    python benchmarks/tools/layer_peers.py --img 1280 --dtype tf32 --rows cand.py   # + samhq with candidate rows

--rows FILE: time_arch_rows.py's candidate config rows (a .py file defining ROWS, checked as the table is), after the
table's, in one more build, "samhq+rows" (Inductor's caches off for it: its compile must see the rows): whether a row
that makes a layer fit, or changes its launches, beats Inductor there.

--out FILE: a results row per build (common.row_meta, the layer's shape, ms, peak, fused, the check and, for
samhq+rows, the candidate rows), as results/layer_peers.jsonl holds them.

Builds: samhq on the "eager" class (samhq-eager), Inductor on the "sdpa" class (inductor) and on the "eager" class
(inductor-eager), default mode, each a fresh compile of a fresh random-init layer (samhq_fx.models.random_init_).
A step: forward, a loss against a fixed random projection of the output, backward to the input and every parameter.
Median of --iters steps after --warmup (the first compiles), CUDA events on a GPU (time.perf_counter on CPU); peak =
max_memory_allocated over the timed steps above what was live before. "fused" is how many attentions samhq rewrote:
0 means it left the layer to Inductor (a launch that does not fit the GPU, say), and then the two should tie. "check":
the first step's loss and input-gradient norm against the first build's, relative; over common.DTYPE_TOL (TF32 1e-2,
bf16 1e-1, fp32 1e-3) the run fails.
dtypes: bf16 (autocast), tf32 (fp32, matmul precision "high"), fp32 ("highest", PyTorch's default).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # benchmarks/: common
sys.path.insert(0, HERE)
import common  # noqa: E402
from samhq_fx import models  # noqa: E402
from time_arch_rows import load_rows, table_with  # noqa: E402

BUILDS = {"samhq-eager": ("eager", "samhq"), "inductor": ("sdpa", "inductor"), "inductor-eager": ("eager", "inductor")}


def build_layer(size: str, img: int, layer: str, attn: str, device: torch.device):
    """(the layer, its input [batch-less grid, hidden]): SAM-HQ's encoder layer of `size` at `img` px, global (window
    size 0) or windowed (the config's 14)."""
    from transformers.models.sam_hq.modeling_sam_hq import SamHQVisionLayer

    cfg = models.vision_config(size, attn, image_size=img)
    mod = SamHQVisionLayer(cfg, window_size=0 if layer == "global" else cfg.window_size)
    return models.random_init_(mod).to(device), cfg


def run(build: str, args, dtype: str, device: torch.device, rows: list | None = None) -> dict:
    """One build's row: ms (median step), peak MiB, fused count; with candidate config `rows`, "samhq+rows"."""
    if rows:
        with table_with(rows), torch._inductor.config.patch(force_disable_caches=True):
            return dict(run(build, args, dtype, device), build="samhq+rows")
    attn, backend = BUILDS[build]
    common.reset_compile_state()
    common.set_precision(common.DTYPE_PRECISION[dtype])
    mod, cfg = build_layer(args.model, args.img, args.layer, attn, device)
    g = args.img // cfg.patch_size
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, g, g, cfg.hidden_size, generator=gen).to(device).requires_grad_()  # [B, H, W, C]
    probe = torch.randn(args.batch, g, g, cfg.hidden_size, generator=gen).to(device)
    net = torch.compile(mod, backend=backend, dynamic=False)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            out = net(x)
        out = out[0] if isinstance(out, tuple) else out  # a tuple in some transformers versions, a tensor in others
        loss = (out.float() * probe).mean()
        loss.backward()
        return loss.detach()

    cuda = device.type == "cuda"
    loss = step()  # the first (compiling) step: its loss and input gradient are what the builds are checked by
    check = (float(loss), float(x.grad.double().norm()))
    for _ in range(args.warmup - 1):
        step()
    common.sync(device)
    base = torch.cuda.memory_allocated(device) if cuda else 0
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    ms = common.median(common.wall_times(lambda i: step(), args.iters, device)) / 1e3
    peak = (torch.cuda.max_memory_allocated(device) - base) / 2**20 if cuda else None
    return dict(build=build, ms=ms, peak_mib=peak, fused=common.samhq_fused_count(), check=check)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit-b", choices=list(models.VIT_SIZES))
    p.add_argument("--img", type=int, default=1024, help="image size, a multiple of 16 (the grid is img / 16 wide)")
    p.add_argument("--layer", default="global", choices=["global", "windows"])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--dtype", nargs="+", default=["bf16", "tf32"], choices=list(common.DTYPE_PRECISION))
    p.add_argument("--builds", nargs="+", default=list(BUILDS), choices=list(BUILDS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps, the first (compiling) one included")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--rows", help="a Python file whose ROWS (candidate config rows) a samhq+rows build runs with")
    p.add_argument("--out", default=None, help="append a row per build to this .jsonl file (a directory: "
                                               "<dir>/layer_peers.jsonl); default: print only")
    args = p.parse_args(argv)
    rows = load_rows(args.rows) if args.rows else None  # checked as the table is, before anything compiles
    try:
        models.check_image_size(args.img, 16, "--img")
    except ValueError as e:
        p.error(str(e))
    if args.batch < 1 or args.iters < 1 or args.warmup < 1:
        p.error("--batch, --iters and --warmup must be at least 1")
    device = common.pick_device(args.device)
    meta = common.row_meta(common.env_info(), device)
    out = common.results_path("layer_peers", args.out, default=False)
    print(f"{args.model} {args.img} px {args.layer} layer, batch {args.batch}, {device}")
    print(f"{'dtype':<6}{'build':<16}{'ms':>9}{'peak MiB':>10}{'fused':>6}{'vs samhq':>9}{'check':>9}")
    failed = []
    for dtype in args.dtype:
        results = [run(b, args, dtype, device) for b in args.builds]
        if rows:
            results.append(run("samhq-eager", args, dtype, device, rows))
        ours = next((r["ms"] for r in results if r["build"] == "samhq-eager"), None)
        for r in results:
            # relative difference of the first step's loss and input-gradient norm from the first build's
            diff = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(r["check"], results[0]["check"]))
            if not diff <= common.DTYPE_TOL[dtype]:  # NaN fails too
                failed.append(f"{dtype} {r['build']} {diff:.1e} (over {common.DTYPE_TOL[dtype]:g})")
            peak = f"{r['peak_mib']:10.1f}" if r["peak_mib"] is not None else f"{'-':>10}"
            ratio = f"{r['ms'] / ours:9.2f}" if ours else f"{'-':>9}"
            print(f"{dtype:<6}{r['build']:<16}{r['ms']:9.3f}{peak}{r['fused']:6d}{ratio}{diff:9.1e}", flush=True)
            common.append_rows(out, [dict(meta, model=args.model, img=args.img, layer=args.layer, batch=args.batch,
                                          dtype=dtype, build=r["build"], ms=r["ms"], peak_mib=r["peak_mib"],
                                          fused=r["fused"], check_rel=diff, iters=args.iters,
                                          rows=rows if r["build"] == "samhq+rows" else None)])
    if failed:
        print(f"FAIL: loss or input gradient differs from {args.builds[0]}'s:", "; ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
