"""Training-step benchmark: HF SamHQVisionModel ViT-B/L/H, forward + backward + optimizer, per implementation.

Model: transformers' SamHQVisionModel of --model's size, samhq_fx.models.vision_config(size): "vit-b" (the
default; equal to SamHQVisionConfig() defaults: hidden 768, 12 layers, 12 heads, global attention in layers
2/5/8/11), "vit-l" (1024, 24 layers, 16 heads, global 5/11/17/23) or "vit-h" (1280, 32 layers, 16 heads, global
7/15/23/31); all with window 14, patch 16, MLP 4x hidden, built for and fed images of --img (1024, SAM's, the
default; 512, 256: an img/16-square patch grid, benchmarks/image_size.py).  --quick: the tiny QUICK_CONFIG model,
recorded as model "tiny" at its own image size.  Randomly initialised (seed 0, initializer_range 0.02 instead of the config's 1e-10
so activations are not ~0).  The attention implementation
is chosen at construction with SamHQVisionModel._from_config(config, attn_implementation=...), which works on
transformers 5.17 and 5.24 (the layers pick their attention class when they are built), and is verified on the
built model.

One step = model.zero_grad(set_to_none=True) and torch.compiler.cudagraph_mark_step_begin() (untimed), then
forward on pixel_values [B,3,img,img], loss = (out.last_hidden_state.float() * probe).mean() with a fixed
random probe of the output's shape [B,256,img/16,img/16], loss.backward(), and the optimizer step (--optimizer:
"adamw-fused" = torch.optim.AdamW(fused=True), the default; "adamw-compiled" = AdamW(foreach=False) whose
step() is torch.compile'd with Inductor; "none").  lr 1e-6: the weights move, the timing does not care.
(A fixed random projection rather than .pow(2).mean(): the vision neck ends in a LayerNorm, so the mean square
of its output is ~1 whatever the model computes, and its gradient ~0, which would make the loss useless as a
sanity check.)
Implementations (benchmarks/impls.py; each row's "recipe" says exactly how it was built):
  eager-sdpa, eager-eager          HF "sdpa" (SDPA with the dense rel-pos bias, HF's default) / "eager" class
  inductor, inductor-eager         torch.compile(model) on either class, default mode
  inductor-ro, inductor-eager-ro   the same with mode="reduce-overhead" (CUDA graphs)
  samhq-eager, samhq-sdpa          torch.compile(model, backend="samhq"), default mode
  samhq-eager-ro, samhq-sdpa-ro    the same with mode="reduce-overhead"
  samhq-eager-ca, samhq-eager-ca-ro   compiled autograd: forward + loss + backward inside one
                                   torch.compile'd function with torch._dynamo.config.compiled_autograd=True,
                                   so the backward graph goes through the backend too; default mode / CUDA graphs
  inductor-eager-ca-ro             the same with Inductor (not in the default set)
Default set: every one but the compiled-autograd ones, so the best Inductor configuration (either attention
class, either mode) is measured in the same run as samhq; the summaries hold samhq to it (over both modes, and
mode by mode).  --modes default / --modes reduce-overhead (or ro) keeps only the compiled impls of that mode (the
eager baselines, the loss check's reference, stay): half the compiles.
Precision: "tf32" = fp32 with torch.set_float32_matmul_precision("high"); "bf16" = the same plus
torch.autocast(bfloat16) around the forward; "fp32" (only when named) = fp32 at PyTorch's default precision,
"highest" (true fp32 GEMMs; samhq's kernels run 3-pass TF32 dots).  Every compile is dynamic=False, fresh per cell.

Every row records its "model" and "img"; rows of different models or image sizes are never compared (summaries,
loss check and merge keys include both), and rows without them are read as "vit-b" at 1024.
Measurements per (model, dtype, batch, impl) cell:
  ms/step   median over --steps steps after --warmup warm-up steps (the first compiles), CUDA events around the
            step (no L2 flush: a step is ~50 ms, far beyond what L2 state can change). Default-mode compiled cells
            (not compiled autograd) are kept alive and timed again after the last cell of their dtype and batch,
            3 rounds that each time every such cell in turn: their ms/step is the median of those rounds
            (ms_per_step_by_round; the first timing stays as ms_per_step_in_cell), because the first build timed
            in a process runs slower on the host (--no-rotate: the first timing only);
  peak MiB  torch.cuda.max_memory_allocated() over the warm-up (after the first step) and timed steps
            (parameters, gradients, optimizer state and activations together), less what was allocated when the
            cell started (the cells kept alive before it);
  GPU busy  one more step under torch.profiler (CUPTI): the sum of its GPU records' durations (kernels, memcpy,
            memset) / the step's wall time on the GPU (from the end of a marker kernel launched right before the
            step to the start of one launched right after it): how much of the step the GPU worked, the rest
            being host time it waited for;
  gpu_ms, host_ms  from that profiled step: gpu_ms = the sum of its GPU records' durations (the numerator of GPU
            busy), host_ms = ms/step - gpu_ms, clipped at 0: the share of a step the GPU spent waiting for the host
            (launches, Python, guards, the optimizer's loop) rather than computing (None without the profile);
  attention share  in the same profile: sum of GPU kernel durations whose names look like
            attention / total GPU kernel time of the step.  "Look like attention" = name matches ATTN_PATTERN
            (flash, fmha, attention, attn, softmax, sdpa, rel_pos, samhq, flex) or starts with the name of a Triton
            kernel of samhq_fx.kernels.rel_pos_attention.  A heuristic: it catches fused attention kernels and the
            softmax of the explicit path, not the explicit path's Q@K^T / P@V GEMMs or the rel-pos bias
            elementwise kernels, so for eager-eager / inductor-eager it is a lower bound;
  cudagraph_skips, graph_breaks  graphs Inductor compiled without CUDA graphs (with its reasons) and Dynamo
            graph breaks, over the whole cell (a compiled-autograd cell has one by design, at backward(); the
            compiled optimizer adds its own);
  loss, rel_pos_grad_norm  of the first step (the norm of all rel_pos_h/rel_pos_w gradients, which flow only
            through attention), and their relative differences from eager-eager's (else eager-sdpa's) of the same
            model, image size, batch and dtype -- a cheap check that a compiled model computes the same thing (FAIL
            above common.DTYPE_TOL: 1e-2 in tf32, 1e-1 in bf16, 1e-3 in fp32).
Summaries, over the OK rows of the results file:
  "summary"          per (model, img, dtype, batch): the fastest samhq, Inductor and eager rows (any mode) and samhq's
                     speedup over the fastest Inductor and eager ones (plot.best_per_family);
  "summary_by_mode"  per (model, img, dtype, batch, mode): the fastest samhq row against the fastest Inductor row of the
                     SAME mode (either attention class; compiled-autograd rows count in their mode), the ratio
                     Inductor ms / samhq ms and both sides' host_ms and gpu_busy (plot.best_by_mode), printed last
                     as one line each, e.g. "vit-b 1024px bf16 b1 default: samhq-eager 41.0 ms vs inductor 46.5 ms:
                     1.13x (host 1.2 / 2.3 ms, busy 88% / 93%)" ("-" where not measured).

  python benchmarks/train_step.py                         # batch 1,4 x tf32,bf16 x 10 impls, 480 s budget
  python benchmarks/train_step.py --model vit-h --batch 1 # SAM-HQ's ViT-H encoder
  python benchmarks/train_step.py --img 512 --batch 8     # 512x512 images: a 32x32 grid, 9 windows per image
  python benchmarks/train_step.py --modes reduce-overhead # CUDA-graph builds (and the eager baselines) only
  python benchmarks/train_step.py --out /tmp/t.jsonl --resume /tmp/t.jsonl   # continue a cut run: the rest only
  python benchmarks/train_step.py --gpus 2                # cells split over 2 GPUs of this host, timed at once
  python benchmarks/train_step.py --quick                 # CPU smoke test (tiny model), used in CI
Appends one row per cell to benchmarks/results/train_step.jsonl (or --out) as the cell finishes (a default-mode
compiled cell timed again in rotation: after its group), each starting with common.row_meta (commit, date, GPU,
versions); draws train_step.png beside it (if matplotlib) and prints a table last.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402
import image_size  # noqa: E402
import impls  # noqa: E402
import plot  # noqa: E402

IMPLS = impls.IMPLS
DEFAULT_IMPLS = tuple(n for n, i in IMPLS.items() if not i.compiled_autograd and not i.options)  # the rest on request
QUICK_IMPLS = ("eager-eager", "samhq-eager")
OPTIMIZERS = ("adamw-fused", "adamw-compiled", "none")
LR = 1e-6
DTYPES = tuple(common.DTYPE_PRECISION)
MODELS = ("vit-b", "vit-l", "vit-h")  # samhq_fx.models.VIT_SIZES; --quick records "tiny"
MODEL_LAYERS = {"vit-b": 12, "vit-l": 24, "vit-h": 32}
# Tiny model for the CPU smoke test: 8x8 patch grid, window 2, one global layer.
QUICK_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=32, patch_size=4,
                    window_size=2, global_attn_indexes=(1,), output_channels=16)
ATTN_PATTERN = r"flash|fmha|attention|attn|softmax|sdpa|rel_pos|samhq|flex"


def prior_s(impl: str, batch: int, model: str = "vit-b") -> float:
    """Guessed seconds for a cell before one like it has run (the budget's estimate, and --gpus' share cost).
    Compiling dominates; 2026-11-30 on the H200 host, ViT-B: 45-60 s at batch 1, 90-120 s at batch 4 (fresh
    caches); compiled autograd compiles the backward a second way (guess: 1.3x); ViT-L / ViT-H: scaled by their
    layer count (a guess: the graph grows with the layers)."""
    spec = IMPLS[impl]
    scale = MODEL_LAYERS.get(model, 12) / 12
    if spec.backend is None:
        return 10.0 * scale
    return (70.0 if batch <= 1 else 120.0) * (1.3 if spec.compiled_autograd else 1.0) * scale
HARNESS = "train_step"  # its rows: benchmarks/results/train_step.jsonl


def attention_regex() -> re.Pattern:
    """ATTN_PATTERN plus the samhq Triton kernels' names (read from the module, so renames follow)."""
    names = []
    try:
        import samhq_fx.kernels.rel_pos_attention as k

        names = [n for n, v in vars(k).items() if type(v).__module__.startswith("triton") and hasattr(v, "run")]
    except Exception:
        pass
    return re.compile("|".join([ATTN_PATTERN] + ["^" + re.escape(n) for n in names]), re.IGNORECASE)


