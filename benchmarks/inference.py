"""Inference benchmark: SAM-HQ ViT-B/L/H image encoder (or the whole SamHQModel), forward only, per implementation.

Model: transformers' SamHQModel with a vision encoder of --model's size (samhq_fx.models.sam_hq_config(full=True,
size=...): "vit-b", the default, "vit-l" or "vit-h", VIT_SIZES), built for and fed images of --img (1024, SAM's, the
default; 512, 256: an img/16-square patch grid, benchmarks/image_size.py); --quick: the small CPU model,
sam_hq_config(full=False), recorded as model "tiny" at its own image size; random weights
(samhq_fx.models.random_init_), .eval(), every call under torch.no_grad().  --target encoder (default)
times model.vision_encoder(pixel_values) -- the image embeddings, where all rel-pos attention and nearly all
FLOPs are; --target model times model(pixel_values, input_boxes=one box per image, multimask_output=False).
Precision: "tf32" = fp32 weights with torch.set_float32_matmul_precision("high"); "bf16" = the model and input
cast to bfloat16 (inference keeps no fp32 master weights, so no autocast); "fp32" (only when named) = fp32 at
PyTorch's default precision, "highest" (true fp32 GEMMs; samhq's kernels run 3-pass TF32 dots).
Implementations (benchmarks/impls.py; each row's "recipe" says how it was built): eager-sdpa (HF's default
class), eager-eager, inductor (default mode) and inductor-ro (mode="reduce-overhead", CUDA graphs) on the
"sdpa" class, the same two on the "eager" class (inductor-eager, inductor-eager-ro), samhq-eager, samhq-sdpa,
samhq-eager-ro, samhq-sdpa-ro (impls.COMPARED, with the two eager baselines: the default set).  --modes default /
--modes reduce-overhead (or ro) keeps only the compiled impls of that mode (the eager baselines, the check's
reference, stay).  Every compile is dynamic=False, fresh per cell.

Every row records its "model" and "img"; rows of different models or image sizes are never compared (summaries, the
check and merge keys include both), and rows without them are read as "vit-b" at 1024.
Per (model, img, target, dtype, batch, impl) cell, all cells of a (target, dtype, batch) group in one process (host-bound
timings from different processes are not comparable; --gpus N splits whole groups over N GPUs):
  latency ms   median over --iters calls after --warmup calls (the first compiles; reduce-overhead records its
               graph in the next ones), CUDA events around the call, torch.compiler.cudagraph_mark_step_begin()
               before each (untimed). Default-mode compiled cells are kept alive and timed again after the group's
               last cell, 3 rounds that each time every such cell in turn: their latency is the median of those
               rounds (latency_ms_by_round; the first timing stays as latency_ms_in_cell), because the first
               build timed in a process runs slower on the host (--no-rotate: the first timing only);
  images/s     batch / latency;
  peak MiB     torch.cuda.max_memory_allocated() over the warm-up after the first call and the timed calls
               (weights, activations and any CUDA-graph pool together), less what was allocated when the cell
               started (the cells kept alive before it);
  GPU busy     one more call under torch.profiler: sum of its GPU records' durations / its wall on the GPU
               (common.busy_share);
  gpu_ms, host_ms  from that profiled call: gpu_ms = the sum of its GPU records' durations (kernels, memcpy,
               memset; the numerator of GPU busy), host_ms = latency - gpu_ms, clipped at 0: the part of a call
               the GPU waited for the host (launches, Python, guards) rather than computed (None without the
               profile: CPU, --no-profile);
  check        (out.float() * probe).mean() of the first call, relative difference from eager-eager's (else
               eager-sdpa's) of the same group: FAIL above common.DTYPE_TOL (tf32 1e-2, bf16 1e-1, fp32 1e-3);
  cudagraph_skips (reduce-overhead cells), graph_breaks, fused (samhq cells).
Summaries, over the OK rows of the run:
  "summary"          per group: the fastest samhq, Inductor and eager rows (any mode) and samhq's speedup over each
                     (plot.best_per_family);
  "summary_by_mode"  per (model, img, target, dtype, batch, mode): the fastest samhq row against the fastest Inductor row
                     of the SAME mode (either attention class), the ratio Inductor latency / samhq latency and both
                     sides' host_ms and gpu_busy (plot.best_by_mode), printed last as one line each, e.g.
                     "vit-b 1024px encoder bf16 b1 default: samhq-eager 4.9 ms vs inductor-eager 8.5 ms: 1.73x
                     (host 1.2 / 2.3 ms, busy 88% / 93%)" ("-" where not measured).

  python benchmarks/inference.py                          # encoder, tf32+bf16, batch 1+8, 10 impls, 480 s budget
  python benchmarks/inference.py --model vit-l --batch 1  # SAM-HQ's ViT-L encoder
  python benchmarks/inference.py --img 256 --batch 1,32   # 256x256 images: a 16x16 grid, 4 windows per image
  python benchmarks/inference.py --modes default          # default-mode builds (and the eager baselines) only
  python benchmarks/inference.py --gpus 2                 # the 4 (dtype, batch) groups over 2 GPUs
  python benchmarks/inference.py --quick                  # CPU smoke test (small model), used in CI
Appends one row per cell to benchmarks/results/inference.jsonl (or --out) as the cell finishes (a default-mode
compiled cell timed again in rotation: after its group), each starting with common.row_meta (commit, date, GPU,
versions); draws inference.png beside it (if matplotlib) and prints a table last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import common  # noqa: E402
import image_size  # noqa: E402
import impls  # noqa: E402
import plot  # noqa: E402

IMPLS = {n: i for n, i in impls.IMPLS.items() if not i.compiled_autograd and not i.options}  # no backward here
QUICK_IMPLS = ("eager-eager", "samhq-eager")
DTYPES = tuple(common.DTYPE_PRECISION)
TARGETS = ("encoder", "model")
MODELS = ("vit-b", "vit-l", "vit-h")  # samhq_fx.models.VIT_SIZES; --quick records "tiny"
PRIORS = {n: 5 if i.backend is None else 45 for n, i in IMPLS.items()}  # forward-only compiles: guess, H200 host
HARNESS = "inference"  # its rows: benchmarks/results/inference.jsonl


def build(attn: str, quick: bool, device: torch.device, dtype: str, size: str = "vit-b", img: int | None = 1024):
    """SamHQModel with the `size` encoder at image size `img`, or the small CPU one (quick), random weights."""
    from transformers import SamHQModel

    from samhq_fx.models import random_init_, sam_hq_config

    cfg = sam_hq_config(attn) if quick else image_size.sam_hq_config(attn, size, img)
    model = random_init_(SamHQModel(cfg))
    got = type(model.vision_encoder.layers[0].attn).__name__
    if ("Sdpa" in got) != (attn == "sdpa"):
        raise RuntimeError(f"asked for attn_implementation={attn!r}, got {got}")
    return model.to(device=device, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32).eval()


def run_cell(key: tuple, args, device, keep: dict | None = None) -> dict:
    """One cell: build, compile, warm up, time, profile. With `keep` (a dict), the compiled call stays alive in
    keep[key] for the group's timing rounds (rotate), and dynamo's state is left as it is: a reset would drop the
    compiled code of the cells kept before it."""
    from torch._dynamo.utils import counters

    from samhq_fx.debug import cudagraph_skips

    target, dtype, batch, name = key
    impl = IMPLS[name]
    what = "model.vision_encoder" if target == "encoder" else "model"
    row = {"model": args.model, "img": args.img, "target": target, "dtype": dtype, "batch": batch, "impl": name, "attn_implementation": impl.attn,
           "compiler": impl.backend or "none", "mode": impl.mode or "default", "recipe": impls.recipe(impl, what),
           "status": None, "detail": "", "latency_ms": None, "images_per_s": None, "peak_mib": None,
           "gpu_busy": None, "gpu_ms": None, "host_ms": None, "compile_s": None, "check": None, "fused": None}
    cuda = device.type == "cuda"
    if keep is None:
        common.reset_compile_state()
    else:
        counters["samhq"].clear()
    common.set_precision(common.DTYPE_PRECISION[dtype])
    model = fn = skips = None
    breaks0 = sum(counters["graph_break"].values())
    base = torch.cuda.memory_allocated(device) if cuda else 0  # the cells kept alive before this one
    try:
        with cudagraph_skips() as skips, torch.no_grad():
            model = build(impl.attn, args.quick, device, dtype, args.model, args.img)
            cfg = model.config.vision_config
            row["img"] = cfg.image_size
            gen = torch.Generator().manual_seed(batch)
            x = torch.randn(batch, 3, cfg.image_size, cfg.image_size, generator=gen).to(device, model.dtype)
            boxes = (torch.tensor([[[0.2, 0.2, 0.7, 0.6]]]) * cfg.image_size).repeat(batch, 1, 1).to(device)
            module = model.vision_encoder if target == "encoder" else model
            fn = torch.compile(module, **impls.compile_kwargs(impl)) if impl.backend else module

            def call(_i=0):
                if target == "encoder":
                    return fn(pixel_values=x).last_hidden_state
                return fn(pixel_values=x, input_boxes=boxes, multimask_output=False).pred_masks

            before = torch.compiler.cudagraph_mark_step_begin
            tc = time.perf_counter()
            before()
            out = call()
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(device)
            row["check"] = (out.float() * probe).mean().item()  # synchronizes
            row["compile_s"] = round(time.perf_counter() - tc, 3)
            del out  # under CUDA graphs the next replay overwrites it
            row["fused"] = common.samhq_fused_count() if impl.backend == "samhq" else None
            if cuda:
                torch.cuda.reset_peak_memory_stats(device)
            for _ in range(1, args.warmup):
                before()
                call()
            common.sync(device)
            times = common.wall_times(call, args.iters, device, flush=None, before=before)
            row["latency_ms"] = common.median(times) / 1e3
            row["images_per_s"] = float(f"{batch / (row['latency_ms'] / 1e3):.4g}")  # 4 digits, also below 10/s (CPU)
            if cuda:
                row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
            if cuda and args.profile:
                _, kernels, walls = common.kernel_spans(call, 1, device, before=before, walls=True)
                ks = kernels[0] if kernels else []
                busy = common.busy_share(ks, walls[0] if walls else None)
                row["gpu_busy"] = None if busy is None else round(busy, 4)
                row.update(common.host_gpu_ms(ks, row["latency_ms"]))
        row["status"] = "OK"
        if keep is not None:
            keep[key] = (call, before)
    except Exception as e:  # compile errors, OOM, ...: record and go on
        row["status"] = "ERROR"
        row["detail"] = f"{type(e).__name__}: {e}"[:2000]
        common.log("    " + "\n    ".join(traceback.format_exc().strip().splitlines()[-6:]))
    row["graph_breaks"] = sum(counters["graph_break"].values()) - breaks0
    if impl.mode == impls.RO and skips is not None:
        row["cudagraph_skips"], row["cudagraph_skip_reasons"] = skips.count, skips.reasons[:4]
    if keep is None:  # free the model before the next cell (a kept cell's call still reads model and fn)
        model = fn = None  # noqa: F841
        common.reset_compile_state()
    return row


def rotate(rows: dict, keep: dict, args, device) -> None:
    """Time the kept cells of one group again in rotation (common.rotate_timings): latency_ms becomes the median of
    the rounds' medians (the in-cell figure stays as latency_ms_in_cell), host_ms follows it."""
    with torch.no_grad():  # as in the cell: grad mode is part of what the compiled code guards on
        by_round = common.rotate_timings(keep, args.iters, device)
    for key, lat in (by_round or {}).items():
        row = rows[key]
        row["latency_ms_in_cell"], row["latency_ms_by_round"] = row["latency_ms"], [round(x, 4) for x in lat]
        row["latency_ms"] = common.median(lat)
        row["images_per_s"] = float(f"{row['batch'] / (row['latency_ms'] / 1e3):.4g}")
        if row.get("gpu_ms") is not None:
            row["host_ms"] = round(max(0.0, row["latency_ms"] - row["gpu_ms"]), 3)


