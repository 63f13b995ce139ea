"""Every kernel launch at SAM's shapes, compiled for every GPU architecture class on this CPU: does it fit?

    python tests/cross_compile.py                      # the whole table; exit 1 if a launch does not fit or spills
    python tests/cross_compile.py --json rows.json     # also write the rows
    python tests/cross_compile.py --arch sm_86 --mode bf16 tf32x3 --quiet
    PYTHONPATH=.ci-triton36 python tests/cross_compile.py   # with Triton 3.6 (.ci/run puts 3.6 / 3.7 / 3.8 in .ci-triton3x)
    python tests/cross_compile.py --px 384 640 768 1280 --no-extras --quiet   # other image sizes: exit 1, they spill
    python tests/cross_compile.py --px 896 --batch 4 --model H --mode bf16 --no-extras   # any 16-px multiple, batch

For each architecture (kernels/arch.py), dtype / precision (bf16, fp16, fp32 "high" = TF32, fp32 "highest" = 3-pass
TF32) and SAM shape class (ViT-B 12 heads / ViT-L 16 heads at head dim 64, ViT-H 16 heads at 80; global layers on
64x64, 32x32 and 16x16 key grids, 14x14 windows, 25 / 9 / 4 a 1024 / 512 / 256 px image; batch 1 and 8), the launches
forward + backward make are recorded on meta tensors (kernels/fit.py) and each distinct one compiled once, in
threads, by the Triton this runs with (Triton ships ptxas: no GPU). A line per distinct launch: its config, shared
memory, registers, spills (stack bytes per thread), tensor-memory columns (sm_100), CTAs per SM, the verdict, and the
shapes it serves. Compiles are typed as Inductor types user kernels (Python floats as fp64 scalars, ints equal to 1
as constants), as fit.py records them.

The check fails (exit 1) when a launch does not build, needs more shared memory than a CTA may have or more tensor
memory than an SM has, or, in bf16 / fp16, spills registers, unless ALLOWED_SPILLS names it with its figure. Also
checked (unless --no-extras): the benchmark sweeps' OVERRIDES and the head dim 80 padded to 128 instead of
split compile and fit on sm_90.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass

os.environ.pop("TRITON_INTERPRET", None)  # real compiles; before triton is imported

import torch  # noqa: E402
import triton  # noqa: E402

try:  # the installed package, or the repo's kernels/ from a checkout
    from samhq_fx.kernels import arch, configs, fit, tiles
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from kernels import arch, configs, fit, tiles

# mode -> (dtype, torch's fp32 matmul precision)
MODES = {"bf16": (torch.bfloat16, "highest"), "fp16": (torch.float16, "highest"),
         "tf32": (torch.float32, "high"), "tf32x3": (torch.float32, "highest")}
# model -> (heads, head dim)
MODELS = {"B": (12, 64), "L": (16, 64), "H": (16, 80)}
# what the check covers unless --px says otherwise: SAM's 1024 px and the fine-tuning sizes; the other sizes compile
# with spills and, above 1024 px (key grids over 64 wide), some launches do not fit (benchmarks/DECISIONS.md)
SAM_PX = (1024, 512, 256)
BATCHES = (1, 8)


def resolution(px: int) -> tuple[int, int]:
    """(global key grid side, windows per image) of a px-wide SAM image: 16-pixel patches, the grid padded to whole
    14x14 windows (any multiple of 16)."""
    if px % 16 or not 16 <= px <= 4096:
        raise ValueError(f"image size {px}: a multiple of 16 (SAM's patch) from 16 to 4096")
    side = px // 16
    return side, (-(-side // 14)) ** 2


@dataclass(frozen=True)
class SamShape:
    model: str  # "B", "L", "H"
    layer: str  # "global" or "window"
    px: int  # image side
    batch: int

    @property
    def name(self) -> str:
        return f"{self.model}/{self.layer[0]}{self.px}/b{self.batch}"

    def fit_shape(self) -> fit.Shape:
        heads, d = MODELS[self.model]
        side, windows = resolution(self.px)
        # the output heads-last, as the rewrite writes it for SAM's attention (both HF classes, segment_anything)
        if self.layer == "global":
            return fit.Shape(self.batch * heads, side * side, side, side, d, d, heads=heads)
        return fit.Shape(self.batch * windows * heads, 196, 14, 14, d, d, heads=heads)


# 16-bit launches that may spill, with the figure: (classes, kernel, head dim, key tile of dQ's blocks (the forward's
# for "fwd"), most stack bytes per thread by Triton version (one not named: none may spill), why). fp16 takes bf16's
# entries (the same configs). CI compiles with 3.6, 3.7, 3.8 and 3.9 (3.7 / 3.8: what torch 2.12 / 2.14 install;
# benchmarks/DECISIONS.md, "Tritons 3.7 and 3.8")
ALLOWED_SPILLS: list[tuple[tuple[str, ...], str, int, int, dict[str, int], str]] = [
    (("sm_120",), "bwd:dq", 80, 64, {"3.6": 8, "3.7": 112, "3.8": 80, "3.9": 88},
     "ViT-H global dQ on sm_120, SPLIT_ROW 64 / 4 warps (plain: 152-272 B)"),
    (("sm_90",), "bwd:both", 80, 32, {"3.6": 48, "3.7": 8, "3.8": 8},
     "ViT-H 256 px global at batch 1 on sm_90 (the spill-free rows of more rows: 1.26x slower there)"),
    (("sm_100",), "bwd:dq", 80, 64, {"3.6": 8, "3.7": 32}, "ViT-H 512 px global dQ on sm_100, batch 8 (bf16 and fp16)"),
    (("sm_120",), "bwd:dkdv", 80, 32, {"3.7": 16, "3.8": 16, "3.9": 16}, "ViT-H windows dK/dV on sm_120"),
    (("sm_80",), "bwd:dq", 80, 64, {"3.7": 8}, "ViT-H global dQ on sm_80, SPLIT_ROW"),
]


def _triton_version() -> str:
    return ".".join(triton.__version__.split(".")[:2])


def key_tile(launch: fit.Launch) -> int:
    """Keys per tile of dQ's blocks (of the forward's, for "fwd"): R grid rows of WK_PAD columns."""
    c = dict(launch.constexprs)
    return c.get("R_Q", c.get("R", 0)) * c.get("WK_PAD", 0)


def allowed_spills(built: fit.Built) -> tuple[int, str] | None:
    """(most bytes, why) where ALLOWED_SPILLS names this 16-bit launch for the installed Triton, else None."""
    version = _triton_version()
    for archs, kernel, d, tile, most, why in ALLOWED_SPILLS:
        if (built.arch.name in archs and built.launch.kernel == kernel and head_dim(built.launch) == d
                and key_tile(built.launch) == tile and version in most):
            return most[version], why
    return None


def describe(launch: fit.Launch) -> str:
    """A launch's blocks as the config table names them: queries x keys per block, warps, stages."""
    c, o = dict(launch.constexprs), dict(launch.options)
    wk_pad = c.get("WK_PAD", 0)
    if launch.kernel == "fwd":
        blocks = f"{c['BLOCK_M']}x{c['R'] * wk_pad}" + (" sel" if c.get("RH_SELECT") else "")
    else:
        parts = []
        if launch.kernel in ("bwd:dq", "bwd:both"):
            parts.append(f"q {c['BLOCK_M_Q']}x{c['R_Q'] * wk_pad}" + (" sel" if c.get("RH_SELECT_Q") else "")
                         + (" split" if c.get("SPLIT_ROW_Q") else ""))
        if launch.kernel in ("bwd:dkdv", "bwd:both"):
            parts.append(f"kv {c['BLOCK_M_KV']}x{c['R_KV'] * wk_pad}" + (" sel" if c.get("RH_SELECT_KV") else "")
                         + (" biasT" if c.get("BIAS_T") else ""))
        blocks = " ".join(parts)
    return f"{blocks} w{o.get('num_warps')} s{o.get('num_stages')}"


