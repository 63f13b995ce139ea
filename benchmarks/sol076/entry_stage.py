"""The 076 entry's inputs staged for its own CUDA graph: every input cast to bf16 in one kernel, outside the graph.

A CUDA graph reads its inputs at the addresses it was captured with, and the benchmark hands over fresh
addresses each call. Under mode="reduce-overhead" (CUDA graph trees) that costs, every call:
  * one multi-tensor copy of all 8 inputs into the graph's fp32 buffers (18 us at 7x7x1, where the weights are
    most of the 10 MB; 68 us at 64x64x4, in two launches; the H200, 2026-12-01),
  * then, inside the graph, bf16 casts of those copies (5-6 kernels: x, grad_output, both weights, qkv bias,
    the tables' concatenation), each with its launch gap,
  * and the graph trees' Python between the copy and the replay, which the GPU waits through.
Here one Triton kernel reads each fresh input once and writes what the graph reads, in the form it reads it:
bf16 x, grad_output, qkv weight and bias, projection weight, and the padded bf16 table matrix
[rel_pos_h; rel_pos_w; zero rows] (entry.py's `tables`). What must stay fp32 stays fp32: the projection
weight (a copy, for the v-bias gradient's GEMV) and grad_output's column sums (both bias gradients: bf16 terms
break the benchmark's tolerance there, entry.py), which the kernel writes as one fp32 partial sum per
BLOCK_R-row block, summed in block order inside the graph (deterministic, no atomics).

    buffers = stage_buffers(shapes..., device)   # once per workload: the graph's static inputs
    stage(buffers, grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, rel_pos_h, rel_pos_w)

The kernel's programs split into ranges, one per input (an if-chain on the program id), one tile each: of
grad_output (with the sums), of x, of each weight, of the qkv bias (as one row), and of the two tables. On CPU without
the Triton interpreter, stage() does the same with torch ops (the partial sums then sit in one row).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Tiles: BLOCK_R x BLOCK_C of the token matrices (and BLOCK_R table rows), BLOCK_RW x BLOCK_C of the weights;
# grad_output's partial column sums are one row per BLOCK_R token rows
BLOCK_R = 32
BLOCK_RW = 16  # the weights are most of the bytes on the small grids: more, smaller tiles there
BLOCK_C = 256


@triton.jit
def _cast_tile(SRC, DST, DST32, PART, tile, n_rows, COLS: tl.constexpr, BLOCK_R: tl.constexpr,
               BLOCK_C: tl.constexpr, SUM: tl.constexpr, COPY32: tl.constexpr):
    # one [BLOCK_R, BLOCK_C] tile (row-block major) of a contiguous [n_rows, COLS] fp32 matrix -> DST (its dtype);
    # COPY32: also DST32 (fp32); SUM: PART[row block, cols] = the tile's column sums (fp32, fixed order).
    # One load per program, no loop: a program that walked its columns in steps waited one DRAM latency per step
    # (the qkv bias as one program of 9 steps set the kernel's time on the small grids: ~9.5 us)
    n_cb: tl.constexpr = (COLS + BLOCK_C - 1) // BLOCK_C
    rb, cb = tile // n_cb, tile % n_cb
    rows = rb * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    ok = (rows < n_rows)[:, None] & (cols < COLS)[None, :]
    offs = rows.to(tl.int64)[:, None] * COLS + cols[None, :]
    x = tl.load(SRC + offs, mask=ok, other=0.0)
    tl.store(DST + offs, x.to(DST.dtype.element_ty), mask=ok)
    if COPY32:
        tl.store(DST32 + offs, x, mask=ok)
    if SUM:
        tl.store(PART + rb * COLS + cols, tl.sum(x, axis=0), mask=cols < COLS)


@triton.jit
def _stage_kernel(G, G16, GPART, X, X16, WQ, WQ16, BQ, BQ16, WP, WP16, WP32, RH, RW, TAB16,
                  n_tokens, rows_h, rows_w, C: tl.constexpr, D: tl.constexpr,
                  BLOCK_R: tl.constexpr, BLOCK_RW: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    # G, X: [n_tokens, C]; WQ: [3C, C]; BQ: [3C]; WP: [C, C]; RH: [rows_h, D]; RW: [rows_w, D], all fp32,
    # contiguous. TAB16: [width, D] bf16, RH's rows then RW's (the zero rows past them are never written).
    # Program ranges, in order: G's tiles, X's, WQ's, WP's, BQ's (one row), RH's, RW's
    pid = tl.program_id(0)
    n_cb: tl.constexpr = (C + BLOCK_C - 1) // BLOCK_C
    n_tok = tl.cdiv(n_tokens, BLOCK_R) * n_cb
    end_x = 2 * n_tok
    end_wq = end_x + ((3 * C + BLOCK_RW - 1) // BLOCK_RW) * n_cb
    end_wp = end_wq + ((C + BLOCK_RW - 1) // BLOCK_RW) * n_cb
    end_bq = end_wp + (3 * C + BLOCK_C - 1) // BLOCK_C
    end_rh = end_bq + tl.cdiv(rows_h, BLOCK_R)
    if pid < n_tok:
        _cast_tile(G, G16, G16, GPART, pid, n_tokens, C, BLOCK_R, BLOCK_C, True, False)
    elif pid < end_x:
        _cast_tile(X, X16, X16, GPART, pid - n_tok, n_tokens, C, BLOCK_R, BLOCK_C, False, False)
    elif pid < end_wq:
        _cast_tile(WQ, WQ16, WQ16, GPART, pid - end_x, 3 * C, C, BLOCK_RW, BLOCK_C, False, False)
    elif pid < end_wp:
        _cast_tile(WP, WP16, WP32, GPART, pid - end_wq, C, C, BLOCK_RW, BLOCK_C, False, True)
    elif pid < end_bq:
        _cast_tile(BQ, BQ16, BQ16, GPART, pid - end_wp, 1, 3 * C, 1, BLOCK_C, False, False)
    elif pid < end_rh:
        _cast_tile(RH, TAB16, TAB16, GPART, pid - end_bq, rows_h, D, BLOCK_R, BLOCK_D, False, False)
    else:
        _cast_tile(RW, TAB16 + rows_h * D, TAB16, GPART, pid - end_rh, rows_w, D, BLOCK_R, BLOCK_D, False, False)


def table_width(rows_h: int, rows_w: int) -> int:
    """Rows of the padded table matrix: rows_h + rows_w rounded up to 8, so that bf16 rows of T and dT (this many
    columns) are 16-byte aligned, which cuBLAS's fast kernels need (entry.py, 2026-12-01)."""
    return -(-(rows_h + rows_w) // 8) * 8


def stage_buffers(grad_output: torch.Tensor, qkv_weight: torch.Tensor, rel_pos_h: torch.Tensor,
                  rel_pos_w: torch.Tensor) -> dict[str, torch.Tensor]:
    """The graph's static inputs for inputs shaped like these (allocated here, written by stage()):
    g16, x16 [B, H, W, C] bf16; g_part [blocks, C] fp32; wq16 [3C, C], bq16 [3C], wp16 [C, C] bf16;
    wp32 [C, C] fp32; tables16 [width, D] bf16 (zero rows past the two tables')."""
    dev, (B, H, W, C), D = grad_output.device, grad_output.shape, rel_pos_h.shape[1]
    bf16 = torch.bfloat16
    width = table_width(rel_pos_h.shape[0], rel_pos_w.shape[0])
    return {"g16": torch.empty((B, H, W, C), dtype=bf16, device=dev),
            "g_part": torch.empty((triton.cdiv(B * H * W, BLOCK_R), C), dtype=torch.float32, device=dev),
            "x16": torch.empty((B, H, W, C), dtype=bf16, device=dev),
            "wq16": torch.empty(qkv_weight.shape, dtype=bf16, device=dev),
            "bq16": torch.empty(qkv_weight.shape[0], dtype=bf16, device=dev),
            "wp16": torch.empty((C, C), dtype=bf16, device=dev),
            "wp32": torch.empty((C, C), dtype=torch.float32, device=dev),
            "tables16": torch.zeros((width, D), dtype=bf16, device=dev)}


def _check(name: str, t: torch.Tensor, shape: tuple, device: torch.device) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"stage: `{name}` has shape {tuple(t.shape)}; expected {tuple(shape)} (the staged buffers')")
    if t.dtype != torch.float32 or t.device != device:
        raise ValueError(f"stage: `{name}` must be float32 on {device}; got {t.dtype} on {t.device}")
    return t.contiguous()


