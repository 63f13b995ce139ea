"""Experiment: the backward's dQ part as a Gluon kernel for Hopper, with the elementwise work of one key tile under
the previous tile's dQ MMA (forward_gluon.py's schedule, applied to dQ). Off unless rel_pos_attention.DQ_GLUON.

What the dQ programs compute (backward.py, PART "dq"): per query block, over key tiles j,
    S_j = Q K_j^T, dP_j = dO V_j^T          (non-accumulator MMAs)
    P_j = exp2(S_j * scale + rel_w + rel_h[:, j] - lse), dS_j = P_j * (dP_j - delta)
    d_rel_h[:, j] = rowsum(dS_j), d_rel_w += dS_j, dQ += dS_j K_j
and delta = rowsum(dO * O), stored for the dK/dV launch. Triton's tl kernel waits for S and dP right after
issuing them and for nothing else to overlap. Here, per tile j:

    issue S_j, dP_j, then dQ += dS_{j-1} K_{j-1} (dS_{j-1} from shared memory)
    wait until 1 MMA is in flight      -> S_j and dP_j are done, the dQ MMA runs
    P_j, dS_j, d_rel_h, d_rel_w; dS_j to shared memory (the other buffer)
    wait until 0 in flight; refill tile j-1's K/V slot (TMA)

dS goes through shared memory, not registers: with a register A operand in flight ptxas moves the second wait
above the elementwise work (forward_gluon.py, NOTES session 10). Scope as forward_gluon.py: fp16 / bf16, head dim
64, key grids exactly 64 wide, N_Q a multiple of BLOCK_M, contiguous q / k / v / dout; else backward.py's kernel.
Its SASS schedule is checked in CI (tests/gluon_compile_check.py), its numbers by the GPU tests
(tests/test_tma_kernels.py: passed on the H200, session 11). Timed in session 11: the SAM-B bf16 backward with it
is 916.9 us against 593.2 with the tl dQ (64x64x4: 3384 against 2285): slower, kept off. Likely cost (not
profiled): two warpgroups that split a 64-row tile by columns combine delta, d_rel_h and d_rel_w through shared
memory with a barrier per tile, at one CTA of 8 warps per SM.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, warpgroup_mma,
                                                              warpgroup_mma_wait)

from . import rel_pos_attention as K
from .forward_gluon import _tma_load, descriptors

_LOG2E = 1.4426950408889634


@gluon.jit
def _dq_step(j, ds_out, ds_in, dq, drw, q_smem, do_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw_smem, rh_ptr,
             drh_ptr, delta, zero, k_row, qk_scale, HK: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr,
             kv_bytes: gl.constexpr, dtype: gl.constexpr, mma: gl.constexpr):
    # key tile j >= 1: S_j, dP_j, then dQ += dS_{j-1} K_{j-1} from ds_in; tile j's elementwise work under that MMA,
    # its dS into ds_out
    LOG2E: gl.constexpr = 1.4426950408889634
    slot = j % STAGES
    prev = (j - 1) % STAGES
    rh = gl.load(rh_ptr + j).to(gl.float32) * LOG2E
    mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(do_smem, v_smem.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
    dq_tok = warpgroup_mma(ds_in, k_smem.index(prev), dq, is_async=True)
    # S_j and dP_j are the older groups: done once at most the dQ MMA is still in flight
    s_ij, dp = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, dp_tok))
    ds = gl.exp2(s_ij * qk_scale + rw_smem.load(mma) + rh[:, None]) * (dp - delta[:, None])
    gl.store(drh_ptr + j, gl.sum(ds, 1).to(drh_ptr.dtype.element_ty))
    drw += ds
    ds_out.store(ds.to(dtype))
    fence_async_shared()
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ))
    # tile j-1's K (read by that dQ MMA) and V are free: refill the slot with tile j-1+STAGES
    nxt = j - 1 + STAGES
    if nxt < HK:
        mbarrier.expect(kv_bar.index(prev), kv_bytes)
        _tma_load(k_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(prev), k_smem.index(prev))
        _tma_load(v_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(prev), v_smem.index(prev))
    return dq, drw


@gluon.jit
def _dq_gluon_kernel(
    q_desc, do_desc, k_desc, v_desc, O, DO, RH, RW, LSE, DELTA, DQ, DRH, DRW,
    so_b, so_n, sdo_b, sdo_n, srh_b, srh_n, srw_b, srw_n, slse_b, sdl_b, sdq_b, sdq_n, sdrh_b, sdrh_n,
    sdrw_b, sdrw_n,
    N_Q, N_K, qk_scale, scale,
    HK: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
    STAGES: gl.constexpr, num_warps: gl.constexpr,
):
    # q_desc, do_desc: [B*N_Q, D] in [BLOCK_M, D] boxes; k_desc, v_desc: [B*N_K, D] in [BLOCK_N, D] boxes
    # out, dout: [B, N_Q, D]; rel_h: [B, N_Q, HK], rel_w: [B, N_Q, BLOCK_N]; lse, delta: [B, N_Q] fp32
    LOG2E: gl.constexpr = 1.4426950408889634
    qk_scale = qk_scale.to(gl.float32)
    scale = scale.to(gl.float32)
    pid_m = gl.program_id(0)
    b = gl.program_id(1).to(gl.int64)
    dtype: gl.constexpr = q_desc.dtype

    # 8 warps on 64 rows: two warpgroups split the key / head-dim columns, halving each thread's tiles
    WARPS_N: gl.constexpr = num_warps * 16 // BLOCK_M
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps // WARPS_N, WARPS_N],
                                                  instr_shape=[16, BLOCK_N // WARPS_N, 16])
    row: gl.constexpr = gl.SliceLayout(1, mma)
    col: gl.constexpr = gl.SliceLayout(0, mma)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], do_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
    ds_a = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], ds_layout)  # dS of even tiles
    ds_b = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], ds_layout)  # dS of odd tiles
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_bar.index(s), count=1)

    q_row = gl.program_id(1) * N_Q + pid_m * BLOCK_M  # TMA coordinates are int32
    k_row = gl.program_id(1) * N_K
    kv_bytes: gl.constexpr = 2 * BLOCK_N * D * 2
    mbarrier.expect(q_bar, 2 * BLOCK_M * D * 2)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    _tma_load(do_desc, [q_row, 0], q_bar, do_smem)
    for s in gl.static_range(STAGES):
        if s < HK:
            mbarrier.expect(kv_bar.index(s), kv_bytes)
            _tma_load(k_desc, [k_row + s * BLOCK_N, 0], kv_bar.index(s), k_smem.index(s))
            _tma_load(v_desc, [k_row + s * BLOCK_N, 0], kv_bar.index(s), v_smem.index(s))

    # delta = rowsum(dO * O), stored for dK/dV; rel_w in the log2 domain with lse folded in: [BLOCK_M, BLOCK_N]
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row)
    offs_n = gl.arange(0, BLOCK_N, layout=col)
    offs_d = gl.arange(0, D, layout=col)
    o = gl.load(O + b * so_b + offs_m[:, None] * so_n + offs_d[None, :]).to(gl.float32)
    do = gl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_d[None, :]).to(gl.float32)
    delta = gl.sum(o * do, 1)
    gl.store(DELTA + b * sdl_b + offs_m, delta)
    lse = gl.load(LSE + b * slse_b + offs_m) * LOG2E
    rw = gl.load(RW + b * srw_b + offs_m[:, None] * srw_n + offs_n[None, :]).to(gl.float32) * LOG2E - lse[:, None]
    # held in shared memory, read back per tile: in registers it would add 32 per thread to a kernel at the limit
    rw_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, BLOCK_N],
                                        gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=8, order=[1, 0]))
    rw_smem.store(rw)
    rh_ptr = RH + b * srh_b + offs_m * srh_n
    drh_ptr = DRH + b * sdrh_b + offs_m * sdrh_n

    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=mma)
    dq = gl.zeros([BLOCK_M, D], gl.float32, layout=mma)
    mbarrier.wait(q_bar, 0)
    # tile 0: no dQ MMA to overlap yet
    rh = gl.load(rh_ptr).to(gl.float32) * LOG2E
    mbarrier.wait(kv_bar.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    dp_tok = warpgroup_mma(do_smem, v_smem.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    s_ij, dp = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, dp_tok))
    ds = gl.exp2(s_ij * qk_scale + rw + rh[:, None]) * (dp - delta[:, None])
    gl.store(drh_ptr, gl.sum(ds, 1).to(DRH.dtype.element_ty))
    drw = ds
    ds_a.store(ds.to(dtype))
    fence_async_shared()

    # two tiles per trip, each dS buffer its own allocation: storing dS_j into one index of a [2, ...] buffer
    # while the dQ MMA reads the other crashes ptxas 12.8 and 12.9 (13.4 compiles it)
    for j in range(1, HK - 1, 2):
        dq, drw = _dq_step(j, ds_b, ds_a, dq, drw, q_smem, do_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw_smem, rh_ptr,
                           drh_ptr, delta, zero, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes, dtype, mma)
        dq, drw = _dq_step(j + 1, ds_a, ds_b, dq, drw, q_smem, do_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw_smem,
                           rh_ptr, drh_ptr, delta, zero, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes, dtype, mma)
    if HK % 2 == 0:  # tiles 1 .. HK-1 are an odd count: one more step, writing ds_b
        dq, drw = _dq_step(HK - 1, ds_b, ds_a, dq, drw, q_smem, do_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw_smem,
                           rh_ptr, drh_ptr, delta, zero, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes, dtype, mma)
        ds_last = ds_b
    else:
        ds_last = ds_a

    last = (HK - 1) % STAGES
    dq_tok = warpgroup_mma(ds_last, k_smem.index(last), dq, is_async=True)
    dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq_tok, ))
    mbarrier.invalidate(q_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bar.index(s))

    gl.store(DQ + b * sdq_b + offs_m[:, None] * sdq_n + offs_d[None, :], (dq * scale).to(dtype))
    gl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + offs_n[None, :], drw.to(DRW.dtype.element_ty))


BLOCK_M = 64
# 8 warps on 64 rows (two warpgroups split the columns): offline, sm_90a, 164-173 registers, no spills, every
# exponential under the dQ MMA. At 4 warps: 255 registers and spills. ptxas 12.8 (triton 3.6) crashes on some
# shapes and configs (3 stages; odd key-grid heights), ptxas 13.4 compiles them all (NOTES, session 10)
NUM_WARPS = 8
STAGES = 2


def unsupported_reason(q, k, v, rel_h, rel_w, dout=None, out=None) -> str | None:
    """None if dq_gluon takes these inputs (forward_gluon.py's scope, plus contiguous dout and out)."""
    from .forward_gluon import unsupported_reason as forward_reason

    why = forward_reason(q, k, v, rel_h, rel_w)
    if why is None and any(t is not None and not t.is_contiguous() for t in (dout, out)):
        why = "contiguous dout / out only"
    return why


def dq_gluon(dout, q, k, v, rel_h, rel_w, out, lse, scale: float):
    """The split backward's dQ launch: (dq, d_rel_h, d_rel_w, delta), delta [B, N_Q] fp32 for dK/dV."""
    b, n_q, d = q.shape
    hk = rel_h.shape[2]
    dq = K._empty(q.shape, q.dtype, q.device)
    drh = K._empty(rel_h.shape, rel_h.dtype, q.device)
    drw = K._empty(rel_w.shape, rel_w.dtype, q.device)
    delta = K._empty((b, n_q), torch.float32, q.device)
    q_desc, k_desc, v_desc = descriptors(q, k, v, BLOCK_M)
    do_desc = descriptors(dout, k, v, BLOCK_M)[0]  # dout as q is
    _dq_gluon_kernel[(n_q // BLOCK_M, b)](
        q_desc, do_desc, k_desc, v_desc, out, dout, rel_h, rel_w, lse, delta, dq, drh, drw,
        out.stride(0), out.stride(1), dout.stride(0), dout.stride(1), rel_h.stride(0), rel_h.stride(1),
        rel_w.stride(0), rel_w.stride(1), lse.stride(0), delta.stride(0), dq.stride(0), dq.stride(1),
        drh.stride(0), drh.stride(1), drw.stride(0), drw.stride(1),
        n_q, k.shape[1], scale * _LOG2E, scale,
        HK=hk, BLOCK_M=BLOCK_M, BLOCK_N=64, D=d, STAGES=STAGES, num_warps=NUM_WARPS,
    )
    return dq, drh, drw, delta