def head_dim(launch: fit.Launch) -> int:
    c = dict(launch.constexprs)
    return max(c["D"], c["DV"])


def verdict(built: fit.Built, mode: str) -> tuple[bool, str]:
    """(fails the check, the verdict in words)."""
    if built.misfit:
        return True, "over: " + built.misfit
    if built.spills and mode in ("bf16", "fp16"):
        allowed = allowed_spills(built)
        if allowed and built.spills <= allowed[0]:
            return False, f"fits, spills {built.spills} B allowed ({allowed[1]})"
        return True, f"spills {built.spills} B in {mode}"
    return False, "fits" + (f", spills {built.spills} B" if built.spills else "")


def table(archs: list[str], modes: list[str], shapes: list[SamShape], workers: int | None) -> list[dict]:
    """Record every launch, compile each distinct (launch, arch) once, and return a row per (arch, mode, launch)."""
    served: dict[tuple, list[str]] = {}  # (arch, mode, launch) -> shape names, in order
    for a in archs:
        for mode in modes:
            dtype, prec = MODES[mode]
            for s in shapes:
                for launch in fit.launches(arch.ARCHS[a], dtype, prec, s.fit_shape()):
                    served.setdefault((a, mode, launch), []).append(s.name)
    todo = list(dict.fromkeys((launch, arch.ARCHS[a]) for a, _, launch in served))
    built = dict(zip(todo, fit.build_all(todo, workers)))
    rows = []
    for (a, mode, launch), names in served.items():
        b = built[(launch, arch.ARCHS[a])]
        failed, why = verdict(b, mode)
        rows.append(dict(arch=a, triton=triton.__version__, mode=mode, kernel=launch.kernel, d=head_dim(launch),
                         config=describe(launch), smem=b.shared, registers=b.registers, spills=b.spills, tmem=b.tmem,
                         ctas_per_sm=b.ctas_per_sm, warps_per_sm=b.ctas_per_sm * b.warps, failed=failed,
                         verdict=why, shapes=names))
    return rows


