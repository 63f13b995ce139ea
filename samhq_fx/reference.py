"""Reference implementation of decomposed rel-pos attention, in plain PyTorch.

This is the op's implementation wherever no Triton kernel applies (CPU, MPS, unsupported shapes),
and the float64 oracle that tests hold the kernels to. It processes the queries in blocks, so peak
memory is O(block x N) instead of the O(N x N) that eager SAM spends on its score matrix, and it
saves what a flash-style backward needs (output and row log-sum-exp), never the probabilities.

Math, per batch*head b and query i (key j sits at row j // Wk, column j % Wk of the key grid):
    s[i, j] = scale * <q[i], k[j]> + rel_h[i, j // Wk] + rel_w[i, j % Wk]
    lse[i]  = log sum_j exp(s[i, j])
    out[i]  = sum_j exp(s[i, j] - lse[i]) * v[j]
"""

from __future__ import annotations

import torch

# Largest score block (elements) materialised at once: 2**24 fp32 = 64 MiB.
_BLOCK_ELEMENTS = 1 << 24


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64 (so gradcheck works); everything else is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def query_block(batch: int, n_q: int, n_k: int) -> int:
    """Queries per block so one [batch, block, n_k] score tile stays under _BLOCK_ELEMENTS."""
    return max(1, min(n_q, _BLOCK_ELEMENTS // max(1, batch * n_k)))


def query_rows(t) -> int:
    """Query rows of a rel-pos term: [B, Nq, K], or [B, Hq, Wq, K] with the query grid as two dims."""
    return t.shape[1] if t.dim() == 3 else t.shape[1] * t.shape[2]


def _rows(t):
    # a rel-pos term as [B, Nq, K]: [B, Hq, Wq, K] (the query grid as two dims) flattened, a copy where it must be
    return t.flatten(1, 2) if t.dim() == 4 else t


def _scores(q_blk, k, rh_blk, rw_blk, scale):
    # q_blk: [B, bq, D], k: [B, Nk, D], rh_blk: [B, bq, Hk], rw_blk: [B, bq, Wk] -> s: [B, bq, Nk]
    b, bq, hk = rh_blk.shape
    wk = rw_blk.shape[-1]
    s = torch.matmul(q_blk, k.transpose(-2, -1)).mul_(scale)
    s = s.view(b, bq, hk, wk).add_(rh_blk[..., :, None]).add_(rw_blk[..., None, :])
    return s.view(b, bq, hk * wk)


def forward(q, k, v, rel_h, rel_w, scale: float):
    """q: [B, Nq, D], k: [B, Nk, D], v: [B, Nk, Dv], rel_h: [B, Nq, Hk], rel_w: [B, Nq, Wk] (or either term
    [B, Hq, Wq, K] with Hq * Wq = Nq).

    Returns out [B, Nq, Dv] in q's dtype and lse [B, Nq] in float32.
    """
    ct = compute_dtype(q.dtype)
    qc, kc, vc, rh, rw = (t.to(ct) for t in (q, k, v, _rows(rel_h), _rows(rel_w)))
    b, n_q, _ = q.shape
    n_k = k.shape[1]
    out = torch.empty(b, n_q, v.shape[-1], dtype=q.dtype, device=q.device)
    lse = torch.empty(b, n_q, dtype=torch.float32, device=q.device)
    step = query_block(b, n_q, n_k)
    for i in range(0, n_q, step):
        sl = slice(i, min(i + step, n_q))
        s = _scores(qc[:, sl], kc, rh[:, sl], rw[:, sl], scale)
        row_lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s.sub_(row_lse[..., None]))
        out[:, sl] = torch.matmul(p, vc).to(q.dtype)
        lse[:, sl] = row_lse.to(torch.float32)
    return out, lse


def backward(dout, q, k, v, rel_h, rel_w, out, lse, scale: float):
    """Gradients of forward() for the saved (out, lse). Returns dq, dk, dv, d_rel_h, d_rel_w (each gradient
    contiguous, in its input's shape)."""
    ct = compute_dtype(q.dtype)
    qc, kc, vc, rh, rw, do = (t.to(ct) for t in (q, k, v, _rows(rel_h), _rows(rel_w), dout))
    b, n_q, _ = q.shape
    n_k = k.shape[1]
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    # delta[i] = sum_d dout[i, d] * out[i, d]  (= sum_j p[i, j] * dp[i, j])
    delta = (do * out.to(ct)).sum(-1)
    # fresh contiguous buffers: output strides never follow the (possibly strided) inputs
    dq = qc.new_empty(qc.shape)
    dk = kc.new_zeros(kc.shape)
    dv = vc.new_zeros(vc.shape)
    drh = rh.new_empty(rh.shape)
    drw = rw.new_empty(rw.shape)
    step = query_block(b, n_q, n_k)
    for i in range(0, n_q, step):
        sl = slice(i, min(i + step, n_q))
        s = _scores(qc[:, sl], kc, rh[:, sl], rw[:, sl], scale)
        row_lse = lse[:, sl, None].to(ct)
        # a row with non-finite lse is NaN throughout, as in eager softmax (not 0 for its finite scores)
        row_lse = torch.where(torch.isfinite(row_lse), row_lse, float("nan"))
        p = torch.exp(s.sub_(row_lse))
        dv += torch.matmul(p.transpose(-2, -1), do[:, sl])
        dp = torch.matmul(do[:, sl], vc.transpose(-2, -1))
        ds = p.mul_(dp.sub_(delta[:, sl, None]))  # [B, bq, Nk], reuses p's storage
        dq[:, sl] = torch.matmul(ds, kc).mul_(scale)
        dk += torch.matmul(ds.transpose(-2, -1), qc[:, sl]).mul_(scale)
        ds4 = ds.view(b, -1, hk, wk)
        drh[:, sl] = ds4.sum(-1)
        drw[:, sl] = ds4.sum(-2)
    return (dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), drh.to(rel_h.dtype).view(rel_h.shape),
            drw.to(rel_w.dtype).view(rel_w.shape))


def naive(q, k, v, rel_h, rel_w, scale: float):
    """The textbook O(N^2)-memory formula, as SAM writes it. For tests only."""
    b, n_q, _ = q.shape
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    s = (q * scale) @ k.transpose(-2, -1)
    s = (s.view(b, n_q, hk, wk) + rel_h[..., :, None] + rel_w[..., None, :]).view(b, n_q, hk * wk)
    return torch.softmax(s, dim=-1) @ v
