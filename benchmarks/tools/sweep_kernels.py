"""Sweeps of the rel-pos attention kernels' block configs and variants (H200; results feed kernels/configs.py).

Each sweep times one kernel's alternatives with the others as shipped, through `configs.OVERRIDES`, by
CUDA-graph replay (do_bench median, L2 flushed; bench_attention_core.graph_bench). A config that does not
fit the SM fails at its first launch and is recorded as an error, not fatal.

    python benchmarks/tools/sweep_kernels.py --bwd       # backward: split vs fused launch, dK/dV and dQ blocks; fwd blocks
    python benchmarks/tools/sweep_kernels.py --narrow    # fp32 block configs on the narrow 076 grids
    python benchmarks/tools/sweep_kernels.py --narrow-bf16 --narrow16  # bf16 on narrow grids; fp32 with 16-key tiles
    python benchmarks/tools/sweep_kernels.py --tables OLD_configs.py     # another revision's config table vs this one
    python benchmarks/tools/sweep_kernels.py --fp32-occupancy  # fp32 dK/dV / dQ configs with more warps per SM
    python benchmarks/tools/sweep_kernels.py --d80-fp32  # TF32 dK/dV / dQ configs at ViT-H's head dim 80
    python benchmarks/tools/sweep_kernels.py --d80-bf16  # bf16 forward / dQ key tiles at ViT-H's windows, D=80 and 64
    python benchmarks/tools/sweep_kernels.py --maxnreg   # bf16 kernels with a register cap, one more CTA per SM
    python benchmarks/tools/sweep_kernels.py --dkdv128   # bf16 dK/dV with 128-key tiles and 8 warps (capped at 128 registers)
    --baseline FILE: also time a kernels module from FILE (e.g. `git show REV:kernels/rel_pos_attention.py`
    when that revision was one file) on the same shapes, in the same process: before / after without
    a second run. --warm-only --shard i/n compiles first, in parallel processes (below).
    Appends one row per timed candidate to benchmarks/results/sweep_kernels.jsonl (or --out: a .jsonl file, or a
    directory for <dir>/sweep_kernels.jsonl), each starting with common.row_meta (commit, date, GPU, versions) and
    naming its sweep; a table last.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/: common, bench_attention_core
import common  # noqa: E402
from bench_attention_core import (D, HEADS, K, MODES, SOL, flops, graph_bench, load_module, make,  # noqa: E402
                                  ours_fns)


@contextlib.contextmanager
def overrides(table: dict):
    saved = K.configs.OVERRIDES
    K.configs.OVERRIDES = table
    try:
        yield
    finally:
        K.configs.OVERRIDES = saved


# --warm-only --shard i/n: compile every candidate once, in n processes at once, into Triton's on-disk
# cache, so that the timing pass that follows (one process, nothing else on the GPU) compiles nothing
WARM = dict(only=False, shard=0, shards=1, calls=0)


def time_call(kernels, q, k, v, rh, rw, do, which: str):
    """GPU ms of forward ('fwd') or backward ('bwd') through a kernels module, or an error string."""
    WARM["calls"] += 1
    if WARM["only"] and WARM["calls"] % WARM["shards"] != WARM["shard"]:
        return "skipped (another shard warms it)"
    try:
        fwd, bwd, _ = ours_fns(q, k, v, rh, rw, do, D ** -0.5, kernels)  # compiles the forward
        if WARM["only"]:
            bwd()
            return 0.0
        return graph_bench(fwd if which == "fwd" else bwd)
    except Exception as e:  # noqa: BLE001 - a config that does not fit is a result
        torch.cuda.synchronize()
        return f"{type(e).__name__}: {str(e)[:160]}"


# --bwd: the backward's launch (split: dQ then dK/dV; fused: one launch) and the dK/dV / dQ blocks on the
# SAM-B global layer; split vs fused on every 076 shape. RH_SELECT matters for R > 1 tiles only
# (128-key dK/dV tiles on 64-wide grids).
_KV = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s, RH_SELECT=True)
       for bm, bn, w, s in ((32, 128, 4, 5), (64, 128, 8, 3), (32, 64, 4, 4), (64, 64, 4, 4), (128, 64, 8, 2))]
_Q = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s)
      for bm, bn, w, s in ((128, 64, 8, 3), (64, 64, 4, 4), (128, 64, 4, 2))]
_FWD = [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=s, RH_SELECT=True)
        for bm, bn, w, s in ((128, 64, 8, 3), (128, 128, 8, 3), (64, 128, 4, 3))]
# fused-launch variants: dK/dV and dQ must agree on warps and stages
_FUSED = {
    "fused": {"bwd": dict(FUSED=True)},
    "fused-4w3s": {"bwd": dict(FUSED=True), "dkdv": dict(num_warps=4, num_stages=3),
                   "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)},
    "fused-4w2s": {"bwd": dict(FUSED=True), "dkdv": dict(num_warps=4, num_stages=2),
                   "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2)},
}


def sweep_bwd(results, baseline=None, sam=(64, HEADS), shapes=SOL):
    rows = []
    side, b = sam
    for mode in ("bf16", "fp32-tf32"):
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        q, k, v, rh, rw, do = make(b, side, dtype)
        cands = [("shipped", "bwd", {}), ("shipped", "fwd", {})]
        cands += [(f"fwd {c}", "fwd", {"fwd": c}) for c in _FWD]
        cands += [(name, "bwd", o) for name, o in _FUSED.items()]
        cands += [(f"dkdv {c}", "bwd", {"dkdv": c}) for c in _KV]
        cands += [(f"dkdv {c} fused", "bwd", {"dkdv": c, "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=c["num_warps"],
                                                                     num_stages=c["num_stages"]), "bwd": dict(FUSED=True)})
                  for c in _KV[:2]]
        cands += [(f"dq {c}", "bwd", {"dq": c}) for c in _Q]
        for name, which, table in cands:
            with overrides(table):
                ms = time_call(K, q, k, v, rh, rw, do, which)
            rows.append(dict(sweep="sam_b", mode=mode, grid=side, batch=1, variant=name, kernel=which,
                             **({"ms": ms} if isinstance(ms, float) else {"error": ms})))
            print(rows[-1], flush=True)
        if baseline is not None:
            for which in ("fwd", "bwd"):
                ms = time_call(baseline, q, k, v, rh, rw, do, which)
                rows.append(dict(sweep="sam_b", mode=mode, grid=side, batch=1, variant="baseline", kernel=which,
                                 **({"ms": ms} if isinstance(ms, float) else {"error": ms})))
                print(rows[-1], flush=True)
    # split vs fused on the 076 shapes
    for mode in ("bf16", "fp32-tf32"):
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        for side, batch in shapes:
            q, k, v, rh, rw, do = make(batch * HEADS, side, dtype)
            variants = [("shipped", K, {}), ("split", K, {"bwd": dict(FUSED=False)}),
                        ("fused-4w3s", K, _FUSED["fused-4w3s"])]
            if mode == "bf16":
                variants.append(("fused", K, _FUSED["fused"]))
            if baseline is not None:
                variants.append(("baseline", baseline, {}))
            for name, mod, table in variants:
                with overrides(table):
                    ms = time_call(mod, q, k, v, rh, rw, do, "bwd")
                rows.append(dict(sweep="sol", mode=mode, grid=side, batch=batch, variant=name, kernel="bwd",
                                 **({"ms": ms} if isinstance(ms, float) else {"error": ms})))
                print(rows[-1], flush=True)
    results["sweep_bwd"] = rows
    if not WARM["only"]:
        print_bwd_tables(rows, shapes)
    return rows


def print_bwd_tables(rows, shapes=SOL):
    print("\nSAM-B global layer (12 heads, 64x64, D=64), us (TFLOP/s credited: fwd 4, bwd 10 N^2 D per head):")
    f_fwd, f_bwd = flops(HEADS, 64 * 64, D)
    for r in rows:
        if r["sweep"] == "sam_b":
            tf = (f_fwd if r["kernel"] == "fwd" else f_bwd) / r["ms"] / 1e9 if "ms" in r else 0
            cell = f"{r['ms'] * 1e3:8.1f} {tf:6.0f}" if "ms" in r else f"ERROR {r['error'][:50]}"
            print(f"  {r['mode']:<10}{r['kernel']:<4} {r['variant'][:90]:<92}{cell}")
    print("\n076 shapes, backward us:")
    names = []
    for r in rows:
        if r["sweep"] == "sol" and r["variant"] not in names:
            names.append(r["variant"])
    print(f"  {'mode':<10}{'shape':<10}" + "".join(f"{n:>13}" for n in names))
    for mode in ("bf16", "fp32-tf32"):
        for side, batch in shapes:
            cells = []
            for n in names:
                r = [x for x in rows if x["sweep"] == "sol" and x["mode"] == mode and (x["grid"], x["batch"]) == (side, batch)
                     and x["variant"] == n and "ms" in x]
                cells.append(f"{r[0]['ms'] * 1e3:13.1f}" if r else f"{'-':>13}")
            print(f"  {mode:<10}{f'{side}x{side}x{batch}':<10}" + "".join(cells))


# --narrow: block configs on the narrow grids (Wk <= 32: several grid rows per key tile unless BLOCK_N is the
# padded row width). fp32 on the narrow 076 grids; --narrow-bf16 adds 16-key tiles (R = 1 on 14- and 16-wide
# grids) and SAM-B's windowed layer (14x14 windows, 25 per image, batch 4: 100 x 12 heads)
NARROW = [(7, 64), (14, 8), (32, 4), (48, 2)]
NARROW_BF16 = [(7, 64), (14, 8), (14, 100), (16, 32), (32, 4), (48, 2)]
_SELECT = [dict(BLOCK_M=64, BLOCK_N=bn, num_warps=4, num_stages=3, RH_SELECT=True) for bn in (64, 128)]
NARROW_CANDS = {
    "fwd": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=3)
            for bm, w in ((64, 4), (128, 8)) for bn in (32, 64, 128)] + _SELECT,
    "dkdv": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3) for bm in (32, 64) for bn in (32, 64, 128)],
    "dq": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=3)
           for bm, w in ((64, 4), (128, 8)) for bn in (32, 64, 128)] + _SELECT,
}
_SELECT16 = [dict(BLOCK_M=64, BLOCK_N=bn, num_warps=4, num_stages=4, RH_SELECT=True) for bn in (32, 64)]
# fp32: 16-key tiles were not among the 2026-11-30 candidates
NARROW16 = [(7, 64), (14, 1), (14, 8), (16, 1), (16, 32)]
NARROW16_CANDS = {
    "fwd": [dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=3), dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=3)],
    "dkdv": [dict(BLOCK_M=32, BLOCK_N=16, num_warps=4, num_stages=3), dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=3),
             dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3, RH_SELECT=True)],
    "dq": [dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=3), dict(BLOCK_M=128, BLOCK_N=16, num_warps=8, num_stages=2)],
}
NARROW_CANDS_BF16 = {
    "fwd": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=4)
            for bm, w in ((64, 4), (128, 8)) for bn in (16, 32, 64)] + _SELECT16,
    # dK/dV's rel_h by selects: not timed when (2026-12-01) selects won 3x in the forward
    "dkdv": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3) for bm in (32, 64) for bn in (16, 32, 64)]
    + [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=4, num_stages=3, RH_SELECT=True) for bm in (32, 64) for bn in (32, 64)]
    # the bias copies with queries contiguous on grids <= 16 wide too (the 2026-11-30 rows left them off there, measured on
    # small problems where the copy is launch cost; SAM's windows at batch 4 are not small)
    + [dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3, RH_SELECT=sel, BIAS_T=True) for sel in (False, True)],
    "dq": [dict(BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=3)
           for bm, w in ((64, 4), (128, 8)) for bn in (16, 32, 64)] + _SELECT16,
}


# --fp32-occupancy: fp32 "high" dK/dV and dQ configs that fit more warps per SM on the wide grids. Since the
# K-major copies (2026-11-30) the shipped dK/dV (32 queries, 4 warps, 4 stages) needs 185 KB of shared memory
# and dQ (128 x 32, 8 warps, 3 stages) 208 KB: one CTA per SM, 4 or 8 warps (offline, sm_90a, Triton 3.6).
# At 2 stages dK/dV needs 104 KB and 174 registers: two CTAs per SM. 128-key dK/dV tiles (two grid rows, selects)
# at 8 warps, 2 stages: 145 KB, 176 registers, one CTA of two warp groups with 128-row MMAs. dQ stays at one CTA
# (254 registers). In the 076 entry at 64x64x4, fp32 dK/dV is 4792 us against dQ's 1540 for 4 MMAs against 3.
OCC_SHAPES = [(64, 1), (64, 4), (56, 1), (48, 2), (32, 8)]
OCC_CANDS = {
    "dkdv": [dict(BLOCK_M=32, num_warps=4, num_stages=2), dict(BLOCK_M=32, num_warps=8, num_stages=3),
             dict(BLOCK_M=64, num_warps=8, num_stages=2), dict(BLOCK_M=32, num_warps=4, num_stages=3),
             dict(BLOCK_M=32, BLOCK_N=128, num_warps=8, num_stages=2, RH_SELECT=True)],
    "dq": [dict(BLOCK_M=128, num_warps=8, num_stages=2), dict(BLOCK_M=64, num_warps=8, num_stages=2)],
}

# --fp32-small-steps: after the 2-stage dK/dV (2026-12-01: two CTAs per SM), 16-query dK/dV steps fit more
# (offline, sm_90a, Triton 3.6, 64-wide grid): "high" at 2 stages 152 registers and 70 KB (3 CTAs), at 3
# stages 157 and 90 KB (2); "highest" (3-pass TF32) at 2 stages 242 registers and 94 KB (2 CTAs, against
# the shipped 32-query 3-stage 246 and 165 KB: one). fp32 dQ has no config with two CTAs and wgmma (32-query
# blocks drop to mma.sync), so it is not swept here.
SMALL_STEP_SHAPES = [(64, 1), (64, 4), (32, 8), (16, 32)]
SMALL_STEP_CANDS = {
    "fp32-tf32": {"dkdv": [dict(BLOCK_M=16, num_warps=4, num_stages=2), dict(BLOCK_M=16, num_warps=4, num_stages=3)]},
    "fp32-highest": {"dkdv": [dict(BLOCK_M=16, num_warps=4, num_stages=2), dict(BLOCK_M=32, num_warps=4, num_stages=2)]},
}

# --d80-fp32: TF32 at ViT-H's head dim 80 (64 + 16), 16 heads, its global grid and 14x14 windows (25 per image), the
# layer 1.68x / 1.44x head dim 64's (f6b9dbe; target 1.3x). The shipped dK/dV runs 16-query steps (2 CTAs per SM);
# the 32-query steps at 1 CTA per SM were the risk named before the timing. Offline (sm_90a, compiled on the CI CPU
# with Triton 3.9, 2026-12-02), global / windows: dK/dV shipped (16, 2 stages) 84 / 88 KB, 2 CTAs per SM; 32 at 2
# stages 128 / 136 KB, 1; 32 at 3 stages 176 / 192 KB, 1; 16 at 3 stages 108 / 116 KB, 2 / 1. dQ shipped 200 KB
# (8 warps, 2 stages) / 85 KB, 1 / 2 CTAs; 64 queries, 4 warps, 2 stages 160 / 70 KB, 1 / 3; 3 stages 220 / 85 KB.
# Measured (H200, 2026-12-03, results/sweep_kernels.jsonl, sweep "sweep_d80_fp32"): dK/dV at 16 queries and 3 stages, backward 3170 ->
# 2622 us global (now shipped there), 540 -> 615 windows; the others lost.
# The windows' dQ at 2 stages (offline, sm_90, Triton 3.9: 168 registers / 70 KB, 3 CTAs per SM against 162 / 85 KB,
# 2 at the shipped 3; the global layer ships 2 stages already) lost: 577.8 against 540.6 us (050645a, 2026-12-03,
# results/sweep_kernels.jsonl). Register caps would add a CTA to the forward (130 -> 127, 4) but
# Inductor's triton_op launches drop them (benchmarks/DECISIONS.md, register caps).
D80_SHAPES = [(64, 1), (14, 25)]
D80_CANDS = {
    "dkdv": [dict(BLOCK_M=32, num_warps=4, num_stages=2), dict(BLOCK_M=32, num_warps=4, num_stages=3),
             dict(BLOCK_M=16, num_warps=4, num_stages=3)],
    "dq": [dict(BLOCK_M=64, num_warps=4, num_stages=2), dict(BLOCK_M=64, num_warps=4, num_stages=3),
           dict(num_stages=2), dict(BLOCK_M=64, num_warps=8, num_stages=2)],
}
# The shipped global dQ (128 queries, 8 warps, 2 stages) sits at 255 registers with 40 bytes of stack (Triton 3.6,
# sm_90a); 64 queries on 8 warps has none (255 registers, 164 KB, 1 CTA of 8 warps as now, twice the programs):
# D80_CANDS' last dQ row.

# --d80-bf16: bf16 at ViT-H's windows (16 heads x 25 windows of 14x14, head dim 80 as 64 + 16), 1.31x ViT-L's (D=64)
# layer against a 1.3x target, the forward the furthest off (49 against 35 us). One key-grid row per tile (BLOCK_N 16,
# R = 1: rel_h one value per query, no selects) cuts registers: offline, sm_90a with Triton 3.6 (the GPU's; its
# register counts matched ncu's, 185 for TF32 dK/dV at D=80), forward 128 -> 93 registers, 4 -> 5 CTAs per SM
# (D=64's shipped occupancy), dQ 141 -> 128, 3 -> 4 CTAs, each at twice the key tiles. Predicted: forward 49 -> 42-45
# us; dQ within +-5%; at D=64 the forward at 16 (95 -> 80 registers, 5 -> 6 CTAs) within +-5%.
# Measured (H200, 2026-12-03, results/sweep_kernels.jsonl, sweep "sweep_d80_bf16_windows"): D=80 forward 48.9 -> 47.8 us at 16, 47.6 at
# 16 / 3 stages (-2.7%: the fifth CTA bought a third of what was predicted); dQ at 16 lost (backward 154.4 -> 155.7,
# 156.9 at 3 stages); D=64's forward at 16 lost (35.3 -> 38.6).
D80_BF16_SHAPES = [(14, 25)]
D80_BF16_CANDS = {"fwd": [dict(BLOCK_N=16), dict(BLOCK_N=16, num_stages=3)],
                  "dq": [dict(BLOCK_N=16), dict(BLOCK_N=16, num_stages=3)]}
D64_BF16_CANDS = {"fwd": [dict(BLOCK_N=16)]}

# --maxnreg: a register cap (ptxas -maxrregcount) that fits one more CTA per SM, bf16. Offline (sm_90a, Triton 3.6,
# SAM-B global): dK/dV (32-query steps) 138 registers, 3 CTAs -> capped at 128: no spill, 4 CTAs; dK/dV with
# 64-query steps at 2 stages capped at 168: no spill, 3 CTAs (against 192 and 2 uncapped); dQ 228 registers, 2
# CTAs -> capped at 168: 80-112 bytes of spill, 3 CTAs; forward at 3 stages 162 -> capped at 128: 56 bytes of
# spill, 4 CTAs (3 uncapped).
MAXNREG_SHAPES = [(64, 1), (64, 4), (56, 1), (48, 2), (32, 8), (14, 100), (16, 32)]
MAXNREG_CANDS = {
    "fwd": [dict(num_stages=3), dict(num_stages=3, MAXNREG=128)],
    "dkdv": [dict(MAXNREG=128), dict(BLOCK_M=64, num_stages=2), dict(BLOCK_M=64, num_stages=2, MAXNREG=168)],
    "dq": [dict(MAXNREG=168), dict(num_stages=2, MAXNREG=168), dict(MAXNREG=160)],
}


# --dkdv128: bf16 dK/dV with 128-key tiles (two rows of a 64-wide grid, rel_h by selects) and 8 warps, the program an
# ordered one-pass backward would extend (benchmarks/DECISIONS.md). Uncapped it fits 1 CTA per SM (154-204 registers; best
# backward 647 us against 591 shipped at SAM-B); capped at 128 registers, 2 CTAs of 8 warps (offline, 8-byte stack)
DKDV128_SHAPES = [(64, 1), (64, 4), (56, 1), (48, 2), (32, 8)]
DKDV128_CANDS = {"dkdv": [dict(BLOCK_N=128, num_warps=8, BLOCK_M=bm, num_stages=st, RH_SELECT=True, MAXNREG=cap)
                          for bm, st, cap in ((32, 2, 128), (32, 3, 128), (64, 3, None), (64, 2, 168))]}

def sweep_narrow(results, mode="fp32-tf32", shapes=NARROW, cands=NARROW_CANDS, key=None, heads=HEADS, d=64):
    dtype, prec = MODES[mode]
    torch.set_float32_matmul_precision(prec)
    rows = []
    for side, batch in shapes:
        q, k, v, rh, rw, do = make(batch * heads, side, dtype, d=d)
        for kern, lst in [("shipped", [{}])] + list(cands.items()):
            for c in lst:
                with overrides({kern: c} if c else {}):
                    ms = time_call(K, q, k, v, rh, rw, do, "fwd" if kern == "fwd" else "bwd")
                    if kern == "shipped":
                        ms = (ms, time_call(K, q, k, v, rh, rw, do, "fwd"))
                rows.append(dict(mode=mode, grid=side, batch=batch, kernel=kern, cfg=c,
                                 **({"ms": ms} if not isinstance(ms, str) else {"error": ms})))
                print(rows[-1], flush=True)
    results[key or f"sweep_narrow_{mode}"] = rows
    return rows


def print_narrow(rows):
    """Per shape and kernel: shipped (bwd, fwd) ms and the best candidate."""
    for r in rows:
        if r["kernel"] == "shipped" and "ms" in r and not any(isinstance(x, str) for x in r["ms"]):
            print(f"{r['mode']} {r['grid']}x{r['grid']}x{r['batch']}: shipped bwd {r['ms'][0]*1e3:.1f} us, fwd {r['ms'][1]*1e3:.1f} us")
            for kern in ("fwd", "dkdv", "dq"):
                cand = [x for x in rows if (x["grid"], x["batch"], x["kernel"]) == (r["grid"], r["batch"], kern)
                        and isinstance(x.get("ms"), float)]
                if cand:
                    best = min(cand, key=lambda x: x["ms"])
                    print(f"    best {kern:<5} {best['ms']*1e3:8.1f} us  {best['cfg']}")


# --tables OLD: the config table of another revision (a configs.py file, e.g. `git show REV:kernels/configs.py`)
# against this one, forward and backward, bf16 and fp32 "high", on SAM-B's global layer, its windows and every
# 076 shape, in one process; plus the backward variants in VARIANTS under this table
TABLE_SHAPES = [(64, 1), (14, 100)] + SOL
VARIANTS = {"bf16": {"dq 4 stages": {"dq": dict(num_stages=4)}, "dkdv 32 queries": {"dkdv": dict(BLOCK_M=32)}}}


def sweep_tables(results, old_path: str, shapes=TABLE_SHAPES):
    import importlib.util

    spec = importlib.util.spec_from_file_location("old_configs", old_path)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    rows = []
    for mode in ("bf16", "fp32-tf32"):
        dtype, prec = MODES[mode]
        torch.set_float32_matmul_precision(prec)
        for side, batch in shapes:
            q, k, v, rh, rw, do = make(batch * HEADS, side, dtype)
            row = dict(mode=mode, grid=side, batch=batch)
            new_table = K.configs.TABLE
            for name, table in (("old", old.TABLE), ("new", new_table)):
                K.configs.TABLE = table
                try:
                    for which in ("fwd", "bwd"):
                        row[f"{name}_{which}"] = time_call(K, q, k, v, rh, rw, do, which)
                finally:
                    K.configs.TABLE = new_table
            for name, o in VARIANTS.get(mode, {}).items():
                with overrides(o):
                    row[name] = time_call(K, q, k, v, rh, rw, do, "bwd")
            print(row, flush=True)
            rows.append(row)
    results["sweep_tables"] = rows
    if not WARM["only"]:
        us = lambda x: f"{x * 1e3:9.1f}" if isinstance(x, float) else f"{'err':>9}"  # noqa: E731
        print(f"\n{'mode':<10}{'shape':<10}{'old fwd':>9}{'new fwd':>9}{'old bwd':>9}{'new bwd':>9}  variants (bwd us)")
        for r in rows:
            var = "  ".join(f"{n}: {us(r[n]).strip()}" for n in VARIANTS.get(r["mode"], {}))
            shape = f"{r['grid']}x{r['grid']}x{r['batch']}"
            print(f"{r['mode']:<10}{shape:<10}{us(r['old_fwd'])}{us(r['new_fwd'])}"
                  f"{us(r['old_bwd'])}{us(r['new_bwd'])}  {var}")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None, help="append the rows to this .jsonl file (a directory: "
                                                "<dir>/sweep_kernels.jsonl) instead of benchmarks/results/sweep_kernels.jsonl")
    ap.add_argument("--bwd", action="store_true")
    ap.add_argument("--narrow", action="store_true")
    ap.add_argument("--narrow-bf16", action="store_true", help="bf16 configs on narrow grids and SAM-B's windows")
    ap.add_argument("--narrow16", action="store_true", help="fp32 with 16-key tiles on the 14- and 16-wide 076 grids")
    ap.add_argument("--fp32-occupancy", action="store_true", help="fp32 dK/dV and dQ configs with more warps per SM")
    ap.add_argument("--fp32-small-steps", action="store_true", help="fp32 dK/dV with 16-query steps, 'high' and 'highest'")
    ap.add_argument("--d80-fp32", action="store_true", help="TF32 dK/dV and dQ configs at ViT-H's head dim 80")
    ap.add_argument("--d80-bf16", action="store_true", help="bf16 forward / dQ key tiles at ViT-H's windows, D=80 and 64")
    ap.add_argument("--maxnreg", action="store_true", help="bf16 kernels with a register cap (one more CTA per SM)")
    ap.add_argument("--dkdv128", action="store_true", help="bf16 dK/dV with 128-key tiles and 8 warps, capped or not")
    ap.add_argument("--tables", metavar="OLD_CONFIGS_PY", help="another revision's configs.py against this one")
    ap.add_argument("--baseline", help="a one-file kernels module to time beside this one (--bwd)")
    ap.add_argument("--warm-only", action="store_true", help="compile the candidates, time nothing, write nothing")
    ap.add_argument("--shard", default="0/1", help="i/n: with --warm-only, this process's share of the candidates")
    args = ap.parse_args()
    WARM["only"] = args.warm_only
    WARM["shard"], WARM["shards"] = map(int, args.shard.split("/"))
    meta = common.row_meta(common.env_info(), torch.device("cuda"))
    path = common.results_path("sweep_kernels", args.out)
    results: dict = {}  # sweep name -> its rows
    baseline = load_module(args.baseline) if args.baseline else None
    for flag, run in ((args.bwd, lambda: sweep_bwd(results, baseline)), (args.narrow, lambda: sweep_narrow(results)),
                      (args.narrow_bf16, lambda: print_narrow(sweep_narrow(results, "bf16", NARROW_BF16, NARROW_CANDS_BF16))),
                      (args.narrow16, lambda: print_narrow(sweep_narrow(results, "fp32-tf32", NARROW16, NARROW16_CANDS))),
                      (args.fp32_occupancy, lambda: print_narrow(sweep_narrow(results, "fp32-tf32", OCC_SHAPES, OCC_CANDS,
                                                                              "sweep_fp32_occupancy"))),
                      (args.fp32_small_steps, lambda: [print_narrow(sweep_narrow(results, mode, SMALL_STEP_SHAPES, cands,
                                                                                 f"sweep_small_steps_{mode}"))
                                                       for mode, cands in SMALL_STEP_CANDS.items()]),
                      (args.d80_fp32, lambda: print_narrow(sweep_narrow(results, "fp32-tf32", D80_SHAPES, D80_CANDS,
                                                                        "sweep_d80_fp32", heads=16, d=80))),
                      (args.d80_bf16, lambda: [print_narrow(sweep_narrow(results, "bf16", D80_BF16_SHAPES, cands,
                                                                         f"sweep_d{d}_bf16_windows", heads=16, d=d))
                                               for d, cands in ((80, D80_BF16_CANDS), (64, D64_BF16_CANDS))]),
                      (args.tables, lambda: sweep_tables(results, args.tables)),
                      (args.maxnreg, lambda: print_narrow(sweep_narrow(results, "bf16", MAXNREG_SHAPES, MAXNREG_CANDS,
                                                                       "sweep_maxnreg"))),
                      (args.dkdv128, lambda: print_narrow(sweep_narrow(results, "bf16", DKDV128_SHAPES, DKDV128_CANDS,
                                                                       "sweep_dkdv128")))):
        if flag:
            before = set(results)
            run()
            if WARM["only"]:
                continue
            common.append_rows(path, [{**meta, "sweep": key, **r} for key in results if key not in before
                                      for r in results[key]])


if __name__ == "__main__":
    main()
