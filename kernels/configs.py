"""Block configs of the rel-pos attention kernels: one table, each row with the measurement behind it.

Blocks are fixed per shape class, never autotuned at run time: autotuning picks by timing, and two
processes that pick differently give different bits (the backward's reduction order follows the blocks).

Shape class: the facts `config()` is called with (kernels/rel_pos_attention.py derives them per call).
    fp32      bool   fp32 inputs (False: fp16 / bf16)
    prec      str    dot precision: "none" (16-bit), "tf32" ("high", "medium"), "tf32x3" ("highest")
    wide      bool   head dim as the kernels see it (tiles.pad) above D_WIDE = 80: 96 = 64 + 32; 112, 128 run as 128
    d         int    head dim as the kernels see it (the larger of q / k's and v's): 64, 80 (= 64 + 16), 128, ...
    wk        int    key-grid width in columns, before padding to a power of two
    rows      int    query rows in all: batch * heads * queries
    smem      int    bytes of shared memory one CTA may have on the target GPU (kernels/arch.py: 101376 on
                     sm_86 / sm_89 / sm_120, 166912 on sm_80, 232448 on sm_90 / sm_100)
    cc        int    the target's compute capability, major * 10 + minor (80, 86, 89, 90, 100, 120)
    interpret bool   Triton's CPU interpreter (tests)

A row is (kernel, conditions, config, reason). kernel: "fwd", "dkdv", "dq", "bwd" (how the backward is
launched), or "place" (whether the rewrite fuses the shape class at all). Conditions a row may name (thresholds
are the named constants above the table: WK_TINY, WK_NARROW, ROWS_SMALL_FP32, ROWS_SMALL_16BIT, D_64, D_WIDE):
    fp32=, prec=, wide=, interpret=           the fact equals this
    min_d=, max_d=                            d at least / at most this (inclusive)
    min_wk=, max_wk=                          wk at least / at most this (inclusive)
    min_rows=, max_rows=                      rows at least / at most this (inclusive)
    min_smem=, max_smem=                      smem at least / at most this (inclusive)
    min_cc=, max_cc=                          cc at least / at most this (inclusive)

Selection rules (the only ones; `_applies` and `config()` implement them, `check_table` enforces the keys):
  1. GPU rows and interpreter rows: a row that names interpret=True is an interpreter row, every other row a
     GPU row (as if it named interpret=False). Under the interpreter only interpreter rows apply; on the GPU
     only GPU rows.
  2. Head dims: a GPU row that does not name `wide` is for head dims up to 80 only (as if it named wide=False);
     wide head dims take only the rows that name wide=True. Interpreter rows take every head dim.
  3. A row applies when it is for the kernel asked for and all its conditions (with rules 1 and 2) hold.
  4. The config starts empty; every row that applies, in table order, sets the keys it names (dict.update):
     a later row replaces an earlier row's value of the same key and keeps the rest. So a general row comes
     first and the rows that refine it come below it. A key no row sets is off: RH_SELECT, BIAS_T, FUSED and
     INDUCTOR read as False (so with no "bwd" row, as for wide head dims, the backward runs split).
  5. Last, OVERRIDES[kernel] (tests and benchmark sweeps set it; empty in production) sets its keys over
     the table's.
  6. At import, a row with an unknown kernel, an unknown condition key (or a value of the wrong type), a
     config key that its kernel does not take, or a reason that is not one line with a figure is an error
     naming the row (where a row came from is in git's history, not in the reason). tests/test_configs.py
     checks that no row is dead: each one, somewhere it applies, sets a key that no later row replaces.

Keys of a config: BLOCK_M (query block, or query step in dK/dV), BLOCK_N (key-tile target: the tile is
R = max(1, BLOCK_N // WK_PAD) whole grid rows), num_warps, num_stages, and RH_SELECT (rel_h by R column
loads + selects instead of a tile gather, R > 1 only), for dK/dV with 16-bit inputs BIAS_T (rel_h and
rel_w copied with queries contiguous before the launch; fp32 gets them anyway, with its K-major copies), and
for dQ SPLIT_ROW (one-row key tiles of 32 columns or more taken as two halves: half the live score tiles).
MAXNREG (a register cap for ptxas, so one more CTA fits per SM) is honoured by direct launches only (Inductor's
codegen of a triton_op's kernels drops it); no row sets it: capped dK/dV / dQ / forward configs with one more CTA
per SM were within -3% .. +20% of the rows below on the H200 (benchmarks/DECISIONS.md).
The "bwd" rows say how the backward is launched: FUSED (dK/dV and dQ programs in one launch, each computing
delta itself) or split (dQ first, writing delta, then dK/dV); a fused launch needs dK/dV and dQ to agree on
num_warps and num_stages.
The "place" rows say where the rewrite puts a shape class: INDUCTOR=True leaves it to Inductor (where Inductor is
measured or estimated faster), asked before its launches are compiled or checked for fit, with the deciding row's
reason in the match report (`inductor_reason`). Decided at the traced sizes (a dynamic key grid: its traced width);
direct calls of the op still run the kernels. A row that lifts one for a test (INDUCTOR=False) names wide=True too
for head dims above 80.

Times: one H200, triton 3.6, CUDA-graph replay, do_bench median, L2 flushed (benchmarks/DECISIONS.md). The rows for
the other GPU classes (max_smem / min_cc / max_cc conditions, after the rows they refine) are chosen by compiled
figures, shared memory, tensor memory, registers, spills and CTAs per SM (tests/cross_compile.py), with the smallest
change from Hopper's row that fits; benchmarks/tools/time_arch_rows.py times them on the H200 against Hopper's
(on an H100 where a row's reason says so).
"""

from __future__ import annotations

import re