GROUP = ("model", "img", "target", "dtype", "batch")  # what a summary line and the check compare within
CELL = ("target", "dtype", "batch", "impl")  # a cell of this run (its model is --model)


def check_outputs(rows: list[dict]) -> None:
    """Each row's check value against eager-eager's (else eager-sdpa's) of its group; too far: FAIL."""
    for r in rows:
        ref = common.eager_reference(rows, r, GROUP, "check")
        if r.get("check") is None or ref is None:
            continue
        r["check_rel_diff"] = abs(r["check"] - ref["check"]) / max(abs(ref["check"]), 1e-30)
        if r["status"] == "OK" and r["check_rel_diff"] > common.DTYPE_TOL[r["dtype"]]:
            r["status"], r["detail"] = "FAIL", f"check {r['check']:.6g} vs {ref['impl']} {ref['check']:.6g}"


def summarize(rows: list[dict]) -> list[dict]:
    """Per group: the fastest samhq, Inductor and eager rows of this run, samhq's speedup over each."""
    return plot.best_per_family(rows, GROUP, "latency_ms")


def summarize_by_mode(rows: list[dict]) -> list[dict]:
    """Per (model, target, dtype, batch, mode): the fastest samhq row against the fastest Inductor row of the same
    mode, either attention class, with the ratio and both sides' host ms and GPU busy (plot.best_by_mode)."""
    return plot.best_by_mode(rows, GROUP, "latency_ms")


