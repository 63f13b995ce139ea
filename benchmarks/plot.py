"""Charts and summaries of the benchmark results, from the results rows alone.

    python benchmarks/plot.py benchmarks/results/sol076.jsonl [more sol076 rows.jsonl ...]   # table, summary, charts
    python benchmarks/plot.py benchmarks/results/train_step.jsonl --gpu H200
    python benchmarks/plot.py benchmarks/results/inference.jsonl
    python benchmarks/plot.py --default-mode OUT.png benchmarks/results/profile_host.jsonl   # host vs GPU per build

Everything here reads result rows (the JSON objects of a harness's benchmarks/results/<harness>.jsonl, one a line),
nothing else: the runners (sol076/compare_impls.py, sol076/time_entry.py, train_step.py, inference.py) call these
functions, never the other way round, so a chart can be redrawn from the rows without the code that timed them.
Orders come from the rows (workloads by size, implementations as they first appear).
A cell is keyed by (precision, workload, impl) for sol076 and sol076_entry, (gpu, model, img, impl, batch, dtype) for
train_step and (gpu, model, img, target, dtype, batch, impl) for inference; of the rows of one cell the last one read
wins (files in the order given, rows in file order: the latest run), and --gpu keeps the rows whose GPU name
contains it.  A train_step / inference row without `model` is read as "vit-b", one without `img` as 1024, one
without `compiler` / `mode` by its impl name (normalize_rows).  train_step / inference charts: one panel per model
and GPU, one bar per impl (one color per impl in every panel), the reduce-overhead builds hatched; their summaries:
best_per_family (any mode) and best_by_mode (samhq against Inductor of the same mode, printed as lines).  Charts are
written beside the first file; matplotlib is optional (not installed in CI): without it the charts are skipped with
a message.
"""

from __future__ import annotations

import json
import math
import os
import re

PRECISION_ORDER = ("highest", "high", "medium")  # fp32 matmul precisions, most exact first


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return None
    return plt


def _bars(ax, groups, series: dict, title: str, ylabel: str, log: bool, hatched=(), colors=None) -> None:
    """Grouped bars on `ax`: one group per entry of `groups`, one bar per series (None = missing bar); the series
    named in `hatched` drawn hatched (the CUDA-graph builds of train_step / inference), colors by name if given."""
    n = max(1, len(series))
    width = 0.8 / n
    for k, (name, ys) in enumerate(series.items()):
        xs = [g + (k - (n - 1) / 2) * width for g in range(len(groups))]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width, label=name,
                   color=(colors or {}).get(name),
                   hatch="//" if name in hatched else None, edgecolor="white" if name in hatched else None)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=45, ha="right")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", which="both", alpha=0.3)