# ---- the thresholds in the rows' conditions (the figures behind each are in the rows that use them) ----------
# Key-grid widths (wk). At the 64-key tile target, a grid wk wide (padded to a power of two) gives
# R = 64 // pad(wk) grid rows per key tile.
WK_TINY = 8  # 7x7 windows, padded to 8 (R = 8): fp32 dQ with 64-query blocks and one fused fp32 backward launch pay
WK_NARROW = 16  # 14x14 windows (SAM's) and 16x16 grids, padded to 16 (R = 4): rel_h by selects in 32-key tiles;
#                 from 17 up (padded to 32 and more, R <= 2) dK/dV's bias copies pay at every size
WK_32 = 32  # 32x32 grids (SAM's global layer at 512 px): 64-query dQ on mma.sync GPUs spills there, not on 64x64
WK_64 = 64  # 64x64 grids (SAM's global layer at 1024 px); wider ones (80x80 at 1280 px) pad to 128-key grid rows
# Query rows in all (rows = batch * heads * queries; the row figures are at 12 heads).
ROWS_SMALL_FP32 = 8192  # fp32 on grids 9 to 16 wide: up to this many rows one fused backward launch wins (14x14x2,
#                         4704 rows: 64.0 -> 58.5 us), above it split launches (14x14x8, 18816 rows: 140 vs 145 us)
ROWS_TINY_16BIT = 8192  # sm_90 / sm_100, 16-bit: from this many rows up 32-query dK/dV steps at 2 stages win in the
#                         fused launch (14x14x48, 9408 rows: 35.8 -> 30.7 us); below, 64 at 3 do (16x16x12, 3072 rows:
#                         21.4 vs 23.6)
ROWS_SMALL_16BIT = 40000  # 16-bit: up to this many rows one fused backward launch wins (56x56x1, 37632 rows: 473 ->
#                           447 us); above it split launches do (32x32x4, 49152 rows: 234 vs 249 us), and so do
#                           dK/dV's 32-query steps and, on grids up to 16 wide, its bias copies (7x7x64, 37632 rows:
#                           38.3 -> 44.9 us, a loss; 16x16x32, 98304 rows: 132.3 -> 126.4)
# Head dims (d, as the kernels see them).
D_64 = 64  # d above this but not wide (ViT-H's 80 = 64 + 16) runs the rows for 64 and then the min_d=D_64 + 1 rows,
#            where a fifth more per tile costs a CTA per SM or does not fit shared memory
# Shared memory a CTA may have (smem, bytes; kernels/arch.py), by GPU class.
SMEM_99KB = 101376  # sm_86, sm_89, sm_120
SMEM_163KB = 166912  # sm_80
SMEM_HOPPER = 232448  # sm_90, sm_100
D_WIDE = 80  # d above this (96 = 64 + 32; 112 and 128 run as 128) is `wide`: only the wide=True rows (rule 2)

