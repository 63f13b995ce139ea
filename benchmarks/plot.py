"""Charts for the benchmark results, and a standalone way to merge results files and redraw them.

    python benchmarks/plot.py benchmarks/results/sol076.json [other sol076.json ...]   # merge, table, charts
    python benchmarks/plot.py benchmarks/results/train_step.json

Merging: rows are keyed by (precision, workload, impl) for sol076 and (impl, batch, dtype) for train_step;
a later file wins.  The merged JSON is written next to the first file as *_merged.json.
matplotlib is optional (not installed in CI): without it the charts are skipped with a message.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def bar_chart(groups, series: dict, path: str, title: str, ylabel: str, log: bool = True) -> str:
    """Grouped bars: one group per entry of `groups`, one bar per series (None = missing bar)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return f"matplotlib not importable: skipped chart {path}"
    n = max(1, len(series))
    width = 0.8 / n
    fig, ax = plt.subplots(figsize=(min(16, max(7, 0.55 * len(groups) * max(1, n / 4) + 2)), 6))
    for k, (name, ys) in enumerate(series.items()):
        xs = [g + (k - (n - 1) / 2) * width for g in range(len(groups))]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
        if pts:
            ax.bar([p[0] for p in pts], [p[1] for p in pts], width=width, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=45, ha="right")
    if log:
        ax.set_yscale("log")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.22), frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"wrote {path}"


def sol076_charts(payload: dict, out_dir: str) -> list[str]:
    """One chart per precision: latency (kernel span, else wall) per workload per implementation, log scale.
    Bars only for PASS cells."""
    import sol_execbench_076 as bench

    rows = payload["results"]
    msgs = []
    for prec in [p for p in bench.PRECISIONS if any(r["precision"] == p for r in rows)]:
        pr = [r for r in rows if r["precision"] == prec]
        wls = [w for w in map(bench.wl_name, list(bench.sol076.WORKLOADS) + list(bench.EXTRA_WORKLOADS))
               if any(r["workload"] == w for r in pr)]
        impls = [i for i in bench.IMPLS if any(r["impl"] == i for r in pr)]
        cell = {(r["workload"], r["impl"]): r for r in pr}
        series = {i: [bench.metric(cell[(w, i)]) if (w, i) in cell and cell[(w, i)]["status"] == "PASS" else None
                      for w in wls] for i in impls}
        what = "kernel span" if any(r.get("span_us") for r in pr) else "wall time"
        msgs.append(bar_chart(wls, series, os.path.join(out_dir, f"sol076_{prec}.png"),
                              f"SOL-ExecBench L2/076 backward, {payload['env'].get('device')}, fp32 matmul {prec}",
                              f"{what} per call (us, log)"))
    return msgs


def train_chart(payload: dict, out_dir: str) -> list[str]:
    """ms/step per (batch, dtype) group, one bar per implementation."""
    rows = [r for r in payload["results"] if r.get("ms_per_step")]
    groups = sorted({(r["batch"], r["dtype"]) for r in rows})
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    cell = {(r["batch"], r["dtype"], r["impl"]): r["ms_per_step"] for r in rows}
    series = {i: [cell.get((b, d, i)) for b, d in groups] for i in impls}
    return [bar_chart([f"B={b} {d}" for b, d in groups], series, os.path.join(out_dir, "train_step.png"),
                      f"SamHQ ViT-B train step, {payload['env'].get('device')}", "ms / step (log)")]


def main(argv=None) -> None:
    paths = (argv if argv is not None else sys.argv[1:]) or []
    if not paths:
        raise SystemExit(__doc__)
    payloads = [json.load(open(p)) for p in paths]
    merged = dict(payloads[-1])
    is_train = "ms_per_step" in json.dumps(payloads[0]["results"][:1]) or os.path.basename(paths[0]).startswith("train")
    key = (lambda r: (r["impl"], r["batch"], r["dtype"])) if is_train else \
        (lambda r: (r["precision"], r["workload"], r["impl"]))
    rows = {}
    for p in payloads:
        rows.update({key(r): r for r in p["results"]})
    merged["results"] = list(rows.values())
    out_dir = os.path.dirname(os.path.abspath(paths[0]))
    if is_train:
        import train_step

        msgs = train_chart(merged, out_dir)
        train_step.print_report(merged["results"])
    else:
        import sol_execbench_076 as bench

        merged["summary"] = bench.summarize(merged["results"])
        msgs = sol076_charts(merged, out_dir)
        bench.print_report(merged["results"], merged["summary"], [])
    if len(paths) > 1:
        out = os.path.splitext(os.path.abspath(paths[0]))[0] + "_merged.json"
        with open(out, "w") as f:
            json.dump(merged, f, indent=1, default=str)
        msgs.append(f"wrote {out}")
    print("\n".join(msgs), flush=True)


if __name__ == "__main__":
    main()
