"""Hopper forward, an experiment: every load through a TMA descriptor, so that Triton's automatic warp
specialization for sm_90 applies (`tl.range(..., warp_specialize=True)`: one producer warp group issues
the TMA copies, two consumer warp groups split the query block and do the MMAs and the softmax, with
`setmaxnreg` moving registers from producer to consumers).

Why a second forward. Triton 3.6 waits for every non-accumulator wgmma right after issuing it, so inside
a warp group of forward.py the MMAs and the softmax never overlap (NOTES, session 7); overlap comes only
from other CTAs. Warp specialization gives each SM two consumer warp groups sharing one K/V pipeline, the
shape of FlashAttention-3's schedule. Triton 3.6's Hopper pass asserts on any pointer load in the kernel
(WSLowerToken.cpp, even a plain softmax(QK^T)V loop with q read by pointer), so q, k, v, rel_w and rel_h
all come through descriptors, rel_h as the 16-column group holding the tile's key row, spread over the
tile by a small 0/1 matmul. How the query-side descriptors must be built for the split to be right is in
the kernel's comments: reading the TTGIR offline found two wrong splits (batch index offset, whole-block
copies into half-block buffers) and two compiler aborts, each avoided by the spelling here.

The op uses it only under rel_pos_attention.FWD_TMA (off); benchmarks/sweep_kernels.py --fwd-tma times it
against forward.py on the H200. Measured there (session 9, Triton 3.6): slower than forward.py on every shape
(SAM-B global bf16 221.7 us with WS, 210.3 without, 152.9 shipped), and non-finite with WS on 16-wide grids.
Kept to re-time on later Tritons (one command); benchmarks/NOTES.md, session 9.

Takes: key tiles of one whole grid row (Wk <= 128 keys, padded to a power of two by TMA's zero fill),
16-bit dtypes, D and Dv powers of two in 16..128, Hk and Wk multiples of 8 (16-byte TMA rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from .rel_pos_attention import _empty
from .tiles import _dot

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _fwd_tma_kernel(
    Q, k_desc, v_desc, RH, RW, O, LSE,
    so_b, so_n, slse_b, N_Q, N_ROWS, qk_scale,
    HK: tl.constexpr, WK: tl.constexpr, WK_PAD: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, WS: tl.constexpr,
):
    # q: [B*Nq, D]  rel_h: [B*Nq, Hk]  rel_w: [B*Nq, Wk] (contiguous, N_ROWS = B*Nq rows) through descriptors
    # built here; k_desc / v_desc (host): [B*Hk, Wk, D|Dv] in [1, WK_PAD, D|Dv] boxes, one grid row of keys,
    # columns >= Wk zero-filled.
    # Why the query side is built in the kernel, 2-D, query rows first: warp specialization splits those
    # boxes between the two consumer warp groups along dim 0, and only for descriptors it creates itself
    # does it also halve the box (a host descriptor keeps the box the host gave it, so each half-copy would
    # write a whole block; a 3-D [1, BLOCK_M, D] box was split along the batch index: TTGIR, Triton 3.6).
    # Rows past this batch's Nq read the next batch's rows (zeros past the end) and are never stored.
    qk_scale = tl.cast(qk_scale, tl.float32)  # fp64 when Inductor passes a Python float
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    m0 = pid_m * BLOCK_M
    row0 = b * N_Q + m0
    col = tl.arange(0, WK_PAD)
    col16 = tl.arange(0, 16)
    q_desc = tl.make_tensor_descriptor(Q, shape=[N_ROWS, D], strides=[D, 1], block_shape=[BLOCK_M, D])
    rw_desc = tl.make_tensor_descriptor(RW, shape=[N_ROWS, WK], strides=[WK, 1], block_shape=[BLOCK_M, WK_PAD])
    rh_desc = tl.make_tensor_descriptor(RH, shape=[N_ROWS, HK], strides=[HK, 1], block_shape=[BLOCK_M, 16])

    q = q_desc.load([row0, 0])
    # rel_w: the same for every key tile (tiles are grid rows); -inf on the padded columns masks those
    # keys for the whole loop, so the loop itself needs no mask
    rw = rw_desc.load([row0, 0]).to(tl.float32) * _LOG2E
    if WK < WK_PAD:
        rw = tl.where(col[None, :] < WK, rw, float("-inf"))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    for kh in tl.range(0, HK, warp_specialize=WS):
        k = k_desc.load([b * HK + kh, 0, 0]).reshape(WK_PAD, D)
        # rel_h[:, kh] spread over the tile: [BLOCK_M, 16] columns around kh (TMA boxes are >= 16 bytes) times a
        # 0/1 selector [16, WK_PAD], on the tensor cores and exact (one product per output, fp32 sum). A select
        # and row-sum in registers is what the Hopper pass cannot partition ("Unexpected op", WSDataPartition).
        rh16 = rh_desc.load([row0, (kh // 16) * 16])
        # (tl.where, not a cast of the bool: Triton 3.9's interpreter casts bool to bf16 as 0)
        sel = tl.where((col16[:, None] == kh % 16) & (col[None, :] >= 0), 1.0, 0.0).to(rh16.dtype)
        rh = _dot(rh16, sel, tl.zeros([BLOCK_M, WK_PAD], tl.float32), "none")
        qk = _dot(q, k.T, tl.zeros([BLOCK_M, WK_PAD], tl.float32), "none")
        s = qk * qk_scale + rw + rh * _LOG2E
        m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile has a real key
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([b * HK + kh, 0, 0]).reshape(WK_PAD, DV)
        acc = _dot(p.to(v.dtype), v, acc, "none")
        m_i = m_new

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, DV)
    m_ok = offs_m < N_Q
    tl.store(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :], (acc / l_i[:, None]).to(O.dtype.element_ty),
             mask=m_ok[:, None])
    tl.store(LSE + b * slse_b + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=m_ok)


def _scratch(size: int, alignment: int, stream):
    # global memory for the tensor maps the kernel builds (tl.make_tensor_descriptor)
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def dtype_and_dims_reason(q, v) -> str | None:
    """What every TMA experiment needs of the operands: 16-bit, head dims that are whole TMA / MMA tiles."""
    d, dv = q.shape[2], v.shape[2]
    if q.dtype not in (torch.bfloat16, torch.float16):
        return "16-bit dtypes only"
    if not (d == _pow2(d) <= 128 and dv == _pow2(dv) <= 128):
        return f"head dims must be powers of two in 16..128, got D={d}, Dv={dv}"
    return None


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if forward_tma takes these inputs (rank-3, as for forward()); else why not."""
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    if (why := dtype_and_dims_reason(q, v)) is not None:
        return why
    if wk % 8 or hk % 8 or wk > 128:
        return f"TMA rows must be 16-byte aligned and a key tile one grid row: Hk={hk}, Wk={wk}"
    if k.shape[1] != hk * wk:
        return f"keys must form the Hk x Wk grid: {k.shape[1]} != {hk} x {wk}"
    return None