# (kernel, conditions, config, reason: one line, the measurement or compiled figure behind the row)
TABLE = [
    # ---- fp16 / bf16, head dim <= 64 -----------------------------------------------------------------
    ("fwd", dict(fp32=False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4),
     "bf16 SAM-B global fwd 0.153 ms vs 0.19 at 128 x 64 / 8 warps"),
    ("dkdv", dict(fp32=False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "bf16 SAM-B global bwd: the best of 4 swept configs"),
    ("dq", dict(fp32=False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "bf16 SAM-B global bwd: the best of 4 swept configs"),
    # narrow grids (R > 1 grid rows per key tile): rel_h by R column loads and selects, not a per-element
    # gather, which was most of the forward's time there; two grid rows per tile on 14- and 16-wide grids
    ("fwd", dict(fp32=False), dict(RH_SELECT=True),
     "bf16 fwd us gather -> selects: 7x7x64 22.1 -> 12.8, 28x28x4 151.5 -> 41.0, 32x32x8 381.1 -> 92.2"),
    ("fwd", dict(fp32=False, min_wk=WK_TINY + 1, max_wk=WK_NARROW), dict(BLOCK_N=32),
     "bf16 fwd us BLOCK_N 64 -> 32 (selects): 14x14x100 102.7 -> 92.2, 16x16x32 40.7 -> 37.7"),
    ("dq", dict(fp32=False), dict(RH_SELECT=True),
     "bf16 bwd us gather -> selects: 32x32x1 88.9 -> 67.9, 32x32x4 232.8 -> 180.6, 32x32x8 444.8 -> 341.7"),
    ("dq", dict(fp32=False, min_wk=WK_TINY + 1, max_wk=WK_NARROW), dict(BLOCK_N=32),
     "bf16 bwd us gather at 64 -> selects at 32: 14x14x100 465.1 -> 432.1, 16x16x32 154.2 -> 133.7"),
    # dK/dV reads the bias as [keys, queries] tiles, against its memory order: a copy with queries contiguous
    # pays where it is more than launch cost
    ("dkdv", dict(fp32=False, min_wk=WK_NARROW + 1), dict(BIAS_T=True),
     "bf16 bwd with bias copies: 1.27x at 64x64x4, 1.56x at 56x56x1, 1.10x at 32x32x8; 5-7% slower at 14x14"),
    ("dkdv", dict(fp32=False, min_wk=WK_TINY + 1, max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1), dict(BIAS_T=True),
     "bf16 bwd us without -> with bias copies: 14x14x100 414.5 -> 354.8, 16x16x32 132.3 -> 126.4"),
    # big problems (split launches): dK/dV steps over 32 queries at a time
    ("dkdv", dict(fp32=False, min_wk=WK_NARROW + 1, min_rows=ROWS_SMALL_16BIT + 1), dict(BLOCK_M=32),
     "bf16 bwd us dK/dV 64 -> 32 queries: 32x32x8 341.7 -> 318.8, 48x48x2 541.0 -> 488.6, 64x64x4 2308 -> 2256"),
    ("dkdv", dict(fp32=False, min_wk=WK_TINY + 1, max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1), dict(BLOCK_M=32),
     "bf16 bwd us with bias copies, dK/dV 64 -> 32 queries: 14x14x100 354.6 -> 303.6, 16x16x32 126.1 -> 118.8"),
    ("bwd", dict(fp32=False), dict(FUSED=False),
     "bf16 bwd us split vs fused: 64x64x4 2308 vs 2565, 32x32x4 234 vs 249, 32x32x8 446 vs 468"),
    # one launch where the split launches leave the chip idle: dK/dV and dQ programs run side by side and
    # one launch latency goes
    ("bwd", dict(fp32=False, max_rows=ROWS_SMALL_16BIT), dict(FUSED=True),
     "bf16 bwd us split -> fused: 14x14x1 26.9 -> 18.3, 48x48x1 313 -> 290, 56x56x1 473 -> 447; 32x32x1 84 -> 89"),
    # ... but on narrow grids with many rows, once the forward and dQ use selects (rows above), split launches
    # with a 4-stage dQ win
    ("bwd", dict(fp32=False, max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1), dict(FUSED=False),
     "bf16 bwd us fused -> split with dQ at 4 stages: 14x14x100 432.1 -> 412.5, 16x16x32 133.7 -> 132.0"),
    ("dq", dict(fp32=False, max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1), dict(num_stages=4),
     "the split launch's dQ stages (row above: 14x14x100 432.1 -> 412.5 us)"),
    # ---- fp32 (TF32 dots), head dim <= 64, with the K-major operand copies ----------------------------
    # key tiles of one grid row on grids >= 32 wide (BLOCK_N 32): two rows per tile cost 3.4x in the
    # forward (365 vs 106 us at 32x32x4) and 1.4x in dQ, because of the rel_h gather
    ("fwd", dict(fp32=True), dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3, RH_SELECT=True),
     "fp32 high 48x48x2 fwd 262 us vs 293 at 128 x 64 / 8 warps; selects 1.87x at 32x32x8"),
    ("fwd", dict(fp32=True, max_wk=WK_NARROW), dict(BLOCK_N=16),
     "fp32 high fwd us BLOCK_N 32 -> 16: 7x7x64 39.7 -> 32.0, 14x14x8 46.0 -> 33.3, 16x16x32 115.6 -> 108.6"),
    ("dkdv", dict(fp32=True), dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
     "fp32 high SAM-B global bwd 2.12 ms vs 2.36 with 64-query steps"),
    ("dq", dict(fp32=True), dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
     "fp32 high 32x32x4 bwd 570 us vs 573-815 in a narrow sweep"),
    ("bwd", dict(fp32=True), dict(FUSED=False),
     "fp32 high bwd us split vs fused: 14x14x8 140 vs 145, 16x16x32 527 vs 570, 64x64x4 6673 vs 8127"),
    # key grids at most 8 wide (7x7 windows): dQ with 64-query blocks
    ("dq", dict(fp32=True, max_wk=WK_TINY), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "fp32 high 7x7x64 bwd 145 us vs 170 in a narrow sweep"),
    # 14- and 16-wide grids: one grid row per dQ key tile
    ("dq", dict(fp32=True, min_wk=WK_TINY + 1, max_wk=WK_NARROW),
     dict(BLOCK_M=64, BLOCK_N=16, num_warps=4, num_stages=3),
     "fp32 high bwd us, dQ 128 x 32 / 8 warps -> 64 x 16 / 4: 14x14x8 141.7 -> 126.0, 16x16x32 528.5 -> 467.7"),
    # 1-pass TF32: dK/dV at 2 stages fits two CTAs per SM (occupancy beats pipelining depth: one CTA of 4
    # warps leaves a scheduler one warp); dQ has the shared memory for 3 stages (3-pass "highest" does not:
    # 256 KB for its dQ at 3 stages on 64-wide grids, 227 KB available)
    ("dkdv", dict(prec="tf32"), dict(num_stages=2),
     "fp32 high SAM-B global bwd 1694 -> 1386 us at 4 -> 2 stages: 107 KB, 2 CTAs per SM instead of 1"),
    ("dq", dict(prec="tf32"), dict(num_stages=3),
     "fp32 high: 3 dQ stages fit beside 1-pass TF32 ('highest' at 3: 256 KB, over 227)"),
    # small fp32 problems: one launch, dK/dV's 4 warps / 3 stages for both kinds of program and dQ's blocks
    # as on 7x7 grids (after the TF32 rows, whose stages these override)
    ("bwd", dict(fp32=True, max_wk=WK_TINY), dict(FUSED=True),
     "fp32 high bwd us split -> fused: 7x7x1 22.5 -> 14.6, 7x7x64 92.8 -> 84.4"),
    ("bwd", dict(fp32=True, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32), dict(FUSED=True),
     "fp32 high bwd us split -> fused: 14x14x1 60.3 -> 40.4, 14x14x2 64.0 -> 58.5, 16x16x1 62.1 -> 39.2"),
    ("dq", dict(fp32=True, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32),
     dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "the fused launch's dQ blocks (row above: 14x14x1 60.3 -> 40.4 us)"),
    ("dkdv", dict(fp32=True, max_wk=WK_TINY), dict(num_stages=3),
     "the fused launch's stages (rows above: 7x7x64 92.8 -> 84.4 us)"),
    ("dkdv", dict(fp32=True, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32), dict(num_stages=3),
     "the fused launch's stages (rows above: 14x14x1 60.3 -> 40.4 us)"),
    # ---- head dim 80 (ViT-H: 64 + 16, tiles.split()): the rows above, refined where a fifth more per tile costs a CTA
    # per SM or does not fit 227 KB of shared memory (compiled for sm_90 at SAM-H's global layer, 16 x 64x64, and
    # windows, 400 x 14x14). Not where a fused launch's warps / stages must agree (wk <= 16)
    ("fwd", dict(fp32=False, min_d=D_64 + 1, min_wk=WK_NARROW + 1), dict(num_stages=3),
     "bf16 D=80 global: 3 CTAs per SM (166 registers, 70 KB) as D=64 has at 4 stages; 4 stages: 2 (90 KB)"),
    ("fwd", dict(fp32=False, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW), dict(BLOCK_N=16, num_stages=3),
     "bf16 D=80 ViT-H windows fwd 48.9 -> 47.6 us, 128 -> 93 registers, 4 -> 5 CTAs per SM (D=64: a loss)"),
    ("fwd", dict(fp32=True, min_d=D_64 + 1), dict(num_stages=2),
     "fp32 D=80 global: 2 CTAs per SM (249 registers, 100 KB) as D=64 has at 3 stages; 3 stages: 1 (140 KB)"),
    ("dq", dict(fp32=True, min_d=D_64 + 1, min_wk=WK_NARROW + 1), dict(num_stages=2),
     "fp32 'high' D=80 global dQ: 200 KB, 1 CTA per SM as D=64 has at 3 stages; 3 stages: 260 KB, over 227"),
    ("dq", dict(prec="tf32x3", min_d=D_64 + 1, min_wk=WK_NARROW + 1), dict(BLOCK_M=64, num_warps=4),
     "fp32 'highest' D=80 global dQ: 172 KB; 128 queries / 8 warps at 2 stages: 252 KB, over 227"),
    ("dkdv", dict(fp32=True, min_d=D_64 + 1), dict(BLOCK_M=16),
     "fp32 'high' D=80 dK/dV, 16-query steps: 2 CTAs per SM (84 KB) as D=64 has at 32; 32: 1 CTA (128 KB)"),
    ("dkdv", dict(prec="tf32", min_d=D_64 + 1, min_wk=WK_NARROW + 1), dict(num_stages=3),
     "fp32 high D=80 global bwd 3170 -> 2622 us, 16-query dK/dV at 2 -> 3 stages (108 KB, 2 CTAs per SM)"),
    # sm_90 on grids over 32 wide: 3-pass 64-query dQ (SAM-B's were 128 / 8 warps) and ViT-H's dK/dV at 1 stage
    # (H100, same process, 640 / 768 px: SAM-B 1.05x faster, ViT-H 1.22-1.29x); clean under compute-sanitizer memcheck
    ("dq", dict(prec="tf32x3", min_cc=90, max_cc=90, min_wk=WK_32 + 1), dict(BLOCK_M=64, num_warps=4, num_stages=1),
     "3-pass global dQ on sm_90, 64 x 64 / 1 stage; H100 SAM-B 5.511 -> 5.245 ms, ViT-H 14.001 -> 12.417"),
    ("dkdv", dict(prec="tf32x3", min_cc=90, max_cc=90, min_d=D_64 + 1, min_wk=WK_32 + 1), dict(num_stages=1),
     "3-pass ViT-H global dK/dV on sm_90, 16 x 64 / 1 stage, with the row above: H100 14.002 -> 10.071 ms"),
    # ... and past 64 wide (128-key grid rows, 1280 px) the launches that needed 240-352 KB: memcheck-clean, float64
    # GPU tests pass. They serve direct calls of the op: the rewrite leaves these layers to Inductor ("place" below)
    ("dkdv", dict(prec="tf32x3", min_cc=90, max_cc=90, max_d=D_64, min_wk=WK_64 + 1), dict(num_stages=2),
     "3-pass SAM-B 1280 px (128-key rows) dK/dV on sm_90, 2 stages: 192 KB (3: 240); H100 35.5 ms (16 q: 40.0)"),
    ("dq", dict(prec="tf32", min_cc=90, max_cc=90, min_wk=WK_64 + 1), dict(BLOCK_M=64, num_warps=4, num_stages=1),
     "TF32 1280 px dQ on sm_90, 64 x 128, 1 stage: 96-104 KB (was 320-352); H100 B 10.10 ms, H 23.34 (32 q: 11.14)"),
    # the one fp32 launch on 9- to 16-wide grids holds dQ's 64 x 64 tiles and dK/dV's at once: 253 KB at 3 stages
    # ('high'; 264 KB 'highest'), over the 227 KB a CTA may have (OutOfResources on the H200 at 24 x 14x14)
    ("dq", dict(fp32=True, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32),
     dict(num_stages=2),
     "fp32 D=80 fused backward at 14x14, 2 stages: 177 KB 'high', 188 KB 'highest' (253 KB at 3)"),
    ("dkdv", dict(fp32=True, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32),
     dict(num_stages=2), "the fused launch's stages (row above: 177 KB at 2 stages)"),
    # ---- sm_90 and sm_100, 16-bit fused backward on 9- to 16-wide grids with ROWS_TINY_16BIT rows or more: configs
    # that compile spill-free with Tritons 3.6 to 3.9 for both (the rows above spilled 8-128 B there; sm_100 compiled
    # only, tests/cross_compile.py) and that the H200 ran faster, fwd + bwd (B x grid x head dim): 48 x 14x14 x 64
    # 35.8 -> 30.7 us, 96 x 16x16 x 64 51.8 -> 48.9, 64 x 14x14 x 80 54.5 -> 51.3. Below that many rows they lose (12
    # x 16x16 x 64 21.4 -> 23.6 us, 16 x 16x16 x 80 29.1 -> 36.8)
    ("dkdv", dict(fp32=False, min_cc=90, max_cc=119, min_wk=WK_TINY + 1, max_wk=WK_NARROW, min_rows=ROWS_TINY_16BIT,
                  max_rows=ROWS_SMALL_16BIT), dict(BLOCK_M=32, num_stages=2),
     "bf16 SAM-B 512 px windows (108 x 14x14) fwd + bwd, H200: 62.1 -> 53.1 us"),
    ("dq", dict(fp32=False, min_cc=90, max_cc=119, min_wk=WK_TINY + 1, max_wk=WK_NARROW, min_rows=ROWS_TINY_16BIT,
                max_rows=ROWS_SMALL_16BIT), dict(num_stages=2),
     "the fused launch's stages (row above: 62.1 -> 53.1 us)"),
    ("dkdv", dict(fp32=False, min_cc=90, max_cc=119, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                  min_rows=ROWS_TINY_16BIT, max_rows=ROWS_SMALL_16BIT), dict(BLOCK_M=16, num_stages=1),
     "bf16 ViT-H 512 px windows (144 x 14x14 x 80) fwd + bwd, H200: 98.3 -> 89.7 us"),
    ("dq", dict(fp32=False, min_cc=90, max_cc=119, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                min_rows=ROWS_TINY_16BIT, max_rows=ROWS_SMALL_16BIT), dict(num_stages=1),
     "the fused launch's stages (row above: 98.3 -> 89.7 us)"),
    # ---- ViT-H's 512 px global layer (32x32 grid, D=80) at batch 1 on sm_90 / sm_100: one-row (32-key) forward and
    # dQ tiles, 16-query dK/dV steps, as the mma.sync classes' rows below (at batch 8 the 32-key forward lost 1.3%)
    ("fwd", dict(fp32=False, min_cc=90, max_cc=119, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32,
                 max_rows=ROWS_SMALL_16BIT), dict(BLOCK_N=32),
     "bf16 ViT-H 512 px global fwd + bwd, batch 1, H100: 0.161 -> 0.151 ms with the two rows below"),
    ("dq", dict(fp32=False, min_cc=90, max_cc=119, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32,
                max_rows=ROWS_SMALL_16BIT), dict(BLOCK_N=32), "the fused launch's dQ, 64 x 32 (row above's figure)"),
    ("dkdv", dict(fp32=False, min_cc=90, max_cc=119, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32,
                  max_rows=ROWS_SMALL_16BIT), dict(BLOCK_M=16),
     "the fused launch's dK/dV, 16 x 64 (row above's figure)"),
    # ---- grids over 64 wide (SAM above 1024 px: 80x80 at 1280), one 128-key tile a grid row: at D=80 the rows above
    # spill on sm_90 (dQ 320 B, dK/dV 248 B); SPLIT_ROW at 2 stages and 16-query dK/dV steps spill 88 B / none
    # (benchmarks/DECISIONS.md, "Image sizes outside the check"; D=64's spill-free 32-query dQ on 8 warps: a loss)
    ("dq", dict(fp32=False, min_d=D_64 + 1, min_wk=WK_64 + 1), dict(SPLIT_ROW=True, num_stages=2),
     "bf16 ViT-H 1280 px global fwd + bwd, H100: 7.24 -> 6.37 ms with the dK/dV row below; dQ spills 88 B (320)"),
    ("dkdv", dict(fp32=False, min_d=D_64 + 1, min_wk=WK_64 + 1), dict(BLOCK_M=16),
     "bf16 ViT-H 1280 px global dK/dV, 16-query steps: sm_90 no spill (32: 248 B); the row above's 7.24 -> 6.37 ms"),
    # ---- other GPU classes (kernels/arch.py): the rows above, refined to fit a CTA's shared memory and an SM's tensor
    # memory and, in bf16 / fp16, to run without register spills. Figures: tests/cross_compile.py (Triton 3.6,
    # aligned arguments) at SAM's shapes; not timed on those GPUs (benchmarks/tools/time_arch_rows.py times them on
    # the H200 against the rows above, on an H100 where a row's reason says so)
    # mma.sync GPUs (sm_80, sm_86, sm_89, sm_120: at most 163 KB a CTA), 16-bit: 32-query dQ blocks and dK/dV steps
    ("dq", dict(fp32=False, max_smem=SMEM_163KB), dict(BLOCK_M=32),
     "bf16 SAM-B global dQ on sm_86, 32 queries: 210 registers, no spill (64 queries / 8 warps: 8 B)"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB), dict(BLOCK_M=32),
     "bf16 SAM-B 512 px fused backward on sm_86, 32 queries: 225 registers, no spill (64 / 8 warps: 40 B)"),
    ("dq", dict(fp32=False, max_smem=SMEM_163KB, min_d=D_64 + 1), dict(BLOCK_N=32),
     "bf16 D=80 dQ on 32x32 grids, sm_86, 32 x 32 tiles: 244 registers, no spill (32 x 64: 96-104 B)"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB, min_d=D_64 + 1), dict(BLOCK_M=16),
     "bf16 D=80 dK/dV on sm_86, 16-query steps: no spill (32: 24 B global, 72 B windows)"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB, max_wk=WK_NARROW, max_rows=ROWS_SMALL_16BIT), dict(BLOCK_M=16),
     "bf16 fused backward on 14x14 windows, sm_86, 16-query dK/dV steps: D=80 no spill (32: 272 B)"),
    # ... at 2 stages: fewer registers (sm_80's fused launches spill at 3) and, at 99 KB a CTA (sm_86, sm_89, sm_120),
    # two CTAs an SM beside 255 registers a thread
    ("dq", dict(fp32=False, max_smem=SMEM_163KB), dict(num_stages=2),
     "bf16 SAM-B global dQ on sm_86: 26 KB at 2 stages, 2 CTAs per SM (its registers allow 2)"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB), dict(num_stages=2),
     "bf16 SAM-B 512 px fused backward, sm_80: 16 B spilled at 3 stages (54 KB), none at 2 (38 KB, 2 CTAs)"),
    ("fwd", dict(fp32=False, max_smem=SMEM_99KB), dict(num_stages=2),
     "bf16 SAM-B global fwd on sm_86: 24 KB, 2 CTAs per SM (4 stages: 56 KB, 1)"),
    # ... but windows keep Hopper's forward stages (2 CTAs per SM there too) and the split backward launches (above
    # ROWS_SMALL_16BIT) take Hopper's blocks where they compile without spills with Triton 3.6 and 3.9: 64-query dQ
    # (on 64x64 grids and windows: 32x32 grids spill 8-104 B) and 3-stage dK/dV, not on sm_120 where 3.9 spills them
    ("fwd", dict(fp32=False, max_smem=SMEM_99KB, min_wk=WK_TINY + 1, max_wk=WK_NARROW), dict(num_stages=4),
     "bf16 SAM-B windows fwd on sm_86 at 4 stages: 32-40 KB, 2 CTAs per SM, no spill"),
    ("fwd", dict(fp32=False, max_smem=SMEM_99KB, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW),
     dict(num_stages=3), "bf16 ViT-H windows fwd on sm_86 at Hopper's 3 stages: 20 KB, no spill"),
    ("dq", dict(fp32=False, max_smem=SMEM_163KB, max_d=D_64, min_wk=WK_32 + 1, min_rows=ROWS_SMALL_16BIT + 1,
                max_cc=89), dict(BLOCK_M=64, num_stages=3),
     "bf16 SAM-B global fwd + bwd, sm_80's rows on the H200: 1.25 -> 0.74 ms (sm_90's); 42 KB, no spill"),
    ("dq", dict(fp32=False, max_smem=SMEM_163KB, min_wk=WK_TINY + 1, max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1),
     dict(BLOCK_M=64, num_stages=4),
     "bf16 SAM-B windows fwd + bwd, sm_86's rows on the H200: 0.216 -> 0.121 ms (sm_90's); 34-43 KB"),
    # ... ViT-H's windows dQ (D=80) there: the tile or the stage count that compiles without spills with Tritons 3.6-3.9
    ("dq", dict(fp32=False, min_smem=SMEM_163KB, max_smem=SMEM_163KB, min_d=D_64 + 1, min_wk=WK_TINY + 1,
                max_wk=WK_NARROW, min_rows=ROWS_SMALL_16BIT + 1), dict(BLOCK_N=16),
     "bf16 ViT-H windows dQ on sm_80, 64 x 16: no spill (64 x 32: 8 B); H100 fwd + bwd 0.207 -> 0.210 ms"),
    ("dq", dict(fp32=False, max_smem=SMEM_99KB, max_cc=89, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                min_rows=ROWS_SMALL_16BIT + 1), dict(num_stages=3),
     "bf16 ViT-H windows dQ on sm_86 / sm_89, 3 stages: no spill (4: 16 B); H100 fwd + bwd 0.207 -> 0.209 ms"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB, min_rows=ROWS_SMALL_16BIT + 1, max_cc=89), dict(num_stages=3),
     "bf16 ViT-H windows fwd + bwd, sm_80's rows on the H200: 0.318 -> 0.201 ms; 33-47 KB, no spill"),
    # ViT-H's global dQ (64-key rows at D=80) spills 96-272 B at every plain config; with SPLIT_ROW (each row as two
    # 32-key tiles) 64 queries on 4 warps spill none on sm_80/86/89 and 8-88 B on sm_120 with Tritons 3.6 / 3.9
    # (3.7: 8 B on sm_80, 112 on sm_120; tests/cross_compile.py's ALLOWED_SPILLS)
    ("dq", dict(fp32=False, max_smem=SMEM_163KB, min_d=D_64 + 1, min_wk=WK_32 + 1, min_rows=ROWS_SMALL_16BIT + 1),
     dict(BLOCK_M=64, num_warps=4, num_stages=2, SPLIT_ROW=True),
     "bf16 ViT-H global fwd + bwd, H200, sm_86's rows 2.03 -> 1.70 ms, sm_120's 2.90 -> 1.97 (sm_90's 1.18)"),
    # ... and where Triton 3.9 spills 8-16 B at 2 stages, the stage count with none, within 2% on the H200
    ("dkdv", dict(fp32=False, max_smem=SMEM_99KB, min_cc=120, max_d=D_64, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                  min_rows=ROWS_SMALL_16BIT + 1), dict(num_stages=1),
     "bf16 SAM-B windows dK/dV on sm_120, 1 stage: 28 KB, no spill; H200 fwd + bwd 0.128 -> 0.130 ms"),
    ("dq", dict(fp32=False, max_smem=SMEM_99KB, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                max_rows=ROWS_SMALL_16BIT), dict(num_stages=1),
     "bf16 ViT-H fused windows backward, sm_86 / sm_120, 1 stage: no spill; H200 0.130 -> 0.126 ms"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_99KB, min_d=D_64 + 1, min_wk=WK_TINY + 1, max_wk=WK_NARROW,
                  max_rows=ROWS_SMALL_16BIT), dict(num_stages=1), "the fused launch's stages (row above: 27 KB)"),
    # ViT-H's 512 px global layer (32x32 grids, where it was timed) on mma.sync GPUs: 32-key (one grid row) forward
    # and dQ tiles at sm_90's 3 stages, 64-query dQ blocks, fused (batch 1) or split (batch 8) backward; no spill
    # with Tritons 3.6-3.9, faster than sm_90's rows at batch 1
    ("dq", dict(fp32=False, max_smem=SMEM_163KB, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32),
     dict(BLOCK_M=64, num_stages=3),
     "bf16 ViT-H 512 px fwd + bwd, H100: sm_80's rows 0.244 -> 0.150 ms, sm_86's 0.250 -> 0.152 (sm_90's 0.159)"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_163KB, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32), dict(num_stages=3),
     "batch 8 (split), H100: sm_80 1.398 -> 0.796 ms, sm_86 1.408 -> 0.805, sm_120 1.529 -> 0.805 (sm_90 0.674)"),
    ("fwd", dict(fp32=False, max_smem=SMEM_99KB, min_d=D_64 + 1, min_wk=WK_32, max_wk=WK_32),
     dict(BLOCK_N=32, num_stages=3),
     "bf16 ViT-H 512 px fwd on sm_86 / sm_120, 64 x 32, 3 stages: no spill (sm_120's 64 x 64: 16 B)"),
    # ... its 1024 px dK/dV on sm_120 at 3 stages, as sm_86 / sm_89 have them: no spill with 3.6-3.9, 33 KB
    ("dkdv", dict(fp32=False, max_smem=SMEM_99KB, min_cc=120, min_d=D_64 + 1, min_wk=WK_32 + 1, max_wk=WK_64,
                  min_rows=ROWS_SMALL_16BIT + 1), dict(num_stages=3),
     "bf16 ViT-H global fwd + bwd, sm_120's rows on the H100: 1.946 -> 1.682 ms (sm_90's 1.169)"),
    # 384 px (24x24 grids) at batch 1, fused backward: the spill-free configs, no slower on the H100
    ("dq", dict(fp32=False, max_smem=SMEM_99KB, max_cc=89, max_d=D_64, min_wk=WK_NARROW + 1, max_wk=WK_32 - 1,
                max_rows=ROWS_SMALL_16BIT), dict(num_stages=1),
     "bf16 SAM-B 384 px fused bwd on sm_86, 1 stage: no spill (2: 16-32 B on 3.6); H100 0.078 ms either way"),
    ("dkdv", dict(fp32=False, max_smem=SMEM_99KB, max_cc=89, max_d=D_64, min_wk=WK_NARROW + 1, max_wk=WK_32 - 1,
                  max_rows=ROWS_SMALL_16BIT), dict(num_stages=1), "the fused launch's stages (row above: 28 KB)"),
    ("dq", dict(fp32=False, min_cc=100, max_cc=119, min_wk=WK_NARROW + 1, max_wk=WK_32 - 1), dict(BLOCK_N=32),
     "bf16 384 px dQ on sm_100, 64 x 32: no spill (8-104 B); H100 ViT-H 0.086 -> 0.084 ms, batch 8 0.317 -> 0.305"),
    ("dkdv", dict(fp32=False, min_cc=100, max_cc=119, min_d=D_64 + 1, min_wk=WK_NARROW + 1, max_wk=WK_32 - 1,
                  max_rows=ROWS_SMALL_16BIT), dict(BLOCK_M=32),
     "ViT-H 384 px fused bwd on sm_100, 32-query dK/dV steps: no spill, 77-95 KB (row above's figures)"),
    # fp32 on 99 KB: 2 stages, 32-query dQ blocks on wide grids (64 at 1 stage for TF32, and for 3-pass on 64-wide
    # grids), 16-query dK/dV steps, split backward launches
    ("fwd", dict(fp32=True, max_smem=SMEM_99KB), dict(num_stages=2),
     "fp32 high SAM-B global fwd on sm_86: 48 KB at 2 stages, 2 CTAs per SM; 'highest' D=80 80 KB"),
    ("dq", dict(fp32=True, max_smem=SMEM_99KB), dict(BLOCK_M=32, num_warps=4, num_stages=2),
     "fp32 SAM-B global dQ on sm_86, 32 x 64 / 4 warps / 2 stages: 72 KB 'high', 96 'highest' (64: 80, 112)"),
    ("dq", dict(prec="tf32", max_smem=SMEM_99KB, min_wk=WK_NARROW + 1), dict(BLOCK_M=64, num_stages=1),
     "TF32 global dQ on sm_86, 64 x 64 / 1 stage, 64-72 KB; H100 SAM-B 2.439 -> 1.945 ms, ViT-H 5.318 -> 4.086"),
    ("dq", dict(fp32=True, max_smem=SMEM_99KB, max_wk=WK_NARROW), dict(BLOCK_M=64, BLOCK_N=16),
     "fp32 windows dQ on sm_86, 64 x 16 at 2 stages: 44 KB 'high', 95 KB 'highest' D=80 (3 stages: 110)"),
    ("dq", dict(prec="tf32x3", max_smem=SMEM_99KB, min_wk=WK_NARROW + 1), dict(num_stages=1),
     "fp32 'highest' global dQ on sm_86, 1 stage: 48 KB, 56 at D=80 (2: 96-112 KB, over 99 with Triton 3.8)"),
    ("dq", dict(prec="tf32x3", max_smem=SMEM_99KB, min_wk=WK_32 + 1), dict(BLOCK_M=64),
     "3-pass global dQ on sm_86, 64 x 64, 80-96 KB; H100 SAM-B 5.838 -> 5.108 ms, ViT-H 23.847 -> 10.150"),
    ("dkdv", dict(fp32=True, max_smem=SMEM_99KB), dict(BLOCK_M=16, num_stages=2),
     "fp32 SAM-B global dK/dV on sm_86, 16-query steps at 2 stages: 52 KB 'high', 84 KB 'highest'"),
    ("dkdv", dict(prec="tf32x3", max_smem=SMEM_99KB, min_d=D_64 + 1), dict(num_stages=1),
     "fp32 'highest' D=80 windows dK/dV on sm_86, 1 stage: 84 KB (2 stages: 108 KB)"),
    ("bwd", dict(fp32=True, max_smem=SMEM_99KB), dict(FUSED=False),
     "fp32 fused backward on 16x16 grids, sm_86, 2 stages: 117 KB 'high' D=80, 129 'highest' D=64: split"),
    # sm_80 (163 KB), fp32: 64-query dQ blocks on 4 warps; 'highest' fused launches at 2 stages
    ("dq", dict(fp32=True, min_smem=SMEM_163KB, max_smem=SMEM_163KB, min_wk=WK_NARROW + 1),
     dict(BLOCK_M=64, num_warps=4), "fp32 SAM-B global dQ on sm_80, 64 x 64 / 4 warps: 128 KB 'high', 112 'highest'"),
    ("dkdv", dict(prec="tf32x3", min_smem=SMEM_163KB, max_smem=SMEM_163KB, min_wk=WK_TINY + 1), dict(num_stages=2),
     "fp32 'highest' dK/dV on sm_80, 2 stages: 112-120 KB (3: 160.5 KB, 168.5 with Triton 3.8, over 163)"),
    ("dq", dict(prec="tf32x3", min_smem=SMEM_163KB, max_smem=SMEM_163KB, max_wk=WK_NARROW,
                max_rows=ROWS_SMALL_FP32), dict(num_stages=2),
     "fp32 'highest' fused backward on 16x16, sm_80, 2 stages: 129 KB (3: 193 KB)"),
    ("dkdv", dict(prec="tf32x3", min_smem=SMEM_163KB, max_smem=SMEM_163KB, max_wk=WK_NARROW,
                  max_rows=ROWS_SMALL_FP32), dict(num_stages=2),
     "the fused launch's stages (row above: 129 KB at 2 stages)"),
    ("dq", dict(prec="tf32x3", min_smem=SMEM_163KB, max_smem=SMEM_163KB, min_d=D_64 + 1, max_wk=WK_NARROW,
                max_rows=ROWS_SMALL_FP32), dict(num_stages=1),
     "fp32 'highest' D=80 fused backward on 16x16, sm_80, 1 stage: 96 KB (2: 157 KB, 172 with Triton 3.8, over 163)"),
    ("dkdv", dict(prec="tf32x3", min_smem=SMEM_163KB, max_smem=SMEM_163KB, min_d=D_64 + 1, max_wk=WK_NARROW,
                  max_rows=ROWS_SMALL_FP32), dict(num_stages=1), "the fused launch's stages (row above: 96 KB)"),
    # sm_100 (tcgen05, 512 columns of tensor memory an SM): 'highest' dQ blocks whose accumulators fit
    ("dq", dict(prec="tf32x3", min_cc=100, max_cc=119, min_wk=WK_NARROW + 1), dict(BLOCK_M=64, num_warps=4),
     "fp32 'highest' SAM-B global dQ on sm_100, 64 queries / 4 warps: 512 tensor-memory columns (128: 640)"),
    ("dq", dict(prec="tf32x3", min_cc=100, max_cc=119, min_d=D_64 + 1, min_wk=WK_NARROW + 1), dict(BLOCK_M=32),
     "fp32 'highest' D=80 global dQ on sm_100, 32 queries (mma, no tensor memory): 100 KB (64: 688 columns)"),
    ("dq", dict(prec="tf32x3", min_cc=100, max_cc=119, min_d=D_64 + 1, max_wk=WK_NARROW, max_rows=ROWS_SMALL_FP32),
     dict(BLOCK_M=32), "fp32 'highest' D=80 fused backward on 16x16, sm_100, 32-query dQ: 512 columns (64: 688)"),
    # ---- head dim above 80 (96 = 64 + 32; 112 and 128 run as 128) ------------------------------------
    # replaces the rows above; fp32 tiles twice as wide must fit 227 KB of shared memory (the fp32 D=80
    # forward padded to 128 at 128 x 64 x 3 stages would want 320 KB)
    ("fwd", dict(wide=True, fp32=False), dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3, RH_SELECT=False),
     "H200: right against float64 at D=80 padded to 128"),
    ("dkdv", dict(wide=True, fp32=False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "H200: right against float64 at D=80 padded to 128"),
    ("dkdv", dict(wide=True, fp32=False, min_wk=WK_NARROW + 1), dict(BIAS_T=True),
     "as for head dims <= 64 (the min_wk row above: 1.27x at 64x64x4)"),
    ("dq", dict(wide=True, fp32=False), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
     "H200: right against float64 at D=80 padded to 128"),
    ("fwd", dict(wide=True, fp32=True), dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2, RH_SELECT=False),
     "fp32 at D=80 padded to 128: fits sm_90's 227 KB of shared memory"),
    ("dkdv", dict(wide=True, fp32=True), dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
     "fp32 at D=80 padded to 128: fits sm_90's 227 KB of shared memory"),
    ("dq", dict(wide=True, fp32=True), dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
     "fp32 at D=80 padded to 128: fits sm_90's 227 KB of shared memory"),
    # ---- placement: fp32 on key grids past 64 wide (above 1024 px) goes to Inductor, on every class. One 1280 px
    # global layer, forward + backward, H100 (tools/layer_peers.py, benchmarks/DECISIONS.md): fused TF32 SAM-B 13.17
    # ms against 12.71 left to Inductor, ViT-H 29.22 against 18.22; 3-pass 43.76 / 23.55 and 94.36 / 44.53
    ("place", dict(fp32=True, min_wk=WK_64 + 1), dict(INDUCTOR=True),
     "fp32 past 64-wide grids: fused 13.17 ms, left to Inductor 12.71 (SAM-B TF32 1280 px, H100; ViT-H 29.22/18.22)"),
    ("place", dict(fp32=True, wide=True, min_wk=WK_64 + 1), dict(INDUCTOR=True),
     "fp32 past 64-wide grids, head dims over 80: as at 80 (ViT-H TF32 1280 px: fused 29.22 ms, Inductor 18.22)"),
    # ---- the CPU interpreter: small blocks, so a tiny test shape crosses several query blocks and key
    # tiles with partial ones at both ends (not measured: correctness only)
    ("fwd", dict(interpret=True), dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, RH_SELECT=False),
     "tests: 16 x 16 blocks, correctness only, not timed"),
    ("dkdv", dict(interpret=True), dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
     "tests: 16 x 16 blocks, correctness only, not timed"),
    ("dq", dict(interpret=True), dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1, RH_SELECT=False),
     "tests: 16 x 16 blocks, correctness only, not timed"),
    ("bwd", dict(interpret=True), dict(FUSED=False),
     "tests: 16 x 16 blocks, correctness only, not timed"),
]

