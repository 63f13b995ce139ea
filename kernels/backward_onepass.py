"""Experiment (off by default): the backward in one pass over the scores, with an ordered dQ / d_rel_w reduction.

The shipped backward (backward.py) recomputes P and dP twice, once in the dK/dV programs and once in the dQ
programs, so that every output has one writer: 7 N*N*D matmuls. Here a dK/dV program also makes its
key tile's share of dQ (dS @ K) and of d_rel_w (dS summed over the tile's grid rows) and adds them into fp32
buffers: 5 matmuls. d_rel_h needs no buffer: with whole grid rows per key tile, column kh of d_rel_h has one
writer, the program that owns row kh.

ACCUM says how the shares are added (benchmarks/NOTES.md, session 15):
  "atomic"   fp32 atomic adds into zeroed buffers, finished by torch ops. Not deterministic.
  "tma"      the same with TMA bulk reduce-adds (FlashAttention-3's dQ). Not deterministic.
  "none"     a timing probe: the shares are made and dropped (dq and d_rel_w wrong).
  "ordered"  one writer at a time per query block, in a fixed order, through a step semaphore per
             (batch*head, query block): the same bits every run. The first contributor writes instead of
             adding (no zeroing); the last writes dq * scale and d_rel_w in their dtype (no finishing kernel).
With ROTATE, program n starts at query block n * QB // T and wraps around, so that the T programs of a head
work on different blocks at every step and, once started, never wait for each other; block m then gets its
shares from programs n0(m), n0(m) - 1, ... (cyclic), n0(m) being the program whose start is the last at or
before m. A waiting program waits on a higher id, so a head's programs must be resident together (in-order
dispatch, as FlashAttention-3's deterministic mode assumes). Triton's interpreter runs programs one after
another, which that order would deadlock: it gets ROTATE=False (every program in block order, shares in
program order; other bits than ROTATE, the same each run).

16-bit inputs only (fp32 would need the K-major operand copies of the shipped kernels).

Measured on the H200 (session 15, bf16, SAM-B global layer 64x64x1, CUDA-graph replay; shipped backward 587-591 us;
`benchmarks/sweep_kernels.py --onepass ACCUM`, results/onepass_session15_h200.json): slower in every form.
  "none" (the shares made and dropped: the compute alone)   616 us (64 keys, 64-query steps), 733, 1366 (128 keys)
  "tma"                                                      858 us, 989, 1652
  "atomic"                                                   923 us (64 keys, 32-query steps), 1484-1697 (128 keys)
  "ordered"                                                  2031-3438 us (128 keys); 64 keys / 4 warps: an illegal
                                                             address in CUDA-graph replay (the eager calls ran; not
                                                             found)
So the dS @ K product, d_rel_h's reduction across the MMA's key axis and the d_rel_w tile cost a dK/dV program more
than the whole dQ program they replace, before any accumulation. Kept in history only (removed in the next commit).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .tiles import _col, _col_ok, _dot

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = tl.constexpr(1.4426950408889634)

# The SAM-B global layer's best 128-key dK/dV (benchmarks/NOTES.md, session 15: 2276 us against 2259 shipped at
# 64x64x4), the program this one extends.
DEFAULT_CONFIG = dict(BLOCK_N=128, BLOCK_M=32, num_warps=8, num_stages=3, MAXNREG=128)
_INTERPRET_CONFIG = dict(BLOCK_N=16, BLOCK_M=16, num_warps=4, num_stages=1)


@triton.jit
def _onepass_kernel(
    Q, K, V, RH_T, RW_T, DO, LSE, DELTA, DQ, DK, DV_, DRH, DRW, DQ_ACC, DRW_ACC, SEM,
    sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
    srh_b, srh_n, srh_k, srw_b, srw_n, srw_k,  # the bias copies, queries contiguous (as dK/dV's BIAS_T)
    sdo_b, sdo_n, sdo_d, slse_b, slse_n, sdl_b,
    sdq_b, sdq_n, sdq_d, sdk_b, sdk_n, sdk_d, sdv_b, sdv_n, sdv_d,
    sdrh_b, sdrh_n, sdrh_k, sdrw_b, sdrw_n, sdrw_k,
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, ACCUM: tl.constexpr, ROTATE: tl.constexpr, B_ROWS: tl.constexpr,
):
    # q, k: [B, N, D]  v, do: [B, N, DV]  lse, delta: [B, N_Q]  sem: [B, QB] i32
    # dq_acc: [B, D_PAD, QB*BLOCK_M], drw_acc: [B, WK_PAD, QB*BLOCK_M] fp32, queries contiguous (transposed tiles)
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    n = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    T: tl.constexpr = (HK + R - 1) // R
    BLOCK_N: tl.constexpr = R * WK_PAD
    QB = tl.cdiv(N_Q, BLOCK_M)
    NQ_PAD = QB * BLOCK_M
    kh0 = n * R
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    offs_w = tl.arange(0, WK_PAD)
    row = offs_n // WK_PAD
    col = _col(offs_n, WK_PAD, R)
    kh = kh0 + row
    col_ok = _col_ok(col, WK, WK_PAD)
    n_ok = col_ok & (kh < HK)
    j = kh * WK + col

    # k: [BLOCK_N, D_PAD], v: [BLOCK_N, DV_PAD], resident for the whole query loop
    k = tl.load(K + b * sk_b + j[:, None] * sk_n + offs_d[None, :] * sk_d,
                mask=n_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv[None, :] * sv_d,
                mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, D_PAD], tl.float32)
    dv = tl.zeros([BLOCK_N, DV_PAD], tl.float32)
    start = (n * QB) // T if ROTATE else 0

    for step in range(0, QB):
        mb = (start + step) % QB
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        # qT: [D_PAD, BLOCK_M], do: [BLOCK_M, DV_PAD]
        qT = tl.load(Q + b * sq_b + offs_m[None, :] * sq_n + offs_d[:, None] * sq_d,
                     mask=m_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d,
                     mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        lse = tl.load(LSE + b * slse_b + offs_m * slse_n, mask=m_ok, other=0.0) * _LOG2E
        delta = tl.load(DELTA + b * sdl_b + offs_m, mask=m_ok, other=0.0)
        # bias^T: [BLOCK_N, BLOCK_M]; the copies are padded to whole query blocks, so no query mask
        biasT = tl.load(RW_T + b * srw_b + offs_m[None, :] * srw_n + col[:, None] * srw_k,
                        mask=col_ok[:, None], other=0.0).to(tl.float32)
        for r in tl.static_range(R):  # rel_h by R row loads placed by key row (dK/dV's RH_SELECT)
            rh_ok = (tl.zeros([BLOCK_M], tl.int32) + kh0 + r) < HK
            rh_r = tl.load(RH_T + b * srh_b + offs_m * srh_n + (kh0 + r) * srh_k, mask=rh_ok, other=0.0)
            biasT = tl.where((row == r)[:, None], biasT + rh_r.to(tl.float32)[None, :], biasT)

        qkT = _dot(k, qT, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), "none")
        pT = tl.math.exp2(qkT * qk_scale + biasT * _LOG2E - lse[None, :])
        pT = tl.where(n_ok[:, None] & m_ok[None, :], pT, 0.0)
        dv = _dot(pT.to(do.dtype), do, dv, "none")
        dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), "none")
        dsT = pT * (dpT - delta[None, :])  # [BLOCK_N, BLOCK_M] fp32; 0 on masked keys and queries
        dsT16 = dsT.to(qT.dtype)
        dk = _dot(dsT16, tl.trans(qT), dk, "none")
        # this key tile's shares, transposed: dq^T [D_PAD, BLOCK_M] (unscaled; k^T @ dS^T has M = D = 64, a
        # whole warpgroup MMA, where dS @ k would have M = BLOCK_M = 32) and d_rel_w^T [WK_PAD, BLOCK_M]
        dqT = _dot(tl.trans(k), dsT16, tl.zeros([D_PAD, BLOCK_M], tl.float32), "none")
        ds3 = tl.reshape(dsT, [R, WK_PAD, BLOCK_M])
        drwT = tl.sum(ds3, 0)
        # d_rel_h[:, kh0 + r]: one writer (this program owns those grid rows)
        offs_r = kh0 + tl.arange(0, R)
        tl.store(DRH + b * sdrh_b + offs_m[None, :] * sdrh_n + offs_r[:, None] * sdrh_k,
                 tl.sum(ds3, 1).to(DRH.dtype.element_ty), mask=m_ok[None, :] & (offs_r[:, None] < HK))

        acc_q = DQ_ACC + b * D_PAD * NQ_PAD + offs_d[:, None] * NQ_PAD + offs_m[None, :]
        acc_w = DRW_ACC + b * WK_PAD * NQ_PAD + offs_w[:, None] * NQ_PAD + offs_m[None, :]
        if ACCUM == "atomic":
            tl.atomic_add(acc_q, dqT, sem="relaxed")
            tl.atomic_add(acc_w, drwT, sem="relaxed")
        elif ACCUM == "tma":  # bulk reduce-adds from shared memory (cp.reduce.async.bulk), as FlashAttention-3's dQ
            dq_desc = tl.make_tensor_descriptor(DQ_ACC, shape=[B_ROWS * D_PAD, NQ_PAD], strides=[NQ_PAD, 1],
                                                block_shape=[D_PAD, BLOCK_M])
            drw_desc = tl.make_tensor_descriptor(DRW_ACC, shape=[B_ROWS * WK_PAD, NQ_PAD], strides=[NQ_PAD, 1],
                                                 block_shape=[WK_PAD, BLOCK_M])
            dq_desc.atomic_add([(b * D_PAD).to(tl.int32), mb * BLOCK_M], dqT)
            drw_desc.atomic_add([(b * WK_PAD).to(tl.int32), mb * BLOCK_M], drwT)
        elif ACCUM == "none":  # timing probe: the shares made and dropped (wrong dq, d_rel_w)
            tl.store(acc_q, dqT, mask=(offs_d[:, None] < 0))
            tl.store(acc_w, drwT, mask=(offs_w[:, None] < 0))
        else:
            # which share this is: k-th of T for block mb (module docstring)
            if ROTATE:
                n0 = ((mb + 1) * T + QB - 1) // QB - 1
                kth = (n0 - n + T) % T
            else:
                kth = n
            sem = SEM + b * QB + mb
            while tl.atomic_cas(sem, kth, kth, sem="acquire") != kth:
                pass
            # the first share writes, the last one writes the outputs: as [BLOCK_M] vectors (Triton's interpreter
            # rejects a vector mask combined with a 0-d one)
            kth_m = tl.zeros([BLOCK_M], tl.int32) + kth
            prev, keep, last = kth_m > 0, kth_m < T - 1, kth_m == T - 1
            # L2 reads (.cg): the previous share was written by another SM
            acc_dq = tl.load(acc_q, mask=prev[None, :], other=0.0, cache_modifier=".cg") + dqT
            acc_drw = tl.load(acc_w, mask=prev[None, :], other=0.0, cache_modifier=".cg") + drwT
            tl.store(acc_q, acc_dq, mask=keep[None, :])
            tl.store(acc_w, acc_drw, mask=keep[None, :])
            tl.store(DQ + b * sdq_b + offs_m[None, :] * sdq_n + offs_d[:, None] * sdq_d,
                     (acc_dq * scale).to(DQ.dtype.element_ty), mask=(m_ok & last)[None, :] & (offs_d[:, None] < D))
            tl.store(DRW + b * sdrw_b + offs_m[None, :] * sdrw_n + offs_w[:, None] * sdrw_k,
                     acc_drw.to(DRW.dtype.element_ty), mask=(m_ok & last)[None, :] & (offs_w[:, None] < WK))
            tl.debug_barrier()  # every thread's stores issued before the release
            tl.atomic_xchg(sem, kth + 1, sem="release")

    dk = dk * scale
    tl.store(DK + b * sdk_b + j[:, None] * sdk_n + offs_d[None, :] * sdk_d, dk.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & (offs_d[None, :] < D))
    tl.store(DV_ + b * sdv_b + j[:, None] * sdv_n + offs_dv[None, :] * sdv_d, dv.to(DV_.dtype.element_ty),
             mask=n_ok[:, None] & (offs_dv[None, :] < DV))


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if this experiment takes the inputs (the shipped kernels' checks first)."""
    from .rel_pos_attention import unsupported_reason as shipped_reason

    reason = shipped_reason(q, k, v, rel_h, rel_w)
    if reason is None and q.dtype == torch.float32:
        reason = "fp32 (the one-pass backward is 16-bit only)"
    return reason


