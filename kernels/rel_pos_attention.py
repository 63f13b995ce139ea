"""Fused Triton kernels for SAM's decomposed relative-position attention, forward and backward.

This room holds the GPU implementation of the one op samhq-fx fuses. Per batch*head b and query i,
with key j at row j // Wk, column j % Wk of an Hk x Wk key grid:

    s[i, j] = scale * <q[i], k[j]> + rel_h[i, j // Wk] + rel_w[i, j % Wk]
    lse[i]  = log sum_j exp(s[i, j])                  (natural log, fp32)
    out[i]  = sum_j exp(s[i, j] - lse[i]) * v[j]

It is flash attention with the bias built on the fly: no N x N matrix ever reaches memory.

The one idea that makes the bias cheap: every key tile is a whole number R of key-grid rows, with the
row width padded to a power of two WK_PAD (BLOCK_N = R * WK_PAD; padded columns are masked keys). Then
  * the rel_w part of the bias, rel_w[i, n % WK_PAD], is the same for every key tile: it is loaded
    once per query block, before the key loop;
  * the rel_h part is rel_h[i, kh0] for the whole tile when R == 1 (grids at least 64 wide: one
    [BLOCK_M] vector load per tile), or a small gather from L1 when R > 1 (narrow grids);
  * in the backward, d_rel_w[i, :] is the plain elementwise sum of the dS tiles (R == 1) and
    d_rel_h[i, kh0] is one row-sum of the tile, both owned by the program that owns query row i.
The price is the padding: a 48-wide grid runs 64-wide tiles (25% of the keys masked).

Kernels (jitted first, host functions after):
  _fwd_kernel        grid (query blocks, B)   online softmax over key tiles -> out, lse
  _bwd_delta_kernel  grid (query blocks, B)   delta[i] = <dout[i], out[i]>
  _bwd_dkdv_kernel   grid (key tiles, B)      owns a key tile, loops over query blocks -> dk, dv
  _bwd_dq_kernel     grid (query blocks, B)   owns a query block, loops over key tiles -> dq, d_rel_h, d_rel_w
The backward uses no atomics: every output element has exactly one writer and a fixed reduction
order, so the same inputs give the same bits (block sizes are fixed per shape, not autotuned, so
that holds across processes too). The price is recomputing P in both backward kernels
(7 N*N*D matmuls for the backward pair instead of FA2's 5 with atomic dq).

Precision: fp16/bf16 operands feed the tensor cores directly; fp32 operands follow
torch.get_float32_matmul_precision() as PyTorch's matmuls do ("highest" -> 3-pass TF32 dots, fp32-accurate,
"high" and "medium" -> TF32). Accumulators and softmax statistics are fp32. "medium" is TF32, not
bf16-cast operands, because that is what PyTorch's own fp32 matmuls do on CUDA in "medium" (cuBLAS has no
bf16 path for fp32 GEMMs), and because bf16 operands fail SOL-ExecBench 076's rtol 1e-3 rule (measured on
the H200: qkv_bias gradient only 89-92% of elements within tolerance; benchmarks/NOTES.md, session 3).

Operand layout (fp32): TF32 tensor-core products read both operands K-major, so the host passes V, K, Q,
dout (and the dK/dV bias) a second time, transposed and zero-padded to whole tiles (`_keys_kmajor`,
`_queries_kmajor`): every tile then arrives as 16-byte vectors. Without them Triton filled shared memory
4 bytes at a time and the fp32 kernels were load-bound (benchmarks/NOTES.md, session 4).

All launches go through torch.library.wrap_triton and host functions only allocate, copy (torch ops) and launch, so
they can run inside a torch.library.triton_op traced by Inductor with fake tensors.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

# Under the interpreter (CPU CI) blocks are small so a tiny test shape still crosses several query
# blocks and several key tiles, and partial blocks at both ends get exercised.
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Test hook: when True, every output buffer is filled with NaN right after allocation, so an element
# a kernel fails to write shows up as NaN in the tests. Never set in production.
_POISON_OUTPUTS = False

# Block-size knobs, per kernel. BLOCK_N is a target: the key tile is R whole grid rows (see module
# docstring), R = max(1, BLOCK_N // WK_PAD). Chosen from a sweep on the H200 (benchmarks/NOTES.md), for
# head dims padded to <= 64; tests and benchmarks may override entries.
CONFIG = {  # fp16 / bf16 inputs
    "fwd": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=4),
    "dkdv": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "delta": dict(BLOCK_M=128, num_warps=4, num_stages=1),
}
# fp32 inputs ("high" / "medium" / "highest"), with the K-major operand copies (KMAJOR_FP32). Key tiles of
# one grid row where the grid is >= 32 wide (BLOCK_N 32): on 32x32 grids two rows per tile cost 3.4x in
# the forward (365 vs 106 us at 32x32x4) and 1.4x in dQ, because of the rel_h gather; narrower grids
# take rel_h by selects (RH_SELECT). Session 4 sweeps on the H200, benchmarks/NOTES.md.
CONFIG_FP32 = {
    "fwd": dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=3, RH_SELECT=True),
    "dkdv": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=3),
    "dq": dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
}
# 1-pass TF32 ("high", "medium") leaves the shared memory for one more stage in both backward kernels
# (3-pass "highest" does not: 256 KB for its dQ at 3 stages on 64-wide grids, 227 KB available)
CONFIG_TF32 = {"dkdv": dict(BLOCK_M=32, num_warps=4, num_stages=4), "dq": dict(num_stages=3)}
# key grids at most 8 wide (7x7 windows): dQ with 64-query blocks measured 15% faster (145 vs 170 us)
CONFIG_FP32_NARROW = {"dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)}
# head dim padded above 64 (ViT-H's 80 -> 128): the configs validated on the H200 for that size
# (fp32 ones shrink so twice-as-wide fp32 tiles fit the 227 KB of shared memory: the fp32 D=80
# forward at 128 x 64 x 3 stages would want 320 KB)
CONFIG_WIDE = {
    "fwd": dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
    "dkdv": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
    "dq": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3),
}
CONFIG_WIDE_FP32 = {
    "fwd": dict(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=2),
    "dkdv": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
    "dq": dict(BLOCK_M=32, BLOCK_N=64, num_warps=4, num_stages=2),
}
CONFIG_INTERPRET = {
    "fwd": dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    "dkdv": dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    "dq": dict(BLOCK_M=16, BLOCK_N=16, num_warps=4, num_stages=1),
    "delta": dict(BLOCK_M=16, num_warps=4, num_stages=1),
}
if _INTERPRET:
    CONFIG = CONFIG_FP32 = CONFIG_INTERPRET
    CONFIG_TF32 = CONFIG_FP32_NARROW = CONFIG_WIDE = CONFIG_WIDE_FP32 = {}

_MAX_HEAD_DIM = 128  # D_PAD and DV_PAD beyond this would blow the register budget
_MAX_WK = 128  # one key-grid row must fit in one key tile


# ----------------------------------------------------------------------------------------------
# Jitted kernels
# ----------------------------------------------------------------------------------------------


# Triton's CPU interpreter (3.9) computes bf16 x bf16 dots wrongly (garbage, ~1e10), so under the
# interpreter bf16 operands are widened to fp32 first. That is exact: bf16 products fit in fp32, the
# same as a bf16 MMA with fp32 accumulation.
_INTERPRET_WIDEN_BF16 = tl.constexpr(_INTERPRET)


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
def _rel_h_column(RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh, HK: tl.constexpr):
    # rel_h[:, kh] for the block's queries: [BLOCK_M] fp32, log2 domain, 0 past the last grid row
    return tl.load(RH + b * srh_b + offs_m * srh_n + kh * srh_k,
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
    # [len(offs_s), D_PAD] tile of x from its K-major copy xT: [B, D, S] (S contiguous, zero-padded so
    # every offs_s is in bounds: no mask along S, so the loads stay 16-byte vectors)
    return tl.load(XT + b * sxt_b + offs_s[:, None] + offs_d[None, :] * sxt_d,
                   mask=(offs_d < D)[None, :], other=0.0)


@triton.jit
def _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh0, kh,
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
        rh_next = _rel_h_column(RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh0 + 1, HK)
    elif RH_SELECT:
        bias = rw
        for r in tl.static_range(R):
            rh_r = _rel_h_column(RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh0 + r, HK)
            bias = tl.where((kh == kh0 + r)[None, :], rw + rh_r[:, None], bias)
        s = qk * qk_scale + bias
    else:
        rh = tl.load(RH + b * srh_b + offs_m[:, None] * srh_n + kh[None, :] * srh_k,
                     mask=m_ok[:, None] & (kh < HK)[None, :], other=0.0)
        s = qk * qk_scale + rw + rh.to(tl.float32) * 1.4426950408889634
    return s, rh_next


@triton.jit
def _fwd_kernel(
    Q, K, V, VT, RH, RW, O, LSE,
    sq_b, sq_n, sq_d,
    sk_b, sk_n, sk_d,
    sv_b, sv_n, sv_d,
    svt_b, svt_d,  # vT: [B, DV, padded keys], keys contiguous (KMAJOR only)
    srh_b, srh_n, srh_k,
    srw_b, srw_n, srw_k,
    so_b, so_n, so_d,
    slse_b,
    N_Q, qk_scale,  # qk_scale = scale * log2(e): scores live in the log2 domain
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr, RH_SELECT: tl.constexpr = False,
):
    # q: [B, N_Q, D]  k: [B, HK*WK, D]  v: [B, HK*WK, DV]  rel_h: [B, N_Q, HK]  rel_w: [B, N_Q, WK]
    # out: [B, N_Q, DV]  lse: [B, N_Q] fp32
    # KMAJOR (fp32 operands): P @ V reads V from vT, whose keys are contiguous (see _keys_kmajor)
    BLOCK_N: tl.constexpr = R * WK_PAD
    LOG2E: tl.constexpr = 1.4426950408889634
    # Python floats arrive as fp64 when Inductor compiles the kernel (triton_op path):
    # pin them to fp32 so the scores, P and the accumulators stay fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    row = offs_n // WK_PAD  # grid row of key n inside the tile (0..R-1)
    col = _col(offs_n, WK_PAD, R)  # grid column of key n (same for every tile)
    m_ok = offs_m < N_Q
    col_ok = _col_ok(col, WK, WK_PAD)

    # q: [BLOCK_M, D_PAD], stays in registers for the whole key loop
    q = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    # rel_w bias: [BLOCK_M, BLOCK_N]; key tiles are whole grid rows, so it is the same for every tile
    rw = tl.load(RW + b * srw_b + offs_m[:, None] * srw_n + col[None, :] * srw_k,
                 mask=m_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32) * LOG2E

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
    rh_next = tl.zeros([BLOCK_M], tl.float32)  # R == 1: rel_h prefetched one tile ahead (_biased_scores)
    if R == 1:
        rh_next = _rel_h_column(RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, 0, HK)

    for kh0 in range(0, HK, R):
        kh = kh0 + row
        n_ok = col_ok & (kh < HK)
        j = kh * WK + col  # key index in the flattened grid
        # kT: [D_PAD, BLOCK_N]
        kT = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d[:, None] * sk_d,
                     mask=n_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        qk = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
        s, rh_next = _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh0, kh,
                                    HK, R, RH_SELECT)
        s = tl.where(n_ok[None, :], s, float("-inf"))

        # online softmax; every tile holds at least one real key, so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # v: [BLOCK_N, DV_PAD]
        if KMAJOR:
            v = _load_kmajor(VT, b, svt_b, svt_d, kh0 * WK_PAD + offs_n, offs_dv, DV)
        else:
            v = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv[None, :] * sv_d,
                        mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        acc = _dot(p.to(v.dtype), v, acc, PREC)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :] * so_d,
             out.to(O.dtype.element_ty), mask=m_ok[:, None] & (offs_dv[None, :] < DV))
    # back to natural log
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + b * slse_b + offs_m, lse, mask=m_ok)


@triton.jit
def _bwd_delta_kernel(
    O, DO, DELTA,
    so_b, so_n, so_d,
    sdo_b, sdo_n, sdo_d,
    sdl_b,
    N_Q,
    DV: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # out, dout: [B, N_Q, DV] -> delta: [B, N_Q] fp32, delta[i] = sum_d dout[i, d] * out[i, d]
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, DV_PAD)
    mask = (offs_m[:, None] < N_Q) & (offs_dv[None, :] < DV)
    o = tl.load(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :] * so_d, mask=mask, other=0.0)
    do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d, mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + b * sdl_b + offs_m, delta, mask=offs_m < N_Q)


@triton.jit
def _bwd_dkdv_kernel(
    Q, K, V, RH, RW, DO, LSE, DELTA, DK, DV_, QT, DOT,
    sq_b, sq_n, sq_d,
    sk_b, sk_n, sk_d,
    sv_b, sv_n, sv_d,
    srh_b, srh_n, srh_k,
    srw_b, srw_n, srw_k,
    sdo_b, sdo_n, sdo_d,
    slse_b, slse_n, sdl_b,  # lse: [B, N_Q] (any strides), delta: [B, N_Q] contiguous
    sdk_b, sdk_n, sdk_d,
    sdv_b, sdv_n, sdv_d,
    sqt_b, sqt_d, sdot_b, sdot_d,  # qT: [B, D, padded N_Q], doT: [B, DV, padded N_Q] (KMAJOR only)
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr, BIAS_T: tl.constexpr,
):
    # Owns key tile (grid rows kh0 .. kh0+R-1), loops over all query blocks. Works on the transposed
    # scores sT = s^T: [BLOCK_N, BLOCK_M], so dk and dv come out of plain dots with no transposes.
    BLOCK_N: tl.constexpr = R * WK_PAD
    LOG2E: tl.constexpr = 1.4426950408889634
    # Python floats arrive as fp64 when Inductor compiles the kernel (triton_op path):
    # pin them to fp32 so the scores, P and the accumulators stay fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_t = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    kh0 = pid_t * R

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
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

    for m0 in range(0, N_Q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        # qT: [D_PAD, BLOCK_M], do: [BLOCK_M, DV_PAD]
        qT = tl.load(Q + b * sq_b + offs_m[None, :] * sq_n + offs_d[:, None] * sq_d,
                     mask=m_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d,
                     mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        lse = tl.load(LSE + b * slse_b + offs_m * slse_n, mask=m_ok, other=0.0) * LOG2E
        delta = tl.load(DELTA + b * sdl_b + offs_m, mask=m_ok, other=0.0)
        # bias^T: [BLOCK_N, BLOCK_M]. BIAS_T: rel_h / rel_w are copies with queries contiguous and padded
        # to whole query blocks, so no query mask (padded queries are dropped from pT below)
        if BIAS_T:
            mb_ok = tl.full([BLOCK_M], 1, tl.int1)
        else:
            mb_ok = m_ok
        biasT = tl.load(RW + b * srw_b + offs_m[None, :] * srw_n + col[:, None] * srw_k,
                        mask=mb_ok[None, :] & col_ok[:, None], other=0.0).to(tl.float32)
        if R == 1:
            rh = tl.load(RH + b * srh_b + offs_m * srh_n + kh0 * srh_k, mask=mb_ok, other=0.0)
            biasT += rh.to(tl.float32)[None, :]
        else:
            rh = tl.load(RH + b * srh_b + offs_m[None, :] * srh_n + kh[:, None] * srh_k,
                         mask=mb_ok[None, :] & (kh < HK)[:, None], other=0.0)
            biasT += rh.to(tl.float32)

        qkT = _dot(k, qT, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), PREC)
        pT = tl.math.exp2(qkT * qk_scale + biasT * LOG2E - lse[None, :])
        pT = tl.where(n_ok[:, None] & m_ok[None, :], pT, 0.0)
        if KMAJOR:  # fp32: the B operands of dV and dK from copies with queries contiguous
            dv = _dot(pT, _load_kmajor(DOT, b, sdot_b, sdot_d, offs_m, offs_dv, DV), dv, PREC)
        else:
            dv = _dot(pT.to(do.dtype), do, dv, PREC)
        # dpT = v @ do^T: [BLOCK_N, BLOCK_M]
        dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), PREC)
        dsT = pT * (dpT - delta[None, :])
        if KMAJOR:
            dk = _dot(dsT, _load_kmajor(QT, b, sqt_b, sqt_d, offs_m, offs_d, D), dk, PREC)
        else:
            dk = _dot(dsT.to(qT.dtype), tl.trans(qT), dk, PREC)

    dk = dk * scale
    tl.store(DK + b * sdk_b + j[:, None] * sdk_n + offs_d[None, :] * sdk_d, dk.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & (offs_d[None, :] < D))
    tl.store(DV_ + b * sdv_b + j[:, None] * sdv_n + offs_dv[None, :] * sdv_d, dv.to(DV_.dtype.element_ty),
             mask=n_ok[:, None] & (offs_dv[None, :] < DV))


@triton.jit
def _bwd_dq_kernel(
    Q, K, V, RH, RW, DO, LSE, DELTA, DQ, DRH, DRW, KT,
    sq_b, sq_n, sq_d,
    sk_b, sk_n, sk_d,
    sv_b, sv_n, sv_d,
    srh_b, srh_n, srh_k,
    srw_b, srw_n, srw_k,
    sdo_b, sdo_n, sdo_d,
    slse_b, slse_n, sdl_b,
    sdq_b, sdq_n, sdq_d,
    sdrh_b, sdrh_n, sdrh_k,
    sdrw_b, sdrw_n, sdrw_k,
    skt_b, skt_d,  # kT: [B, D, padded keys] (KMAJOR only)
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr, RH_SELECT: tl.constexpr = False,
):
    # Owns a query block, loops over key tiles. d_rel_h / d_rel_w are per query row, so this program
    # reduces them itself: no atomics, fixed order.
    BLOCK_N: tl.constexpr = R * WK_PAD
    LOG2E: tl.constexpr = 1.4426950408889634
    # Python floats arrive as fp64 when Inductor compiles the kernel (triton_op path):
    # pin them to fp32 so the scores, P and the accumulators stay fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    offs_w = tl.arange(0, WK_PAD)
    row = offs_n // WK_PAD
    col = _col(offs_n, WK_PAD, R)
    m_ok = offs_m < N_Q
    col_ok = _col_ok(col, WK, WK_PAD)

    # q: [BLOCK_M, D_PAD], do: [BLOCK_M, DV_PAD]
    q = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d,
                 mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    lse = tl.load(LSE + b * slse_b + offs_m * slse_n, mask=m_ok, other=0.0) * LOG2E
    delta = tl.load(DELTA + b * sdl_b + offs_m, mask=m_ok, other=0.0)
    # rel_w bias [BLOCK_M, BLOCK_N], same for every tile (log2 domain, lse folded in)
    rw = tl.load(RW + b * srw_b + offs_m[:, None] * srw_n + col[None, :] * srw_k,
                 mask=m_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32) * LOG2E - lse[:, None]

    dq = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    if R == 1:
        drw = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    else:
        drw = tl.zeros([BLOCK_M, WK_PAD], tl.float32)
    rh_next = tl.zeros([BLOCK_M], tl.float32)  # R == 1: rel_h prefetched one tile ahead (_biased_scores)
    if R == 1:
        rh_next = _rel_h_column(RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, 0, HK)

    for kh0 in range(0, HK, R):
        kh = kh0 + row
        n_ok = col_ok & (kh < HK)
        j = kh * WK + col
        # kT: [D_PAD, BLOCK_N], vT: [DV_PAD, BLOCK_N]
        kT = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d[:, None] * sk_d,
                     mask=n_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        vT = tl.load(V + b * sv_b + j[None, :] * sv_n + offs_dv[:, None] * sv_d,
                     mask=n_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
        qk = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
        s, rh_next = _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, srh_n, srh_k, offs_m, m_ok, kh0, kh,
                                    HK, R, RH_SELECT)
        p = tl.math.exp2(s)
        p = tl.where(n_ok[None, :], p, 0.0)
        dp = _dot(do, vT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
        ds = p * (dp - delta[:, None])  # [BLOCK_M, BLOCK_N] fp32; 0 on masked keys
        if KMAJOR:  # fp32: the B operand of dQ from the copy with keys contiguous
            dq = _dot(ds, _load_kmajor(KT, b, skt_b, skt_d, kh0 * WK_PAD + offs_n, offs_d, D), dq, PREC)
        else:
            dq = _dot(ds.to(kT.dtype), tl.trans(kT), dq, PREC)
        if R == 1:
            # d_rel_h[:, kh0] is the row-sum of this tile; d_rel_w accumulates elementwise
            tl.store(DRH + b * sdrh_b + offs_m * sdrh_n + kh0 * sdrh_k,
                     tl.sum(ds, 1).to(DRH.dtype.element_ty), mask=m_ok)
            drw += ds
        else:
            ds3 = tl.reshape(ds, [BLOCK_M, R, WK_PAD])
            offs_r = kh0 + tl.arange(0, R)
            tl.store(DRH + b * sdrh_b + offs_m[:, None] * sdrh_n + offs_r[None, :] * sdrh_k,
                     tl.sum(ds3, 2).to(DRH.dtype.element_ty), mask=m_ok[:, None] & (offs_r[None, :] < HK))
            drw += tl.sum(ds3, 1)

    dq = dq * scale
    tl.store(DQ + b * sdq_b + offs_m[:, None] * sdq_n + offs_d[None, :] * sdq_d, dq.to(DQ.dtype.element_ty),
             mask=m_ok[:, None] & (offs_d[None, :] < D))
    if R == 1:
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + col[None, :] * sdrw_k,
                 drw.to(DRW.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])
    else:
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + offs_w[None, :] * sdrw_k,
                 drw.to(DRW.dtype.element_ty), mask=m_ok[:, None] & (offs_w[None, :] < WK))


# ----------------------------------------------------------------------------------------------
# Host functions: allocate and launch only (traced with fake tensors inside a triton_op)
# ----------------------------------------------------------------------------------------------

# "highest" runs 3-pass TF32 (a = hi + lo split; error ~ fp32 rounding): Triton's "ieee" dot runs on
# FMA units at < 1 TFLOP/s on the H200 (213 ms for the SAM-B global layer, benchmarks/NOTES.md).
_FP32_PREC = {"highest": "tf32x3", "high": "tf32", "medium": "tf32"}


def _dot_precision(dtype: torch.dtype) -> str:
    # fp32 follows torch's matmul precision setting, read at call (= trace) time
    if dtype == torch.float32:
        return _FP32_PREC[torch.get_float32_matmul_precision()]
    return "none"


def _tile(hk: int, wk: int, target_n: int) -> tuple[int, int]:
    """(WK_PAD, R): key tile = R grid rows of WK_PAD (padded) columns, BLOCK_N = R * WK_PAD >= 16."""
    wk_pad = triton.next_power_of_2(wk)
    r = max(1, target_n // wk_pad)
    r = min(r, triton.next_power_of_2(hk))  # no tiles taller than the grid
    while r * wk_pad < 16:  # tl.dot needs every dim >= 16
        r *= 2
    return wk_pad, r


def _config(kernel: str, dtype: torch.dtype, prec: str, d_pad: int, dv_pad: int, wk: int) -> dict:
    """Block config for one kernel (see the CONFIG tables)."""
    fp32 = dtype == torch.float32
    if kernel == "delta":
        return dict(CONFIG["delta"])
    if max(d_pad, dv_pad) > 64 and not _INTERPRET:
        return dict((CONFIG_WIDE_FP32 if fp32 else CONFIG_WIDE)[kernel])
    cfg = dict((CONFIG_FP32 if fp32 else CONFIG)[kernel])
    if fp32 and wk <= 8:
        cfg.update(CONFIG_FP32_NARROW.get(kernel, {}))
    if prec == "tf32":
        cfg.update(CONFIG_TF32.get(kernel, {}))
    return cfg


def _pad(d: int) -> int:
    return max(16, triton.next_power_of_2(d))


# fp32 operands: TF32 wgmma reads both operands K-major from shared memory (only 16-bit types may be
# transposed), so a B operand whose contiguous axis is not the reduction axis (V in P @ V, dO and Q in
# the dV / dK products, K in dS @ K) was copied into shared memory 4 bytes at a time, with 8-way bank
# conflicts (ncu on the H200: L1 87% busy, the SMs 9% busy; benchmarks/NOTES.md, session 4). The host
# hands those operands over a second time, transposed, so the kernels read them as 16-byte vectors.
# Costs one extra read and write of q, k, v and dout per call. A knob so benchmarks can compare.
KMAJOR_FP32 = True
# The dK/dV kernel reads rel_h / rel_w as [keys, queries] tiles, against their memory order, in every dtype
# (bf16 PTX: 2- and 4-byte loads). With K-major fp32 it gets copies with queries contiguous; 16-bit inputs
# get them from key grids wider than 16: bf16 backward on the H200 1.27x at 64x64x4, 1.56x at 56x56x1,
# 1.10x at 32x32x8, but 5-7% slower at 14x14 and 16x16x1, where the copy is mostly launch cost
# (bench_attention_core.py --sweep-bias16; benchmarks/NOTES.md, session 5).
BIAS_COPIES_16BIT = True
BIAS_COPIES_16BIT_MIN_WK = 17


def _kmajor(dtype: torch.dtype, wk: int, d_pad: int) -> bool:
    # not for key grids <= 8 wide: at 7x7 the copies cost more than they save (fwd + bwd 1.5x slower,
    # 7x7x64 on the H200), those tiles being mostly padding and the call mostly launch time. Not for
    # head dims padded above 64 either: the extra tiles do not fit shared memory beside the wide configs
    # (and those were measured without them).
    return KMAJOR_FP32 and dtype == torch.float32 and wk > 8 and (d_pad <= 64 or _INTERPRET)


def _keys_kmajor(x, hk: int, wk: int, wk_pad: int, r: int):
    """x: [B, HK*WK, D] -> [B, D, HK_PAD*WK_PAD], keys contiguous and laid out as the key tiles see them
    (grid rows padded to WK_PAD, grid padded to whole tiles of R rows), zeros in the padding."""
    b, _, d = x.shape
    hk_pad = triton.cdiv(hk, r) * r
    if hk_pad == hk and wk_pad == wk:
        return x.transpose(1, 2).contiguous()
    xt = x.new_zeros((b, d, hk_pad, wk_pad))
    xt[:, :, :hk, :wk] = x.unflatten(1, (hk, wk)).permute(0, 3, 1, 2)
    return xt.view(b, d, hk_pad * wk_pad)


def _queries_kmajor(x, block_m: int):
    """x: [B, N, D] -> [B, D, N_PAD], queries contiguous, N padded with zeros to whole query blocks."""
    b, n, d = x.shape
    n_pad = triton.cdiv(n, block_m) * block_m
    if n_pad == n:
        return x.transpose(1, 2).contiguous()
    xt = x.new_zeros((b, d, n_pad))
    xt[:, :, :n] = x.transpose(1, 2)
    return xt


def _empty(shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    if _POISON_OUTPUTS:
        t.fill_(float("nan"))
    return t


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if the kernels handle these inputs; else a short reason (the caller then uses the reference)."""
    ts = (q, k, v, rel_h, rel_w)
    if any(t.dim() != 3 for t in ts):
        return "expected q, k, v, rel_h, rel_w of rank 3"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype} not supported by the Triton kernels"
    if any(t.dtype != q.dtype for t in (k, v)):
        return "q, k, v must share a dtype"
    if any(t.dtype not in (torch.float16, torch.bfloat16, torch.float32) for t in (rel_h, rel_w)):
        return f"rel_h/rel_w dtype {rel_h.dtype}/{rel_w.dtype} not supported"
    if any(t.device != q.device for t in ts):
        return "inputs on different devices"
    if q.device.type != "cuda" and not _INTERPRET:
        return f"device {q.device.type} (Triton kernels need CUDA)"
    b, n_q, d = q.shape
    n_k = k.shape[1]
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    if k.shape[0] != b or v.shape[0] != b or rel_h.shape[0] != b or rel_w.shape[0] != b:
        return "batch sizes differ"
    if k.shape[2] != d:
        return "q and k head dims differ"
    if v.shape[1] != n_k:
        return "k and v lengths differ"
    if rel_h.shape[1] != n_q or rel_w.shape[1] != n_q:
        return "rel_h/rel_w rows must equal the number of queries"
    if hk * wk != n_k:
        return f"key grid {hk}x{wk} does not match {n_k} keys"
    if n_q == 0 or n_k == 0 or d == 0 or v.shape[2] == 0:
        return "empty input"
    if max(d, v.shape[2]) > _MAX_HEAD_DIM:
        return f"head dim above {_MAX_HEAD_DIM}"
    if wk > _MAX_WK:
        return f"key grid width {wk} above {_MAX_WK}"
    return None