def sources(buffers: dict[str, torch.Tensor], grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight,
            rel_pos_h, rel_pos_w) -> list[torch.Tensor]:
    """The 7 inputs checked against `buffers` (shapes, fp32, device) and made contiguous, in the kernel's order."""
    g16, tab = buffers["g16"], buffers["tables16"]
    dev, (B, H, W, C), D = g16.device, g16.shape, tab.shape[1]
    rows_h, rows_w = rel_pos_h.shape[0], rel_pos_w.shape[0]
    if rows_h + rows_w > tab.shape[0]:
        raise ValueError(f"stage: tables of {rows_h} + {rows_w} rows do not fit the staged {tab.shape[0]}")
    return [_check("grad_output", grad_output, (B, H, W, C), dev),
            _check("hidden_states", hidden_states, (B, H, W, C), dev),
            _check("qkv_weight", qkv_weight, (3 * C, C), dev), _check("qkv_bias", qkv_bias, (3 * C,), dev),
            _check("proj_weight", proj_weight, (C, C), dev), _check("rel_pos_h", rel_pos_h, (rows_h, D), dev),
            _check("rel_pos_w", rel_pos_w, (rows_w, D), dev)]


def stage(buffers: dict[str, torch.Tensor], grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight,
          rel_pos_h, rel_pos_w) -> list[torch.Tensor]:
    """Write the fresh fp32 inputs into `buffers` (stage_buffers()'s): one kernel launch on CUDA. Returns the
    sources it read (sources()), whose addresses a graph that captured this launch was captured with."""
    srcs = sources(buffers, grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, rel_pos_h, rel_pos_w)
    g, x, wq, bq, wp, rh, rw = srcs
    g16, tab = buffers["g16"], buffers["tables16"]
    (B, H, W, C), D = g16.shape, tab.shape[1]
    rows_h, rows_w = rh.shape[0], rw.shape[0]
    if g16.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        _stage_torch(buffers, *srcs)
        return srcs
    n_tok = B * H * W
    n_cb = triton.cdiv(C, BLOCK_C)
    n_prog = (2 * triton.cdiv(n_tok, BLOCK_R) + triton.cdiv(3 * C, BLOCK_RW) + triton.cdiv(C, BLOCK_RW)) * n_cb \
        + triton.cdiv(3 * C, BLOCK_C) + triton.cdiv(rows_h, BLOCK_R) + triton.cdiv(rows_w, BLOCK_R)
    _stage_kernel[(n_prog,)](
        g, g16, buffers["g_part"], x, buffers["x16"], wq, buffers["wq16"], bq, buffers["bq16"], wp, buffers["wp16"],
        buffers["wp32"], rh, rw, tab, n_tok, rows_h, rows_w, C=C, D=D, BLOCK_R=BLOCK_R, BLOCK_RW=BLOCK_RW,
        BLOCK_C=BLOCK_C, BLOCK_D=triton.next_power_of_2(D), num_warps=4)
    return srcs


def _stage_torch(buffers, g, x, wq, bq, wp, rh, rw) -> None:
    """stage() with torch ops (CPU without the interpreter): the same buffers, the column sums in one row."""
    C = g.shape[-1]
    buffers["g16"].copy_(g)
    buffers["x16"].copy_(x)
    buffers["g_part"].zero_()
    buffers["g_part"][0] = g.reshape(-1, C).sum(0)
    for name, src in (("wq16", wq), ("bq16", bq), ("wp16", wp), ("wp32", wp)):
        buffers[name].copy_(src)
    buffers["tables16"][:rh.shape[0]] = rh
    buffers["tables16"][rh.shape[0]:rh.shape[0] + rw.shape[0]] = rw