def forward_tma(q, k, v, rel_h, rel_w, scale: float, block_m: int = 128, num_warps: int = 4, ws: bool = True):
    """forward()'s contract: q [B, Nq, D], k [B, Nk, D], v [B, Nk, Dv], rel_h [B, Nq, Hk], rel_w [B, Nq, Wk]
    -> out [B, Nq, Dv] in q.dtype, lse [B, Nq] fp32 (natural log). Check unsupported_reason() first."""
    b, n_q, d = q.shape
    dv, hk, wk = v.shape[2], rel_h.shape[2], rel_w.shape[2]
    wk_pad = _pow2(wk)
    q, k, v, rel_h, rel_w = (t.contiguous() for t in (q, k, v, rel_h, rel_w))
    k_desc = TensorDescriptor(k, [b * hk, wk, d], [wk * d, d, 1], [1, wk_pad, d])
    v_desc = TensorDescriptor(v, [b * hk, wk, dv], [wk * dv, dv, 1], [1, wk_pad, dv])
    if q.is_cuda:  # process-wide: Triton asks it for the kernel's tensor-map memory at each launch
        triton.set_allocator(_scratch)
    out = _empty((b, n_q, dv), q.dtype, q.device)
    lse = _empty((b, n_q), torch.float32, q.device)
    _fwd_tma_kernel[(triton.cdiv(n_q, block_m), b)](
        q, k_desc, v_desc, rel_h, rel_w, out, lse, out.stride(0), out.stride(1), lse.stride(0),
        n_q, b * n_q, scale * 1.4426950408889634,
        HK=hk, WK=wk, WK_PAD=wk_pad, D=d, DV=dv, BLOCK_M=block_m, WS=ws, num_warps=num_warps,
    )
    return out, lse
