"""What each GPU class's config rows cost against Hopper's, timed on the GPU at hand (kernels/configs.py, arch.py).

For each architecture class (SAMHQ_FX_ARCH emulates its configs on the real device) and SAM shape (ViT-B global and
windows at batch 1, ViT-H global and windows at batch 1), forward + backward of the fused kernels in bf16, TF32
("high") and 3-pass TF32 ("highest"), next to the sm_90 rows on the same GPU: a short table (arch, shape, mode, ms,
ratio to sm_90) and a row each appended to benchmarks/results/arch_rows.jsonl. A class whose launches are sm_90's is
not timed again (marked "same", with that class's time), nor one whose launches an earlier class has; a launch that does not fit the real GPU (shared memory,
tensor memory; kernels/fit.py compiles it first) is never run (marked "skip"). Times are the configs' cost on this
GPU, not on the class's own: an sm_86 row timed on an H200 says what its smaller tiles cost on the H200.

    python benchmarks/tools/time_arch_rows.py             # all classes, 1024 px shapes, modes (under 4 minutes, H200)
    python benchmarks/tools/time_arch_rows.py --dry-run   # no GPU needed: what it would time, and what it would skip
    python benchmarks/tools/time_arch_rows.py --arch sm_86 sm_120 --mode bf16
    python benchmarks/tools/time_arch_rows.py --rows cand.py --shape H-windows H-global-512   # candidate rows

`--rows FILE` times candidate rows against the table: FILE defines ROWS, rows in kernels/configs.py's TABLE format
(checked as the table is), put after the table's; every cell whose launches they change is timed again with them
(`rows ms`, and `rows/tab`, the ratio to the table's time in the same process), within the same time budget.
The other shapes are timed only when named: -256 and -512 (SAM at 256 / 512 px: 16x16 / 32x32 global grids; -b8 at
batch 8) and -1280 (80x80 grids, one 128-key tile a grid row), or any SAM layer as MODEL-LAYER-PX[-bBATCH]
(`--shape B-global-640-b8 H-windows-768`: ViT-B / L / H, a px/16-wide global grid or its 14x14 windows).

Timing: CUDA-graph replay of forward + backward, triton.testing.do_bench median, L2 flushed before each replay
(bench_attention_core.graph_bench); inputs as bench_attention_core.make builds them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # benchmarks/: bench_attention_core, common
import common  # noqa: E402
try:
    from samhq_fx.kernels import arch, configs, fit
except ImportError:  # run from the repo root without the package installed
    sys.path.insert(0, os.path.join(HERE, "..", ".."))
    from kernels import arch, configs, fit

# name -> (batch * heads, key-grid side, head dim): SAM at batch 1, 1024 px (and, when named, 256, 512 and 1280 px,
# and ViT-H's 512 px global layer at batch 8, whose split backward launches batch 1's fused one does not make)
SHAPES = {"B-global": (12, 64, 64), "B-windows": (25 * 12, 14, 64), "H-global": (16, 64, 80),
          "H-windows": (25 * 16, 14, 80), "B-global-512": (12, 32, 64), "H-global-512": (16, 32, 80),
          "H-global-512-b8": (8 * 16, 32, 80), "H-global-256": (16, 16, 80),
          "B-global-1280": (12, 80, 64), "H-global-1280": (16, 80, 80)}
DEFAULT_SHAPES = ("B-global", "B-windows", "H-global", "H-windows")
# any other SAM layer by name: MODEL-LAYER-PX[-bBATCH], e.g. L-global-768-b8 (ViT-L's global layer of a 768 px image
# at batch 8)
SHAPE_NAME = re.compile(r"^([BLH])-(global|windows)-(\d+)(?:-b(\d+))?$")
MODES = {"bf16": (torch.bfloat16, "highest"), "tf32": (torch.float32, "high"), "tf32x3": (torch.float32, "highest")}
RESULTS = os.path.join(HERE, "..", "results", "arch_rows.jsonl")
BUDGET_S = 220.0  # stop starting new cells past this: the whole run stays under 4 minutes


def shape_spec(name: str) -> tuple[int, int, int]:
    """(batch * heads, key-grid side, head dim) of a SHAPES name or of MODEL-LAYER-PX[-bBATCH]: a px-wide image has a
    px/16-wide global grid and that grid padded to whole 14x14 windows. ValueError for anything else."""
    if name in SHAPES:
        return SHAPES[name]
    m = SHAPE_NAME.match(name)
    if not m or int(m[3]) % 16 or not 16 <= int(m[3]) <= 4096 or (m[4] is not None and int(m[4]) < 1):
        raise ValueError(f"shape {name!r}: one of {', '.join(SHAPES)}, or MODEL-LAYER-PX[-bBATCH] with MODEL B, L or "
                         f"H, LAYER global or windows, PX a multiple of 16 up to 4096 (e.g. H-global-768-b8)")
    from image_size import grid_classes  # benchmarks/: SAM's layers at an image size
    from samhq_fx.models import VIT_SIZES

    vit = VIT_SIZES["vit-" + m[1].lower()]
    heads = vit["num_attention_heads"]
    (_, side, _), (_, window, windows) = grid_classes(int(m[3]))
    batch = int(m[4] or 1)
    if m[2] == "global":
        return batch * heads, side, vit["hidden_size"] // heads
    return batch * windows * heads, window, vit["hidden_size"] // heads


def _shape_arg(name: str) -> str:
    try:
        shape_spec(name)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return name


def shape_of(name: str) -> fit.Shape:
    b, side, d = shape_spec(name)
    return fit.Shape(b, side * side, side, side, d, d)


def load_rows(path: str) -> list:
    """ROWS of the Python file at `path`: candidate rows in TABLE's format, checked as TABLE is."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("candidate_rows", path)
    if spec is None:
        raise SystemExit(f"--rows {path}: not a Python file (a .py file defining ROWS)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = list(getattr(module, "ROWS", None) or [])
    if not rows:
        raise SystemExit(f"--rows {path}: defines no ROWS (a list of (kernel, conditions, config, reason) rows)")
    configs.check_table(rows, table_name=f"{path}: ROWS")
    return rows


@contextlib.contextmanager
def table_with(rows: list | None):
    """configs.TABLE with candidate `rows` after the table's, for the block (a new list: the host's plans are keyed by
    the table's identity)."""
    table = configs.TABLE
    configs.TABLE = table + rows if rows else table
    try:
        yield
    finally:
        configs.TABLE = table


def _described(launches) -> list[str]:
    """Each launch's options and the constexprs a config row decides (blocks, key-tile rows, selects, copies)."""
    decided = ("BLOCK", "R", "SPLIT", "BIAS_T")  # R, R_Q, R_KV, RH_SELECT*
    return [f"{launch.kernel} {dict(launch.options)} { {k: v for k, v in launch.constexprs if k.startswith(decided)} }"
            for launch in launches]


def _misfit(launches, real: arch.Arch | None) -> str | None:
    if real is None:
        return None
    return next((b.misfit for b in fit.build_all([(launch, real) for launch in launches]) if b.misfit), None)


def plan(archs: list[str], shapes: list[str], modes: list[str], real: arch.Arch | None,
         rows: list | None = None) -> list[dict]:
    """A cell per (arch, shape, mode): 'time', 'same' (sm_90's launches: not timed again) or 'skip' (a launch does
    not fit `real`, the GPU at hand; None: not checked). With candidate `rows`, a cell whose launches they change has
    rows_configs (the launches with them) and rows_action ('time' or 'skip: ...')."""
    cells = []
    hopper = arch.ARCHS["sm_90"]
    for shape in shapes:
        for mode in modes:
            dtype, prec = MODES[mode]
            seen: dict[tuple, str] = {}  # launches -> the first class that has them
            for name in ["sm_90"] + [a for a in archs if a != "sm_90"]:
                launches = tuple(fit.launches(arch.ARCHS[name], dtype, prec, shape_of(shape)))
                cell = dict(arch=name, shape=shape, mode=mode, action="time", why="", same_as=None,
                            configs=_described(launches), rows_configs=None, rows_action=None, rows_key=None)
                if rows and name in archs:
                    with table_with(rows):
                        changed = tuple(fit.launches(arch.ARCHS[name], dtype, prec, shape_of(shape)))
                    if changed != launches:
                        why = _misfit(changed, real)
                        # rows_key: sm_89 takes sm_86's launches with the rows too (timed once); the shape is in it,
                        # as launches do not carry the batch
                        cell.update(rows_configs=_described(changed), rows_action="skip: " + why if why else "time",
                                    rows_key=hash((shape, mode, changed)))
                if launches in seen:
                    cell.update(action="same", same_as=seen[launches], why=f"{seen[launches]}'s launches")
                    if name not in archs:
                        continue
                    cells.append(cell)
                    continue
                seen[launches] = name
                why = _misfit(launches, real)
                if why:
                    cell.update(action="skip", why=f"does not fit {real.name}: {why}")
                cells.append(cell)
    return cells  # per (shape, mode) sm_90 first (the ratio's base), then each class after the class it copies


def time_cell(cell: dict, rows: list | None = None) -> float:
    """ms of one forward + backward with `cell`'s class configs (and candidate `rows` after the table's) on the GPU
    at hand."""
    from bench_attention_core import graph_bench, make, ours_fns

    try:
        from samhq_fx.kernels import rel_pos_attention as K
    except ImportError:
        from kernels import rel_pos_attention as K
    b, side, d = shape_spec(cell["shape"])
    dtype, prec = MODES[cell["mode"]]
    torch.set_float32_matmul_precision(prec)
    os.environ["SAMHQ_FX_ARCH"] = cell["arch"]  # read at every call; captured into the graph with its configs
    try:
        with table_with(rows):
            q, k, v, rh, rw, do = make(b, side, dtype, d=d)
            _, _, both = ours_fns(q, k, v, rh, rw, do, d ** -0.5, kernels=K)
            return graph_bench(both)
    finally:
        os.environ.pop("SAMHQ_FX_ARCH", None)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", nargs="+", default=list(arch.ARCHS), choices=list(arch.ARCHS))
    p.add_argument("--shape", nargs="+", default=list(DEFAULT_SHAPES), type=_shape_arg, metavar="SHAPE",
                   help=f"{', '.join(SHAPES)}, or MODEL-LAYER-PX[-bBATCH] (e.g. B-global-640-b8)")
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--dry-run", action="store_true", help="list the cells (and, on a GPU, what does not fit); time none")
    p.add_argument("--rows", help="a Python file whose ROWS (candidate table rows) are timed against the table")
    p.add_argument("--out", default=RESULTS, help="JSON lines to append to")
    args = p.parse_args(argv)
    t0 = time.time()
    if os.environ.get("SAMHQ_FX_ARCH"):
        p.error("unset SAMHQ_FX_ARCH: this script sets it per cell")
    gpu = torch.cuda.is_available()
    if not gpu and not args.dry_run:
        p.error("needs a CUDA GPU (or --dry-run)")
    real = arch.of(torch.device("cuda")) if gpu else None
    archs = ["sm_90"] + [a for a in args.arch if a != "sm_90"]  # the baseline of every ratio
    rows = load_rows(args.rows) if args.rows else None
    cells = plan(archs, args.shape, args.mode, real, rows)
    if rows and not any(cell["rows_action"] for cell in cells):
        print(f"--rows {args.rows}: the rows change no launch of these classes, shapes and modes", file=sys.stderr)
    base: dict[tuple, float] = {}
    timed: dict[tuple, float] = {}  # (arch, shape, mode) -> ms
    rows_timed: dict[int, float] = {}  # the launches with the rows (their hash) -> ms
    header = common.row_meta(common.env_info(), torch.device("cuda" if gpu else "cpu"))
    extra = f" {'rows ms':>8s} {'rows/tab':>8s}" if rows else ""
    print(f"{'arch':7s} {'shape':16s} {'mode':7s} {'ms':>8s} {'vs sm_90':>8s}{extra}  note")
    out = []
    for cell in cells:
        key = (cell["shape"], cell["mode"])
        ms = rows_ms = None
        if cell["action"] == "time" and not args.dry_run:
            if time.time() - t0 > BUDGET_S:
                cell.update(action="skip", why=f"time budget ({BUDGET_S:.0f} s) spent")
            else:
                ms = time_cell(cell)
        if cell["action"] == "same":
            ms = timed.get((cell["same_as"], *key))
        if cell["rows_action"] == "time" and not args.dry_run:
            if cell["rows_key"] in rows_timed:
                rows_ms = rows_timed[cell["rows_key"]]
            elif time.time() - t0 > BUDGET_S:
                cell.update(rows_action=f"skip: time budget ({BUDGET_S:.0f} s) spent")
            else:
                rows_ms = rows_timed[cell["rows_key"]] = time_cell(cell, rows)
        if ms is not None:
            timed[(cell["arch"], *key)] = ms
        if cell["arch"] == "sm_90" and ms is not None:
            base[key] = ms
        ratio = ms / base[key] if ms is not None and base.get(key) else None
        note = cell["why"] or ("would time: " + "; ".join(cell["configs"]) if args.dry_run else "")
        if cell["rows_action"]:
            note += f" | rows: {cell['rows_action']}" + (": " + "; ".join(cell["rows_configs"]) if args.dry_run else "")
        fmt = lambda x, f: "-" if x is None else f.format(x)  # noqa: E731
        extra = (f" {fmt(rows_ms, '{:.3f}'):>8s} {fmt(rows_ms / ms if rows_ms and ms else None, '{:.3f}'):>8s}"
                 if rows else "")
        print(f"{cell['arch']:7s} {cell['shape']:16s} {cell['mode']:7s} {fmt(ms, '{:.3f}'):>8s} "
              f"{fmt(ratio, '{:.2f}'):>8s}{extra}  {cell['action']}{': ' + note.lstrip(' |') if note else ''}",
              flush=True)
        out.append({**header, **cell, "ms": ms, "ratio_to_sm90": ratio, "rows_ms": rows_ms, "rows_file": args.rows})
    if not args.dry_run:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "a") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")
        print(f"{len(out)} rows appended to {args.out} in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
