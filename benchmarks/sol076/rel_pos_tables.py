"""SAM's rel-pos terms taken out of table-row space and their gradients put back, one Triton kernel each (the 076
entry's rel_h / rel_w from T, and its dT).

SAM computes its rel-pos terms from two tables, rel_pos_h [2H-1, D] and rel_pos_w [2W-1, D]: for a query at
grid row ih, column iw of an H x W grid (self-attention: the key grid is the same grid),

    rel_h[i, kh] = <q[i], rel_pos_h[ih - kh + H - 1]>      rel_w[i, kw] = <q[i], rel_pos_w[iw - kw + W - 1]>

so with T = q @ [rel_pos_h; rel_pos_w]^T every term is one entry of T, at a column shifted by the query's grid
position (`rel_terms`: rel = [rel_h | rel_w], [B, H*W, H + W]). The backward shifts d_rel_h / d_rel_w back the
same way into dT (`table_grad`), which two plain GEMMs then turn into dq (dT @ tables) and the tables'
gradients (dT^T @ q):

    dT[i, r]          = d_rel_h[i, ih - r + H - 1]    for r < 2H - 1, where 0 <= ih - r + H - 1 < H
    dT[i, 2H - 1 + r] = d_rel_w[i, iw - r + W - 1]    for r < 2W - 1, where 0 <= iw - r + W - 1 < W
    0 everywhere else, including the padding columns up to `width`

Each (query, table row) pair has at most one key row, so this is a masked gather, not a scatter-add: every
output element is written once, deterministically. Written as torch ops (a gather with a remainder and a
masked fill), Inductor's kernel ran at ~245 GB/s on grids whose width is not a power of two (int64
remainders and index asserts per element: 71.5 us at 56x56x1, 85.7 at 48x48x2 on the H200); this kernel
computes the shifts in int32 and writes whole rows: 10.4 and 12.2 us (benchmarks/DECISIONS.md).
`width` pads the rows (to a multiple of 8) so the GEMMs that read dT get 16-byte aligned rows.

The forward gather is fast as Inductor writes it alone (benchmarks/tools/bench_rel_tables.py: 13.7 us at 56x56x1, 44.7 at
64x64x4, where `rel_terms` takes 15.2 and 76.3: its reversed-order gathers are not yet tuned), but in the entry
Inductor fused it into the transposed bias copies that the dK/dV kernel reads (rel_pos_attention.py, BIAS_T):
gather-and-transpose kernels at ~300 GB/s. With `rel_terms` as a barrier the rel-pos kernels of the entry's
call summed 34.4 us on the 076 mean against 39.8 (7x7x64: 22.0 -> 2.8, 56x56x1: 29.8 -> 15.8; 16x16x32 and
64x64x4 unchanged), so the entry keeps it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from samhq_fx.kernels import rel_pos_attention as _attention


@triton.jit
def _table_grad_kernel(DRH, DRW, DT, n_rows, H: tl.constexpr, W: tl.constexpr, WIDTH: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # DRH: [rows, H], DRW: [rows, W], DT: [rows, WIDTH], all contiguous; row = b * H * W + ih * W + iw
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    row_ok = rows < n_rows
    n = rows % (H * W)
    ih, iw = n // W, n % W
    kh = ih[:, None] - cols[None, :] + (H - 1)  # key row whose d_rel_h lands in table row `cols`
    ok_h = row_ok[:, None] & (cols < 2 * H - 1)[None, :] & (kh >= 0) & (kh < H)
    cw = cols - (2 * H - 1)
    kw = iw[:, None] - cw[None, :] + (W - 1)
    ok_w = row_ok[:, None] & ((cw >= 0) & (cw < 2 * W - 1))[None, :] & (kw >= 0) & (kw < W)
    vh = tl.load(DRH + rows[:, None] * H + kh, mask=ok_h, other=0.0)
    vw = tl.load(DRW + rows[:, None] * W + kw, mask=ok_w, other=0.0)
    tl.store(DT + rows[:, None] * WIDTH + cols[None, :], vh + vw, mask=row_ok[:, None] & (cols < WIDTH)[None, :])


@triton.jit
def _rel_terms_kernel(T, REL, n_rows, H: tl.constexpr, W: tl.constexpr, WIDTH: tl.constexpr,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    # T: [rows, WIDTH], REL: [rows, H + W], contiguous; REL[row, kh] = T[row, ih - kh + H - 1],
    # REL[row, H + kw] = T[row, 2H - 1 + iw - kw + W - 1] (always in range: no mask but the edges)
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    ok = (rows < n_rows)[:, None] & (cols < H + W)[None, :]
    n = rows % (H * W)
    ih, iw = n // W, n % W
    src = tl.where((cols < H)[None, :], ih[:, None] - cols[None, :] + (H - 1),
                   (3 * H - 2 + W) + iw[:, None] - cols[None, :])  # 2H-1 + iw - (c - H) + W - 1
    v = tl.load(T + rows[:, None] * WIDTH + src, mask=ok, other=0.0)
    tl.store(REL + rows[:, None] * (H + W) + cols[None, :], v, mask=ok)


def rel_terms(t: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """t: [B*H*W, width] (T, contiguous rows) -> rel: [B, H*W, H + W], rel[..., :H] = rel_h, rel[..., H:] = rel_w."""
    t = t.contiguous()
    rows, width = t.shape
    rel = _attention._empty((rows // (h * w), h * w, h + w), t.dtype, t.device)
    block_c = triton.next_power_of_2(h + w)
    block_r = max(1, 4096 // block_c)
    torch.library.wrap_triton(_rel_terms_kernel)[(triton.cdiv(rows, block_r),)](
        t, rel, rows, H=h, W=w, WIDTH=width, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return rel


def table_grad(d_rel_h: torch.Tensor, d_rel_w: torch.Tensor, width: int) -> torch.Tensor:
    """d_rel_h: [B, H*W, H], d_rel_w: [B, H*W, W] -> dT: [B*H*W, width] in their dtype (module docstring).

    Host function: allocates and launches through torch.library.wrap_triton only, so it can run inside a
    torch.library.triton_op that Inductor traces."""
    h, w = d_rel_h.shape[-1], d_rel_w.shape[-1]
    d_rel_h, d_rel_w = d_rel_h.contiguous(), d_rel_w.contiguous()
    rows = d_rel_h.numel() // h
    dt = _attention._empty((rows, width), d_rel_h.dtype, d_rel_h.device)  # NaN-filled under the tests' poison hook
    block_c = triton.next_power_of_2(width)
    block_r = max(1, 4096 // block_c)  # 4096-element tiles: 16 per thread at 4 warps
    torch.library.wrap_triton(_table_grad_kernel)[(triton.cdiv(rows, block_r),)](
        d_rel_h, d_rel_w, dt, rows, H=h, W=w, WIDTH=width, BLOCK_R=block_r, BLOCK_C=block_c, num_warps=4)
    return dt