def build_model(attn: str, quick: bool, device: torch.device, size: str = "vit-b", img: int = 1024):
    """SamHQVisionModel of `size` (samhq_fx.models.VIT_SIZES) at image size `img`, or the tiny QUICK_CONFIG one
    (quick)."""
    from transformers import SamHQVisionConfig, SamHQVisionModel

    cfg = SamHQVisionConfig(**QUICK_CONFIG) if quick else image_size.vision_config(size, attn, img)
    cfg.initializer_range = 0.02
    torch.manual_seed(0)
    model = SamHQVisionModel._from_config(cfg, attn_implementation=attn)
    got = type(model.vision_encoder.layers[0].attn).__name__
    if ("Sdpa" in got) != (attn == "sdpa"):
        raise RuntimeError(f"asked for attn_implementation={attn!r}, got {got}")
    return model.to(device).train(), cfg


def make_optimizer(kind: str, model):
    """(the optimizer, its step function) for --optimizer; (None, None) for "none"."""
    if kind == "none":
        return None, None
    if kind == "adamw-fused":
        opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)
        return opt, opt.step
    # compiled optimizer step (PyTorch's recipe): a tensor lr so a change would not recompile, single-tensor
    # kernels for Inductor to fuse, the step compiled once with Inductor's default mode
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(LR), foreach=False)
    return opt, torch.compile(opt.step, backend="inductor")