def extras(workers: int | None) -> list[dict]:
    """The sweeps' OVERRIDES (benchmarks/tools/sweep_kernels.py) and head dim 80 padded to 128, on sm_90."""
    h = arch.ARCHS["sm_90"]
    cases = [  # (name, mode, shape, overrides, split head dims)
        ("RH_SELECT dK/dV, dQ at 7x7", "tf32", fit.Shape(2, 49, 7, 7, 64, 64),
         {"dq": dict(RH_SELECT=True), "dkdv": dict(RH_SELECT=True)}, True),
        ("fused bwd, dK/dV 32x128 sel at 64x64", "bf16", fit.Shape(2, 4096, 64, 64, 64, 64),
         {"bwd": dict(FUSED=True), "dkdv": dict(BLOCK_N=128, BLOCK_M=32, RH_SELECT=True)}, True),
    ] + [(f"D=80 padded to 128, {mode} {side}x{side}", mode, fit.Shape(b, side * side, side, side, 80, 80), {}, False)
         for mode in ("bf16", "tf32", "tf32x3") for side, b in ((14, 400), (64, 16))]
    rows = []
    saved = (configs.OVERRIDES, tiles.SPLIT_HEAD_DIM)
    try:
        for name, mode, shape, overrides, split in cases:
            configs.OVERRIDES = dict(overrides)  # a new object: the host's call plans are keyed by its identity
            tiles.SPLIT_HEAD_DIM = split
            dtype, prec = MODES[mode]
            found = fit.launches(h, dtype, prec, shape)
            for b in fit.build_all([(launch, h) for launch in found], workers):
                rows.append(dict(arch=h.name, triton=triton.__version__, mode=mode, kernel=b.launch.kernel,
                                 d=head_dim(b.launch), config=describe(b.launch), smem=b.shared,
                                 registers=b.registers, spills=b.spills, tmem=b.tmem, ctas_per_sm=b.ctas_per_sm,
                                 warps_per_sm=b.ctas_per_sm * b.warps, failed=bool(b.misfit),
                                 verdict="over: " + b.misfit if b.misfit else "fits", shapes=[name]))
    finally:
        configs.OVERRIDES, tiles.SPLIT_HEAD_DIM = saved
    return rows


