"""SOL-ExecBench L2/076 timed by the benchmark's own rules: the leaderboard entry against the other paths.

Implementations (all in one process, per precision and workload):
  solution                   entry.make_solution(): sol076_backward compiled whole with
                             mode="reduce-overhead", fullgraph=True -- one CUDA graph per call, no autograd
  solution-opaque            the same with the opaque registration of the fused op (kernels launched from
                             inside the op, the operand copies with them) instead of the triton_op one
  solution-combo             the entry with Inductor's combo_kernels (independent small kernels fused side by
                             side into one launch); untried on the GPU, so not in the default set
  solution-chunked           the entry with max_rows=2**16: the batch in chunks of whole images, so that
                             the intermediates of one chunk at a time set the peak (64x64x4: 4 chunks;
                             32x32x8 and 16x16x32: 2); untried on the GPU, so not in the default set
  solution-bf16              the entry with compute="bf16": every GEMM and the attention kernels on bf16
                             operands (fp32 accumulation), fp32 gradients out; the benchmark checks the
                             outputs' tolerance, not the precision used inside, so it runs under any setting
  solution-bf16-chunked      solution-bf16 with max_rows=2**17 (the peak-memory variant: of the 16 workloads
                             only 64x64x4 is split, in two chunks of two images)
  solution-bf16-nocg         solution-bf16 compiled without CUDA graphs (Inductor's default mode): no copy of
                             the inputs into a graph's static buffers, at the price of launching each kernel
                             from the host (which the GPU hides only where its kernels are long)
  solution-bf16-staged       solution-bf16 with staged=True: the inputs cast to bf16 by one kernel into the
                             graph's own buffers (entry_stage.py), then one replay of a CUDA graph captured
                             by hand (no graph trees: no input copies, no casts inside the graph), the
                             independent gradient GEMMs and sums on two low-priority streams inside it, the
                             main branch at a higher priority (the fastest entry: 537 us "high" mean, 2026-12-01)
  solution-bf16-staged-1s    solution-bf16-staged with everything on one stream
  samhq-reduce-overhead      what users get: torch.compile(layer, backend="samhq", mode="reduce-overhead")
                             + torch.autograd.grad (compare_impls.py's build, the same Python call)
  inductor-reduce-overhead   torch.compile(layer, mode="reduce-overhead") + torch.autograd.grad
  eager                      definition.attention_layer + torch.autograd.grad

The benchmark's rules (README.md beside this file), per cell:
  * 10 warm-up calls (the first compiles; its time is compile_s), then the median of 50 timed calls;
  * before each call the L2 is flushed (common.L2Flusher writes twice the L2 size) and the device synced;
  * inputs at fresh addresses for each call: every call gets its own copy of the input set, all made
    before the cell starts (so no copy, allocation or free is near a timed call, and no two calls of a
    cell share an address; CUDA-graph builds copy them into their static buffers inside the call, as they
    would in use);
  * latency = first kernel start to last kernel end of the call (torch.profiler / CUPTI, the marker
    scheme of common.kernel_spans), so idle gaps between kernels count; kernels per call from the same
    trace (kernels, memcpy and memset records), and the last timed call's list of them (kernels_last_call:
    name, duration and start in us from the call's first record, which places its gaps);
  * correctness: after the warm-up, one call on a separately drawn input set, checked with definition.check
    (per output: finite, >= 99% within atol + 1e-3 |ref|) against the float64 eager layer.
  peak_mib = max_memory_allocated over the warm-up and timed calls minus memory_allocated after the first
  call (the extra memory a call needs beyond its inputs; CUDA-graph pools are recorded after it, so
  they count). On CPU there is no profiler: wall time (perf_counter) instead of span, no peak.

Run time on an H200 host (2026-12-01: 15-20 s per compiled cell, compile included; a few s for eager): ~60 s
per workload for the default five implementations (the staged entry's cells take ~5-10 s), ~15 minutes for 16 workloads in one precision, so split
the implementations over calls. --time-budget (default 500 s) skips cells that would not finish (listed, and in the JSON).

  python benchmarks/sol076/time_entry.py --precision high --out $OUT      # 16 workloads x 5, one precision
  python benchmarks/sol076/time_entry.py --quick --out $OUT               # CPU smoke test (CI): 4x4x2, eager + solution
  python benchmarks/sol076/time_entry.py --resume $OUT --out $OUT         # only the cells not yet run
Appends each cell's row to benchmarks/results/sol076_entry.jsonl (or --out: a .jsonl file, or a directory for
<dir>/sol076_entry.jsonl) as it finishes, starting with common.row_meta (commit, date, GPU, versions); prints the
per-workload table (markdown), the suite means and the targets last.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # benchmarks/: common
sys.path.insert(0, HERE)  # definition, compare_impls, the entry

import torch  # noqa: E402

import common  # noqa: E402
import compare_impls as bench  # noqa: E402
import definition  # noqa: E402
import entry  # noqa: E402

IMPLS = ("solution", "inductor-reduce-overhead", "samhq-reduce-overhead", "eager", "solution-opaque",
         "solution-combo", "solution-chunked", "solution-bf16", "solution-bf16-chunked", "solution-bf16-nocg",
         "solution-bf16-staged", "solution-bf16-staged-1s")
# the fastest entry (staged), the precision-following one (solution), and the three paths they are measured against
DEFAULT_IMPLS = ("solution-bf16-staged", "solution") + IMPLS[1:4]
CUDAGRAPH_IMPLS = ("solution", "solution-opaque", "solution-combo", "solution-chunked", "solution-bf16",
                   "solution-bf16-chunked", "solution-bf16-staged", "solution-bf16-staged-1s",
                   "inductor-reduce-overhead", "samhq-reduce-overhead")
SOLUTIONS = {"solution": {}, "solution-opaque": {"fused": "opaque"},  # make_solution() arguments
             "solution-combo": {"options": {"combo_kernels": True}},
             "solution-chunked": {"max_rows": 2**16}, "solution-bf16": {"compute": "bf16"},
             "solution-bf16-chunked": {"compute": "bf16", "max_rows": 2**17},
             "solution-bf16-nocg": {"compute": "bf16", "mode": "default"},
             "solution-bf16-staged": {"compute": "bf16", "staged": True},
             "solution-bf16-staged-1s": {"compute": "bf16", "staged": True, "side_streams": False}}
PRIORS = {"solution": 12, "solution-opaque": 10, "solution-combo": 12, "solution-chunked": 20, "solution-bf16": 12,
          "solution-bf16-chunked": 20, "solution-bf16-nocg": 12, "solution-bf16-staged": 12,
          "solution-bf16-staged-1s": 12,
          "inductor-reduce-overhead": 12,
          "samhq-reduce-overhead": 8, "eager": 3}
# targets printed for these
ENTRIES = ("solution", "solution-bf16", "solution-bf16-staged", "solution-bf16-staged-1s", "solution-bf16-chunked",
           "solution-chunked")
HARNESS = "sol076_entry"  # its rows: benchmarks/results/sol076_entry.jsonl
WARMUP, ITERS = 10, 50  # the benchmark's counts
# Targets from the issue (H200): checked and printed under the table
TARGETS = {"high_mean_us": 600, "highest_mean_us": 2500, "span_7x7x1_us": 60, "peak_64x64x4_mib": 700}


def build(impl: str):
    """call(inputs) -> the 7 gradients, for one implementation (compiled lazily on the first call)."""
    if impl in SOLUTIONS:
        solution = entry.make_solution(**SOLUTIONS[impl])
        return lambda inputs: solution(*inputs)
    layer = bench.build_layer(impl)
    return lambda inputs: definition.layer_backward(*inputs, layer=layer)


def fresh_copies(inputs, n: int) -> list[list[torch.Tensor]]:
    """n copies of one input set, each at its own addresses (leaves requiring grad where the set's do)."""
    return [[t.detach().clone().requires_grad_(t.requires_grad) for t in inputs] for _ in range(n)]


def run_cell(impl, wl, precision, data, copies, device, flusher, args) -> dict:
    row = {"workload": bench.wl_name(wl), "impl": impl, "precision": precision, "status": None, "detail": "",
           "span_us": None, "wall_us": None, "n_kernels": None, "peak_mib": None, "compile_s": None}
    cuda = device.type == "cuda"
    common.reset_compile_state()
    common.set_precision(precision)
    fn = None
    try:
        fn = build(impl)
        before = torch.compiler.cudagraph_mark_step_begin if (impl in CUDAGRAPH_IMPLS and cuda) else None
        from torch._dynamo.utils import counters

        skips0, graphs0 = counters["inductor"]["cudagraph_skips"], counters["stats"]["unique_graphs"]

        def call(i):
            return fn(copies[i])

        def flush_and_step():
            flusher()
            if before:
                before()

        tc = time.perf_counter()
        flush_and_step()
        call(0)
        common.sync(device)
        row["compile_s"] = round(time.perf_counter() - tc, 3)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        for i in range(1, args.warmup):
            flush_and_step()
            call(i)
        common.sync(device)

        # correctness on the separately drawn set; clone before a replay can overwrite CUDA-graph outputs
        if before:
            before()
        got = [g.detach().clone() for g in fn(data.check)]
        ok, why = definition.check(got, data.ref, data.atol)
        del got
        row["status"], row["detail"] = ("PASS" if ok else "FAIL"), why

        timed = lambda i: call(args.warmup + i)  # noqa: E731  (copies never used by an earlier call)
        if cuda:
            # flush + sync happen before the opening marker (common.kernel_spans), outside the span
            spans, kernels = common.kernel_spans(timed, args.iters, device, flusher, before, starts=True)
            row["span_us"] = common.median(spans)
            row["span_us_all"] = [None if s is None else round(s, 2) for s in spans]
            counts = [len(k) for k in kernels if k]
            row["n_kernels"] = common.median(counts) if counts else None
            if kernels and kernels[-1]:
                # (name, duration us, start us from the call's first kernel): the gaps can be placed
                row["kernels_last_call"] = [(n[:120], round(t, 2), round(t0, 2)) for n, t, t0 in kernels[-1]]
            row["peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / 2**20, 1)
        else:
            row["wall_us"] = common.median(common.wall_times(timed, args.iters, device, flusher, before))
        row["graphs"] = counters["stats"]["unique_graphs"] - graphs0  # Dynamo graphs over the cell (solution: 1)
        if before:  # > 0: Inductor refused to capture, so the cell ran without CUDA graphs
            row["cudagraph_skips"] = counters["inductor"]["cudagraph_skips"] - skips0
    except Exception as e:  # one implementation's failure must not end the run
        row["status"] = "ERROR"
        row["detail"] = f"{type(e).__name__}: {e}"[:2000]
        common.log("    " + "\n    ".join(traceback.format_exc().strip().splitlines()[-6:]))
    finally:
        del fn
        common.reset_compile_state()
    return row


def latency(row):
    return row.get("span_us") if row.get("span_us") is not None else row.get("wall_us")


def summarize(rows: list[dict]) -> dict:
    """Per precision and implementation: mean latency over its PASS workloads, and against Inductor RO."""
    out: dict = {}
    for prec in dict.fromkeys(r["precision"] for r in rows):
        pr = [r for r in rows if r["precision"] == prec]
        ind = {r["workload"]: latency(r) for r in pr
               if r["impl"] == "inductor-reduce-overhead" and r["status"] == "PASS"}
        out[prec] = {}
        for impl in [i for i in IMPLS if any(r["impl"] == i for r in pr)]:
            ok = [r for r in pr if r["impl"] == impl and r["status"] == "PASS" and latency(r) is not None]
            n = sum(r["impl"] == impl for r in pr)
            out[prec][impl] = {
                "n": n, "n_pass": len(ok),
                "mean_us": sum(map(latency, ok)) / len(ok) if ok else None,
                "faster_than_inductor_ro": sum(latency(r) < ind[r["workload"]] for r in ok if r["workload"] in ind),
                "n_compared": sum(r["workload"] in ind for r in ok),
            }
    return out


def targets(rows: list[dict], summary: dict, impl: str = "solution") -> list[tuple[str, object, bool | None]]:
    """(target, measured value, met?) for the issue's targets, for `impl`; None where not measured."""
    def cell(prec, wl, key):
        r = [r for r in rows
             if (r["precision"], r["workload"], r["impl"]) == (prec, wl, impl) and r["status"] == "PASS"]
        return latency(r[0]) if r and key == "latency" else (r[0].get(key) if r else None)

    def full(prec):  # a suite mean counts only when every workload of the suite passed
        s = summary.get(prec, {}).get(impl)
        return s["mean_us"] if s and s["n_pass"] == len(definition.WORKLOADS) else None

    out = []
    for name, value, limit in (
            (f"'high' mean <= {TARGETS['high_mean_us']} us", full("high"), TARGETS["high_mean_us"]),
            (f"'highest' mean <= {TARGETS['highest_mean_us']} us", full("highest"), TARGETS["highest_mean_us"]),
            (f"7x7x1 span <= {TARGETS['span_7x7x1_us']} us ('high')", cell("high", "7x7x1", "latency"),
             TARGETS["span_7x7x1_us"]),
            (f"64x64x4 peak <= {TARGETS['peak_64x64x4_mib']} MiB ('high')", cell("high", "64x64x4", "peak_mib"),
             TARGETS["peak_64x64x4_mib"])):
        out.append((name, value, None if value is None else value <= limit))
    for prec, d in summary.items():
        s = d.get(impl)
        if s and s["n_compared"]:
            out.append((f"faster than Inductor RO on every workload ('{prec}')",
                        f"{s['faster_than_inductor_ro']}/{s['n_compared']}",
                        s["faster_than_inductor_ro"] == s["n_compared"] == len(definition.WORKLOADS)))
        if s:
            out.append((f"every cell passes ('{prec}')", f"{s['n_pass']}/{s['n']}", s["n_pass"] == s["n"]))
    return out


def markdown(rows, summary) -> str:
    """benchmarks/README.md table: per workload, each implementation's span us / kernels per call / peak MiB."""
    order = [bench.wl_name(w) for w in list(definition.WORKLOADS) + list(bench.EXTRA_WORKLOADS)]
    lines = []
    for prec, d in summary.items():
        impls = list(d)
        by = {(r["workload"], r["impl"]): r for r in rows if r["precision"] == prec}
        lines += [f"'{prec}': latency us (kernel span; wall time on CPU) / kernels per call / peak MiB", "",
                  "| workload | " + " | ".join(impls) + " |",
                  "|---" * (len(impls) + 1) + "|"]
        for w in [w for w in order if any((w, i) in by for i in impls)]:
            cells = []
            for i in impls:
                r = by.get((w, i))
                cells.append("-" if r is None else r["status"] if r["status"] != "PASS" else
                             f"{common.fmt(latency(r), '.0f')} / {common.fmt(r.get('n_kernels'), '.0f')} / "
                             f"{common.fmt(r.get('peak_mib'), '.0f')}")
            lines.append(f"| {w} | " + " | ".join(cells) + " |")
        lines.append("| mean (PASS) | " + " | ".join(common.fmt(d[i]["mean_us"], ".0f") for i in impls) + " |")
        lines.append("")
    return "\n".join(lines)


def print_report(rows, summary, skipped) -> None:
    """The markdown table per precision (benchmarks/README.md), each implementation's suite line, the targets."""
    print()
    print(markdown(rows, summary))
    for prec, d in summary.items():
        print(f"'{prec}', mean over PASS workloads:")
        common.print_table(["impl", "pass/n", "mean_us", "faster than Inductor RO"],
                           [[i, f"{s['n_pass']}/{s['n']}", common.fmt(s["mean_us"], ".0f"),
                             f"{s['faster_than_inductor_ro']}/{s['n_compared']}"] for i, s in d.items()])
        print()
    for impl in [i for i in ENTRIES if any(r["impl"] == i for r in rows)]:
        print(f"targets ({impl}):")
        for name, value, met in targets(rows, summary, impl):
            print(f"  {name:50s} {common.fmt(value, '.0f') if not isinstance(value, str) else value:>10s}  "
                  f"{'MET' if met else 'missed' if met is False else 'not measured'}")
    print(f"remaining (skipped for the time budget): {len(skipped)}", flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="all", help="comma list of HxWxB, 'all' (the 16) or 'rep'")
    ap.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help=f"comma list from {', '.join(IMPLS)}")
    ap.add_argument("--precision", default="high", help="comma list of highest,high,medium, or 'all'")
    ap.add_argument("--warmup", type=int, default=WARMUP, help="warm-up calls, the compiling one included")
    ap.add_argument("--iters", type=int, default=ITERS, help="timed calls")
    common.add_run_args(ap, HARNESS, budget=500.0)
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: 4x4x2, eager + solution, 2 + 2 calls")
    args = ap.parse_args(argv)
    if args.quick:
        args.warmup, args.iters = 2, 2
        args.workloads = "4x4x2" if args.workloads == "all" else args.workloads
        args.impls = "eager,solution" if args.impls == ",".join(DEFAULT_IMPLS) else args.impls
    args.impls = bench.parse_list(args.impls, IMPLS, None, "implementation")
    args.precision = bench.parse_list(args.precision, bench.PRECISIONS, {"all": bench.PRECISIONS}, "precision")
    args.workloads = bench.parse_workloads(args.workloads, False)
    args.warmup, args.iters = max(1, args.warmup), max(1, args.iters)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    device, budget, env, meta = common.start_run(args, PRIORS)
    t0 = budget.t0
    common.log(f"sol076 exact rules on {env['device']}: torch {env['torch']}, triton {env['triton']}; "
               f"{len(args.workloads)} workloads x {len(args.impls)} impls x {len(args.precision)} precisions", t0)
    if device.type == "cuda":
        common.check_profiler(device)  # before any CUDA graph is captured
    flusher = common.L2Flusher(device)
    rows: list[dict] = [r for r in common.load_rows(args.resume) if r.get("status") in common.DONE_STATUSES]
    done = {(r["precision"], r["workload"], r["impl"]) for r in rows}
    resumed = len(rows)
    skipped: list[dict] = []
    path = common.results_path(HARNESS, args.out, default=not args.quick)

    for prec in args.precision:
        for wl, atol in args.workloads.items():
            data = copies = None
            for impl in args.impls:
                if (prec, bench.wl_name(wl), impl) in done:
                    continue
                if not budget.fits(impl):
                    skipped.append({"precision": prec, "workload": bench.wl_name(wl), "impl": impl})
                    continue
                tcell = time.perf_counter()
                if data is None:  # one input set, its per-call copies and the fp64 reference, shared by the impls
                    data = bench.WorkloadData(wl, atol, device, 1)
                    copies = fresh_copies(data.sets[0], args.warmup + args.iters)
                row = run_cell(impl, wl, prec, data, copies, device, flusher, args)
                row["cell_s"] = round(time.perf_counter() - tcell, 2)
                row = {**meta, **row, "warmup": args.warmup, "iters": args.iters}
                budget.record(impl, row["cell_s"])
                rows.append(row)
                common.append_rows(path, [row])
                common.log(f"{prec:7s} {bench.wl_name(wl):8s} {impl:25s} {row['status']:5s} "
                           f"{'span' if row['span_us'] is not None else 'wall'} {common.fmt(latency(row)):>9s} us  "
                           f"kernels {common.fmt(row['n_kernels'], '.0f'):>4s}  "
                           f"peak {common.fmt(row['peak_mib']):>8s} MiB"
                           f"  compile {common.fmt(row['compile_s'])} s"
                           + (f"  graphs {row.get('graphs')}, cudagraph skips {row['cudagraph_skips']}"
                              if row.get("cudagraph_skips") else "")
                           + ("" if row["status"] == "PASS" else f"  [{row['detail'][:100]}]"), t0)
            del data, copies
            common.reset_compile_state()
    summary = summarize(rows)
    result = {"results": rows, "summary": summary, "skipped": skipped,
              "targets": {impl: targets(rows, summary, impl) for impl in ENTRIES if any(r["impl"] == impl for r in rows)}}
    print_report(rows, summary, skipped)
    common.log(f"appended {len(rows) - resumed} rows to {path}" if path else "--quick without --out: no rows written", t0)
    return result


if __name__ == "__main__":
    main()