def run_cell(name: str, batch: int, dtype: str, args, device, attn_re, keep: dict | None = None) -> dict:
    """One cell: build, compile, warm up, time, profile. With `keep` (a dict), the cell's step stays alive in
    keep[(name, batch, dtype)] for the group's timing rounds (rotate), and dynamo's state is left as it is: a reset
    would drop the compiled code of the cells kept before it."""
    import contextlib

    from torch._dynamo.utils import counters

    from samhq_fx.debug import cudagraph_skips

    impl = IMPLS[name]
    row = {"model": args.model, "img": args.img, "impl": name, "attn_implementation": impl.attn, "compiler": impl.backend or "none",
           "mode": impl.mode or "default", "compiled_autograd": impl.compiled_autograd, "optimizer": args.optimizer,
           "recipe": impls.recipe(impl, "model" if not impl.compiled_autograd else "forward_backward")
           + f"; optimizer {args.optimizer}", "batch": batch, "dtype": dtype,
           "status": None, "detail": "", "ms_per_step": None, "peak_mib": None, "compile_s": None, "gpu_busy": None,
           "gpu_ms": None, "host_ms": None,
           "attn_share": None, "step_span_ms": None, "loss": None, "fused": None}
    cuda = device.type == "cuda"
    if keep is None:
        common.reset_compile_state()
    else:
        counters["samhq"].clear()
    common.set_precision(common.DTYPE_PRECISION[dtype])
    model = fn = net = opt_step = skips = None
    breaks0 = sum(counters["graph_break"].values())
    base = torch.cuda.memory_allocated(device) if cuda else 0  # the cells kept alive before this one
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(impls.compiled_autograd(impl))
            skips = stack.enter_context(cudagraph_skips())
            model, cfg = build_model(impl.attn, args.quick, device, args.model, args.img)
            kw = impls.compile_kwargs(impl)
            x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=torch.Generator().manual_seed(batch))
            x = x.to(device)
            g = cfg.image_size // cfg.patch_size
            probe = torch.randn(batch, cfg.output_channels, g, g, generator=torch.Generator().manual_seed(7)).to(device)
            autocast = dtype == "bf16"
            net = torch.compile(model, **kw) if impl.backend and not impl.compiled_autograd else model

            def forward_backward(x):
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                    out = net(pixel_values=x)
                loss = (out.last_hidden_state.float() * probe).mean()
                loss.backward()
                return loss.detach()

            # compiled autograd needs the backward inside the compiled function; elsewhere the model is compiled
            fn = torch.compile(forward_backward, **kw) if impl.compiled_autograd else forward_backward
            opt_step = make_optimizer(args.optimizer, model)[1]  # a bound method: it keeps the optimizer

            def step(_i=0):
                loss = fn(x)
                if opt_step is not None:
                    opt_step()
                return loss

            def zero():
                model.zero_grad(set_to_none=True)  # fresh gradients: under CUDA graphs the last ones are graph outputs
                torch.compiler.cudagraph_mark_step_begin()

            tc = time.perf_counter()
            zero()
            loss = fn(x)  # first step, without the optimizer: its loss and gradients are the check
            row["loss"] = loss.item()  # .item() synchronizes
            # the rel-pos tables get gradient only through attention: a sharp check of the attention backward
            row["rel_pos_grad_norm"] = torch.stack([p.grad.float().norm() for n, p in model.named_parameters()
                                                    if "rel_pos" in n and p.grad is not None]).norm().item()
            if opt_step is not None:
                opt_step()
            common.sync(device)
            row["compile_s"] = round(time.perf_counter() - tc, 3)
            if impl.backend == "samhq":
                row["fused"] = common.samhq_fused_count()
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            for i in range(1, args.warmup):
                zero()
                step()
            common.sync(device)
            times = common.wall_times(step, args.steps, device, flush=None, before=zero)
            row["ms_per_step"] = common.median(times) / 1e3
            row["ms_all"] = [round(t / 1e3, 3) for t in times]
            if cuda:
                row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
            if cuda and args.profile:
                profile_step(row, step, zero, device, attn_re)
            row["status"] = "OK"
            if keep is not None:
                keep[(name, batch, dtype)] = (step, zero)
        except Exception as e:  # compile errors, OOM, ...: record and go on
            row["status"] = "ERROR"
            row["detail"] = f"{type(e).__name__}: {e}"[:2000]
            common.log("    " + "\n    ".join(traceback.format_exc().strip().splitlines()[-6:]))
    row["graph_breaks"] = sum(counters["graph_break"].values()) - breaks0
    if impl.mode == impls.RO and skips is not None:
        row["cudagraph_skips"] = skips.count
        row["cudagraph_skip_reasons"] = skips.reasons[:4]
    if keep is None:  # free the cell's model before the next one (the closures hold these cells)
        model = fn = net = opt_step = None  # noqa: F841
        common.reset_compile_state()
    return row