def bar_chart(groups, series: dict, path: str, title: str, ylabel: str, log: bool = True) -> str:
    """Grouped bars: one group per entry of `groups`, one bar per series (None = missing bar)."""
    plt = _pyplot()
    if plt is None:
        return f"matplotlib not importable: skipped chart {path}"
    n = max(1, len(series))
    fig, ax = plt.subplots(figsize=(min(16, max(7, 0.55 * len(groups) * max(1, n / 4) + 2)), 6))
    _bars(ax, groups, series, title, ylabel, log)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def panel_chart(panels: list[tuple[str, list, dict]], path: str, title: str, ylabel: str, log: bool = True,
                hatched=()) -> str:
    """One grouped-bar panel per (panel title, groups, series), stacked, one legend for all (series by name)."""
    plt = _pyplot()
    if plt is None:
        return f"matplotlib not importable: skipped chart {path}"
    width = max(min(16, max(7, 0.55 * len(g) * max(1, len(sr) / 4) + 2)) for _, g, sr in panels)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width, 1 + 4.5 * len(panels)), squeeze=False)
    handles: dict = {}
    names = list(dict.fromkeys(n for _, _, sr in panels for n in sr))
    colors = {n: f"C{k % 10}" for k, n in enumerate(names)}  # one color per series in every panel
    for ax, (sub, groups, series) in zip(axes[:, 0], panels):
        _bars(ax, groups, series, sub, ylabel, log, hatched, colors)
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    fig.suptitle(title)
    fig.legend(list(handles.values()), list(handles), fontsize=8, ncol=5, loc="lower center", frameon=False)
    fig.tight_layout(rect=(0, 0.03 + 0.04 * ((len(handles) + 4) // 5) / len(panels), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def _first_seen(rows: list[dict], key: str) -> list:
    return list(dict.fromkeys(r[key] for r in rows))


def _workload_size(name: str) -> tuple:
    """'64x64x4' -> (4096, 4): tokens, then batch."""
    h, w, b = (int(v) for v in re.findall(r"\d+", name)[:3])
    return h * w, b


def metric(row):
    """Headline latency of a sol076 row: kernel span on CUDA, wall time where there is no span (CPU)."""
    return row.get("span_us") if row.get("span_us") is not None else row.get("wall_us")


def sol076_summary(rows: list[dict]) -> dict:
    """Per precision and implementation: mean latency over PASS workloads, PASS count, and the geometric-mean
    speedup over eager across workloads where both passed (means over different workload sets would mislead)."""
    out: dict = {}
    for prec in sorted({r["precision"] for r in rows}):
        pr = [r for r in rows if r["precision"] == prec]
        eager = {r["workload"]: metric(r) for r in pr if r["impl"] == "eager" and r["status"] == "PASS"}
        out[prec] = {}
        for impl in _first_seen(pr, "impl"):
            ir = [r for r in pr if r["impl"] == impl]
            ok = [r for r in ir if r["status"] == "PASS" and metric(r) is not None]
            ratios = [eager[r["workload"]] / metric(r) for r in ok if eager.get(r["workload"])]
            out[prec][impl] = {
                "n": len(ir), "n_pass": len(ok),
                "mean_us": sum(map(metric, ok)) / len(ok) if ok else None,
                "geomean_speedup_vs_eager": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
                "n_compared": len(ratios),
            }
    return out


def sol076_charts(rows: list[dict], out_dir: str, prefix: str = "sol076") -> list[str]:
    """One chart per precision, <prefix>_<precision>.png: latency (kernel span, else wall) per workload per
    implementation, log scale. Bars only for PASS cells."""
    msgs = []
    precs = sorted({r["precision"] for r in rows}, key=lambda p: (PRECISION_ORDER + (p,)).index(p))
    for prec in precs:
        pr = [r for r in rows if r["precision"] == prec]
        wls = sorted(_first_seen(pr, "workload"), key=_workload_size)
        impls = _first_seen(pr, "impl")
        cell = {(r["workload"], r["impl"]): r for r in pr}
        series = {i: [metric(cell[(w, i)]) if (w, i) in cell and cell[(w, i)]["status"] == "PASS" else None
                      for w in wls] for i in impls}
        what = "kernel span" if any(r.get("span_us") for r in pr) else "wall time"
        msgs.append(bar_chart(wls, series, os.path.join(out_dir, f"{prefix}_{prec}.png"),
                              f"SOL-ExecBench L2/076 backward, {gpus(pr)}, fp32 matmul {prec}",
                              f"{what} per call (us, log)"))
    return msgs


def gpus(rows: list[dict]) -> str:
    """The GPU names of the rows, for a chart's title ("CPU" for rows without one)."""
    return ", ".join(dict.fromkeys(r.get("gpu") or "CPU" for r in rows)) or "-"


def _model_panels(rows: list[dict], group: tuple, value: str, label) -> tuple[list, set]:
    """One panel per model and GPU (as the rows first name them; the GPU in the panel's title where the rows name
    more than one): groups `group` (sorted), one series per impl, and the impls whose rows ran in reduce-overhead
    (hatched)."""
    normalize_rows(rows)
    several = len({r["gpu"] for r in rows}) > 1
    panels = []
    for model, gpu in dict.fromkeys((r["model"], r["gpu"]) for r in rows):
        mr = [r for r in rows if r["model"] == model and r["gpu"] == gpu]
        groups = sorted({tuple(r[g] for g in group) for r in mr})
        cell = {tuple(r[g] for g in group) + (r["impl"],): r[value] for r in mr}
        series = {i: [cell.get(g + (i,)) for g in groups] for i in _first_seen(mr, "impl")}
        panels.append((f"{model}, {gpus(mr)}" if several else model, [label(*g) for g in groups], series))
    return panels, {r["impl"] for r in rows if r["mode"] == "reduce-overhead"}


def train_chart(rows: list[dict], out_dir: str) -> list[str]:
    """train_step.png: ms/step per (img, batch, dtype) group, one bar per implementation (CUDA-graph builds hatched),
    one panel per model."""
    rows = [r for r in rows if r.get("ms_per_step")]
    panels, ro = _model_panels(rows, ("img", "batch", "dtype"), "ms_per_step", lambda s, b, d: f"{s}px B={b} {d}")
    if not panels:
        return []
    return [panel_chart(panels, os.path.join(out_dir, "train_step.png"),
                        f"SAM-HQ encoder train step, {gpus(rows)}", "ms / step (log)", hatched=ro)]


def inference_chart(rows: list[dict], out_dir: str) -> list[str]:
    """inference.png: images/s per (img, target, dtype, batch) group, one bar per implementation (CUDA-graph builds
    hatched), one panel per model."""
    rows = [r for r in rows if r.get("images_per_s")]
    panels, ro = _model_panels(rows, ("img", "target", "dtype", "batch"), "images_per_s",
                               lambda s, t, d, b: f"{s}px {t} {d} B={b}")
    if not panels:
        return []
    return [panel_chart(panels, os.path.join(out_dir, "inference.png"),
                        f"SAM-HQ inference (no grad), {gpus(rows)}", "images / s (log)", hatched=ro)]


DEFAULT_MODEL = "vit-b"  # what the rows written before `model` was recorded timed
DEFAULT_IMG = 1024  # and the image size of every row written before `img` was


def normalize_rows(rows: list[dict]) -> list[dict]:
    """train_step / inference rows as the summaries and charts read them, filled in place: `model` missing (rows
    written before --model) is "vit-b", `img` missing 1024; `compiler` and `mode` missing (older train_step rows) are
    read from the impl name (benchmarks/impls.py spells them: "samhq-*" / "inductor*" compiled, "-ro"
    reduce-overhead); `gpu` missing is None, as on CPU."""
    for r in rows:
        r.setdefault("gpu", None)
        r.setdefault("model", DEFAULT_MODEL)
        r.setdefault("img", DEFAULT_IMG)
        name = str(r.get("impl", ""))
        if "compiler" not in r:
            r["compiler"] = next((c for c in ("samhq", "inductor") if name.startswith(c)), "none")
        if "mode" not in r:
            r["mode"] = "reduce-overhead" if name.endswith("-ro") else "default"
    return rows


def family(row: dict) -> str:
    """'eager', 'inductor' or 'samhq': the compiler of a train_step / inference row."""
    return {"none": "eager"}.get(row.get("compiler", "none"), row.get("compiler"))


def best_per_family(rows: list[dict], group: tuple, value: str) -> list[dict]:
    """Per group (e.g. dtype and batch): the fastest OK row of each family (eager, inductor, samhq; lowest
    `value`), and samhq's speedup over the best Inductor and the best eager row measured in the same run:
    what a "faster than Inductor" claim is held to."""
    out = []
    for key in dict.fromkeys(tuple(r[g] for g in group) for r in rows):
        best: dict[str, dict] = {}
        for r in rows:
            if tuple(r[g] for g in group) != key or r.get("status") != "OK" or not r.get(value):
                continue
            f = family(r)
            if f not in best or r[value] < best[f][value]:
                best[f] = r
        entry = dict(zip(group, key))
        for f, r in best.items():
            entry[f"best_{f}"], entry[f"best_{f}_{value}"] = r["impl"], r[value]
        for peer in ("inductor", "eager"):
            if "samhq" in best and peer in best:
                entry[f"samhq_speedup_vs_{peer}"] = round(best[peer][value] / best["samhq"][value], 3)
        out.append(entry)
    return out


def _ms(v) -> str:
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.2f}"


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def best_by_mode(rows: list[dict], group: tuple, value: str) -> list[dict]:
    """Per group and mode (e.g. model, dtype, batch, mode): the fastest OK samhq row against the fastest OK
    Inductor row of the SAME mode (either attention class; lowest `value`), with the ratio Inductor / samhq and each
    side's host_ms and gpu_busy.  Entries: the group's keys, "mode", "samhq" / "inductor" (impl names, None when
    the group has no such row), "samhq_<value>", "inductor_<value>", "samhq_host_ms", "inductor_host_ms",
    "samhq_gpu_busy", "inductor_gpu_busy", "samhq_speedup_vs_inductor", and "line" (summary_line)."""
    normalize_rows(rows)
    keys = group + ("mode",)
    groups = list(dict.fromkeys(tuple(r[g] for g in group) for r in rows))
    modes = ("default", "reduce-overhead")
    out = []
    for key in sorted(dict.fromkeys(tuple(r[g] for g in keys) for r in rows),  # as the groups come, default first
                      key=lambda k: (groups.index(k[:-1]), modes.index(k[-1]) if k[-1] in modes else len(modes))):
        best: dict[str, dict] = {}
        for r in rows:
            f = family(r)
            if tuple(r[g] for g in keys) != key or f == "eager" or r.get("status") != "OK" or not r.get(value):
                continue
            if f not in best or r[value] < best[f][value]:
                best[f] = r
        if not best:
            continue  # the eager baselines' mode: nothing compiled to compare
        entry = dict(zip(keys, key))
        for f in ("samhq", "inductor"):
            r = best.get(f, {})
            entry[f], entry[f"{f}_{value}"] = r.get("impl"), r.get(value)
            entry[f"{f}_host_ms"], entry[f"{f}_gpu_busy"] = r.get("host_ms"), r.get("gpu_busy")
        both = "samhq" in best and "inductor" in best
        entry["samhq_speedup_vs_inductor"] = round(best["inductor"][value] / best["samhq"][value], 3) if both else None
        entry["line"] = summary_line(entry, group, value)
        out.append(entry)
    return out


def summary_line(entry: dict, group: tuple, value: str) -> str:
    """One best_by_mode entry as a line, e.g. 'vit-b bf16 b1 default: samhq-eager 4.9 ms vs inductor-eager 8.5 ms:
    1.73x (host 1.2 / 2.3 ms, busy 88% / 93%)' (samhq first in each pair; '-' where not measured)."""
    head = " ".join(f"b{entry[g]}" if g == "batch" else f"{entry[g]}px" if g == "img" else
                    (entry[g] or "CPU") if g == "gpu" else str(entry[g]) for g in group) + f" {entry['mode']}:"
    s, i = entry.get("samhq"), entry.get("inductor")
    side = lambda f: f"{entry[f]} {_ms(entry[f'{f}_{value}'])} ms"  # noqa: E731
    if s and i:
        return (f"{head} {side('samhq')} vs {side('inductor')}: {entry[f'inductor_{value}'] / entry[f'samhq_{value}']:.2f}x "
                f"(host {_ms(entry['samhq_host_ms'])} / {_ms(entry['inductor_host_ms'])} ms, "
                f"busy {_pct(entry['samhq_gpu_busy'])} / {_pct(entry['inductor_gpu_busy'])})")
    f = "samhq" if s else "inductor"
    return (f"{head} {side(f)}, no {'Inductor' if s else 'samhq'} row of this mode "
            f"(host {_ms(entry[f'{f}_host_ms'])} ms, busy {_pct(entry[f'{f}_gpu_busy'])})")


SUMMARY_BY_MODE_TITLE = ("samhq vs Inductor, mode by mode (the fastest OK row of each, either attention class; "
                         "ratio = Inductor / samhq; host and busy: samhq / Inductor):")


def print_summary_by_mode(entries: list[dict]) -> None:
    """best_by_mode's lines under their title (train_step.py and inference.py print them last)."""
    if entries:
        print("\n" + SUMMARY_BY_MODE_TITLE)
        print("\n".join(e["line"] for e in entries), flush=True)


# harness: (a cell's key, table columns, chart)
KINDS = {
    "sol076": (("precision", "workload", "impl"), ("precision", "workload", "impl", "span_us", "wall_us", "peak_mib",
                                                    "status"), sol076_charts),
    "sol076_entry": (("precision", "workload", "impl"), ("precision", "workload", "impl", "span_us", "wall_us",
                                                          "n_kernels", "peak_mib", "status"),
                     lambda rows, out_dir: sol076_charts(rows, out_dir, "sol076_entry")),
    "train_step": (("gpu", "model", "img", "impl", "batch", "dtype"),
                   ("gpu", "model", "img", "dtype", "batch", "impl", "ms_per_step", "host_ms", "gpu_ms", "gpu_busy",
                    "peak_mib", "cudagraph_skips", "status"), train_chart),
    "inference": (("gpu", "model", "img", "target", "dtype", "batch", "impl"),
                  ("gpu", "model", "img", "target", "dtype", "batch", "impl", "latency_ms", "images_per_s", "host_ms",
                   "gpu_ms", "gpu_busy", "peak_mib", "cudagraph_skips", "status"), inference_chart),
}


# a cell is one GPU's: rows timed on another GPU are never its latest row, nor compared with it
SUMMARY_GROUPS = {"train_step": ("gpu", "model", "img", "dtype", "batch"),
                  "inference": ("gpu", "model", "img", "target", "dtype", "batch")}
SUMMARY_VALUE = {"train_step": "ms_per_step", "inference": "latency_ms"}


def read_rows(paths) -> list[dict]:
    """The rows of results JSONL files (one JSON object a line), the files in the order given."""
    rows = []
    for path in [paths] if isinstance(paths, str) else paths:
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def latest(rows: list[dict], keys) -> list[dict]:
    """One row per cell (the values of `keys`): the last one, in the order the cells first appear."""
    out: dict = {}
    for r in rows:
        out[tuple(r.get(k) for k in keys)] = r
    return list(out.values())


def default_mode_rows(rows: list[dict]) -> list[dict]:
    """One line per (cell, build) of benchmarks/tools/profile_host.py's rows (one row per build of a run): wall, GPU
    and host ms (wall - GPU) and GPU busy, the cell named by its model, image size (when not 1024), what, dtype and
    batch; builds without a wall (a cut run) left out. A run is the builds one process timed together: the rows of one
    date (a run's start) and `source` (rows converted from the per-run files of before). Where several runs name one
    cell, only one is kept, since a panel is one process's builds: the latest by date, ties going to the run read last
    (an undated run counts as the oldest). A run with no Inductor build (an A/B of samhq's own options) is kept only
    where no run of the cell has one: a panel compares samhq with Inductor."""
    runs: dict = {}  # (source, date, cell) -> that run's rows
    for r in rows:
        img = r.get("img") or 1024
        cell = f"{r['model']}{'' if img == 1024 else f' {img}px'} {r['what']} {r['dtype']} B={r['batch']}"
        runs.setdefault((r.get("source"), r.get("date"), cell), []).append(r)
    best: dict = {}  # cell -> ((has an Inductor build, date, order), run's rows)
    for order, ((_, date, cell), builds) in enumerate(runs.items()):
        rank = (any(b["build"].startswith("inductor") for b in builds), date or "", order)
        if cell not in best or rank >= best[cell][0]:
            best[cell] = (rank, builds)
    out = []
    for cell, (_, builds) in best.items():  # cells in the order first seen
        for b in builds:
            if b.get("wall_ms") is not None:
                out.append(dict(cell=cell, build=b["build"], wall_ms=b["wall_ms"], gpu_ms=b["gpu_ms"],
                                host_ms=b["wall_ms"] - b["gpu_ms"], gpu_busy=b["gpu_ms"] / b["wall_ms"]))
    return out


def default_mode_chart(rows: list[dict], path: str) -> str:
    """Per cell, one stacked bar per build: its GPU time (solid) under its host time (wall - GPU, light)."""
    plt = _pyplot()
    if plt is None:
        return f"matplotlib not importable: skipped chart {path}"
    cells = _first_seen(rows, "cell")
    ncols = min(6, len(cells))  # rows of at most 6 panels, so that a dozen cells stay readable
    nrows = -(-len(cells) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols + 1, 4.5 * nrows), squeeze=False)
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    for ax, cell in zip(axes.flat, cells):
        mine = [r for r in rows if r["cell"] == cell]
        xs = range(len(mine))
        colors = ["C0" if r["build"].startswith("samhq") else "C1" for r in mine]
        ax.bar(xs, [r["gpu_ms"] for r in mine], color=colors, label="GPU")
        ax.bar(xs, [r["host_ms"] for r in mine], bottom=[r["gpu_ms"] for r in mine], color=colors, alpha=0.35,
               label="host (wall - GPU)")
        for x, r in zip(xs, mine):
            ax.text(x, r["wall_ms"], f"{r['wall_ms']:.1f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs))
        ax.set_xticklabels([r["build"] for r in mine], rotation=45, ha="right", fontsize=8)
        ax.set_title(cell, fontsize=9)
        ax.set_ylabel("ms a call")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("default mode, one process per cell: GPU time and the host time on top of it")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def harness_of(path: str) -> str:
    """The harness whose rows a results file holds: its name, benchmarks/results/<harness>.jsonl."""
    name = os.path.basename(path).removesuffix(".jsonl")
    if name not in KINDS:
        raise SystemExit(f"{path}: plot.py reads the rows of {', '.join(k + '.jsonl' for k in KINDS)}")
    return name


def print_rows(rows: list[dict], columns) -> None:
    def cell(v):
        return "-" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)

    table = [[cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(t[i]) for t in table]) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths)))


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="results .jsonl files of one harness")
    ap.add_argument("--default-mode", metavar="PNG", help="the files are profile_host rows: draw host vs GPU per build")
    ap.add_argument("--gpu", default=None, help="only the rows whose GPU name contains this (CPU rows: 'CPU')")
    args = ap.parse_args(argv)
    kind = None if args.default_mode else harness_of(args.files[0])
    rows = [r for r in read_rows(args.files) if args.gpu is None or args.gpu in (r.get("gpu") or "CPU")]
    if args.default_mode:
        lines = default_mode_rows(rows)
        print_rows(lines, ("cell", "build", "wall_ms", "gpu_ms", "host_ms", "gpu_busy"))
        print(default_mode_chart(lines, args.default_mode), flush=True)
        return
    keys, columns, chart = KINDS[kind]
    if kind in SUMMARY_GROUPS:
        normalize_rows(rows)
    rows = latest(rows, keys)
    msgs = chart(rows, os.path.dirname(os.path.abspath(args.files[0])))
    print_rows(rows, columns)
    if kind in SUMMARY_GROUPS:
        summary = best_per_family(rows, SUMMARY_GROUPS[kind], SUMMARY_VALUE[kind])
        if summary:
            print()
            print_rows(summary, list(dict.fromkeys(k for e in summary for k in e)))
        print_summary_by_mode(best_by_mode(rows, SUMMARY_GROUPS[kind], SUMMARY_VALUE[kind]))
    else:
        summary = sol076_summary(rows)
        print()
        print_rows([dict(precision=p, impl=i, **s) for p, d in summary.items() for i, s in d.items()],
                   ("precision", "impl", "n_pass", "n", "mean_us", "geomean_speedup_vs_eager", "n_compared"))
    print("\n".join(msgs), flush=True)


if __name__ == "__main__":
    main()
