"""SOL-ExecBench L2/076 runner: backward of one SAM-HQ ViT-B attention layer, per workload x implementation.

The problem (layer, 16 workloads, inputs, correctness rule) is definition.py beside this file; this file times it.
The timed function is the benchmark's: given grad_output and the 7 inputs, forward + torch.autograd.grad
-> 7 gradients (`definition.layer_backward`), the same Python for every implementation; only the layer differs:

  eager                      definition.attention_layer (explicit softmax)
  eager-sdpa                 same layer, attention by F.scaled_dot_product_attention(attn_mask=dense [B,12,N,N] bias)
  inductor                   torch.compile(layer)                                   (default mode)
  inductor-max-autotune      torch.compile(layer, mode="max-autotune-no-cudagraphs")
  inductor-reduce-overhead   torch.compile(layer, mode="reduce-overhead")           (CUDA graphs)
  flex                       torch.compile(FlexAttention layer); score_mod adds rel_h[b,h,q,kv//W] + rel_w[b,h,q,kv%W]
                             (captured tensors, so their gradients flow)
  samhq                      torch.compile(layer, backend="samhq"): on a Hopper GPU Inductor compiles and launches
                             the kernels (the op's triton_op registration; "samhq.triton_op" "auto")
  samhq-reduce-overhead      torch.compile(layer, backend="samhq", mode="reduce-overhead"): CUDA graphs replay the
                             opaque op, which launches the kernels itself ("auto" under CUDA graphs)
  samhq-opaque               torch.compile(layer, backend="samhq", options={"samhq.triton_op": False}): the same
                             kernels, launched by the opaque op without CUDA graphs

What is compiled: the layer (forward) only, with dynamic=False, fresh per workload and precision.  AOTAutograd
compiles its backward, which torch.autograd.grad then runs, so every compiled implementation compiles exactly
the same region (forward and backward of the layer) and the driver code around it is identical eager Python
for all of them.  (Dynamo does not put torch.autograd.grad itself inside a graph.)

Method, per (precision, workload, implementation) cell:
  1. torch._dynamo.reset(); set torch.set_float32_matmul_precision; build the implementation.
  2. first call (compiles; its time is reported as compile_s).  Peak-memory statistics reset after it.
  3. warm-up calls (--warmup counts the first call), rotating over --input-sets input sets.
  4. correctness: one call on a separate, fresh input set; definition.check against a float64 reference
     (the eager layer on the same values in fp64, on the same device).  FAIL/ERROR cells keep their
     numbers in the JSON but are excluded from the suite means.
  5. wall time: --iters calls; before each, L2 flush (write 2x L2 bytes) and a device synchronize; CUDA
     events right before/after the call.  Median reported.
  6. kernel span: --iters more calls under torch.profiler (CUPTI), same flush + sync; span = first GPU kernel
     start to last GPU kernel end of the call (marker kernels separate calls; the flush is outside; see
     common.kernel_spans).  Median reported.  This is the headline latency.
  7. peak MiB = torch.cuda.max_memory_allocated() over steps 3-6 minus memory_allocated() after step 2,
     i.e. the extra memory one forward+backward needs on top of the resident inputs (it includes the 7
     gradient outputs, and the CUDA-graph pool of the reduce-overhead variants, allocated when the graph
     is recorded during warm-up).
For the reduce-overhead variants torch.compiler.cudagraph_mark_step_begin() is called before every call
(outside the timed window) and the checked outputs are cloned before the next replay can overwrite them;
copying fresh inputs into the graph's static buffers is part of their call, as it would be in use.  Their
rows carry cudagraph_skips (graphs Inductor refused to capture; >0 means the variant ran without graphs).

Run time: compiling dominates (guess for an H200 host: ~5-30 s per compiled cell, a minute or more for
max-autotune on large shapes; samhq under "highest" also runs slowly, see benchmarks/DECISIONS.md).  A full matrix does
not fit one 10-minute window, so the run is budgeted (--time-budget, default 480 s: a cell is started only
if its estimate -- the longest earlier cell of that implementation -- still fits) and resumable:
  python benchmarks/sol076/compare_impls.py --workloads rep        # 4 representative workloads, ~one window
  python benchmarks/sol076/compare_impls.py                        # precision high, all 16 x 8; cut at 480 s
  python benchmarks/sol076/compare_impls.py --out /tmp/r.jsonl --resume /tmp/r.jsonl   # run only the missing
                                                                # cells; repeat until "remaining: 0"
  python benchmarks/sol076/compare_impls.py --precision all ...    # highest, high, medium
  python benchmarks/sol076/compare_impls.py --gpus 2 ...           # split the cells over 2 GPUs of this host (one
                                                                # process each, timed at the same time, merged)
  --impls fast drops inductor-max-autotune (the slowest to compile).
Each cell's row is appended to benchmarks/results/sol076.jsonl (or --out) as it finishes (a killed run keeps what
it finished), starting with common.row_meta (commit, date, GPU, versions); a chart per precision,
sol076_<precision>.png beside it (matplotlib, if importable), and a table printed last; benchmarks/plot.py redraws
them from the rows.
`--quick` is the CPU smoke test used in CI: workload 7x7x1, eager + inductor + samhq, one call each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: common, plot
sys.path.insert(0, HERE)  # definition

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
import plot  # noqa: E402
import definition  # noqa: E402

try:
    from torch.nn.attention.flex_attention import flex_attention
except ImportError:  # very old torch: the flex implementation then reports an ERROR row
    flex_attention = None

IMPLS = ("eager", "eager-sdpa", "inductor", "inductor-reduce-overhead", "flex", "samhq", "samhq-reduce-overhead",
         "samhq-opaque", "inductor-max-autotune")  # the slowest to compile last, so a budget cut loses it first
IMPL_GROUPS = {"all": IMPLS, "fast": tuple(i for i in IMPLS if i != "inductor-max-autotune")}
CUDAGRAPH_IMPLS = ("inductor-reduce-overhead", "samhq-reduce-overhead")
# (backend, mode, options) for the implementations that compile definition.attention_layer itself
COMPILED = {
    "inductor": ("inductor", None, None),
    "inductor-max-autotune": ("inductor", "max-autotune-no-cudagraphs", None),
    "inductor-reduce-overhead": ("inductor", "reduce-overhead", None),
    "samhq": ("samhq", None, None),
    "samhq-reduce-overhead": ("samhq", "reduce-overhead", None),
    "samhq-opaque": ("samhq", None, {"samhq.triton_op": False}),
}
PRECISIONS = ("highest", "high", "medium")
# CI smoke: the smallest benchmark workload (one: on a 2-core CPU Inductor needs ~15-25 s per workload), and a
# tinier extra one that --workloads can name (same atol as 7x7x1).
QUICK_WORKLOADS = {(7, 7, 1): definition.WORKLOADS[(7, 7, 1)]}
EXTRA_WORKLOADS = {(4, 4, 2): definition.WORKLOADS[(7, 7, 1)]}
# --workloads rep: one per regime -- tiny, SAM's 14x14 windows (batch = windows), mid, SAM ViT-B global at 1024
WORKLOAD_GROUPS = {"rep": ((7, 7, 1), (14, 14, 8), (32, 32, 4), (64, 64, 4))}
QUICK_IMPLS = ("eager", "inductor", "samhq")
# Guessed seconds for a first cell of each implementation (H200 host), so the budget does not start a cell
# that cannot finish; replaced by the measured duration after each cell.
PRIORS = {"eager": 3, "eager-sdpa": 3, "inductor": 20, "inductor-reduce-overhead": 20, "flex": 30,
          "samhq": 20, "samhq-reduce-overhead": 20, "samhq-opaque": 20, "inductor-max-autotune": 90}
HARNESS = "sol076"  # its rows: benchmarks/results/sol076.jsonl


# ---------------------------------------------------------------------------------------------- layers
def _qkv_rel(hidden_states, qkv_weight, qkv_bias, rel_pos_h, rel_pos_w):
    """q, k, v as [B, heads, N, 64] and the decomposed rel-pos terms rel_h [B,heads,N,H], rel_w [B,heads,N,W],
    computed exactly as definition.attention_layer computes them (same ops, same order)."""
    B, H, W, _ = hidden_states.shape
    N = H * W
    qkv = F.linear(hidden_states, qkv_weight, qkv_bias).reshape(B, N, 3, definition.HEADS, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.unbind(0)
    r_q = q.reshape(B, definition.HEADS, H, W, -1)
    rel_h = torch.einsum("bnhwc,hkc->bnhwk", r_q, definition.get_rel_pos(H, H, rel_pos_h))
    rel_w = torch.einsum("bnhwc,wkc->bnhwk", r_q, definition.get_rel_pos(W, W, rel_pos_w))
    return q, k, v, rel_h.reshape(B, definition.HEADS, N, H), rel_w.reshape(B, definition.HEADS, N, W)


def _proj(out, proj_weight, proj_bias, B, H, W):
    # [B, heads, N, 64] -> [B, H, W, heads*64], heads-major channels as in the reference layer
    return F.linear(out.permute(0, 2, 1, 3).reshape(B, H, W, -1), proj_weight, proj_bias)


def sdpa_layer(hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w, scale=definition.SCALE):
    """The layer with attention by SDPA and the rel-pos terms expanded to a dense [B, 12, N, N] bias (what
    HF's SamHQVisionSdpaAttention does)."""
    B, H, W, _ = hidden_states.shape
    q, k, v, rel_h, rel_w = _qkv_rel(hidden_states, qkv_weight, qkv_bias, rel_pos_h, rel_pos_w)
    N = H * W
    bias = (rel_h.view(B, definition.HEADS, N, H, 1) + rel_w.view(B, definition.HEADS, N, 1, W)).view(B, definition.HEADS, N, N)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
    return _proj(out, proj_weight, proj_bias, B, H, W)


def flex_layer(hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w, scale=definition.SCALE):
    """The layer with FlexAttention; the rel-pos terms enter through score_mod as captured tensors (never
    expanded to N x N), so their gradients flow back through the captured-buffer gradient path."""
    B, H, W, _ = hidden_states.shape
    q, k, v, rel_h, rel_w = _qkv_rel(hidden_states, qkv_weight, qkv_bias, rel_pos_h, rel_pos_w)

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + rel_h[b, h, q_idx, kv_idx // W] + rel_w[b, h, q_idx, kv_idx % W]

    out = flex_attention(q, k, v, score_mod=score_mod, scale=scale)
    return _proj(out, proj_weight, proj_bias, B, H, W)


def build_layer(impl: str):
    """The layer callable for one implementation (compiled lazily by torch.compile on first call)."""
    if impl == "eager":
        return definition.attention_layer
    if impl == "eager-sdpa":
        return sdpa_layer
    if impl == "flex":
        return torch.compile(flex_layer, dynamic=False)
    if impl in COMPILED:
        backend, mode, options = COMPILED[impl]
        return torch.compile(definition.attention_layer, backend=backend, mode=mode, options=options, dynamic=False)
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")


# ---------------------------------------------------------------------------------------------- data
def wl_name(wl) -> str:
    return "x".join(map(str, wl))


def parse_workloads(spec: str, quick: bool) -> dict:
    table = QUICK_WORKLOADS if quick else definition.WORKLOADS
    if spec in ("all", ""):
        return dict(table)
    if spec in WORKLOAD_GROUPS:
        return {wl: definition.WORKLOADS[wl] for wl in WORKLOAD_GROUPS[spec]}
    known = {**definition.WORKLOADS, **EXTRA_WORKLOADS}
    out = {}
    for item in spec.split(","):
        wl = tuple(int(x) for x in item.lower().strip().split("x"))
        if wl not in known:
            raise SystemExit(f"unknown workload {item!r} (HxWxB); known: {', '.join(map(wl_name, known))}")
        out[wl] = known[wl]
    return out


def parse_list(spec: str, universe, groups: dict | None = None, what: str = "item") -> tuple:
    if groups and spec in groups:
        return tuple(groups[spec])
    items = tuple(s.strip() for s in spec.split(",") if s.strip())
    bad = [s for s in items if s not in universe]
    if bad:
        raise SystemExit(f"unknown {what} {bad}; choose from {', '.join(universe)}" +
                         (f" or {', '.join(groups)}" if groups else ""))
    return items


class WorkloadData:
    """Input sets for timing, a separate fresh set for the check, and the float64 reference gradients."""

    def __init__(self, wl, atol: float, device: torch.device, n_sets: int):
        H, W, B = wl
        self.atol = atol
        seed = H * 10_000 + W * 100 + B

        def draw(k):
            return definition.make_inputs(H, W, B, device=device, generator=torch.Generator().manual_seed(seed * 16 + k))

        self.sets = [draw(k) for k in range(n_sets)]
        self.check = draw(15)  # never timed
        self.ref = definition.float64_gradients(*self.check)


# ---------------------------------------------------------------------------------------------- one cell
def run_cell(impl: str, wl, precision: str, data: WorkloadData, args, device, flusher, t0) -> dict:
    row = {"workload": wl_name(wl), "H": wl[0], "W": wl[1], "B": wl[2], "impl": impl, "precision": precision,
           "status": None, "detail": "", "span_us": None, "wall_us": None, "peak_mib": None, "compile_s": None,
           "fused": None, "n_kernels": None}
    cuda = device.type == "cuda"
    common.reset_compile_state()
    common.set_precision(precision)
    layer = None
    try:
        layer = build_layer(impl)
        before = torch.compiler.cudagraph_mark_step_begin if (impl in CUDAGRAPH_IMPLS and cuda) else None
        sets = data.sets

        def call(i):
            return definition.layer_backward(*sets[i % len(sets)], layer=layer)

        # Inductor counts graphs it refused to CUDA-graph (then a reduce-overhead variant is not what it says)
        from torch._dynamo.utils import counters

        skips0 = counters["inductor"]["cudagraph_skips"]
        # first call: compiles (if the implementation compiles)
        tc = time.perf_counter()
        if before:
            before()
        call(0)
        common.sync(device)
        row["compile_s"] = round(time.perf_counter() - tc, 3)
        if impl.startswith("samhq"):
            row["fused"] = common.samhq_fused_count()
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        for i in range(1, args.warmup):
            if before:
                before()
            call(i)
        common.sync(device)

        # correctness on the fresh check inputs; clone before anything can overwrite CUDA-graph outputs
        if before:
            before()
        got = [g.detach().clone() for g in definition.layer_backward(*data.check, layer=layer)]
        ok, why = definition.check(got, data.ref, data.atol)
        del got
        row["status"], row["detail"] = ("PASS" if ok else "FAIL"), why

        walls = common.wall_times(call, args.iters, device, flusher, before)
        row["wall_us"] = common.median(walls)
        row["wall_us_all"] = [round(x, 2) for x in walls]
        if cuda and args.profile:
            spans, kernels = common.kernel_spans(call, args.iters, device, flusher, before)
            row["span_us"] = common.median(spans)
            row["span_us_all"] = [None if s is None else round(s, 2) for s in spans]
            if kernels and kernels[-1]:
                row["n_kernels"] = len(kernels[-1])
                row["kernels_last_call"] = [(n[:160], round(d, 2)) for n, d in kernels[-1]]
        if cuda:
            row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
        if impl.startswith("samhq"):
            row["fused"] = common.samhq_fused_count()
        if before:
            row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips0
    except Exception as e:  # one implementation's failure (compile error, OOM, ...) must not end the run
        row["status"] = "ERROR"
        row["detail"] = f"{type(e).__name__}: {e}"[:2000]
        tb = traceback.format_exc().strip().splitlines()
        common.log("    " + "\n    ".join(tb[-6:]))
    finally:
        del layer
        common.reset_compile_state()
    return row


# ---------------------------------------------------------------------------------------------- report
metric = plot.metric  # headline latency: kernel span on CUDA, wall time on CPU


def summarize(rows: list[dict]) -> dict:
    """plot.sol076_summary, implementations in IMPLS order."""
    order = {i: k for k, i in enumerate(IMPLS)}
    return {p: dict(sorted(d.items(), key=lambda kv: order.get(kv[0], len(order))))
            for p, d in plot.sol076_summary(rows).items()}


def print_report(rows: list[dict], summary: dict, skipped: list[dict]) -> None:
    order = {i: k for k, i in enumerate(IMPLS)}
    wl_order = {wl_name(w): k for k, w in enumerate(list(definition.WORKLOADS) + list(EXTRA_WORKLOADS))}
    rows = sorted(rows, key=lambda r: (PRECISIONS.index(r["precision"]), wl_order.get(r["workload"], 99),
                                       order.get(r["impl"], 99)))
    print()
    common.print_table(
        ["precision", "workload", "impl", "span_us", "wall_us", "peak_MiB", "compile_s", "fused", "status", "detail"],
        [[r["precision"], r["workload"], r["impl"], common.fmt(r.get("span_us")), common.fmt(r.get("wall_us")),
          common.fmt(r.get("peak_mib")), common.fmt(r.get("compile_s")), common.fmt(r.get("fused"), "d"),
          r["status"], "" if r["status"] == "PASS" else (r.get("detail") or "")[:70]] for r in rows])
    print("\nsuite (latency = kernel span on CUDA, wall time on CPU; mean over PASS workloads; "
          "geomean speedup vs eager over workloads both passed)")
    common.print_table(
        ["precision", "impl", "pass/n", "mean_us", "speedup_vs_eager"],
        [[p, i, f"{s['n_pass']}/{s['n']}", common.fmt(s["mean_us"]),
          common.fmt(s["geomean_speedup_vs_eager"], ".2f") + (f" ({s['n_compared']})" if s["n_compared"] else "")]
         for p, d in summary.items() for i, s in d.items()])
    # fused attention blocks per samhq cell: 1 expected (the layer has one attention); list the exceptions
    groups: dict = {}
    for r in rows:
        if r["impl"].startswith("samhq") and r["status"] != "ERROR":
            groups.setdefault((r["precision"], r["impl"]), []).append((r["workload"], r.get("fused") or 0))
    if groups:
        print("\nsamhq fused attention blocks (counters['samhq']['fused']):")
        for (p, i), cells in groups.items():
            other = [f"{w}={f}" for w, f in cells if f != 1]
            print(f"  {p} {i}: 1 in {len(cells) - len(other)}/{len(cells)} workloads" +
                  (f"; {', '.join(other)}" if other else ""))
    print(f"\nremaining (skipped for the time budget): {len(skipped)}", flush=True)


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="all", help="comma list of HxWxB (e.g. 64x64x4,7x7x1), 'all' (the 16), or 'rep' (7x7x1,14x14x8,32x32x4,64x64x4)")
    ap.add_argument("--impls", default=None,
                    help=f"comma list from {', '.join(IMPLS)}, or 'all' (default) / 'fast' (all but max-autotune)")
    ap.add_argument("--precision", default="high",
                    help="float32 matmul precision(s): comma list of highest,high,medium, or 'all' (default: high)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per cell, for wall time and again for spans")
    ap.add_argument("--warmup", type=int, default=10, help="warm-up calls per cell, the first (compiling) one included")
    ap.add_argument("--input-sets", type=int, default=4, help="input sets the calls rotate over")
    common.add_run_args(ap, HARNESS, profile="the kernel-span pass", chart="sol076_<precision>.png")
    ap.add_argument("--no-flush", dest="flush", action="store_false", help="do not flush L2 before calls")
    ap.add_argument("--quick", action="store_true",
                    help="CPU smoke test: workload 7x7x1, impls eager,inductor,samhq, 1 warm-up + 1 timed call")
    common.add_cell_args(ap, "precision/HxWxB/impl")
    args = ap.parse_args(argv)
    parsed = common.parse_cells(ap, args.cells, "precision/HxWxB/impl")
    if parsed:
        cells, (args.precision, args.workloads, args.impls) = parsed
        args.cells = set(cells)
    if args.quick:
        args.iters, args.warmup, args.input_sets = 1, 1, 1
        args.impls = args.impls or ",".join(QUICK_IMPLS)
    args.impls = parse_list(args.impls or "all", IMPLS, IMPL_GROUPS, "implementation")
    args.precision = parse_list(args.precision, PRECISIONS, {"all": PRECISIONS}, "precision")
    args.workloads = parse_workloads(args.workloads, args.quick)
    args.warmup = max(1, args.warmup)
    args.iters = max(1, args.iters)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, budget, env, meta = common.start_run(args, PRIORS)
    t0 = budget.t0
    common.log(f"sol076 on {env['device']}: torch {env['torch']}, triton {env['triton']}; "
               f"{len(args.workloads)} workloads x {len(args.impls)} impls x {len(args.precision)} precisions; "
               f"budget {args.time_budget or 'none'} s; samhq backend registered: {common.samhq_available()}", t0)
    if device.type == "cuda" and args.profile:
        common.check_profiler(device)  # before any CUDA graph is captured
    flusher = common.L2Flusher(device, args.flush)

    done = {(r["precision"], r["workload"], r["impl"]): r for r in common.load_rows(args.resume)
            if r.get("status") in common.DONE_STATUSES}
    rows = list(done.values())
    resumed = len(rows)
    skipped: list[dict] = []
    path = common.results_path(HARNESS, args.out, default=not args.quick)
    config = {"iters": args.iters, "warmup": args.warmup, "input_sets": args.input_sets, "flush": args.flush}

    if args.gpus > 1:
        todo = [(p, wl_name(w), i) for p in args.precision for w in args.workloads for i in args.impls
                if (p, wl_name(w), i) not in done and (not args.cells or (p, wl_name(w), i) in args.cells)]
        child = ["--iters", str(args.iters), "--warmup", str(args.warmup), "--input-sets", str(args.input_sets),
                 "--time-budget", str(args.time_budget), "--no-chart", "--device", "cuda"]
        child += ([] if args.profile else ["--no-profile"]) + ([] if args.flush else ["--no-flush"])
        # one workload's cells stay on one GPU: its inputs and float64 reference are built once there
        shares = common.shard_groups(["/".join(c) for c in todo], lambda c: PRIORS[c.split("/")[2]], args.gpus,
                                     group=lambda c: c.rsplit("/", 1)[0])
        got = common.run_on_gpus(os.path.abspath(__file__), shares, child,
                                 timeout=args.time_budget + 300 if args.time_budget else None, t0=t0)
        rows += got
        common.append_rows(path, got)
        finished = {(r["precision"], r["workload"], r["impl"]) for r in got}
        skipped += [dict(zip(("precision", "workload", "impl"), c)) for c in todo if c not in finished]
        done.update({c: None for c in todo})  # every cell had its GPU: nothing left for the serial loop below

    for prec in args.precision:
        for wl, atol in args.workloads.items():
            todo = [i for i in args.impls if (prec, wl_name(wl), i) not in done
                    and (not args.cells or (prec, wl_name(wl), i) in args.cells)]
            data = None
            for impl in todo:
                if not budget.fits(impl):
                    skipped.append({"precision": prec, "workload": wl_name(wl), "impl": impl})
                    continue
                tcell = time.perf_counter()
                if data is None:
                    try:
                        data = WorkloadData(wl, atol, device, args.input_sets)
                    except Exception as e:  # e.g. OOM in the fp64 reference: record for every impl, go on
                        err = f"reference: {type(e).__name__}: {e}"[:2000]
                        common.log(f"{prec} {wl_name(wl)}: {err}", t0)
                        failed = [{**meta, "workload": wl_name(wl), "H": wl[0], "W": wl[1], "B": wl[2], "impl": i,
                                   "precision": prec, "status": "ERROR", "detail": err, **config}
                                  for i in todo[todo.index(impl):]]
                        rows += failed
                        common.append_rows(path, failed)
                        break
                row = run_cell(impl, wl, prec, data, args, device, flusher, t0)
                row["cell_s"] = round(time.perf_counter() - tcell, 2)
                row = {**meta, **row, **config}
                budget.record(impl, row["cell_s"])
                rows.append(row)
                common.append_rows(path, [row])
                common.log(f"{prec:7s} {wl_name(wl):8s} {impl:25s} {row['status']:5s} "
                           f"span {common.fmt(row['span_us']):>9s} us  wall {common.fmt(row['wall_us']):>9s} us  "
                           f"peak {common.fmt(row['peak_mib']):>8s} MiB  compile {common.fmt(row['compile_s'])} s"
                           + (f"  fused {row['fused']}" if row.get("fused") is not None else "")
                           + ("" if row["status"] == "PASS" else f"  [{row['detail'][:100]}]"), t0)
            del data
            common.reset_compile_state()

    result = {"results": rows, "summary": summarize(rows), "skipped": skipped}
    if args.chart and path:
        for msg in plot.sol076_charts(rows, os.path.dirname(os.path.abspath(path))):
            common.log(msg, t0)
    print_report(rows, result["summary"], skipped)
    if skipped:
        out = path or "ROWS.jsonl"
        print(f"resume with: python {os.path.relpath(__file__)} --resume {out} --out {out} "
              f"--precision {','.join(args.precision)} --impls {','.join(args.impls)} "
              f"--workloads {','.join(w for w in map(wl_name, args.workloads) if any(s['workload'] == w for s in skipped))}",
              flush=True)
    common.log(f"appended {len(rows) - resumed} rows to {path}" if path else "--quick without --out: no rows written", t0)
    return result


if __name__ == "__main__":
    main()
