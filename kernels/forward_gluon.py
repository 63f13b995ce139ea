"""Experiment: the forward as a Gluon kernel for Hopper, meant to overlap softmax and MMA (FlashAttention-3's
intra-warpgroup schedule). Off unless rel_pos_attention.FWD_GLUON is set.

Why it exists: Triton 3.6's tl kernels wait for every non-accumulator wgmma right after issuing it
(`warp_group_dot_wait {pendings = 0}` in the TTGIR, benchmarks/NOTES.md session 7), so within a warpgroup the
exponentials never run under an MMA, and the forward stops at ~338 TFLOP/s. Gluon exposes the wait:

    for key tile j:                     (tile j-1's P is in registers, in the MMA's A-operand layout)
        S_j  = Q @ K_j^T          issue
        O   += P_{j-1} @ V_{j-1}  issue
        wait until 1 MMA is in flight   -> S_j is done, P V still runs on the tensor cores
        softmax of S_j (bias, max, exp2, row sums) -> P_j, alpha_j
        wait until 0 in flight           -> O is done
        O *= alpha_j; refill the K/V slot of tile j-1 (TMA)

K and V arrive through TMA into a ring of STAGES slots, each with an mbarrier. Scope (anything else falls
back to forward.py): fp16 / bf16, head dim 64, key grids exactly 64 wide (SAM's global layers: one key tile
= one grid row, so rel_h is one column per tile and rel_w one tile per program), N_Q a multiple of BLOCK_M,
q / k / v contiguous. No masks are needed inside that scope. Not usable from the triton_op path (host
TensorDescriptors), like the TMA experiments. There is no CPU interpreter for Gluon: CI compiles it for sm_90
(tests/gluon_compile_check.py), the GPU tests run it (tests/test_tma_kernels.py).

Measured (session 10, H200, triton 3.6, bf16, CUDA-graph replay), with P in registers (P_SMEM False): correct
(out and lse bit-identical to forward.py's on the SAM-B global layer and a 7x64 grid; the same error against
float64), and no faster: SAM-B global 153.3 us against 152.4 at 64 rows / 4 warps / 3 stages (165.5 at 2
stages; 189-268 at 128 rows / 8 warps), 64x64x4 603.8 against 598.9. The PTX has the schedule above, but ptxas
does not keep it: in the SASS the wait for the P V MMA (WARPGROUP.DEPBAR.LE gsb0, 0x0) lands before the
exponentials, 0 of them between the two waits. Neither keeping the old P's registers live past the wait nor
moving the TMA refill changed that (offline), nor did ptxas 12.9. With P through shared memory (P_SMEM True,
two buffers, an SS-MMA) ptxas keeps all 32 exponentials of a step between the waits (offline SASS, triton 3.6
and 3.9; tests/gluon_compile_check.py asserts it). Timed in session 11: correct (bit-identical again) and
slower, 167.0 against 153.4 us at SAM-B (4 stages 182.5; 128 rows / 8 warps 212-294): the P store and the CTA
barrier before the SS-MMA cost more than the overlap returns at 3 CTAs per SM. Kept off, as the record.

SCHEDULE "s_ahead" (session 15) puts a shared-memory-only MMA under each softmax instead: per two key tiles,
    S_{j+1} issue; softmax of S_j (under it); P_j V_j issue; wait (1 in flight) -> S_{j+1} done;
    softmax of S_{j+1} (under P_j V_j); S_{j+2} issue; wait (1) -> P_j V_j done; P_{j+1} V_{j+1} issue; wait (0)
nothing in flight across the loop's back-edge (with S_{j+1} carried over it, ptxas serialized every wgmma: C7514,
"non wgmma instructions reading accumulator registers"). ptxas keeps this one: each softmax's 32-34 exponentials
sit under an MMA in the SASS (tests/gluon_compile_check.py asserts it). Correct on the H200 (bit-identical to
forward.py's out and lse again), and slower: SAM-B global 173.4 us (190 registers, 2 CTAs per SM), 164.3 (capped
at 168: 3 CTAs), 158.0 (capped, 4 stages) against 152.0 shipped; 64x64x4 598.4 against 565.9 at best. So the
overlap inside a warpgroup buys less than the third CTA's interleaving already gives, both ways it was written.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from . import rel_pos_attention as K

_LOG2E = 1.4426950408889634
# Triton 3.6 (the GPU image) names the TMA load async_copy_global_to_shared; 3.9 (CI) renamed it async_load
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared


@gluon.jit
def _step(j, p_prev, p_smem, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw, rh_ptr, zero_s,
          k_row, qk_scale, HK: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, kv_bytes: gl.constexpr,
          row_o: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr, P_SMEM: gl.constexpr):
    # one key tile j >= 1: S_j's MMA and tile j-1's P V MMA in flight together, S_j's softmax under the P V.
    # P_SMEM: P goes through shared memory (two buffers) instead of registers
    LOG2E: gl.constexpr = 1.4426950408889634
    slot = j % STAGES
    prev = (j - 1) % STAGES
    rh = gl.load(rh_ptr + j).to(gl.float32) * LOG2E
    mbarrier.wait(kv_bar.index(slot), (j // STAGES) & 1)
    s_tok = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    if P_SMEM:
        o_tok = warpgroup_mma(p_smem.index((j - 1) % 2), v_smem.index(prev), acc, is_async=True)
    else:
        o_tok = warpgroup_mma(p_prev, v_smem.index(prev), acc, is_async=True)
    # S_j is the older group: done once at most one MMA (P V) is still in flight
    s_ij = warpgroup_mma_wait(num_outstanding=1, deps=(s_tok, ))
    s_ij = s_ij * qk_scale + rw + rh[:, None]
    m_new = gl.maximum(m_i, gl.max(s_ij, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s_ij - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    if P_SMEM:
        p_smem.index(j % 2).store(p.to(dtype))
        fence_async_shared()
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, ))
        p_new = p_prev
    else:
        p_new = gl.convert_layout(p.to(dtype), p_layout)
        acc, p_prev = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_prev))
    # tile j-1's K and V are no longer read: refill its slot with tile j-1+STAGES
    nxt = j - 1 + STAGES
    if nxt < HK:
        mbarrier.expect(kv_bar.index(prev), kv_bytes)
        _tma_load(k_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(prev), k_smem.index(prev))
        _tma_load(v_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(prev), v_smem.index(prev))
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    return m_new, l_i, acc, p_new


@gluon.jit
def _issue_s(t, q_smem, k_smem, kv_bar, zero_s, STAGES: gl.constexpr):
    # S_t = Q K_t^T, asynchronous, once tile t's K and V have landed
    mbarrier.wait(kv_bar.index(t % STAGES), (t // STAGES) & 1)
    return warpgroup_mma(q_smem, k_smem.index(t % STAGES).permute((1, 0)), zero_s, use_acc=False, is_async=True)


@gluon.jit
def _softmax_step(s_ij, t, m_i, l_i, rw, rh_ptr, qk_scale):
    # tile t's scores -> P (fp32), the rescale factor, and the running max / sum
    LOG2E: gl.constexpr = 1.4426950408889634
    rh = gl.load(rh_ptr + t).to(gl.float32) * LOG2E
    s_ij = s_ij * qk_scale + rw + rh[:, None]
    m_new = gl.maximum(m_i, gl.max(s_ij, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s_ij - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@gluon.jit
def _refill(t, k_smem, v_smem, kv_bar, k_desc, v_desc, k_row, HK: gl.constexpr, STAGES: gl.constexpr,
            BLOCK_N: gl.constexpr, kv_bytes: gl.constexpr):
    # tile t's K and V are read no more: its slot takes tile t + STAGES
    nxt = t + STAGES
    if nxt < HK:
        slot = t % STAGES
        mbarrier.expect(kv_bar.index(slot), kv_bytes)
        _tma_load(k_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(slot), k_smem.index(slot))
        _tma_load(v_desc, [k_row + nxt * BLOCK_N, 0], kv_bar.index(slot), v_smem.index(slot))


@gluon.jit
def _trip_s_ahead(j, s_j, acc, m_i, l_i, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw, rh_ptr, zero_s, k_row,
                  qk_scale, HK: gl.constexpr, STAGES: gl.constexpr, BLOCK_N: gl.constexpr, kv_bytes: gl.constexpr,
                  row_o: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr, LAST: gl.constexpr):
    # SCHEDULE "s_ahead": key tiles j and j+1, entering with S_j done and no MMA in flight, leaving with S_{j+2}
    # done and none in flight (an accumulator in flight across the loop's back-edge made ptxas serialize every
    # wgmma: C7514). S_j's softmax runs under S_{j+1} (shared-memory operands only), S_{j+1}'s under P_j V_j.
    s1_tok = _issue_s(j + 1, q_smem, k_smem, kv_bar, zero_s, STAGES)
    p, alpha, m_i, l_i = _softmax_step(s_j, j, m_i, l_i, rw, rh_ptr, qk_scale)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    p_j = gl.convert_layout(p.to(dtype), p_layout)
    o_tok = warpgroup_mma(p_j, v_smem.index(j % STAGES), acc, is_async=True)
    s1 = warpgroup_mma_wait(num_outstanding=1, deps=(s1_tok, ))  # S_{j+1} done, P_j V_j in flight
    p, alpha, m_i, l_i = _softmax_step(s1, j + 1, m_i, l_i, rw, rh_ptr, qk_scale)
    if not LAST:
        s2_tok = _issue_s(j + 2, q_smem, k_smem, kv_bar, zero_s, STAGES)
        acc, p_j = warpgroup_mma_wait(num_outstanding=1, deps=(o_tok, p_j))  # P_j V_j done, S_{j+2} in flight
    else:
        acc, p_j = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_j))
    _refill(j, k_smem, v_smem, kv_bar, k_desc, v_desc, k_row, HK, STAGES, BLOCK_N, kv_bytes)
    acc = acc * gl.convert_layout(alpha, row_o)[:, None]
    p_j1 = gl.convert_layout(p.to(dtype), p_layout)
    o_tok = warpgroup_mma(p_j1, v_smem.index((j + 1) % STAGES), acc, is_async=True)
    if not LAST:
        s2, acc, p_j1 = warpgroup_mma_wait(num_outstanding=0, deps=(s2_tok, o_tok, p_j1))
    else:
        s2 = s_j
        acc, p_j1 = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, p_j1))
    _refill(j + 1, k_smem, v_smem, kv_bar, k_desc, v_desc, k_row, HK, STAGES, BLOCK_N, kv_bytes)
    return s2, acc, m_i, l_i


@gluon.jit
def _fwd_gluon_kernel(
    q_desc, k_desc, v_desc, RH, RW, O, LSE,
    srh_b, srh_n, srw_b, srw_n, so_b, so_n, slse_b,
    N_Q, N_K, qk_scale,
    HK: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr,
    STAGES: gl.constexpr, P_SMEM: gl.constexpr, num_warps: gl.constexpr, SCHEDULE: gl.constexpr = "p_ahead",
):
    # q_desc: [B*N_Q, D] in [BLOCK_M, D] boxes; k_desc, v_desc: [B*N_K, D] in [BLOCK_N, D] boxes (one grid row)
    # rel_h: [B, N_Q, HK] (last stride 1), rel_w: [B, N_Q, BLOCK_N], out: [B, N_Q, D], lse: [B, N_Q] fp32
    LOG2E: gl.constexpr = 1.4426950408889634
    qk_scale = qk_scale.to(gl.float32)
    pid_m = gl.program_id(0)
    b = gl.program_id(1).to(gl.int64)
    dtype: gl.constexpr = q_desc.dtype

    # S and O share one MMA layout (BLOCK_N == D == 64): one warpgroup per 64 query rows
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_o: gl.constexpr = gl.SliceLayout(0, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, D], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    kv_bar = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(kv_bar.index(s), count=1)

    # TMA coordinates are int32 (B * N < 2**31 here); pointer offsets use the int64 b
    q_row = gl.program_id(1) * N_Q + pid_m * BLOCK_M
    k_row = gl.program_id(1) * N_K
    kv_bytes: gl.constexpr = 2 * BLOCK_N * D * 2
    mbarrier.expect(q_bar, BLOCK_M * D * 2)
    _tma_load(q_desc, [q_row, 0], q_bar, q_smem)
    for s in gl.static_range(STAGES):
        if s < HK:
            mbarrier.expect(kv_bar.index(s), kv_bytes)
            _tma_load(k_desc, [k_row + s * BLOCK_N, 0], kv_bar.index(s), k_smem.index(s))
            _tma_load(v_desc, [k_row + s * BLOCK_N, 0], kv_bar.index(s), v_smem.index(s))

    # rel_w tile (log2 domain), the same for every key tile: [BLOCK_M, BLOCK_N]
    offs_m = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
    offs_n = gl.arange(0, BLOCK_N, layout=col_s)
    rw = gl.load(RW + b * srw_b + offs_m[:, None] * srw_n + offs_n[None, :]).to(gl.float32) * LOG2E
    rh_ptr = RH + b * srh_b + offs_m * srh_n

    mbarrier.wait(q_bar, 0)
    if SCHEDULE == "s_ahead":  # HK even, STAGES >= 3 (unsupported_reason)
        zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
        s_j = warpgroup_mma_wait(num_outstanding=0, deps=(_issue_s(0, q_smem, k_smem, kv_bar, zero_s, STAGES), ))
        acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_s)
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_s)
        for j in range(0, HK - 2, 2):
            s_j, acc, m_i, l_i = _trip_s_ahead(j, s_j, acc, m_i, l_i, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc,
                                               rw, rh_ptr, zero_s, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes,
                                               row_o, p_layout, dtype, False)
        s_j, acc, m_i, l_i = _trip_s_ahead(HK - 2, s_j, acc, m_i, l_i, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc,
                                           rw, rh_ptr, zero_s, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes,
                                           row_o, p_layout, dtype, True)
    else:
        m_i, l_i, acc = _p_ahead_loop(q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw, rh_ptr, k_row, qk_scale,
                                      HK, STAGES, BLOCK_M, BLOCK_N, D, kv_bytes, s_layout, o_layout, row_o, p_layout,
                                      dtype, P_SMEM)
    mbarrier.invalidate(q_bar)
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(kv_bar.index(s))

    out = acc / gl.convert_layout(l_i, row_o)[:, None]
    offs_mo = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_o)
    offs_d = gl.arange(0, D, layout=col_o)
    gl.store(O + b * so_b + offs_mo[:, None] * so_n + offs_d[None, :], out.to(dtype))
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(LSE + b * slse_b + offs_m, lse)


@gluon.jit
def _p_ahead_loop(q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc, rw, rh_ptr, k_row, qk_scale,
                  HK: gl.constexpr, STAGES: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                  D: gl.constexpr, kv_bytes: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  row_o: gl.constexpr, p_layout: gl.constexpr, dtype: gl.constexpr, P_SMEM: gl.constexpr):
    # SCHEDULE "p_ahead" (the module docstring's): returns m_i, l_i and the finished acc
    LOG2E: gl.constexpr = 1.4426950408889634
    # tile 0: S_0, its softmax, no P V yet
    mbarrier.wait(kv_bar.index(0), 0)
    rh = gl.load(rh_ptr).to(gl.float32) * LOG2E
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_ij = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, ))
    s_ij = s_ij * qk_scale + rw + rh[:, None]
    m_i = gl.max(s_ij, 1)
    p = gl.exp2(s_ij - m_i[:, None])
    l_i = gl.sum(p, 1)
    p_smem = gl.allocate_shared_memory(dtype, [2 if P_SMEM else 1, BLOCK_M, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype))
    if P_SMEM:
        p_smem.index(0).store(p.to(dtype))
        fence_async_shared()
        p_prev = 0  # unused: P lives in p_smem
    else:
        p_prev = gl.convert_layout(p.to(dtype), p_layout)
    acc = gl.zeros([BLOCK_M, D], gl.float32, layout=o_layout)

    # two tiles per trip, so that the P being read by the in-flight MMA and the P being computed are different
    # loop values (with one loop-carried P, ptxas waits for the P V MMA before writing the new P)
    for j in range(1, HK - 1, 2):
        m_i, l_i, acc, p_next = _step(j, p_prev, p_smem, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc,
                                      rw, rh_ptr, zero_s, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes,
                                      row_o, p_layout, dtype, P_SMEM)
        m_i, l_i, acc, p_prev = _step(j + 1, p_next, p_smem, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc,
                                      rw, rh_ptr, zero_s, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes,
                                      row_o, p_layout, dtype, P_SMEM)
    if HK % 2 == 0:  # tiles 1 .. HK-1 are an odd count: one more step
        m_i, l_i, acc, p_prev = _step(HK - 1, p_prev, p_smem, m_i, l_i, acc, q_smem, k_smem, v_smem, kv_bar, k_desc, v_desc,
                                      rw, rh_ptr, zero_s, k_row, qk_scale, HK, STAGES, BLOCK_N, kv_bytes,
                                      row_o, p_layout, dtype, P_SMEM)

    last = (HK - 1) % STAGES
    if P_SMEM:
        o_tok = warpgroup_mma(p_smem.index((HK - 1) % 2), v_smem.index(last), acc, is_async=True)
    else:
        o_tok = warpgroup_mma(p_prev, v_smem.index(last), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(o_tok, ))
    return m_i, l_i, acc


BLOCK_M = 64
NUM_WARPS = 4
STAGES = 3
P_SMEM = False  # True: the overlap in SASS, but 9% slower on the H200 (session 11; module docstring)
# "p_ahead": the schedule above; "s_ahead": S_{j+1} under S_j's softmax, P_j V_j under S_{j+1}'s (session 15;
# `_trip_s_ahead`), for even key-grid heights and STAGES >= 3
SCHEDULE = "p_ahead"
MAXNREG = None  # a register cap for ptxas: "s_ahead" holds 190 registers (2 CTAs per SM), 168 fits 3


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if forward_gluon takes these inputs (see the module docstring), else why not."""
    if q.dtype not in (torch.float16, torch.bfloat16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "fp16 / bf16 only"
    if q.shape[2] != 64 or v.shape[2] != 64:
        return "head dim 64 only"
    if rel_w.shape[2] != 64:
        return "key grids 64 wide only"
    if q.shape[1] % BLOCK_M:
        return f"N_Q a multiple of {BLOCK_M} only"
    if not (q.is_contiguous() and k.is_contiguous() and v.is_contiguous()):
        return "contiguous q, k, v only"
    if rel_h.stride(2) != 1 or rel_w.stride(2) != 1:
        return "rel_h / rel_w with a contiguous last axis only"
    if SCHEDULE == "s_ahead" and (rel_h.shape[2] % 2 or STAGES < 3):
        return "the s_ahead schedule takes even key-grid heights and STAGES >= 3 only"
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] != 9:
        return "Hopper (sm_90) only"
    return None