def rotate(rows: dict, keep: dict, args, device) -> None:
    """Time the kept cells of one (dtype, batch) again in rotation (common.rotate_timings): ms_per_step becomes the
    median of the rounds' medians (the in-cell figure stays as ms_per_step_in_cell), host_ms follows it."""
    by_round = common.rotate_timings(keep, args.steps, device)
    for key, ms in (by_round or {}).items():
        row = rows[key]
        row["ms_per_step_in_cell"], row["ms_per_step_by_round"] = row["ms_per_step"], [round(x, 3) for x in ms]
        row["ms_per_step"] = common.median(ms)
        if row.get("gpu_ms") is not None:
            row["host_ms"] = round(max(0.0, row["ms_per_step"] - row["gpu_ms"]), 3)


def rotating(name: str, args) -> bool:
    """Whether a cell is timed again in rotation: the default-mode compiled cells, outside compiled autograd (whose
    global switch belongs to its own cell)."""
    impl = IMPLS[name]
    return args.rotate and impl.backend is not None and impl.mode is None and not impl.compiled_autograd


def profile_step(row: dict, step, zero, device, attn_re) -> None:
    """One more step under torch.profiler: GPU-busy share, GPU / host ms, attention share, kernel span."""
    spans, kernels, walls = common.kernel_spans(step, 1, device, flush=None, before=zero, walls=True)
    ks = kernels[0] if kernels else []
    total = sum(d for _, d in ks)
    hits: dict[str, float] = {}
    for name, d in ks:
        if attn_re.search(name):
            hits[name[:120]] = hits.get(name[:120], 0.0) + d
    if total:
        row["attn_share"] = round(sum(hits.values()) / total, 4)
        row["gpu_kernel_ms"] = round(total / 1e3, 3)
        row["attn_kernels"] = sorted(([n, round(d / 1e3, 3)] for n, d in hits.items()), key=lambda t: -t[1])[:8]
    if walls and walls[0]:
        row["profiled_wall_ms"] = round(walls[0] / 1e3, 3)
        busy = common.busy_share(ks, walls[0])
        row["gpu_busy"] = None if busy is None else round(busy, 4)
    row.update(common.host_gpu_ms(ks, row["ms_per_step"]))
    if spans and spans[0] is not None:
        row["step_span_ms"] = round(spans[0] / 1e3, 3)