def print_report(rows: list[dict]) -> None:
    order = list(IMPLS)
    rows = sorted(rows, key=lambda r: (r["model"], r["img"] or 0, r["target"], DTYPES.index(r["dtype"]), r["batch"], order.index(r["impl"])))
    print()
    common.print_table(
        ["model", "img", "target", "dtype", "batch", "impl", "latency_ms", "images/s", "host_ms", "gpu_ms", "gpu_busy",
         "peak_MiB", "compile_s",
         "check_rel", "fused", "cg_skips", "breaks", "status", "detail"],
        [[r["model"], r["img"], r["target"], r["dtype"], r["batch"], r["impl"],
          common.fmt(r.get("latency_ms"), ".2f"), common.fmt(r.get("images_per_s")), common.fmt(r.get("host_ms"), ".2f"),
          common.fmt(r.get("gpu_ms"), ".2f"), "-" if r.get("gpu_busy") is None else f"{100 * r['gpu_busy']:.1f}%",
          common.fmt(r.get("peak_mib")), common.fmt(r.get("compile_s")), common.fmt(r.get("check_rel_diff"), ".1e"),
          common.fmt(r.get("fused"), "d"), common.fmt(r.get("cudagraph_skips"), "d"),
          common.fmt(r.get("graph_breaks"), "d"), r["status"],
          (r.get("detail") or "; ".join(r.get("cudagraph_skip_reasons") or []))[:70]] for r in rows])
    summary = summarize(rows)
    if any("best_samhq" in s for s in summary):
        print("\nbest per family in this run (latency ms; samhq's speedup over the fastest Inductor / eager row):")
        common.print_table(
            ["model", "img", "target", "dtype", "batch", "samhq", "ms", "inductor", "ms", "vs_inductor", "vs_eager"],
            [[s["model"], s["img"], s["target"], s["dtype"], s["batch"], s.get("best_samhq", "-"), common.fmt(s.get("best_samhq_latency_ms"), ".2f"),
              s.get("best_inductor", "-"), common.fmt(s.get("best_inductor_latency_ms"), ".2f"),
              common.fmt(s.get("samhq_speedup_vs_inductor"), ".2f"), common.fmt(s.get("samhq_speedup_vs_eager"), ".2f")]
             for s in summary])
    sys.stdout.flush()


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", default=None, help=f"comma list from {', '.join(IMPLS)} (default all of them)")
    ap.add_argument("--model", default="vit-b", choices=MODELS,
                    help="SAM-HQ image encoder size (samhq_fx.models.VIT_SIZES; default vit-b); --quick: the small one")
    ap.add_argument("--img", type=int, default=None, choices=image_size.IMAGE_SIZES,
                    help="image size the model is built for and fed at (default 1024; not with --quick)")
    ap.add_argument("--target", default="encoder", help="comma list of encoder,model (default encoder)")
    ap.add_argument("--modes", default=None,
                    help="comma list of default,reduce-overhead (or ro): only the compiled impls of these modes "
                         "(the uncompiled eager baselines stay); default both")
    ap.add_argument("--batch", default="1,8", help="comma list of batch sizes (default 1,8)")
    ap.add_argument("--dtype", default="tf32,bf16", help="comma list of tf32,bf16,fp32 (default tf32,bf16)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per cell")
    ap.add_argument("--warmup", type=int, default=3, help="warm-up calls per cell, the first (compiling) one included")
    common.add_run_args(ap, HARNESS, resume=False, profile="the GPU-busy profile", chart="inference.png")
    ap.add_argument("--no-rotate", dest="rotate", action="store_false",
                    help="time each default-mode compiled cell once, right after its compile, instead of again in "
                         "rotation with the group's others (rotate())")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke test: small model, batch 1, tf32, eager-eager + samhq-eager, 1 call each")
    common.add_cell_args(ap, "dtype/batch/impl")
    args = ap.parse_args(argv)
    parsed = common.parse_cells(ap, args.cells, "dtype/batch/impl")
    if parsed:
        cells, (args.dtype, args.batch, args.impls) = parsed
        args.cells = {(d, int(b), i) for d, b, i in cells}
    if args.quick and args.img is not None:
        ap.error("--img: --quick builds the small model, at its own image size")
    args.img = None if args.quick else args.img or 1024  # the small model's: recorded from its config
    if args.quick:
        args.iters, args.warmup, args.batch, args.dtype, args.model = 1, 1, "1", "tf32", "tiny"
        args.impls = args.impls or ",".join(QUICK_IMPLS)
    args.impls = impls.parse(args.impls, tuple(IMPLS), IMPLS)
    args.impls = impls.filter_modes(args.impls, args.modes, IMPLS)
    args.target = tuple(args.target.split(","))
    args.dtype = tuple(args.dtype.split(","))
    bad = [t for t in args.target if t not in TARGETS] + [d for d in args.dtype if d not in DTYPES]
    if bad:
        raise SystemExit(f"unknown {bad}; targets: {', '.join(TARGETS)}; dtypes: {', '.join(DTYPES)}")
    args.batch = tuple(int(b) for b in args.batch.split(","))
    args.warmup, args.iters = max(1, args.warmup), max(1, args.iters)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, budget, env, meta = common.start_run(args, PRIORS)
    t0 = budget.t0
    common.log(f"inference on {env['device']}: torch {env['torch']}; model {args.model} at "
               f"{args.img or 'its own size'}px; impls {','.join(args.impls)}; "
               f"targets {args.target}; batch {args.batch}; {','.join(args.dtype)}", t0)
    if device.type == "cuda" and args.profile:
        common.check_profiler(device)
    todo = [(t, d, b, i) for t in args.target for d in args.dtype for b in args.batch for i in args.impls
            if not args.cells or (d, b, i) in args.cells]
    if device.type == "cpu" and any(d == "bf16" for _, d, _, _ in todo):
        common.log("bf16 on CPU is not benchmarked; skipping those cells", t0)
        todo = [c for c in todo if c[1] != "bf16"]
    rows: list[dict] = []
    skipped: list[dict] = []
    path = common.results_path(HARNESS, args.out, default=not args.quick)

    def finish(new: list[dict]) -> None:
        """Check the new rows against their eager reference, then append them."""
        check_outputs(rows)
        common.append_rows(path, new)

    if args.gpus > 1:  # whole groups per GPU, so each group's impls are timed in one process
        if args.target != ("encoder",):
            raise SystemExit("--gpus with --target model: run one target per invocation")
        cells = [f"{d}/{b}/{i}" for _, d, b, i in todo]
        shares = common.shard_groups(cells, lambda c: PRIORS[c.split("/")[2]], args.gpus,
                                     group=lambda c: c.rsplit("/", 1)[0])
        child = ["--iters", str(args.iters), "--warmup", str(args.warmup), "--time-budget", str(args.time_budget),
                 "--no-chart", "--device", "cuda", "--model", args.model,
                 "--img", str(args.img)] + ([] if args.profile else ["--no-profile"])
        rows += common.run_on_gpus(os.path.abspath(__file__), shares, child,
                                   timeout=args.time_budget + 300 if args.time_budget else None, t0=t0)
        finish(rows)
        done = {(r["target"], r["dtype"], r["batch"], r["impl"]) for r in rows}
        skipped += [dict(zip(CELL, c), model=args.model) for c in todo if c not in done]
        todo = []
    # Per group (target, dtype, batch): eager cells first (eager-eager, the check's reference, before all), then
    # reduce-overhead cells, one at a time; then the default-mode compiled cells, kept alive and timed again in
    # rotation (--rotate; rotate()).
    groups: dict[tuple, list] = {}
    for key in todo:
        groups.setdefault(key[:3], []).append(key)
    rotating = lambda key: args.rotate and IMPLS[key[3]].backend is not None and IMPLS[key[3]].mode is None  # noqa: E731
    for cells in groups.values():
        keep: dict = {}
        group_rows: dict = {}
        common.reset_compile_state()
        with common.recompile_limit_patch():
            for key in sorted(cells, key=lambda k: (rotating(k), IMPLS[k[3]].backend is not None, k[3] != "eager-eager")):
                if not budget.fits(key[3]):
                    skipped.append(dict(zip(CELL, key), model=args.model))
                    continue
                tcell = time.perf_counter()
                row = run_cell(key, args, device, keep if rotating(key) else None)
                row["cell_s"] = round(time.perf_counter() - tcell, 2)
                row = {**meta, **row, "iters": args.iters, "warmup": args.warmup}
                budget.record(key[3], row["cell_s"])
                rows.append(row)
                group_rows[key] = row
                if not rotating(key):
                    finish([row])
                common.log(f"{args.model} {row['img']}px {key[0]} {key[1]} B={key[2]} {key[3]:18s} {row['status']:5s} "
                           f"{common.fmt(row['latency_ms'], '.2f'):>8s} ms  {common.fmt(row['images_per_s']):>8s} img/s  "
                           f"host {common.fmt(row['host_ms'], '.2f')} ms  "
                           f"peak {common.fmt(row['peak_mib']):>8s} MiB  compile {common.fmt(row['compile_s'])} s"
                           + (f"  [{row['detail'][:100]}]" if row["detail"] else ""), t0)
            if len(keep) > 1:
                rotate(group_rows, keep, args, device)
                for key in (k for k in keep if "latency_ms_by_round" in group_rows[k]):
                    common.log(f"{args.model} {key[0]} {key[1]} B={key[2]} {key[3]:18s} rotated "
                               + " ".join(f"{x:.2f}" for x in group_rows[key]["latency_ms_by_round"]) + " ms", t0)
            finish([r for key, r in group_rows.items() if rotating(key)])
        keep.clear()
        common.reset_compile_state()
    check_outputs(rows)
    result = {"results": rows, "summary": summarize(rows), "summary_by_mode": summarize_by_mode(rows),
              "skipped": skipped}
    if args.chart and path:
        for msg in plot.inference_chart(rows, os.path.dirname(os.path.abspath(path))):
            common.log(msg, t0)
    print_report(rows)
    print(f"\nremaining (skipped for the time budget): {len(skipped)}", flush=True)
    common.log(f"appended {len(rows)} rows to {path}" if path else "--quick without --out: no rows written", t0)
    plot.print_summary_by_mode(result["summary_by_mode"])
    return result


if __name__ == "__main__":
    main()