def backward_onepass(dout, q, k, v, rel_h, rel_w, out, lse, scale: float, accum: str = "ordered",
                     cfg: dict | None = None):
    """The shipped backward()'s contract (returns dq, dk, dv, d_rel_h, d_rel_w), in one pass. accum: "ordered"
    (deterministic) or "atomic" (not)."""
    from .rel_pos_attention import _empty, _launch_options, _queries_kmajor
    from .configs import pad, tile

    if accum not in ("ordered", "atomic", "tma", "none"):
        raise ValueError(f"accum must be 'ordered', 'atomic', 'tma' or 'none', got {accum!r}")
    cfg = dict(cfg or (_INTERPRET_CONFIG if _INTERPRET else DEFAULT_CONFIG))
    b, n_q, d = q.shape
    dv_ = v.shape[2]
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    d_pad, dv_pad = pad(d), pad(dv_)
    wk_pad, r = tile(hk, wk, cfg["BLOCK_N"])
    bm = cfg["BLOCK_M"]
    qb = triton.cdiv(n_q, bm)
    n_tiles = triton.cdiv(hk, r)

    dq = _empty(q.shape, q.dtype, q.device)
    dk = _empty(k.shape, k.dtype, k.device)
    dv = _empty(v.shape, v.dtype, v.device)
    drh = _empty(rel_h.shape, rel_h.dtype, rel_h.device)
    drw = _empty(rel_w.shape, rel_w.dtype, rel_w.device)
    delta = (dout.float() * out.float()).sum(-1)  # [B, Nq] fp32
    # the atomic adds need zeros; the ordered accumulation writes before it reads (poisoned in the tests)
    alloc = (lambda shape, dtype, device: torch.zeros(shape, dtype=dtype, device=device)) if accum in ("atomic", "tma") \
        else _empty
    dq_acc = alloc((b, d_pad, qb * bm), torch.float32, q.device)
    drw_acc = alloc((b, wk_pad, qb * bm), torch.float32, q.device)
    sem = torch.zeros((b, qb), dtype=torch.int32, device=q.device)
    if accum == "tma" and q.is_cuda:
        from .forward_tma import _scratch

        triton.set_allocator(_scratch)
    rh_t = _queries_kmajor(rel_h, bm).transpose(1, 2)
    rw_t = _queries_kmajor(rel_w, bm).transpose(1, 2)
    torch.library.wrap_triton(_onepass_kernel)[(n_tiles, b)](
        q, k, v, rh_t, rw_t, dout, lse, delta, dq, dk, dv, drh, drw, dq_acc, drw_acc, sem,
        *q.stride(), *k.stride(), *v.stride(), *rh_t.stride(), *rw_t.stride(),
        *dout.stride(), *lse.stride(), delta.stride(0),
        *dq.stride(), *dk.stride(), *dv.stride(), *drh.stride(), *drw.stride(),
        n_q, scale * 1.4426950408889634, scale,
        HK=hk, WK=wk, D=d, DV=dv_, WK_PAD=wk_pad, R=r, D_PAD=d_pad, DV_PAD=dv_pad, BLOCK_M=bm,
        ACCUM=accum, ROTATE=not _INTERPRET, B_ROWS=b, **_launch_options(cfg),
    )
    if accum in ("atomic", "tma", "none"):
        dq = (dq_acc[:, :d, :n_q].transpose(1, 2) * scale).to(q.dtype)
        drw = drw_acc[:, :wk, :n_q].transpose(1, 2).to(rel_w.dtype)
    return dq, dk, dv, drh, drw
