"""The 076 entry's two table ops, `torch.ops.samhq.rel_pos_terms` and `torch.ops.samhq.rel_pos_table_grad`.

    rel_pos_terms(t, h, w)                    T = q @ [rel_pos_h; rel_pos_w]^T -> [rel_h | rel_w]
    rel_pos_table_grad(d_rel_h, d_rel_w, width) d_rel_h, d_rel_w -> dT (zero-padded to `width` columns)

On CUDA they launch the kernels of rel_pos_tables.py (which says why they exist); elsewhere, and as the
oracle of the tests, their torch forms below (`rel_terms`, `table_grad`). Importing this module registers
both ops (entry.py imports it; the fused attention op and the backend use neither).
"""

from __future__ import annotations

import torch

try:  # Triton (and with it the kernels) exists on Linux; elsewhere the torch forms serve alone.
    import rel_pos_tables as _tables
    from torch.library import triton_op as _define_op
except ImportError:  # pragma: no cover
    _tables = None
    _define_op = None


# --- torch forms ---------------------------------------------------------------------------------------------


def table_grad(d_rel_h, d_rel_w, width: int):
    """d_rel_h: [B, H*W, H], d_rel_w: [B, H*W, W] (an H x W grid attending to itself) -> dT: [B*H*W, width]:
    the rel-pos gradients moved into table-row space, zero-padded (rel_pos_tables.py says why and
    holds the kernel; this is its torch form, for CPU and for tests). dT[i, r] = d_rel_h[i, ih - r + H - 1] for
    r < 2H - 1, dT[i, 2H - 1 + r] = d_rel_w[i, iw - r + W - 1], where those key rows / columns exist."""
    b, n, h = d_rel_h.shape
    w = d_rel_w.shape[-1]
    dev = d_rel_h.device
    rows_h, rows_w = 2 * h - 1, 2 * w - 1
    i_h, i_w = torch.arange(h, device=dev), torch.arange(w, device=dev)
    kh = i_h[:, None] - torch.arange(rows_h, device=dev)[None, :] + h - 1  # [H, rows_h]: key row of (ih, r)
    kw = i_w[:, None] - torch.arange(rows_w, device=dev)[None, :] + w - 1
    # any in-range column serves the masked entries: remainder, not clamp (torch 2.11's Inductor folds a
    # clamped iota into a sympy Max it cannot compare; on the GPU the kernel runs instead)
    dt_h = d_rel_h.reshape(b, h, w, h).gather(3, kh.remainder(h).view(1, h, 1, rows_h).expand(b, h, w, rows_h))
    dt_w = d_rel_w.reshape(b, h, w, w).gather(3, kw.remainder(w).view(1, 1, w, rows_w).expand(b, h, w, rows_w))
    parts = [dt_h.masked_fill(((kh < 0) | (kh >= h)).view(1, h, 1, rows_h), 0),
             dt_w.masked_fill(((kw < 0) | (kw >= w)).view(1, 1, w, rows_w), 0)]
    if width > rows_h + rows_w:
        parts.append(d_rel_h.new_zeros(b, h, w, width - rows_h - rows_w))
    return torch.cat(parts, 3).view(b * n, width)


def rel_terms(t, h: int, w: int):
    """t: [B*H*W, width] (T = q @ [rel_pos_h; rel_pos_w; zero rows]^T) -> rel: [B, H*W, H + W] = [rel_h | rel_w],
    rel_h[i, kh] = t[i, ih - kh + H - 1], rel_w[i, kw] = t[i, 2H - 1 + iw - kw + W - 1] (rel_pos_tables.py)."""
    rows, width = t.shape
    b, dev = rows // (h * w), t.device
    i_h, i_w = torch.arange(h, device=dev), torch.arange(w, device=dev)
    col_h = (i_h[:, None] - i_h[None, :] + h - 1).view(1, h, 1, h).expand(b, h, w, h)
    col_w = (i_w[:, None] - i_w[None, :] + w - 1 + 2 * h - 1).view(1, 1, w, w).expand(b, h, w, w)
    t4 = t.view(b, h, w, width)
    return torch.cat([t4.gather(3, col_h), t4.gather(3, col_w)], 3).view(b, h * w, h + w)


# --- the ops -------------------------------------------------------------------------------------------------


def _rel_terms_impl(t: torch.Tensor, h: int, w: int) -> torch.Tensor:
    if _tables is not None and t.device.type == "cuda" and t.numel() < 2**31:  # int32 offsets
        return _tables.rel_terms(t, h, w)
    return rel_terms(t, h, w)