def check_losses(rows: list[dict]) -> None:
    """Relative differences of the first step's loss and rel-pos gradient norm from eager-eager's (else
    eager-sdpa's) of the same (model, batch, dtype); a large difference turns OK into FAIL."""
    for r in rows:
        ref = common.eager_reference(rows, r, GROUP, "loss")
        if r.get("loss") is None or ref is None:
            continue
        for key, out in (("loss", "loss_rel_diff"), ("rel_pos_grad_norm", "grad_rel_diff")):
            if r.get(key) is None or ref.get(key) is None:
                continue
            r[out] = abs(r[key] - ref[key]) / max(abs(ref[key]), 1e-30)
            if r["status"] == "OK" and r[out] > common.DTYPE_TOL[r["dtype"]]:
                r["status"], r["detail"] = "FAIL", f"{key} {r[key]:.6g} vs {ref['impl']} {ref[key]:.6g}"


GROUP = ("model", "img", "dtype", "batch")  # what a summary line and the loss check compare within


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, dtype, batch): the fastest samhq, Inductor and eager rows of this run, samhq's speedup over each."""
    return plot.best_per_family(rows, GROUP, "ms_per_step")


def summarize_by_mode(rows: list[dict]) -> list[dict]:
    """Per (model, dtype, batch, mode): the fastest samhq row against the fastest Inductor row of the same
    mode, either attention class, with the ratio and both sides' host ms and GPU busy (plot.best_by_mode)."""
    return plot.best_by_mode(rows, GROUP, "ms_per_step")


