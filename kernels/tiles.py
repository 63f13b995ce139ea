"""Tile geometry and the jitted building blocks shared by the forward and backward kernels: dots, masks, bias tiles.

Host side (plain functions): key tiles as whole grid rows (`tile`), head dims as one or two power-of-two
chunks (`split`, `pad`, behind the SPLIT_HEAD_DIM switch). Device side: the @triton.jit pieces below them.

Scores live in the log2 domain (exp2 is one MUFU instruction; exp is exp2 plus a multiply), so every
bias read here is scaled by log2(e) on load. See rel_pos_attention.py for the tile scheme these serve.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Triton's CPU interpreter (3.9) computes bf16 x bf16 dots wrongly (garbage, ~1e10), so under the
# interpreter bf16 operands are widened to fp32 first. That is exact: bf16 products fit in fp32, the
# same as a bf16 MMA with fp32 accumulation.
_INTERPRET_WIDEN_BF16 = tl.constexpr(_INTERPRET)


# ----------------------------------------------------------------------------------------------
# Host side: tile geometry
# ----------------------------------------------------------------------------------------------

def tile(hk: int, wk: int, target_n: int) -> tuple[int, int]:
    """(WK_PAD, R): key tile = R grid rows of WK_PAD (padded) columns, BLOCK_N = R * WK_PAD >= 16."""
    wk_pad = triton.next_power_of_2(wk)
    r = max(1, target_n // wk_pad)
    r = min(r, triton.next_power_of_2(hk))  # no tiles taller than the grid
    while r * wk_pad < 16:  # tl.dot needs every dim >= 16
        r *= 2
    return wk_pad, r


# Head dims between powers of two run in two chunks (split below): ViT-H's global layer, 16 heads x 64x64, head dim
# 80, bf16 forward + backward 1.159 ms chunked (64 + 16) against 2.041 ms padded to 128, 1.15x head dim 64's 1.008 ms
# (H200; benchmarks/DECISIONS.md). SAMHQ_FX_SPLIT_HEAD_DIM=0 pads instead.
SPLIT_HEAD_DIM = os.environ.get("SAMHQ_FX_SPLIT_HEAD_DIM", "1") != "0"


def split(d: int) -> tuple[int, int]:
    """(D_A, D_B): the head dim as the kernels see it, two power-of-two chunks (D_B = 0: one chunk), each at
    least 16 (tl.dot's minimum). A head dim that is a power of two plus a smaller one runs as those two chunks
    (80 = 64 + 16, 96 = 64 + 32, 48 = 32 + 16: no dots, registers or shared memory spent on padding); any other
    is padded to one chunk (72 -> 128, 40 -> 64, 112 -> 128, 24 -> 32).

    Only whole chunks: with a second chunk partly past the head dim (72 as 64 + 16, 40 as 32 + 16), the bf16
    forward's output was wrong on the H200 (triton 3.6; q / k dim 72 and v dim 40 at 12 x 48x48: output error 2.8
    against float64, lse right; fp32 right), cause not found (benchmarks/DECISIONS.md)."""
    full = max(16, triton.next_power_of_2(d))
    a, b = full // 2, d - full // 2
    if SPLIT_HEAD_DIM and 16 <= b < a and b & (b - 1) == 0:
        return a, b
    return full, 0


def pad(d: int) -> int:
    """Head dim as the kernels see it: D_A + D_B of split(d) (80 stays 80, 112 -> 128), at least 16."""
    return sum(split(d))


# ----------------------------------------------------------------------------------------------
# Device side: jitted pieces
# ----------------------------------------------------------------------------------------------

@triton.jit
def _dot(a, b, acc, PREC: tl.constexpr):
    # PREC: "none" (fp16/bf16 operands), or for fp32 operands "ieee" | "tf32x3" | "tf32".
    if _INTERPRET_WIDEN_BF16:
        if a.dtype == tl.bfloat16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
    if PREC == "ieee":
        r = tl.dot(a, b, acc, input_precision="ieee")
    elif PREC == "tf32x3":
        r = tl.dot(a, b, acc, input_precision="tf32x3")
    elif PREC == "tf32":
        r = tl.dot(a, b, acc, input_precision="tf32")
    else:
        r = tl.dot(a, b, acc)
    return r


@triton.jit
def _rows(offs_m, s_n, s_h, QW: tl.constexpr):
    # Offsets of query rows offs_m in a rel-pos term: rows as one dim of stride s_n (QW == 0), or as the query
    # grid's (row, column) dims of strides (s_h, s_n), QW columns wide. The second is how the einsums that make
    # the terms lay them out ([h, B*w, k] from a batched GEMM), which a flat row dim cannot view: the term is
    # read where the GEMM wrote it instead of copied into rows first (one copy kernel a term a layer)
    if QW == 0:
        return offs_m * s_n
    else:
        return (offs_m // QW) * s_h + (offs_m % QW) * s_n


@triton.jit
def _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, kh, HK: tl.constexpr):
    # rel_h[:, kh] for the block's queries (rh_m: their row offsets, _rows): [BLOCK_M] fp32, log2 domain, 0 past
    # the last grid row
    return tl.load(RH + b * srh_b + rh_m + kh * srh_k,
                   mask=m_ok & (kh < HK), other=0.0).to(tl.float32) * 1.4426950408889634


@triton.jit
def _col(offs_n, WK_PAD: tl.constexpr, R: tl.constexpr):
    # grid column of key n in the tile; spelled without % when the tile is one grid row, so that the
    # compiler sees the column offsets as contiguous and vectorizes the rel_w loads
    if R == 1:
        return offs_n
    else:
        return offs_n % WK_PAD


@triton.jit
def _col_ok(col, WK: tl.constexpr, WK_PAD: tl.constexpr):
    # real (unpadded) grid columns; a constant when nothing is padded, so that the masks built from it
    # keep the rel_w / key loads vectorized (the compiler cannot see through col = n % WK_PAD)
    if WK == WK_PAD:
        return tl.full(col.shape, 1, tl.int1)
    else:
        return col < WK


@triton.jit
def _load_kmajor(XT, b, sxt_b, sxt_d, offs_s, offs_d, D: tl.constexpr):
    # [len(offs_s), len(offs_d)] tile of x (one head-dim chunk) from its K-major copy xT: [B, D, S] (S contiguous,
    # zero-padded so every offs_s is in bounds: no mask along S, so the loads stay 16-byte vectors)
    return tl.load(XT + b * sxt_b + offs_s[:, None] + offs_d[None, :] * sxt_d,
                   mask=(offs_d < D)[None, :], other=0.0)


@triton.jit
def _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, rh_m, srh_k, m_ok, kh0, kh,
                   HK: tl.constexpr, R: tl.constexpr, RH_SELECT: tl.constexpr):
    """s = qk * qk_scale + rw + rel_h[i, key row] for one key tile, log2 domain: [BLOCK_M, BLOCK_N].

    R == 1: the whole tile is grid row kh0, so rel_h is one value per query, prefetched one tile ahead
    (rh_next; returned refreshed for kh0 + 1: the pipeliner leaves that strided load synchronous, and
    issued a tile early its latency hides behind the dots). R > 1: a [BLOCK_M, BLOCK_N] gather, which
    the pipeliner turns into an async copy through shared memory as large as the K and V tiles
    together (fp32, TTGIR for sm_90); or, with RH_SELECT, R [BLOCK_M] column loads placed by key row
    with R selects (no shared memory; the fp32 forward's default, a config option elsewhere).
    """
    if R == 1:
        s = qk * qk_scale + rw + rh_next[:, None]
        rh_next = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, kh0 + 1, HK)
    elif RH_SELECT:
        bias = rw
        for r in tl.static_range(R):
            rh_r = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, kh0 + r, HK)
            bias = tl.where((kh == kh0 + r)[None, :], rw + rh_r[:, None], bias)
        s = qk * qk_scale + bias
    else:
        rh = tl.load(RH + b * srh_b + rh_m[:, None] + kh[None, :] * srh_k,
                     mask=m_ok[:, None] & (kh < HK)[None, :], other=0.0)
        s = qk * qk_scale + rw + rh.to(tl.float32) * 1.4426950408889634
    return s, rh_next