# kernel -> config keys that replace the table's result (tests, benchmark sweeps); empty in production
OVERRIDES: dict[str, dict] = {}


KERNELS = ("fwd", "dkdv", "dq", "bwd", "place")
# condition key -> the type of its value; min_X / max_X bound fact X
CONDITION_KEYS = dict(fp32=bool, prec=str, wide=bool, interpret=bool, min_d=int, max_d=int, min_wk=int,
                      max_wk=int, min_rows=int, max_rows=int, min_smem=int, max_smem=int, min_cc=int, max_cc=int)
PRECISIONS = ("none", "tf32", "tf32x3")
_BLOCKS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "RH_SELECT", "MAXNREG")
# kernel -> the config keys it takes (see "Keys of a config" above)
CONFIG_KEYS = dict(fwd=_BLOCKS, dq=_BLOCKS + ("SPLIT_ROW",), dkdv=_BLOCKS + ("BIAS_T",), bwd=("FUSED",),
                   place=("INDUCTOR",))
SWITCHES = ("RH_SELECT", "BIAS_T", "SPLIT_ROW", "FUSED", "INDUCTOR")  # config keys that are on or off
REASON_MAX = 110  # characters in a row's reason: one line of the table


def check_table(table: list, table_name: str = "configs.TABLE") -> None:
    """Raise ValueError naming the first row (as table_name[i]) whose kernel, condition keys or config keys are
    unknown."""
    for i, entry in enumerate(table):
        kernel, cond, cfg, why = entry
        name = f"{table_name}[{i}] ({kernel!r}, {cond!r}, {cfg!r}, {why[:50]!r})"
        if kernel not in KERNELS:
            raise ValueError(f"{name}: unknown kernel {kernel!r} (known: {', '.join(KERNELS)})")
        for key, want in cond.items():
            if key not in CONDITION_KEYS:
                raise ValueError(f"{name}: unknown condition key {key!r} (known: {', '.join(CONDITION_KEYS)})")
            typ = CONDITION_KEYS[key]
            if type(want) is not typ:  # noqa: E721 (bool is an int: exact types)
                raise ValueError(f"{name}: condition {key}={want!r} is not a {typ.__name__}")
        if "prec" in cond and cond["prec"] not in PRECISIONS:
            raise ValueError(f"{name}: unknown prec {cond['prec']!r} (known: {', '.join(PRECISIONS)})")
        unknown = sorted(set(cfg) - set(CONFIG_KEYS[kernel]))
        if unknown:
            raise ValueError(f"{name}: config keys {unknown} are not {kernel!r} keys "
                             f"(known: {', '.join(CONFIG_KEYS[kernel])})")
        if not cfg:
            raise ValueError(f"{name}: sets no config key")
        for key in sorted(set(cfg) & set(SWITCHES)):
            if type(cfg[key]) is not bool:  # noqa: E721 ("False" would read as on)
                raise ValueError(f"{name}: config {key}={cfg[key]!r} is not a bool")
        if not isinstance(why, str) or "\n" in why or len(why) > REASON_MAX or not re.search(r"\d", why):
            raise ValueError(f"{name}: the reason must be one line of at most {REASON_MAX} characters with its "
                             f"figure (a measurement or compiled figure)")


