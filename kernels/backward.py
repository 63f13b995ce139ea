"""Backward kernel: dK/dV programs and dQ programs (which also reduce d_rel_h, d_rel_w), split or fused.

One kernel, `_bwd_kernel`, three ways to launch it (PART, a constexpr, so each is its own binary):
  "dq"    grid (query blocks, B)  owns a query block, loops over key tiles -> dq, d_rel_h, d_rel_w, and
                                  delta[i] = <dout[i], out[i]> for dK/dV (stored, when STORE_DELTA);
                                  with SPLIT_ROW_Q, one-row key tiles as two halves
  "dkdv"  grid (key tiles, B)     owns a key tile, loops over query blocks -> dk, dv (reads that delta)
  "both"  grid (key tiles + query blocks, B)   one launch: the first programs are dK/dV ones, the rest dQ
                                  ones; dK/dV programs then compute delta themselves, per query step
The split launches run dQ first, so delta needs no kernel of its own. The fused launch saves one more
launch and lets dK/dV and dQ programs share the chip, which is what small problems (12 heads x a few
query blocks) need; its price is an extra load of an out tile per dK/dV step.

No atomics: every output element has one writer and a fixed reduction order, so the same inputs give the
same bits. The price is recomputing P and dP in both parts (7 N*N*D matmuls instead of FA2's 5).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .tiles import _biased_scores, _col, _col_ok, _dot, _load_kmajor, _rel_h_column, _rows

_LOG2E = tl.constexpr(1.4426950408889634)


@triton.jit
def _dkdv_program(
    pid_t, b,
    Q, K, V, RH, RW, DO, O, LSE, DELTA, DK, DV_, QT, DOT,
    sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
    srh_b, srh_h, srh_n, srh_k, srw_b, srw_h, srw_n, srw_k,
    sdo_b, sdo_n, sdo_d, so_b, so_n, so_d, slse_b, slse_n, sdl_b,
    sdk_b, sdk_n, sdk_d, sdv_b, sdv_n, sdv_d, sqt_b, sqt_d, sdot_b, sdot_d,
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr, DV_A: tl.constexpr,
    DV_B: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr, BIAS_T: tl.constexpr,
    RH_SELECT: tl.constexpr, DELTA_INLINE: tl.constexpr, RH_QW: tl.constexpr, RW_QW: tl.constexpr,
):
    # Owns key tile pid_t (grid rows kh0 .. kh0+R-1), loops over all query blocks. Works on the transposed
    # scores sT = s^T: [BLOCK_N, BLOCK_M], so dk and dv come out of plain dots with no transposes.
    BLOCK_N: tl.constexpr = R * WK_PAD
    kh0 = pid_t * R
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_A)
    offs_dv = tl.arange(0, DV_A)
    if D_B > 0:
        offs_d_b = D_A + tl.arange(0, D_B)
    if DV_B > 0:
        offs_dv_b = DV_A + tl.arange(0, DV_B)
    row = offs_n // WK_PAD
    col = _col(offs_n, WK_PAD, R)
    kh = kh0 + row
    col_ok = _col_ok(col, WK, WK_PAD)
    n_ok = col_ok & (kh < HK)
    j = kh * WK + col

    # k: [BLOCK_N, D_A], v: [BLOCK_N, DV_A] (+ the D_B / DV_B chunks), resident for the whole query loop
    k = tl.load(K + b * sk_b + j[:, None] * sk_n + offs_d[None, :] * sk_d,
                mask=n_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    v = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv[None, :] * sv_d,
                mask=n_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    dk = tl.zeros([BLOCK_N, D_A], tl.float32)
    dv = tl.zeros([BLOCK_N, DV_A], tl.float32)
    if D_B > 0:
        k_b = tl.load(K + b * sk_b + j[:, None] * sk_n + offs_d_b[None, :] * sk_d,
                      mask=n_ok[:, None] & (offs_d_b[None, :] < D), other=0.0)
        dk_b = tl.zeros([BLOCK_N, D_B], tl.float32)
    if DV_B > 0:
        v_b = tl.load(V + b * sv_b + j[:, None] * sv_n + offs_dv_b[None, :] * sv_d,
                      mask=n_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
        dv_b = tl.zeros([BLOCK_N, DV_B], tl.float32)

    for m0 in range(0, N_Q, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        m_ok = offs_m < N_Q
        # qT: [D_A, BLOCK_M], do: [BLOCK_M, DV_A] (+ the D_B / DV_B chunks)
        qT = tl.load(Q + b * sq_b + offs_m[None, :] * sq_n + offs_d[:, None] * sq_d,
                     mask=m_ok[None, :] & (offs_d[:, None] < D), other=0.0)
        do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d,
                     mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
        if D_B > 0:
            qT_b = tl.load(Q + b * sq_b + offs_m[None, :] * sq_n + offs_d_b[:, None] * sq_d,
                           mask=m_ok[None, :] & (offs_d_b[:, None] < D), other=0.0)
        if DV_B > 0:
            do_b = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv_b[None, :] * sdo_d,
                           mask=m_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
        lse = tl.load(LSE + b * slse_b + offs_m * slse_n, mask=m_ok, other=0.0) * _LOG2E
        if DELTA_INLINE:  # fused launch: the dQ programs that store delta run beside this one
            o = tl.load(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :] * so_d,
                        mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
            delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
            if DV_B > 0:
                o_b = tl.load(O + b * so_b + offs_m[:, None] * so_n + offs_dv_b[None, :] * so_d,
                              mask=m_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
                delta += tl.sum(o_b.to(tl.float32) * do_b.to(tl.float32), 1)
        else:
            delta = tl.load(DELTA + b * sdl_b + offs_m, mask=m_ok, other=0.0)
        # bias^T: [BLOCK_N, BLOCK_M]. BIAS_T: rel_h / rel_w are copies with queries contiguous and padded
        # to whole query blocks, so no query mask (padded queries are dropped from pT below)
        if BIAS_T:
            mb_ok = tl.full([BLOCK_M], 1, tl.int1)
        else:
            mb_ok = m_ok
        rh_m = _rows(offs_m, srh_n, srh_h, RH_QW)
        biasT = tl.load(RW + b * srw_b + _rows(offs_m, srw_n, srw_h, RW_QW)[None, :] + col[:, None] * srw_k,
                        mask=mb_ok[None, :] & col_ok[:, None], other=0.0).to(tl.float32)
        if R == 1:
            rh = tl.load(RH + b * srh_b + rh_m + kh0 * srh_k, mask=mb_ok, other=0.0)
            biasT += rh.to(tl.float32)[None, :]
        elif RH_SELECT:  # R row loads placed by key row: no [BLOCK_N, BLOCK_M] gather
            for r in tl.static_range(R):
                # the row test as a [BLOCK_M] vector: Triton's interpreter rejects a vector mask
                # combined with a 0-d one
                rh_ok = (tl.zeros([BLOCK_M], tl.int32) + kh0 + r) < HK
                rh_r = tl.load(RH + b * srh_b + rh_m + (kh0 + r) * srh_k,
                               mask=mb_ok & rh_ok, other=0.0)
                biasT = tl.where((row == r)[:, None], biasT + rh_r.to(tl.float32)[None, :], biasT)
        else:
            rh = tl.load(RH + b * srh_b + rh_m[None, :] + kh[:, None] * srh_k,
                         mask=mb_ok[None, :] & (kh < HK)[:, None], other=0.0)
            biasT += rh.to(tl.float32)

        qkT = _dot(k, qT, tl.zeros([BLOCK_N, BLOCK_M], tl.float32), PREC)
        if D_B > 0:
            qkT = _dot(k_b, qT_b, qkT, PREC)
        pT = tl.math.exp2(qkT * qk_scale + biasT * _LOG2E - lse[None, :])
        pT = tl.where(n_ok[:, None] & m_ok[None, :], pT, 0.0)
        if KMAJOR:  # fp32: the B operands of dV and dK from copies with queries contiguous
            dv = _dot(pT, _load_kmajor(DOT, b, sdot_b, sdot_d, offs_m, offs_dv, DV), dv, PREC)
            if DV_B > 0:
                dv_b = _dot(pT, _load_kmajor(DOT, b, sdot_b, sdot_d, offs_m, offs_dv_b, DV), dv_b, PREC)
        else:
            dv = _dot(pT.to(do.dtype), do, dv, PREC)
            if DV_B > 0:
                dv_b = _dot(pT.to(do_b.dtype), do_b, dv_b, PREC)
        # dpT = v @ do^T: [BLOCK_N, BLOCK_M]
        dpT = _dot(v, tl.trans(do), tl.zeros([BLOCK_N, BLOCK_M], tl.float32), PREC)
        if DV_B > 0:
            dpT = _dot(v_b, tl.trans(do_b), dpT, PREC)
        dsT = pT * (dpT - delta[None, :])
        if KMAJOR:
            dk = _dot(dsT, _load_kmajor(QT, b, sqt_b, sqt_d, offs_m, offs_d, D), dk, PREC)
            if D_B > 0:
                dk_b = _dot(dsT, _load_kmajor(QT, b, sqt_b, sqt_d, offs_m, offs_d_b, D), dk_b, PREC)
        else:
            dk = _dot(dsT.to(qT.dtype), tl.trans(qT), dk, PREC)
            if D_B > 0:
                dk_b = _dot(dsT.to(qT_b.dtype), tl.trans(qT_b), dk_b, PREC)

    dk = dk * scale
    tl.store(DK + b * sdk_b + j[:, None] * sdk_n + offs_d[None, :] * sdk_d, dk.to(DK.dtype.element_ty),
             mask=n_ok[:, None] & (offs_d[None, :] < D))
    tl.store(DV_ + b * sdv_b + j[:, None] * sdv_n + offs_dv[None, :] * sdv_d, dv.to(DV_.dtype.element_ty),
             mask=n_ok[:, None] & (offs_dv[None, :] < DV))
    if D_B > 0:
        tl.store(DK + b * sdk_b + j[:, None] * sdk_n + offs_d_b[None, :] * sdk_d,
                 (dk_b * scale).to(DK.dtype.element_ty), mask=n_ok[:, None] & (offs_d_b[None, :] < D))
    if DV_B > 0:
        tl.store(DV_ + b * sdv_b + j[:, None] * sdv_n + offs_dv_b[None, :] * sdv_d,
                 dv_b.to(DV_.dtype.element_ty), mask=n_ok[:, None] & (offs_dv_b[None, :] < DV))


@triton.jit
def _dq_program(
    pid_m, b,
    Q, K, V, RH, RW, DO, O, LSE, DELTA, DQ, DRH, DRW, KT,
    sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
    srh_b, srh_h, srh_n, srh_k, srw_b, srw_h, srw_n, srw_k,
    sdo_b, sdo_n, sdo_d, so_b, so_n, so_d, slse_b, slse_n, sdl_b,
    sdq_b, sdq_n, sdq_d, sdrh_b, sdrh_n, sdrh_k, sdrw_b, sdrw_n, sdrw_k, skt_b, skt_d,
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, R: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr, DV_A: tl.constexpr,
    DV_B: tl.constexpr, BLOCK_M: tl.constexpr, PREC: tl.constexpr, KMAJOR: tl.constexpr, RH_SELECT: tl.constexpr,
    STORE_DELTA: tl.constexpr, RH_QW: tl.constexpr, RW_QW: tl.constexpr, SPLIT_ROW: tl.constexpr,
):
    # Owns query block pid_m, loops over key tiles. d_rel_h / d_rel_w are per query row, so this program
    # reduces them itself: no atomics, fixed order.
    BLOCK_N: tl.constexpr = R * WK_PAD
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D_A)
    offs_dv = tl.arange(0, DV_A)
    if D_B > 0:
        offs_d_b = D_A + tl.arange(0, D_B)
    if DV_B > 0:
        offs_dv_b = DV_A + tl.arange(0, DV_B)
    offs_w = tl.arange(0, WK_PAD)
    row = offs_n // WK_PAD
    col = _col(offs_n, WK_PAD, R)
    m_ok = offs_m < N_Q
    col_ok = _col_ok(col, WK, WK_PAD)

    # q: [BLOCK_M, D_A], do, o: [BLOCK_M, DV_A] (+ the D_B / DV_B chunks)
    q = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & (offs_d[None, :] < D), other=0.0)
    do = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv[None, :] * sdo_d,
                 mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    o = tl.load(O + b * so_b + offs_m[:, None] * so_n + offs_dv[None, :] * so_d,
                mask=m_ok[:, None] & (offs_dv[None, :] < DV), other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if D_B > 0:
        q_b = tl.load(Q + b * sq_b + offs_m[:, None] * sq_n + offs_d_b[None, :] * sq_d,
                      mask=m_ok[:, None] & (offs_d_b[None, :] < D), other=0.0)
    if DV_B > 0:
        do_b = tl.load(DO + b * sdo_b + offs_m[:, None] * sdo_n + offs_dv_b[None, :] * sdo_d,
                       mask=m_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
        o_b = tl.load(O + b * so_b + offs_m[:, None] * so_n + offs_dv_b[None, :] * so_d,
                      mask=m_ok[:, None] & (offs_dv_b[None, :] < DV), other=0.0)
        delta += tl.sum(o_b.to(tl.float32) * do_b.to(tl.float32), 1)
    if STORE_DELTA:  # for the dK/dV launch that follows
        tl.store(DELTA + b * sdl_b + offs_m, delta, mask=m_ok)
    lse = tl.load(LSE + b * slse_b + offs_m * slse_n, mask=m_ok, other=0.0) * _LOG2E
    rh_m = _rows(offs_m, srh_n, srh_h, RH_QW)
    if SPLIT_ROW:
        # R == 1 tiles as two halves of WK_PAD // 2 columns: the same FLOPs, half the [BLOCK_M, keys] fp32 tiles
        # live at a time (scores, P, dP, dS), and rel_w's bias loaded per half inside the loop, not held across it.
        # That keeps ViT-H's dQ (head dim 64 + 16, 64x64 grids) from spilling registers on sm_80/86/89 (configs.py;
        # benchmarks/DECISIONS.md). d_rel_h[:, row] is the two halves' row sums added.
        HALF: tl.constexpr = WK_PAD // 2
        col_lo = tl.arange(0, HALF)
        col_hi = HALF + tl.arange(0, HALF)
        ok_lo = _col_ok(col_lo, WK, WK_PAD)
        ok_hi = _col_ok(col_hi, WK, WK_PAD)
        rw_m = _rows(offs_m, srw_n, srw_h, RW_QW)
        dq = tl.zeros([BLOCK_M, D_A], tl.float32)
        if D_B > 0:
            dq_b = tl.zeros([BLOCK_M, D_B], tl.float32)
        drw_lo = tl.zeros([BLOCK_M, HALF], tl.float32)
        drw_hi = tl.zeros([BLOCK_M, HALF], tl.float32)
        rh_next = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, 0, HK)  # prefetched one row ahead (_biased_scores)

        for kh in range(0, HK):
            rh = rh_next
            rh_next = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, kh + 1, HK)
            drh = tl.zeros([BLOCK_M], tl.float32)
            for half in tl.static_range(2):
                if half == 0:
                    c = col_lo
                    c_ok = ok_lo
                else:
                    c = col_hi
                    c_ok = ok_hi
                # rel_w bias for this half (log2 domain, lse folded in): the same tile every grid row, loaded here each
                # time (from L1) so that two [BLOCK_M, HALF] fp32 tiles fewer are live across the loop
                rw = tl.load(RW + b * srw_b + rw_m[:, None] + c[None, :] * srw_k,
                             mask=m_ok[:, None] & c_ok[None, :], other=0.0).to(tl.float32) * _LOG2E - lse[:, None]
                j = kh * WK + c
                # kT: [D_A, HALF], vT: [DV_A, HALF] (+ the D_B / DV_B chunks)
                kT = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d[:, None] * sk_d,
                             mask=c_ok[None, :] & (offs_d[:, None] < D), other=0.0)
                vT = tl.load(V + b * sv_b + j[None, :] * sv_n + offs_dv[:, None] * sv_d,
                             mask=c_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
                qk = _dot(q, kT, tl.zeros([BLOCK_M, HALF], tl.float32), PREC)
                if D_B > 0:
                    kT_b = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d_b[:, None] * sk_d,
                                   mask=c_ok[None, :] & (offs_d_b[:, None] < D), other=0.0)
                    qk = _dot(q_b, kT_b, qk, PREC)
                p = tl.math.exp2(qk * qk_scale + rw + rh[:, None])
                p = tl.where(c_ok[None, :], p, 0.0)
                dp = _dot(do, vT, tl.zeros([BLOCK_M, HALF], tl.float32), PREC)
                if DV_B > 0:
                    vT_b = tl.load(V + b * sv_b + j[None, :] * sv_n + offs_dv_b[:, None] * sv_d,
                                   mask=c_ok[None, :] & (offs_dv_b[:, None] < DV), other=0.0)
                    dp = _dot(do_b, vT_b, dp, PREC)
                ds = p * (dp - delta[:, None])  # [BLOCK_M, HALF] fp32; 0 on masked keys
                if KMAJOR:  # fp32: the B operand of dQ from the copy with keys contiguous (one grid row a tile)
                    dq = _dot(ds, _load_kmajor(KT, b, skt_b, skt_d, kh * WK_PAD + c, offs_d, D), dq, PREC)
                    if D_B > 0:
                        dq_b = _dot(ds, _load_kmajor(KT, b, skt_b, skt_d, kh * WK_PAD + c, offs_d_b, D), dq_b, PREC)
                else:
                    dq = _dot(ds.to(kT.dtype), tl.trans(kT), dq, PREC)
                    if D_B > 0:
                        dq_b = _dot(ds.to(kT_b.dtype), tl.trans(kT_b), dq_b, PREC)
                drh += tl.sum(ds, 1)
                if half == 0:
                    drw_lo += ds
                else:
                    drw_hi += ds
            tl.store(DRH + b * sdrh_b + offs_m * sdrh_n + kh * sdrh_k, drh.to(DRH.dtype.element_ty), mask=m_ok)
    else:
        # rel_w bias [BLOCK_M, BLOCK_N], same for every tile (log2 domain, lse folded in)
        rw = tl.load(RW + b * srw_b + _rows(offs_m, srw_n, srw_h, RW_QW)[:, None] + col[None, :] * srw_k,
                     mask=m_ok[:, None] & col_ok[None, :], other=0.0).to(tl.float32) * _LOG2E - lse[:, None]

        dq = tl.zeros([BLOCK_M, D_A], tl.float32)
        if D_B > 0:
            dq_b = tl.zeros([BLOCK_M, D_B], tl.float32)
        if R == 1:
            drw = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        else:
            drw = tl.zeros([BLOCK_M, WK_PAD], tl.float32)
        rh_next = tl.zeros([BLOCK_M], tl.float32)  # R == 1: rel_h prefetched one tile ahead (_biased_scores)
        if R == 1:
            rh_next = _rel_h_column(RH, b, srh_b, rh_m, srh_k, m_ok, 0, HK)

        for kh0 in range(0, HK, R):
            kh = kh0 + row
            n_ok = col_ok & (kh < HK)
            j = kh * WK + col
            # kT: [D_A, BLOCK_N], vT: [DV_A, BLOCK_N] (+ the D_B / DV_B chunks)
            kT = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d[:, None] * sk_d,
                         mask=n_ok[None, :] & (offs_d[:, None] < D), other=0.0)
            vT = tl.load(V + b * sv_b + j[None, :] * sv_n + offs_dv[:, None] * sv_d,
                         mask=n_ok[None, :] & (offs_dv[:, None] < DV), other=0.0)
            qk = _dot(q, kT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
            if D_B > 0:
                kT_b = tl.load(K + b * sk_b + j[None, :] * sk_n + offs_d_b[:, None] * sk_d,
                               mask=n_ok[None, :] & (offs_d_b[:, None] < D), other=0.0)
                qk = _dot(q_b, kT_b, qk, PREC)
            s, rh_next = _biased_scores(qk, qk_scale, rw, rh_next, RH, b, srh_b, rh_m, srh_k, m_ok, kh0, kh,
                                        HK, R, RH_SELECT)
            p = tl.math.exp2(s)
            p = tl.where(n_ok[None, :], p, 0.0)
            dp = _dot(do, vT, tl.zeros([BLOCK_M, BLOCK_N], tl.float32), PREC)
            if DV_B > 0:
                vT_b = tl.load(V + b * sv_b + j[None, :] * sv_n + offs_dv_b[:, None] * sv_d,
                               mask=n_ok[None, :] & (offs_dv_b[:, None] < DV), other=0.0)
                dp = _dot(do_b, vT_b, dp, PREC)
            ds = p * (dp - delta[:, None])  # [BLOCK_M, BLOCK_N] fp32; 0 on masked keys
            if KMAJOR:  # fp32: the B operand of dQ from the copy with keys contiguous
                dq = _dot(ds, _load_kmajor(KT, b, skt_b, skt_d, kh0 * WK_PAD + offs_n, offs_d, D), dq, PREC)
                if D_B > 0:
                    dq_b = _dot(ds, _load_kmajor(KT, b, skt_b, skt_d, kh0 * WK_PAD + offs_n, offs_d_b, D), dq_b, PREC)
            else:
                dq = _dot(ds.to(kT.dtype), tl.trans(kT), dq, PREC)
                if D_B > 0:
                    dq_b = _dot(ds.to(kT_b.dtype), tl.trans(kT_b), dq_b, PREC)
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
    if D_B > 0:
        tl.store(DQ + b * sdq_b + offs_m[:, None] * sdq_n + offs_d_b[None, :] * sdq_d,
                 (dq_b * scale).to(DQ.dtype.element_ty), mask=m_ok[:, None] & (offs_d_b[None, :] < D))
    if SPLIT_ROW:
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + col_lo[None, :] * sdrw_k,
                 drw_lo.to(DRW.dtype.element_ty), mask=m_ok[:, None] & ok_lo[None, :])
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + col_hi[None, :] * sdrw_k,
                 drw_hi.to(DRW.dtype.element_ty), mask=m_ok[:, None] & ok_hi[None, :])
    elif R == 1:
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + col[None, :] * sdrw_k,
                 drw.to(DRW.dtype.element_ty), mask=m_ok[:, None] & col_ok[None, :])
    else:
        tl.store(DRW + b * sdrw_b + offs_m[:, None] * sdrw_n + offs_w[None, :] * sdrw_k,
                 drw.to(DRW.dtype.element_ty), mask=m_ok[:, None] & (offs_w[None, :] < WK))


@triton.jit
def _bwd_kernel(
    Q, K, V, RH, RW, RH_T, RW_T, DO, O, LSE, DELTA, DQ, DK, DV_, DRH, DRW, QT, DOT, KT,
    sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
    srh_b, srh_h, srh_n, srh_k, srw_b, srw_h, srw_n, srw_k,  # rel_h / rel_w as dQ reads them (forward.py)
    srht_b, srht_h, srht_n, srht_k, srwt_b, srwt_h, srwt_n, srwt_k,  # as dK/dV reads them (BIAS_T: copies)
    sdo_b, sdo_h, sdo_n, sdo_d, so_b, so_h, so_n, so_d, slse_b, slse_n, sdl_b,  # sdo_h, so_h: HEADS > 1 only
    sdq_b, sdq_n, sdq_d, sdk_b, sdk_n, sdk_d, sdv_b, sdv_n, sdv_d,
    sdrh_b, sdrh_n, sdrh_k, sdrw_b, sdrw_n, sdrw_k,
    sqt_b, sqt_d, sdot_b, sdot_d, skt_b, skt_d,  # K-major copies (KMAJOR only)
    N_Q, qk_scale, scale,
    HK: tl.constexpr, WK: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
    WK_PAD: tl.constexpr, D_A: tl.constexpr, D_B: tl.constexpr, DV_A: tl.constexpr, DV_B: tl.constexpr,
    PREC: tl.constexpr, KMAJOR: tl.constexpr,
    PART: tl.constexpr,  # "dq", "dkdv" or "both" (module docstring)
    R_KV: tl.constexpr, BLOCK_M_KV: tl.constexpr, RH_SELECT_KV: tl.constexpr, BIAS_T: tl.constexpr,
    R_Q: tl.constexpr, BLOCK_M_Q: tl.constexpr, RH_SELECT_Q: tl.constexpr,
    RH_QW: tl.constexpr = 0, RW_QW: tl.constexpr = 0,  # query grid width where a term's rows are (h, w) dims
    RHT_QW: tl.constexpr = 0, RWT_QW: tl.constexpr = 0,  # the same for what dK/dV reads (0 with BIAS_T copies)
    SPLIT_ROW_Q: tl.constexpr = False,  # dQ takes each grid row as two key tiles (_dq_program; R_Q == 1 only)
    HEADS: tl.constexpr = 1,  # do, out: [B // HEADS, N_Q, HEADS, DV] where above 1 (the forward's heads-last out)
):
    # q, k: [B, N, D]  v, do, out: [B, N, DV]  rel_h: [B, N_Q, HK]  rel_w: [B, N_Q, WK]  lse, delta: [B, N_Q]
    # (rel_h / rel_w with RH_QW / RW_QW > 0: [B, N_Q // QW, QW, K], rows at their own strides; tiles._rows)
    # Head dims in power-of-two chunks as in the forward (D_A + D_B, DV_A + DV_B; D_B == 0: one chunk)
    # Python floats arrive as fp64 when Inductor compiles the kernel (triton_op path):
    # pin them to fp32 so the scores, P and the accumulators stay fp32.
    qk_scale = tl.cast(qk_scale, tl.float32)
    scale = tl.cast(scale, tl.float32)
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    if HEADS > 1:  # do's and out's row bases for batch*head b (image b // HEADS, head b % HEADS), then read as if at b
        bh = tl.program_id(1)
        DO += (bh // HEADS).to(tl.int64) * sdo_b + (bh % HEADS) * sdo_h
        O += (bh // HEADS).to(tl.int64) * so_b + (bh % HEADS) * so_h
        sdo_b = 0 * sdo_b
        so_b = 0 * so_b
    N_KV_TILES: tl.constexpr = (HK + R_KV - 1) // R_KV
    if PART == "dq":
        do_kv = False
        pid_q = pid
    elif PART == "dkdv":
        do_kv = True
        pid_q = 0
    else:
        do_kv = pid < N_KV_TILES
        pid_q = pid - N_KV_TILES
    if do_kv:
        _dkdv_program(
            pid, b, Q, K, V, RH_T, RW_T, DO, O, LSE, DELTA, DK, DV_, QT, DOT,
            sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
            srht_b, srht_h, srht_n, srht_k, srwt_b, srwt_h, srwt_n, srwt_k,
            sdo_b, sdo_n, sdo_d, so_b, so_n, so_d, slse_b, slse_n, sdl_b,
            sdk_b, sdk_n, sdk_d, sdv_b, sdv_n, sdv_d, sqt_b, sqt_d, sdot_b, sdot_d,
            N_Q, qk_scale, scale,
            HK, WK, D, DV, WK_PAD, R_KV, D_A, D_B, DV_A, DV_B, BLOCK_M_KV, PREC, KMAJOR, BIAS_T, RH_SELECT_KV,
            PART == "both", RHT_QW, RWT_QW,
        )
    else:
        _dq_program(
            pid_q, b, Q, K, V, RH, RW, DO, O, LSE, DELTA, DQ, DRH, DRW, KT,
            sq_b, sq_n, sq_d, sk_b, sk_n, sk_d, sv_b, sv_n, sv_d,
            srh_b, srh_h, srh_n, srh_k, srw_b, srw_h, srw_n, srw_k,
            sdo_b, sdo_n, sdo_d, so_b, so_n, so_d, slse_b, slse_n, sdl_b,
            sdq_b, sdq_n, sdq_d, sdrh_b, sdrh_n, sdrh_k, sdrw_b, sdrw_n, sdrw_k, skt_b, skt_d,
            N_Q, qk_scale, scale,
            HK, WK, D, DV, WK_PAD, R_Q, D_A, D_B, DV_A, DV_B, BLOCK_M_Q, PREC, KMAJOR, RH_SELECT_Q,
            PART == "dq", RH_QW, RW_QW, SPLIT_ROW_Q,
        )
