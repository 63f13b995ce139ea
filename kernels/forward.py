"""Forward kernel: online softmax over key tiles with the rel-pos bias built on the fly -> out, lse."""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _biased_scores, _col, _col_ok, _dot, _load_kmajor, _rel_h_column, _rows


@triton.jit
def _fwd_kernel(
    Q, K, V, VT, RH, RW, O, LSE,
    sq_b, sq_n, sq_d,
    sk_b, sk_n, sk_d,
    sv_b, sv_n, sv_d,
    svt_b, svt_d,  # vT: [B, DV, padded keys], keys contiguous (KMAJOR only)
    srh_b, srh_h, srh_n, srh_k,  # rel_h / rel_w: batch, query grid row (RH_QW / RW_QW > 0 only), query, key
    srw_b, srw_h, srw_n, srw_k,
    so_b, so_h, so_n, so_d,  # so_h: heads (HEADS > 1 only)
    slse_b,
    N_Q, qk_scale,  # qk_scale = scale * log2(e): scores live in the log2 domain
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr, DV_A: tl.constexpr,
    DV_B: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr,
    RH_SELECT: tl.constexpr = False, RH_QW: tl.constexpr = 0, RW_QW: tl.constexpr = 0, HEADS: tl.constexpr = 1,
):
    # q: [B, N_Q, D]  k: [B, HK*WK, D]  v: [B, HK*WK, DV]  rel_h: [B, N_Q, HK]  rel_w: [B, N_Q, WK]
    # (rel_h / rel_w with RH_QW / RW_QW > 0: [B, N_Q // QW, QW, K], rows at their own strides; tiles._rows)
    # out: [B, N_Q, DV], or with HEADS > 1 [B // HEADS, N_Q, HEADS, DV] (heads-last: the order the projection
    # after attention reads, so no copy puts it there)  lse: [B, N_Q] fp32
    # Head dims in power-of-two chunks (tiles.split): d in [0, D_A) and, where D_B > 0, [D_A, D_A + D_B);
    # likewise DV_A, DV_B. D_B == 0 / DV_B == 0 compiles the second chunk out.
    # KMAJOR (fp32 operands): P @ V reads V from vT, whose keys are contiguous (see _keys_kmajor)
    BLOCK_N: tl.constexpr = R * WK_PAD
    LOG2E: tl.constexpr = 1.4426950408889634
    # Python floats arrive as fp64 when Inductor compiles the kernel (triton_op path):
    # pin them to fp32 so the scores, P and the accumulators stay fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    pid_m = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if HEADS > 1:  # out's row base for batch*head b (image b // HEADS, head b % HEADS), then stored as if at b
        bh = tl.program_id(1)
        O += (bh // HEADS).to(tl.int64) * so_b + (bh % HEADS) * so_h
        so_b = 0 * so_b

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_A)
    offs_dv = tl.arange(0, DV_A)
    row = offs_n // WK_PAD  # grid row of key n inside the tile (0..R-1)
    col = _col(offs_n, WK_PAD, R)  # grid column of key n (same for every tile)
    m_ok = offs_m < N_Q
    col_ok = _col_ok(col, WK, WK_PAD)

    # q: [BLOCK_M, D_A] (+ [BLOCK_M, D_B]), stays in registers for the whole key loop
    q = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    if D_B > 0:
        offs_d_b = D_A + tl.arange(0, D_B)
        q_b = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d_b[None, :] * sq_d,
                      mask=m_ok[:, None] & (offs_d_b[None, :] < D), other=0.0)
    if DV_B > 0:
        offs_dv_b = DV_A + tl.arange(0, DV_B)
    # rel_w bias: [BLOCK_M, BLOCK_N]; key tiles are whole grid rows, so it is the same for every tile
    rh_m = _rows(offs_m, srh_n, srh_h, RH_QW)
    rw = tl.load(RW + b * srw_b + _rows(offs_m, srw_n, srw_h, RW_QW)[:, None] + col[None, :] * srw_k,
                 mask=m_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32) * LOG2E
    if R > 1 and WK != WK_PAD and HK % R == 0:
        # padded grid columns: -inf here, once, so that their scores come out -inf with no select per score
        # (the 14x14 windows, 28x28): 270 -> 261 loop instructions (sm_90a SASS), bf16 forward -6% on the H200.
        # Not for R == 1: there a select per score cost fewer instructions than the -inf operand
        # did (56-wide grid: 370 -> 384). Not where R does not divide HK: the loop selects anyway (n_ok)
        rw = tl.where(col_ok[None, :], rw, float("-inf"))

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV_A], tl.float32)
    if DV_B > 0:
        acc_b = tl.zeros([BLOCK_M, DV_B], tl.float32)
    rh_next = tl.zeros([BLOCK_M], tl.float32)  # R == 1: rel_h prefetched one tile ahead (_biased_scores)
    if R == 1:
        rh_next = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, 0, HK)

    for kh0 in range(0, HK, R):
        kh = kh0 + row
        n_ok = col_ok & (kh < HK)
        j = kh * WK + col  # key index in the flattened grid
        # kT: [D_A, BLOCK_N] (+ [D_B, BLOCK_N])
        kT = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d[:, None] * sk_d,
                     mask=n_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        qk = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
        if D_B > 0:
            kT_b = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d_b[:, None] * sk_d,
                           mask=n_ok[None, :] & (offs_d_b[:, None] < D), other=0.0)
            qk = _dot(q_b, kT_b, qk, PREC)
        s, rh_next = _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, rh_m, srh_k, m_ok, kh0, kh,
                                    HK, R, RH_SELECT)
        if HK % R != 0:  # the last tile runs past the grid's last row: rows and columns masked here
            s = tl.where(n_ok[None, :], s, float("-inf"))
        elif R == 1 and WK != WK_PAD:
            s = tl.where(col_ok[None, :], s, float("-inf"))

        # online softmax; every tile holds at least one real key, so m_new is finite
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        # v: [BLOCK_N, DV_A] (+ [BLOCK_N, DV_B])
        if KMAJOR:
            v = _load_kmajor(VT, b, svt_b, svt_d, kh0 * WK_PAD + offs_n, offs_dv, DV)
        else:
            v = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv[None, :] * sv_d,
                        mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        acc = _dot(p.to(v.dtype), v, acc, PREC)
        if DV_B > 0:
            acc_b = acc_b * alpha[:, None]
            if KMAJOR:
                v_b = _load_kmajor(VT, b, svt_b, svt_d, kh0 * WK_PAD + offs_n, offs_dv_b, DV)
            else:
                v_b = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv_b[None, :] * sv_d,
                              mask=n_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
            acc_b = _dot(p.to(v_b.dtype), v_b, acc_b, PREC)
        m_i = m_new

    out = acc / l_i[:, None]
    tl.store(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :] * so_d,
             out.to(O.dtype.element_ty), mask=m_ok[:, None] & (offs_dv[None, :] < DV))
    if DV_B > 0:
        tl.store(O + b * so_b + offs_m[:, None] * so_n + offs_dv_b[None, :] * so_d,
                 (acc_b / l_i[:, None]).to(O.dtype.element_ty), mask=m_ok[:, None] & (offs_dv_b[None, :] < DV))
    # back to natural log
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    tl.store(LSE + b * slse_b + offs_m, lse, mask=m_ok)