def _applies(cond: dict, facts: dict) -> bool:
    """Selection rules 1-3 of the module docstring for one row's conditions."""
    if not cond.get("interpret", False):
        cond = {"interpret": False, "wide": False, **cond}  # a GPU row; without `wide`, head dims up to 80
    for key, want in cond.items():
        got = facts[key.removeprefix("max_").removeprefix("min_")]
        if key.startswith("max_"):
            if got > want:
                return False
        elif key.startswith("min_"):
            if got < want:
                return False
        elif got != want:
            return False
    return True


def applying_rows(kernel: str, facts: dict, table: list | None = None) -> list[int]:
    """Indices of the rows of `table` (TABLE) that apply to `kernel` for `facts`, in table order (rules 1-3)."""
    table = TABLE if table is None else table
    return [i for i, (name, cond, _cfg, _why) in enumerate(table) if name == kernel and _applies(cond, facts)]


def config(kernel: str, *, fp32: bool, prec: str, wide: bool, wk: int, rows: int, interpret: bool,
           d: int = 64, smem: int = SMEM_HOPPER, cc: int = 90) -> dict:
    """The block config of one kernel for one shape class on one GPU class (selection rules in the module
    docstring); d = tiles.pad(head dim), smem / cc the target's (kernels/arch.py; Hopper's by default)."""
    facts = dict(fp32=fp32, prec=prec, wide=wide, wk=wk, rows=rows, interpret=interpret, d=d, smem=smem, cc=cc)
    cfg: dict = {}
    for i in applying_rows(kernel, facts):  # rule 4
        cfg.update(TABLE[i][2])
    cfg.update(OVERRIDES.get(kernel, {}))  # rule 5
    return cfg


def inductor_reason(*, fp32: bool, prec: str, wide: bool, wk: int, rows: int, interpret: bool, d: int = 64,
                    smem: int = SMEM_HOPPER, cc: int = 90) -> str | None:
    """Where the "place" rows leave this shape class to Inductor (INDUCTOR=True, rules 1-5 as for a kernel's
    config), the reason of the last row that set it (OVERRIDES': "OVERRIDES"); None where the rewrite may fuse it."""
    facts = dict(fp32=fp32, prec=prec, wide=wide, wk=wk, rows=rows, interpret=interpret, d=d, smem=smem, cc=cc)
    if not config("place", **facts).get("INDUCTOR", False):  # rules 4 and 5, as for a kernel's config
        return None
    if "INDUCTOR" in OVERRIDES.get("place", {}):
        return "OVERRIDES"
    return next(TABLE[i][3] for i in reversed(applying_rows("place", facts)) if "INDUCTOR" in TABLE[i][2])


check_table(TABLE)  # rule 6