def _table_grad_impl(d_rel_h: torch.Tensor, d_rel_w: torch.Tensor, width: int) -> torch.Tensor:
    rows = d_rel_h.numel() // max(1, d_rel_h.shape[-1])
    if _tables is not None and d_rel_h.device.type == "cuda" and rows * width < 2**31:  # int32 offsets
        return _tables.table_grad(d_rel_h, d_rel_w, width)
    return table_grad(d_rel_h, d_rel_w, width)


def _table_grad_fake(d_rel_h, d_rel_w, width):
    return d_rel_h.new_empty((d_rel_h.numel() // d_rel_h.shape[-1], width))


# A triton_op where Triton exists, so Inductor traces into it and launches the kernel from its own code (inside
# the entry's CUDA graph); a plain custom op over the torch form elsewhere.
_TABLE_GRAD_SCHEMA = "(Tensor d_rel_h, Tensor d_rel_w, int width) -> Tensor"
_REL_TERMS_SCHEMA = "(Tensor t, int h, int w) -> Tensor"
if _define_op is not None:
    _define_op("samhq::rel_pos_table_grad", mutates_args=(), schema=_TABLE_GRAD_SCHEMA)(_table_grad_impl)
    _define_op("samhq::rel_pos_terms", mutates_args=(), schema=_REL_TERMS_SCHEMA)(_rel_terms_impl)
else:  # pragma: no cover
    torch.library.custom_op("samhq::rel_pos_table_grad", mutates_args=(), schema=_TABLE_GRAD_SCHEMA)(
        _table_grad_impl).register_fake(_table_grad_fake)
    torch.library.custom_op("samhq::rel_pos_terms", mutates_args=(), schema=_REL_TERMS_SCHEMA)(
        _rel_terms_impl).register_fake(lambda t, h, w: t.new_empty((t.shape[0] // (h * w), h * w, h + w)))


def rel_pos_terms(t: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """t: [B*H*W, width], T = q @ [rel_pos_h; rel_pos_w]^T (zero-padded columns allowed) of an H x W grid attending
    to itself -> [B, H*W, H + W] = [rel_h | rel_w]: each query's terms, taken from T at the shifted columns."""
    if not isinstance(t, torch.Tensor) or t.dim() != 2:
        raise ValueError("rel_pos_terms: `t` must be a 2-D tensor [batch*H*W, width]")
    if h < 1 or w < 1 or t.shape[0] % (h * w) or t.shape[1] < 2 * h - 1 + 2 * w - 1:
        raise ValueError(f"rel_pos_terms: `t` {tuple(t.shape)} must have a multiple of h*w = {h * w} rows and at "
                         f"least 2h-1 + 2w-1 = {2 * h - 1 + 2 * w - 1} columns")
    return torch.ops.samhq.rel_pos_terms(t, h, w)


def rel_pos_table_grad(d_rel_h: torch.Tensor, d_rel_w: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """d_rel_h: [B, H*W, H], d_rel_w: [B, H*W, W] of an H x W grid attending to itself -> dT: [B*H*W, width], the
    gradient of T = q @ [rel_pos_h; rel_pos_w]^T (zero columns past 2H-1 + 2W-1; width defaults to that sum)."""
    for name, t in (("d_rel_h", d_rel_h), ("d_rel_w", d_rel_w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"rel_pos_table_grad: `{name}` must be a 3-D tensor [batch, H*W, H or W]")
    b, n, h = d_rel_h.shape
    w = d_rel_w.shape[-1]
    if h * w != n or d_rel_w.shape[:2] != (b, n):
        raise ValueError(f"rel_pos_table_grad: `d_rel_h` {tuple(d_rel_h.shape)} and `d_rel_w` {tuple(d_rel_w.shape)} "
                         f"must be [B, H*W, H] and [B, H*W, W] of one H x W grid")
    if d_rel_w.dtype != d_rel_h.dtype or d_rel_w.device != d_rel_h.device:
        raise ValueError("rel_pos_table_grad: `d_rel_h` and `d_rel_w` must share a dtype and a device")
    least = 2 * h - 1 + 2 * w - 1
    width = least if width is None else int(width)
    if width < least:
        raise ValueError(f"rel_pos_table_grad: `width` must be at least 2H-1 + 2W-1 = {least}, got {width}")
    return torch.ops.samhq.rel_pos_table_grad(d_rel_h, d_rel_w, width)