def print_rows(rows: list[dict], quiet: bool) -> None:
    last = None
    for r in rows:
        if (r["arch"], r["mode"]) != last:
            last = (r["arch"], r["mode"])
            print(f"\n{r['arch']} ({arch.ARCHS[r['arch']].gpus}), triton {r['triton']}, {r['mode']}")
        if quiet and not r["failed"]:
            continue
        shapes = ",".join(r["shapes"][:6]) + (f",+{len(r['shapes']) - 6}" if len(r["shapes"]) > 6 else "")
        tm = f" tmem {r['tmem']:3d}" if r["tmem"] else ""
        print(f"  {'FAIL' if r['failed'] else 'ok  '} {r['kernel']:8s} D={r['d']:<3d} {r['config']:30s} "
              f"smem {r['smem'] / 1024:5.1f} KB  regs {r['registers']:3d}  spills {r['spills']:5d}{tm}  "
              f"CTAs/SM {r['ctas_per_sm']}  {r['verdict']}  [{shapes}]")


def summary(rows: list[dict]) -> list[str]:
    """A line per architecture: launches, the most shared memory, 16-bit and fp32 launches that spill, failures."""
    lines = []
    for a in dict.fromkeys(r["arch"] for r in rows):
        mine = [r for r in rows if r["arch"] == a]
        spill16 = sum(1 for r in mine if r["spills"] and r["mode"] in ("bf16", "fp16"))
        spill32 = sum(1 for r in mine if r["spills"] and r["mode"] not in ("bf16", "fp16"))
        lines.append(f"{a:7s} triton {mine[0]['triton']}: {len(mine)} launches, max smem "
                     f"{max(r['smem'] for r in mine) / 1024:.1f} KB of {arch.ARCHS[a].smem / 1024:.0f}, "
                     f"spilling {spill16} 16-bit / {spill32} fp32, {sum(r['failed'] for r in mine)} failing")
    return lines


def _image_size(text: str) -> int:
    try:
        px = int(text)
        resolution(px)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e) if "image size" in str(e) else f"image size {text!r}: not a number")
    return px


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"batch {text!r}: a whole number of images, at least 1")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", nargs="+", default=list(arch.ARCHS), choices=list(arch.ARCHS))
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--model", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batch", nargs="+", type=_positive, default=list(BATCHES))
    p.add_argument("--px", nargs="+", type=_image_size, default=list(SAM_PX),
                   help="image sizes: 1024 (64x64 global, 25 windows), 512 (32x32, 9), 256 (16x16, 4), the default; "
                        "also 384 (24x24, 4), 640 (40x40, 9), 768 (48x48, 16), 1280 (80x80, 36), outside the check, or "
                        "any other multiple of 16")
    p.add_argument("--no-extras", action="store_true", help="skip the sweep OVERRIDES and padded head dim 80")
    p.add_argument("--jobs", type=int, default=None, help="compile threads (default: CPU count, at most 8)")
    p.add_argument("--json", help="write the rows to this file")
    p.add_argument("--quiet", action="store_true", help="print failing launches and the summary only")
    args = p.parse_args(argv)
    start = time.time()
    shapes = [SamShape(m, layer, px, b) for m in args.model for layer in ("global", "window") for px in args.px
              for b in args.batch]
    rows = table(args.arch, args.mode, shapes, args.jobs)
    if not args.no_extras:
        rows += extras(args.jobs)
    print_rows(rows, args.quiet)
    print()
    for line in summary(rows):
        print(line)
    failed = [r for r in rows if r["failed"]]
    print(f"{len(rows)} launches, {len(failed)} failing, triton {triton.__version__}, {time.time() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