def print_report(rows: list[dict]) -> None:
    order = list(IMPLS)
    rows = sorted(rows, key=lambda r: (r["model"], r["img"], DTYPES.index(r["dtype"]), r["batch"],
                                       order.index(r["impl"]) if r["impl"] in order else len(order)))
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    print()
    common.print_table(
        ["model", "img", "dtype", "batch", "impl", "ms/step", "host_ms", "gpu_ms", "gpu_busy", "peak_MiB", "attn_share",
         "compile_s", "loss_rel",
         "grad_rel", "fused", "cg_skips", "breaks", "status", "detail"],
        [[r["model"], r["img"], r["dtype"], r["batch"], r["impl"], common.fmt(r.get("ms_per_step"), ".2f"),
          common.fmt(r.get("host_ms"), ".2f"), common.fmt(r.get("gpu_ms"), ".2f"), pct(r.get("gpu_busy")),
          common.fmt(r.get("peak_mib")), pct(r.get("attn_share")), common.fmt(r.get("compile_s")),
          common.fmt(r.get("loss_rel_diff"), ".1e"), common.fmt(r.get("grad_rel_diff"), ".1e"),
          common.fmt(r.get("fused"), "d"), common.fmt(r.get("cudagraph_skips"), "d"),
          common.fmt(r.get("graph_breaks"), "d"), r["status"],
          (r.get("detail") or "; ".join(r.get("cudagraph_skip_reasons") or []))[:70]] for r in rows])
    summary = summarize(rows)
    if any("best_samhq" in s for s in summary):
        print("\nbest per family in this run (ms/step; samhq's speedup over the fastest Inductor / eager row):")
        common.print_table(
            ["model", "img", "dtype", "batch", "samhq", "ms", "inductor", "ms", "eager", "ms", "vs_inductor", "vs_eager"],
            [[s["model"], s["img"], s["dtype"], s["batch"], s.get("best_samhq", "-"), common.fmt(s.get("best_samhq_ms_per_step"), ".2f"),
              s.get("best_inductor", "-"), common.fmt(s.get("best_inductor_ms_per_step"), ".2f"),
              s.get("best_eager", "-"), common.fmt(s.get("best_eager_ms_per_step"), ".2f"),
              common.fmt(s.get("samhq_speedup_vs_inductor"), ".2f"), common.fmt(s.get("samhq_speedup_vs_eager"), ".2f")]
             for s in summary])
    sys.stdout.flush()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default=None, help=f"comma list from {', '.join(IMPLS)} "
                    f"(default: {','.join(DEFAULT_IMPLS)}; 'all' = every one)")
    ap.add_argument("--model", default="vit-b", choices=MODELS,
                    help="SAM-HQ image encoder size (samhq_fx.models.VIT_SIZES; default vit-b); --quick: the tiny one")
    ap.add_argument("--img", type=int, default=None, choices=image_size.IMAGE_SIZES,
                    help="image size the model is built for and fed at (default 1024; not with --quick)")
    ap.add_argument("--modes", default=None,
                    help="comma list of default,reduce-overhead (or ro): only the compiled impls of these modes "
                         "(the uncompiled eager baselines stay); default both")
    ap.add_argument("--batch", default="1,4", help="comma list of batch sizes (default 1,4)")
    ap.add_argument("--dtype", default="tf32,bf16", help="comma list of tf32,bf16,fp32 (default tf32,bf16)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per cell")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up steps per cell, the first (compiling) one included")
    common.add_run_args(ap, HARNESS, profile="the profiled step (GPU-busy and attention shares)", chart="train_step.png")
    ap.add_argument("--optimizer", default="adamw-fused", choices=OPTIMIZERS,
                    help="the step's optimizer (default adamw-fused: torch.optim.AdamW(fused=True))")
    ap.add_argument("--no-rotate", dest="rotate", action="store_false",
                    help="time each default-mode compiled cell once, right after its compile, instead of again in "
                         "rotation with the others of its dtype and batch (rotate())")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke test: tiny config, batch 1, tf32, eager-eager + samhq-eager, 1 warm-up + 1 step")
    common.add_cell_args(ap, "dtype/batch/impl")
    args = ap.parse_args(argv)
    parsed = common.parse_cells(ap, args.cells, "dtype/batch/impl")
    if parsed:
        cells, (args.dtype, args.batch, args.impls) = parsed
        args.cells = {(impl, int(b), d) for d, b, impl in cells}
    if args.quick and args.img is not None:
        ap.error("--img: --quick builds the tiny model, at its own image size")
    args.img = QUICK_CONFIG["image_size"] if args.quick else args.img or 1024
    if args.quick:
        args.steps, args.warmup, args.batch, args.dtype, args.model = 1, 1, "1", "tf32", "tiny"
        args.impls = args.impls or ",".join(QUICK_IMPLS)
    args.impls = impls.parse(args.impls, DEFAULT_IMPLS)
    args.impls = impls.filter_modes(args.impls, args.modes)
    bad = [d for d in args.dtype.split(",") if d not in DTYPES]
    if bad:
        raise SystemExit(f"unknown dtypes {bad}; dtypes: {', '.join(DTYPES)}")
    args.batch = tuple(int(b) for b in args.batch.split(","))
    args.dtype = tuple(args.dtype.split(","))
    args.warmup, args.steps = max(1, args.warmup), max(1, args.steps)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    # the budget's estimates per impl and batch: a batch-4 compile takes about twice a batch-1 one
    device, budget, env, meta = common.start_run(args, {f"{i}/{b}": prior_s(i, b, args.model) for i in args.impls
                                                      for b in args.batch})
    t0 = budget.t0
    common.log(f"train_step on {env['device']}: torch {env['torch']}, transformers {env['transformers']}; "
               f"model {args.model} at {args.img}px; impls {','.join(args.impls)}; batch {args.batch}; {','.join(args.dtype)}; "
               f"samhq backend registered: {common.samhq_available()}", t0)
    if device.type == "cuda" and args.profile:
        common.check_profiler(device)
    attn_re = attention_regex()
    # finished rows of the same optimizer (older rows: none) and GPU are kept for the checks, other models' too;
    # this model's are done
    rows = [r for r in plot.normalize_rows(common.load_rows(args.resume))
            if r.get("status") in common.DONE_STATUSES and r.get("optimizer", "none") == args.optimizer
            and r["gpu"] == meta["gpu"]]
    done = {(r["impl"], r["batch"], r["dtype"]): r for r in rows if (r["model"], r["img"]) == (args.model, args.img)}
    resumed = len(rows)
    skipped: list[dict] = []
    path = common.results_path(HARNESS, args.out, default=not args.quick)

    def finish(new: list[dict]) -> None:
        """Check the new rows against their eager reference, then append them."""
        check_losses(rows)
        common.append_rows(path, new)

    if args.gpus > 1:
        todo = [(i, b, d) for d in args.dtype for b in args.batch for i in args.impls
                if (i, b, d) not in done and (not args.cells or (i, b, d) in args.cells)]
        child = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--time-budget", str(args.time_budget),
                 "--no-chart", "--device", "cuda", "--optimizer", args.optimizer, "--model", args.model,
                 "--img", str(args.img)] + ([] if args.profile else ["--no-profile"])
        shares = common.shard([f"{d}/{b}/{i}" for i, b, d in todo], lambda c: prior_s(c.split("/")[2], int(c.split("/")[1]), args.model),
                              args.gpus)
        got = common.run_on_gpus(os.path.abspath(__file__), shares, child,
                                 timeout=args.time_budget + 300 if args.time_budget else None, t0=t0)
        rows += got
        finish(got)
        finished = {(r["impl"], r["batch"], r["dtype"]) for r in got}
        skipped += [{"model": args.model, "impl": i, "batch": b, "dtype": d} for i, b, d in todo if (i, b, d) not in finished]
        done.update({c: None for c in todo})  # every cell had its GPU: nothing left for the serial loop below

    for dtype in args.dtype:
        if dtype == "bf16" and device.type == "cpu":
            common.log("bf16 autocast on CPU is not benchmarked; skipping", t0)
            continue
        for batch in args.batch:
            # eager cells first (eager-eager, the checks' reference, before all), then reduce-overhead and
            # compiled-autograd cells, one at a time; then the default-mode compiled cells, kept alive and timed again
            # in rotation (--rotate; rotate())
            keep: dict = {}
            group_rows: dict = {}
            common.reset_compile_state()
            with common.recompile_limit_patch():
                for impl in sorted(args.impls, key=lambda i: (rotating(i, args), IMPLS[i].backend is not None,
                                                              i != "eager-eager")):  # stable within each kind
                    if (impl, batch, dtype) in done or (args.cells and (impl, batch, dtype) not in args.cells):
                        continue
                    if not budget.fits(f"{impl}/{batch}"):
                        skipped.append({"model": args.model, "impl": impl, "batch": batch, "dtype": dtype})
                        continue
                    tcell = time.perf_counter()
                    row = run_cell(impl, batch, dtype, args, device, attn_re, keep if rotating(impl, args) else None)
                    row["cell_s"] = round(time.perf_counter() - tcell, 2)
                    row = {**meta, **row, "steps": args.steps, "warmup": args.warmup}
                    budget.record(f"{impl}/{batch}", row["cell_s"])
                    rows.append(row)
                    group_rows[(impl, batch, dtype)] = row
                    if not rotating(impl, args):
                        finish([row])
                    common.log(f"{args.model} {args.img}px {dtype} B={batch} {impl:15s} {row['status']:5s} "
                               f"{common.fmt(row['ms_per_step'], '.2f'):>8s} ms/step  "
                               f"host {common.fmt(row['host_ms'], '.2f')} ms  "
                               f"busy {common.fmt(None if row['gpu_busy'] is None else 100 * row['gpu_busy'])}%  "
                               f"peak {common.fmt(row['peak_mib']):>8s} MiB  "
                               f"attn {common.fmt(None if row['attn_share'] is None else 100 * row['attn_share'])}%  "
                               f"compile {common.fmt(row['compile_s'])} s"
                               + (f"  fused {row['fused']}" if row.get("fused") is not None else "")
                               + (f"  [{row['detail'][:100]}]" if row["detail"] else ""), t0)
                if len(keep) > 1:
                    rotate(group_rows, keep, args, device)
                    for key in (k for k in keep if "ms_per_step_by_round" in group_rows[k]):
                        common.log(f"{args.model} {args.img}px {dtype} B={batch} {key[0]:15s} rotated "
                                   + " ".join(f"{x:.2f}" for x in group_rows[key]["ms_per_step_by_round"])
                                   + " ms/step", t0)
                finish([r for (impl, _, _), r in group_rows.items() if rotating(impl, args)])
            keep.clear()
            common.reset_compile_state()

    check_losses(rows)
    result = {"results": rows, "summary": summarize(rows), "summary_by_mode": summarize_by_mode(rows),
              "skipped": skipped}
    if args.chart and path:
        for msg in plot.train_chart(rows, os.path.dirname(os.path.abspath(path))):
            common.log(msg, t0)
    print_report(rows)
    print(f"\nremaining (skipped for the time budget): {len(skipped)}", flush=True)
    if skipped:
        out = path or "ROWS.jsonl"
        print(f"resume with: python {os.path.relpath(__file__)} --resume {out} --out {out} --model {args.model} --img {args.img} "
              f"--impls {','.join(args.impls)} "
              f"--batch {','.join(map(str, args.batch))} --dtype {','.join(args.dtype)} --optimizer {args.optimizer}", flush=True)
    common.log(f"appended {len(rows) - resumed} rows to {path}" if path else "--quick without --out: no rows written", t0)
    plot.print_summary_by_mode(result["summary_by_mode"])
    return result


if __name__ == "__main__":
    main()