def forward(q, k, v, rel_h, rel_w, scale: float):
    """q: [B, Nq, D], k: [B, Nk, D], v: [B, Nk, Dv], rel_h: [B, Nq, Hk], rel_w: [B, Nq, Wk].

    Returns out [B, Nq, Dv] in q.dtype and lse [B, Nq] fp32 (natural log). Inputs may be strided.
    """
    b, n_q, d = q.shape
    dv = v.shape[2]
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    cfg = _config("fwd", q.dtype, _dot_precision(q.dtype), _pad(d), _pad(dv), wk)
    wk_pad, r = _tile(hk, wk, cfg["BLOCK_N"])
    kmajor = _kmajor(q.dtype, wk, max(_pad(d), _pad(dv)))
    vt = _keys_kmajor(v, hk, wk, wk_pad, r) if kmajor else v  # unused unless KMAJOR
    out = _empty((b, n_q, dv), q.dtype, q.device)
    lse = _empty((b, n_q), torch.float32, q.device)
    grid = (triton.cdiv(n_q, cfg["BLOCK_M"]), b)
    torch.library.wrap_triton(_fwd_kernel)[grid](
        q, k, v, vt, rel_h, rel_w, out, lse,
        *q.stride(), *k.stride(), *v.stride(), vt.stride(0), vt.stride(1),
        *rel_h.stride(), *rel_w.stride(), *out.stride(),
        lse.stride(0),
        n_q, scale * 1.4426950408889634,
        HK=hk, WK=wk, D=d, DV=dv, WK_PAD=wk_pad, R=r, D_PAD=_pad(d), DV_PAD=_pad(dv),
        BLOCK_M=cfg["BLOCK_M"], PREC=_dot_precision(q.dtype), KMAJOR=kmajor,
        RH_SELECT=cfg.get("RH_SELECT", False),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out, lse


def backward(dout, q, k, v, rel_h, rel_w, out, lse, scale: float):
    """Gradients for forward()'s saved (out, lse). Returns (dq, dk, dv, d_rel_h, d_rel_w) in input dtypes."""
    b, n_q, d = q.shape
    dv_ = v.shape[2]
    hk, wk = rel_h.shape[2], rel_w.shape[2]
    prec = _dot_precision(q.dtype)
    d_pad, dv_pad = _pad(d), _pad(dv_)

    # delta: [B, Nq] fp32
    cfg = _config("delta", q.dtype, prec, d_pad, dv_pad, wk)
    delta = _empty((b, n_q), torch.float32, q.device)
    torch.library.wrap_triton(_bwd_delta_kernel)[(triton.cdiv(n_q, cfg["BLOCK_M"]), b)](
        out, dout, delta, *out.stride(), *dout.stride(), delta.stride(0), n_q,
        DV=dv_, DV_PAD=dv_pad, BLOCK_M=cfg["BLOCK_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )

    dq = _empty(q.shape, q.dtype, q.device)
    dk = _empty(k.shape, k.dtype, k.device)
    dv = _empty(v.shape, v.dtype, v.device)
    drh = _empty(rel_h.shape, rel_h.dtype, rel_h.device)
    drw = _empty(rel_w.shape, rel_w.dtype, rel_w.device)

    def common(rh, rw):  # the input strides both kernels take, with the rel_h / rel_w they are given
        return (*q.stride(), *k.stride(), *v.stride(), *rh.stride(), *rw.stride(), *dout.stride(), *lse.stride(),
                delta.stride(0))

    kmajor = _kmajor(q.dtype, wk, max(d_pad, dv_pad))
    cfg = _config("dkdv", q.dtype, prec, d_pad, dv_pad, wk)
    wk_pad, r = _tile(hk, wk, cfg["BLOCK_N"])
    qt = _queries_kmajor(q, cfg["BLOCK_M"]) if kmajor else q  # unused unless KMAJOR
    dot = _queries_kmajor(dout, cfg["BLOCK_M"]) if kmajor else dout
    # dK/dV reads the bias transposed ([keys, queries] tiles): give it copies with queries contiguous,
    # passed as [B, N_Q padded, Hk] / [B, N_Q padded, Wk] views so the kernel's stride arithmetic is unchanged
    bias_t = kmajor or (BIAS_COPIES_16BIT and q.dtype != torch.float32 and wk >= BIAS_COPIES_16BIT_MIN_WK)
    rh_t = _queries_kmajor(rel_h, cfg["BLOCK_M"]).transpose(1, 2) if bias_t else rel_h
    rw_t = _queries_kmajor(rel_w, cfg["BLOCK_M"]).transpose(1, 2) if bias_t else rel_w
    torch.library.wrap_triton(_bwd_dkdv_kernel)[(triton.cdiv(hk, r), b)](
        q, k, v, rh_t, rw_t, dout, lse, delta, dk, dv, qt, dot,
        *common(rh_t, rw_t), *dk.stride(), *dv.stride(), qt.stride(0), qt.stride(1), dot.stride(0), dot.stride(1),
        n_q, scale * 1.4426950408889634, scale,
        HK=hk, WK=wk, D=d, DV=dv_, WK_PAD=wk_pad, R=r, D_PAD=d_pad, DV_PAD=dv_pad,
        BLOCK_M=cfg["BLOCK_M"], PREC=prec, KMAJOR=kmajor, BIAS_T=bias_t,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )

    # done with dK/dV's copies: release them before dQ's, so the two sets never add up in the peak
    # (same stream, so the caching allocator reuses the memory only after dK/dV has read it)
    del qt, dot, rh_t, rw_t
    cfg = _config("dq", q.dtype, prec, d_pad, dv_pad, wk)
    wk_pad, r = _tile(hk, wk, cfg["BLOCK_N"])
    kt = _keys_kmajor(k, hk, wk, wk_pad, r) if kmajor else k  # unused unless KMAJOR
    torch.library.wrap_triton(_bwd_dq_kernel)[(triton.cdiv(n_q, cfg["BLOCK_M"]), b)](
        q, k, v, rel_h, rel_w, dout, lse, delta, dq, drh, drw, kt,
        *common(rel_h, rel_w), *dq.stride(), *drh.stride(), *drw.stride(), kt.stride(0), kt.stride(1),
        n_q, scale * 1.4426950408889634, scale,
        HK=hk, WK=wk, D=d, DV=dv_, WK_PAD=wk_pad, R=r, D_PAD=d_pad, DV_PAD=dv_pad,
        BLOCK_M=cfg["BLOCK_M"], PREC=prec, KMAJOR=kmajor, RH_SELECT=cfg.get("RH_SELECT", False),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return dq, dk, dv, drh, drw
