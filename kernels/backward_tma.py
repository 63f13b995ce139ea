"""Hopper backward, an experiment beside forward_tma.py: the backward's key-side (dK/dV) and query-side (dQ,
d_rel_h, d_rel_w) programs with every load through a TMA descriptor, so that Triton's automatic warp
specialization for sm_90 applies. dQ follows forward_tma's layout (the query block halved between the
consumers; d_rel_w accumulated elementwise, d_rel_h by a per-row select of each step's row sum); the rest
of this docstring is about dK/dV, whose split is the harder one.

The split. Warp specialization gives the loop's MMAs to two consumer warp groups by halving their M
dimension, here the keys, and a warp group's MMA needs M >= 64: so a program owns 128 keys, R = 128 / Wk
whole grid rows (Wk in 16, 32, 64: each consumer then owns whole rows), and loops over query blocks.
With 64 keys the pass cannot split and gives both consumers the whole tile (TTGIR, Triton 3.6): twice
the work for the same result.

The bias. For key j (grid row kh, column c) and query i the score carries rel_w[i, c] + rel_h[i, kh]. As a
[keys, queries] tile: rel_w^T rows c repeated R times, read from a host copy that repeats them
(rel_w^T x R, [B, 128, Nq]: a 128-row box that the pass may halve like the keys), and rel_h^T's 16-row group
holding the tile's key rows spread over the tile by a 0/1 matmul ([128, 16] selector x [16, BLOCK_M]), as
in forward_tma. The key-side boxes are built in the kernel, 2-D, keys first (the rules in forward_tma).

delta (= rowsum(dout * out)) comes from outside: backward()'s dQ launch writes it in the split schedule,
or one torch reduction when dq_tma replaces that launch.
The op uses them only under rel_pos_attention.DQ_TMA / DKDV_TMA (off); benchmarks/sweep_kernels.py --bwd-tma
times the backward with each and both on the H200. Measured there (session 9, Triton 3.6, bf16): dQ slower on
every shape (SAM-B global backward 672 against 601 us) and non-finite with WS on 16-wide grids; dK/dV 5% faster
on 64-wide grids (570 against 601 us), slower on narrower ones. benchmarks/NOTES.md, session 9.

dK/dV takes: 16-bit dtypes, D and Dv powers of two in 16..128, Wk in (16, 32, 64), Hk a multiple of
128 / Wk, Nq a multiple of 8. dQ takes forward_tma's shapes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from . import forward_tma
from .forward_tma import _pow2, _scratch, dtype_and_dims_reason
from .rel_pos_attention import _empty
from .tiles import _dot

_LOG2E = tl.constexpr(1.4426950408889634)
BLOCK_KEYS = 128


@triton.jit
def _dkdv_tma_kernel(
    K, V, RWT, q_desc, do_desc, lse_desc, delta_desc, rht_desc, DK, DV_,
    N_Q, N_K, N_KEY_ROWS, N_RWT_ROWS, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
):
    # K: [B*Nk, D], V: [B*Nk, Dv], RWT: rel_w^T repeated [B*BLOCK_N, Nq] (row r holds column r % Wk), built here;
    # q_desc: [B*Nq, D], do_desc: [B*Nq, Dv] in [BLOCK_M, D|Dv]; lse_desc / delta_desc: [1, B*Nq] fp32 in
    # [1, BLOCK_M]; rht_desc: rel_h^T [B*Hk, Nq] in [16, BLOCK_M] (host descriptors, shared by both consumers).
    # dk, dv: [B, Nk, D|Dv], rows past this batch's keys not stored.
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_n = tl.program_id(0)
    b = tl.program_id(1)
    key0 = pid_n * BLOCK_N  # inside this batch's Nk keys; a whole number of grid rows
    kh0 = key0 // WK
    offs_n = tl.arange(0, BLOCK_N)
    kh_in_group = (kh0 % 16) + offs_n // WK  # the tile's key rows inside rel_h^T's 16-row group
    col16 = tl.arange(0, 16)
    offs_m = tl.arange(0, BLOCK_M)
    k_desc = tl.make_tensor_descriptor(K, shape=[N_KEY_ROWS, D], strides=[D, 1], block_shape=[BLOCK_N, D])
    v_desc = tl.make_tensor_descriptor(V, shape=[N_KEY_ROWS, DV], strides=[DV, 1], block_shape=[BLOCK_N, DV])
    rwt_desc = tl.make_tensor_descriptor(RWT, shape=[N_RWT_ROWS, N_Q], strides=[N_Q, 1], block_shape=[BLOCK_N, BLOCK_M])

    k = k_desc.load([b * N_K + key0, 0])  # [BLOCK_N, D]
    v = v_desc.load([b * N_K + key0, 0])  # [BLOCK_N, DV]
    # selector [BLOCK_N, 16]: key n takes row kh_in_group[n] of the rel_h^T group
    # (tl.where, not a cast of the bool: Triton 3.9's interpreter casts bool to bf16 as 0)
    sel = tl.where(kh_in_group[:, None] == col16[None, :], 1.0, 0.0).to(k.dtype)
    dk = tl.zeros([BLOCK_N, D], tl.float32)
    dv = tl.zeros([BLOCK_N, DV], tl.float32)
    for m0 in tl.range(0, N_Q, BLOCK_M, warp_specialize=WS):
        row0 = b * N_Q + m0
        q = q_desc.load([row0, 0])  # [BLOCK_M, D]
        do = do_desc.load([row0, 0])  # [BLOCK_M, DV]
        lse = lse_desc.load([0, row0]).reshape(BLOCK_M) * _LOG2E
        delta = delta_desc.load([0, row0]).reshape(BLOCK_M)
        rwt = rwt_desc.load([b * BLOCK_N, m0]).to(tl.float32)  # [BLOCK_N, BLOCK_M]
        rht16 = rht_desc.load([b * HK + (kh0 // 16) * 16, m0])  # [16, BLOCK_M]
        rht = _dot(sel, rht16, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), "none")
        qkT = _dot(k, q.T, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), "none")
        sT = qkT * qk_scale + (rwt + rht) * _LOG2E
        # queries past this batch's Nq (the next batch's rows, or zeros past the end) add nothing
        pT = tl.where((m0 + offs_m < N_Q)[None, :], tl.math.exp2(sT - lse[None, :]), 0.0)
        dv = _dot(pT.to(do.dtype), do, dv, "none")
        dpT = _dot(v, do.T, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), "none")
        dsT = pT * (dpT - delta[None, :])
        dk = _dot(dsT.to(q.dtype), q, dk, "none")

    j = key0 + offs_n
    n_ok = j < N_K
    offs_d = tl.arange(0, D)
    offs_dv = tl.arange(0, DV)
    tl.store(DK + (b * N_K + j)[:, None] * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty), mask=n_ok[:, None])
    tl.store(DV_ + (b * N_K + j)[:, None] * DV + offs_dv[None, :], dv.to(DV_.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _dq_tma_kernel(
    Q, DO, RH, RW, LSE, DELTA, k_desc, v_desc, DQ, DRH, DRW,
    N_Q, N_ROWS, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, WK_PAD: tl.constexpr, HK_PAD: tl.constexpr, D: tl.constexpr,
    DV: tl.constexpr, BLOCK_M: tl.constexpr, WS: tl.constexpr,
):
    # The query-side program (forward_tma's layout): q, dout [B*Nq, D|Dv], rel_h [B*Nq, Hk], rel_w [B*Nq, Wk],
    # lse, delta [B*Nq] fp32 through descriptors built here (the split halves them by query rows); k_desc /
    # v_desc (host): [B*Hk, Wk, D|Dv] in [1, WK_PAD, D|Dv] boxes, one grid row of keys per step.
    # -> dq [B*Nq, D], d_rel_h [B*Nq, Hk], d_rel_w [B*Nq, Wk]; rows past this batch's Nq are not stored.
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    row0 = b * N_Q + m0
    col = tl.arange(0, WK_PAD)
    colh = tl.arange(0, HK_PAD)
    col16 = tl.arange(0, 16)
    q_desc = tl.make_tensor_descriptor(Q, shape=[N_ROWS, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    do_desc = tl.make_tensor_descriptor(DO, shape=[N_ROWS, DV], strides=[DV, 1], block_shape=[BLOCK_M, DV])
    rw_desc = tl.make_tensor_descriptor(RW, shape=[N_ROWS, WK], strides=[WK, 1], block_shape=[BLOCK_M, WK_PAD])
    rh_desc = tl.make_tensor_descriptor(RH, shape=[N_ROWS, HK], strides=[HK, 1], block_shape=[BLOCK_M, 16])
    lse_desc = tl.make_tensor_descriptor(LSE, shape=[N_ROWS], strides=[1], block_shape=[BLOCK_M])
    delta_desc = tl.make_tensor_descriptor(DELTA, shape=[N_ROWS], strides=[1], block_shape=[BLOCK_M])

    q = q_desc.load([row0, 0])
    do = do_desc.load([row0, 0])
    lse = lse_desc.load([row0]) * _LOG2E
    delta = delta_desc.load([row0])
    rw = rw_desc.load([row0, 0]).to(tl.float32) * _LOG2E - lse[:, None]  # lse folded in once
    if WK < WK_PAD:
        rw = tl.where(col[None, :] < WK, rw, float("-inf"))  # padded keys: p = 0, so ds = 0
    dq = tl.zeros([BLOCK_M, D], tl.float32)
    drw = tl.zeros([BLOCK_M, WK_PAD], tl.float32)
    drh = tl.zeros([BLOCK_M, HK_PAD], tl.float32)
    for kh in tl.range(0, HK, warp_specialize=WS):
        k = k_desc.load([b * HK + kh, 0, 0]).reshape(WK_PAD, D)
        v = v_desc.load([b * HK + kh, 0, 0]).reshape(WK_PAD, DV)
        rh16 = rh_desc.load([row0, (kh // 16) * 16])
        sel = tl.where((col16[:, None] == kh % 16) & (col[None, :] >= 0), 1.0, 0.0).to(rh16.dtype)
        rh = _dot(rh16, sel, tl.zeros([BLOCK_M, WK_PAD], tl.float32), "none")
        qk = _dot(q, k.T, tl.zeros([BLOCK_M, WK_PAD], tl.float32), "none")
        p = tl.math.exp2(qk * qk_scale + rw + rh * _LOG2E)
        dp = _dot(do, v.T, tl.zeros([BLOCK_M, WK_PAD], tl.float32), "none")
        ds = p * (dp - delta[:, None])  # [BLOCK_M, WK_PAD] fp32; 0 on padded keys
        dq = _dot(ds.to(k.dtype), k, dq, "none")
        drw += ds  # d_rel_w: elementwise over the grid rows
        drh = tl.where(colh[None, :] == kh, tl.sum(ds, 1)[:, None], drh)  # d_rel_h[:, kh]: this row's sum

    offs_m = m0 + tl.arange(0, BLOCK_M)
    rows = (b * N_Q + offs_m)[:, None]
    m_ok = (offs_m < N_Q)[:, None]
    offs_d = tl.arange(0, D)
    tl.store(DQ + rows * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty), mask=m_ok)
    tl.store(DRH + rows * HK + colh[None, :], drh.to(DRH.dtype.element_ty), mask=m_ok & (colh[None, :] < HK))
    tl.store(DRW + rows * WK + col[None, :], drw.to(DRW.dtype.element_ty), mask=m_ok & (col[None, :] < WK))


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if dkdv_tma takes these inputs (rank-3, as for backward()); else why not."""
    n_q, hk, wk = q.shape[1], rel_h.shape[2], rel_w.shape[2]
    if (why := dtype_and_dims_reason(q, v)) is not None:
        return why
    if wk not in (16, 32, 64) or hk % (BLOCK_KEYS // wk) or n_q % 8:
        return f"a 128-key tile must be whole grid rows and TMA rows 16-byte aligned: Hk={hk}, Wk={wk}, Nq={n_q}"
    if k.shape[1] != hk * wk:
        return f"keys must form the Hk x Wk grid: {k.shape[1]} != {hk} x {wk}"
    return None


def dkdv_tma(dout, q, k, v, rel_h, rel_w, lse, delta, scale: float, block_m: int = 64, num_warps: int = 4,
             ws: bool = True):
    """dk [B, Nk, D], dv [B, Nk, Dv] (input dtypes) for backward()'s inputs, given delta [B, Nq] fp32
    (rowsum(dout * out)). Check unsupported_reason() first."""
    b, n_q, d = q.shape
    n_k, dv_ = k.shape[1], v.shape[2]
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    rwt = rel_w.transpose(1, 2).repeat(1, BLOCK_KEYS // wk, 1).contiguous()  # [B, 128, Nq]
    rht = rel_h.transpose(1, 2).contiguous()  # [B, Hk, Nq]
    q_desc = TensorDescriptor(q, [b * n_q, d], [d, 1], [block_m, d])
    do_desc = TensorDescriptor(dout, [b * n_q, dv_], [dv_, 1], [block_m, dv_])
    lse_desc = TensorDescriptor(lse, [1, b * n_q], [b * n_q, 1], [1, block_m])
    delta_desc = TensorDescriptor(delta, [1, b * n_q], [b * n_q, 1], [1, block_m])
    rht_desc = TensorDescriptor(rht, [b * hk, n_q], [n_q, 1], [16, block_m])
    dk = _empty(k.shape, k.dtype, k.device)
    dv = _empty(v.shape, v.dtype, v.device)
    if q.is_cuda:
        triton.set_allocator(_scratch)
    _dkdv_tma_kernel[(triton.cdiv(n_k, BLOCK_KEYS), b)](
        k, v, rwt, q_desc, do_desc, lse_desc, delta_desc, rht_desc, dk, dv,
        n_q, n_k, b * n_k, b * BLOCK_KEYS, scale * 1.4426950408889634, scale,
        HK=hk, WK=wk, D=d, DV=dv_, BLOCK_M=block_m, BLOCK_N=BLOCK_KEYS, WS=ws, num_warps=num_warps,
    )
    return dk, dv


def dq_unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if dq_tma takes these inputs; else why not (forward_tma's conditions: the same query-side layout)."""
    return forward_tma.unsupported_reason(q, k, v, rel_h, rel_w)


def dq_tma(dout, q, k, v, rel_h, rel_w, lse, delta, scale: float, block_m: int = 128, num_warps: int = 4,
           ws: bool = True):
    """dq [B, Nq, D], d_rel_h [B, Nq, Hk], d_rel_w [B, Nq, Wk] (input dtypes) for backward()'s inputs, given
    delta [B, Nq] fp32. Check dq_unsupported_reason() first."""
    b, n_q, d = q.shape
    dv_ = v.shape[2]
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    wk_pad = _pow2(wk)
    q, k, v, dout, rel_h, rel_w = (t.contiguous() for t in (q, k, v, dout, rel_h, rel_w))
    lse, delta = lse.float().contiguous(), delta.float().contiguous()
    k_desc = TensorDescriptor(k, [b * hk, wk, d], [wk * d, d, 1], [1, wk_pad, d])
    v_desc = TensorDescriptor(v, [b * hk, wk, dv_], [wk * dv_, dv_, 1], [1, wk_pad, dv_])
    dq = _empty(q.shape, q.dtype, q.device)
    drh = _empty(rel_h.shape, rel_h.dtype, rel_h.device)
    drw = _empty(rel_w.shape, rel_w.dtype, rel_w.device)
    if q.is_cuda:
        triton.set_allocator(_scratch)
    _dq_tma_kernel[(triton.cdiv(n_q, block_m), b)](
        q, dout, rel_h, rel_w, lse, delta, k_desc, v_desc, dq, drh, drw,
        n_q, b * n_q, scale * 1.4426950408889634, scale,
        HK=hk, WK=wk, WK_PAD=wk_pad, HK_PAD=_pow2(hk), D=d, DV=dv_, BLOCK_M=block_m, WS=ws, num_warps=num_warps,
    )
    return dq, drh, drw
