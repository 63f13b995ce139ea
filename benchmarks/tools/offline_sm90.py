"""What a kernel config costs on Hopper, read without a GPU: registers, spills, shared memory, CTAs per SM by each
limit, and from the SASS how many exponentials run between a wgmma wait that leaves one MMA in flight and the wait
for none (the softmax / MMA overlap that Triton's tl kernels never have; benchmarks/DECISIONS.md).

    python benchmarks/tools/offline_sm90.py bwd bf16 dkdv '{"num_warps": 4, "num_stages": 3, "BLOCK_M_KV": 32}'
    python benchmarks/tools/offline_sm90.py fwd fp32 - '{"BLOCK_M": 64, "R": 2, "WK_PAD": 32, "HK": 32, "WK": 32}'
    python benchmarks/tools/offline_sm90.py fwd bf16 - '{"D": 80, "DV": 80, "D_B": 16, "DV_B": 16}'
    python benchmarks/tools/offline_sm90.py bwd bf16 dkdv '{"num_warps": 8, "R_KV": 2, "RH_SELECT_KV": true, "maxnreg": 128}'
    SAMHQ_FX_SPLIT_HEAD_DIM=1 python benchmarks/tools/offline_sm90.py --table 80

--table D: every launch the host code makes (forward and backward, configs from kernels/configs.py) at SAM's shape
classes with head dim D, in bf16, TF32 and 3-pass TF32, compiled for sm_90; a line each, and an error naming the
shape and kernel where shared memory is over the 227 KB a CTA may have (such a config fails at launch on the GPU).

tl kernels are typed for the SAM-B global layer (64x64 grid, head dim 64) unless the JSON overrides a constexpr
(HK, WK, WK_PAD, D / DV with their chunks D_A, D_B, DV_A, DV_B as tiles.split gives them, R / R_KV / R_Q, BLOCK_M
/ BLOCK_M_KV / BLOCK_M_Q, RH_SELECT*, BIAS_T, KMAJOR, PREC; fp32 means TF32 dots, "PREC": "tf32x3" for "highest").
Registers and shared memory have matched ncu on the H200 every time they were compared (2026-11-30 and 2026-12-01) with
the GPU's Triton; another Triton version allocates registers its own way (3.9: 164 against ncu's 185 for TF32 dK/dV
at head dim 80, where 3.6 gives 185). The tool needs no torch: `python -m venv V && V/bin/pip install triton==3.6.0`
and run it with V/bin/python to read the GPU's figures. What this cannot show is time: it reads the schedule, not
the clock.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from unittest import mock

import triton
from triton.backends.compiler import GPUTarget

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repo root: kernels/
try:
    from samhq_fx.kernels import backward as kb
    from samhq_fx.kernels import forward as kf
except ImportError:  # not installed: the repo's kernels/ directory
    from kernels import backward as kb
    from kernels import forward as kf

TARGET = GPUTarget("cuda", 90, 32)
SM_REGS, SM_SHARED, SM_WARPS, CTA_RESERVED = 65536, 233472, 64, 1024  # H100 / H200 per-SM limits, bytes
CTA_SHARED_MAX = 232448  # the most one CTA may ask for (Triton's OutOfResources limit on the H200)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

# strides Inductor passes as constants (== 1), as the kernels are specialized in practice
_UNIT_STRIDES = {"srh_k", "srw_k", "srht_n", "srwt_n", "slse_n", "sdrh_k", "sdrw_k"}
_KMAJOR_STRIDES = {"sqt_d", "sdot_d", "skt_d", "svt_d"}


def compile_tl(kernel: str, dtype: str, part: str, overrides: dict):
    """Compile forward.py's or backward.py's kernel for sm_90 with SAM-B constexprs updated by `overrides`."""
    fn = kb._bwd_kernel if kernel == "bwd" else kf._fwd_kernel
    const = dict(HK=64, WK=64, D=64, DV=64, WK_PAD=64, D_A=64, D_B=0, DV_A=64, DV_B=0,
                 PREC="none" if dtype == "bf16" else "tf32",
                 KMAJOR=dtype == "fp32", PART=part, R_KV=1, BLOCK_M_KV=64 if dtype == "bf16" else 32,
                 RH_SELECT_KV=False, BIAS_T=True, R_Q=1, BLOCK_M_Q=64, RH_SELECT_Q=False, R=1, BLOCK_M=64,
                 RH_SELECT=False, RH_QW=0, RW_QW=0, RHT_QW=0, RWT_QW=0)
    overrides = dict(overrides)
    num_warps, num_stages = overrides.pop("num_warps", 4), overrides.pop("num_stages", 3)
    options = dict(num_warps=num_warps, num_stages=num_stages)
    if "maxnreg" in overrides:  # a register cap for ptxas, as configs.py's MAXNREG
        options["maxnreg"] = overrides.pop("maxnreg")
    const.update(overrides)
    sig, consts, attrs = {}, {}, {}
    for i, p in enumerate(fn.arg_names):
        if p in const:
            sig[p], consts[(i,)] = "constexpr", const[p]
        elif p.startswith("s") and ((p.endswith("_d") and p not in _KMAJOR_STRIDES) or p in _UNIT_STRIDES):
            sig[p], consts[(i,)] = "constexpr", 1
        elif p == "N_Q" or p.startswith("s"):
            sig[p], attrs[(i,)] = "i32", [["tt.divisibility", 16]]
        elif p in ("qk_scale", "scale"):
            sig[p] = "fp32"
        else:
            sig[p], attrs[(i,)] = ("*fp32" if p in ("LSE", "DELTA") else f"*{dtype}"), [["tt.divisibility", 16]]
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn, sig, consts, attrs), target=TARGET, options=options), num_warps


def sass(cubin: bytes, *flags: str) -> str:
    """cuobjdump's output for a cubin (Triton's bundled binary)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([os.path.join(_BIN, "cuobjdump"), *flags, f.name], capture_output=True, text=True,
                              check=True).stdout