def descriptors(q, k, v, block_m: int | None = None):
    """Host TMA descriptors: q as [B*N_Q, D] in [block_m, D] boxes (default BLOCK_M), k and v as [B*N_K, D] in
    [64, D] boxes."""
    block_m = BLOCK_M if block_m is None else block_m
    d = q.shape[2]
    gdt = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    q2, k2, v2 = q.reshape(-1, d), k.reshape(-1, d), v.reshape(-1, d)
    q_l = gl.NVMMASharedLayout.get_default_for([block_m, d], gdt)
    kv_l = gl.NVMMASharedLayout.get_default_for([64, d], gdt)
    return (TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [block_m, d], q_l),
            TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [64, d], kv_l),
            TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [64, d], kv_l))


def forward_gluon(q, k, v, rel_h, rel_w, scale: float):
    """forward()'s contract (out [B, N_Q, D] in q.dtype, lse [B, N_Q] fp32) for the inputs unsupported_reason
    accepts."""
    b, n_q, d = q.shape
    hk = rel_h.shape[2]
    out = K._empty(q.shape, q.dtype, q.device)  # NaN-poisoned under the tests' hook
    lse = K._empty((b, n_q), torch.float32, q.device)
    q_desc, k_desc, v_desc = descriptors(q, k, v)
    _fwd_gluon_kernel[(n_q // BLOCK_M, b)](
        q_desc, k_desc, v_desc, rel_h, rel_w, out, lse,
        rel_h.stride(0), rel_h.stride(1), rel_w.stride(0), rel_w.stride(1), out.stride(0), out.stride(1),
        lse.stride(0), n_q, k.shape[1], scale * _LOG2E,
        HK=hk, BLOCK_M=BLOCK_M, BLOCK_N=64, D=d, STAGES=STAGES, P_SMEM=P_SMEM, num_warps=NUM_WARPS, SCHEDULE=SCHEDULE,
        **({"maxnreg": MAXNREG} if MAXNREG else {}),
    )
    return out, lse