def exps_between_waits(cubin: bytes) -> list[int]:
    """Per wait pair of the SASS: MUFU.EX2 between 'wait until 1 MMA in flight' and 'wait until 0'."""
    counts, inside, n = [], False, 0
    for op in re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x[01]|MUFU\.EX2", sass(cubin, "-sass")):
        if op.endswith("0x1"):
            inside, n = True, 0
        elif op.endswith("0x0"):
            if inside:
                counts.append(n)
            inside = False
        else:
            n += inside
    return counts


def report(compiled, num_warps: int) -> dict:
    """Registers, local memory (spills), shared memory, CTAs per SM by each limit, wgmma waits and overlap."""
    usage = re.search(r"REG:(\d+) STACK:(\d+).*?LOCAL:(\d+)", sass(compiled.asm["cubin"], "-res-usage"), re.S)
    regs, stack, local = map(int, usage.groups())
    smem = compiled.metadata.shared
    limits = dict(regs=SM_REGS // (-(-regs // 8) * 8 * 32 * num_warps), shared=SM_SHARED // (smem + CTA_RESERVED),
                  warps=SM_WARPS // num_warps)
    return dict(registers=regs, stack=stack, local=local, shared=smem, ctas_per_sm=min(limits.values()),
                ctas_by_limit=limits, wgmma=compiled.asm["ptx"].count("wgmma.mma_async"),
                waits=re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", compiled.asm["ptx"]),
                exps_between_waits=exps_between_waits(compiled.asm["cubin"]))


# SAM's attention shapes as (batch * heads, key grid): ViT-H's global layer at batch 1 and 2, its 14x14 windows
# (25 windows x 16 heads), and the small-batch classes where configs.py picks one fused backward launch
TABLE_SHAPES = [(16, 64), (32, 64), (400, 14), (24, 14), (12, 14), (64, 7)]
TABLE_MODES = [("bf16", "high"), ("fp32", "high"), ("fp32", "highest")]


def launches(dtype: str, precision: str, b: int, grid: int, d: int) -> list[tuple[str, str, dict]]:
    """(kernel, part, constexprs and launch options) of every launch forward() and backward() make for one shape,
    recorded on meta tensors (nothing runs)."""
    import torch

    try:
        from samhq_fx.kernels import rel_pos_attention as K
    except ImportError:
        from kernels import rel_pos_attention as K
    made = []

    class Recorder:
        def __init__(self, fn):
            self.fn = fn

        def __getitem__(self, grid_):
            kernel = "bwd" if self.fn is kb._bwd_kernel else "fwd"
            return lambda *args, **kw: made.append((kernel, kw.get("PART", "-"), kw))

    t = torch.bfloat16 if dtype == "bf16" else torch.float32
    n = grid * grid
    q, k, v = (torch.empty(b, n, d, dtype=t, device="meta") for _ in range(3))
    rel = torch.empty(b, n, grid, dtype=t, device="meta")
    old = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        with mock.patch.object(torch.library, "wrap_triton", Recorder):
            out, lse = K.forward(q, k, v, rel, rel, 0.125)
            K.backward(out, q, k, v, rel, rel, out, lse, 0.125)
    finally:
        torch.set_float32_matmul_precision(old)
    return made


def check_table(d: int) -> int:
    """Compile every launch of TABLE_SHAPES x TABLE_MODES at head dim d; the number over CTA_SHARED_MAX."""
    seen, over = {}, 0
    for dtype, precision in TABLE_MODES:
        for b, grid in TABLE_SHAPES:
            for kernel, part, kw in launches(dtype, precision, b, grid, d):
                key = (kernel, dtype, part, json.dumps(kw, sort_keys=True))
                if key not in seen:
                    seen[key] = report(*compile_tl(kernel, dtype, part, kw))
                r = seen[key]
                bad = r["shared"] > CTA_SHARED_MAX
                over += bad
                print(f"{'OVER ' if bad else 'ok   '}{dtype:4s} {precision:7s} {b:4d} x {grid}x{grid} d={d} "
                      f"{kernel}/{part:4s} shared {r['shared'] // 1024:3d} KB regs {r['registers']:3d} "
                      f"ctas/SM {r['ctas_per_sm']} "
                      f"warps {kw['num_warps']} stages {kw['num_stages']}", flush=True)
    return over


def main(argv=None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--table"]:
        over = check_table(int(args[1]) if len(args) > 1 else 80)
        if over:
            raise SystemExit(f"{over} launches ask for more than {CTA_SHARED_MAX} bytes of shared memory")
        return
    if len(args) < 3:
        raise SystemExit(__doc__)
    kernel, dtype, part = args[:3]
    overrides = json.loads(args[3]) if len(args) > 3 else {}
    compiled, num_warps = compile_tl(kernel, dtype, part, overrides)
    print(json.dumps(report(compiled, num_warps)))


if __name__ == "__main__":
    main()
