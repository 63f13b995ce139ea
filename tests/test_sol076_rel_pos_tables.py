"""The rel-pos terms out of table-row space and their gradients back (the 076 entry's kernels,
benchmarks/sol076/rel_pos_tables.py, and its ops `samhq::rel_pos_terms` and `samhq::rel_pos_table_grad`,
benchmarks/sol076/rel_pos_ops.py).

rel_pos_terms is checked against SAM's definition written as loops over the grid.

dT is the gradient of T = q @ [rel_pos_h; rel_pos_w]^T through the shifted-column gather that makes rel_h /
rel_w from T, so the oracle is autograd itself: T's gradient when rel_h, rel_w (gathered from T by the
definition's index, in float64) are multiplied by d_rel_h, d_rel_w. The kernel (interpreted on CPU, real on the
GPU) and the torch form must both match it exactly, padding columns (zeros) included, with the output poisoned
with NaN before the kernel writes it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "sol076"))

import rel_pos_ops as ops  # noqa: E402
import rel_pos_tables as KT  # noqa: E402
from samhq_fx.kernels import rel_pos_attention as K  # noqa: E402  (the module whose poison hook KT allocates with)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def oracle(d_rel_h, d_rel_w, width):
    """d T of sum(rel_h * d_rel_h) + sum(rel_w * d_rel_w), rel_h[i, kh] = T[i, ih - kh + H - 1] and
    rel_w[i, kw] = T[i, 2H - 1 + iw - kw + W - 1] (SAM's tables, as get_rel_pos indexes them), float64."""
    b, n, h = d_rel_h.shape
    w = d_rel_w.shape[-1]
    t = torch.zeros(b * n, width, dtype=torch.float64, requires_grad=True)
    ih = torch.arange(n) // w
    iw = torch.arange(n) % w
    col_h = ih[:, None] - torch.arange(h)[None, :] + h - 1  # [n, h]
    col_w = 2 * h - 1 + iw[:, None] - torch.arange(w)[None, :] + w - 1
    tv = t.view(b, n, width)
    rel_h = tv.gather(2, col_h.expand(b, n, h))
    rel_w = tv.gather(2, col_w.expand(b, n, w))
    loss = (rel_h * d_rel_h.double().cpu()).sum() + (rel_w * d_rel_w.double().cpu()).sum()
    (grad,) = torch.autograd.grad(loss, t)
    return grad


def inputs(b, h, w, dtype, device=DEVICE, seed=0):
    g = torch.Generator().manual_seed(seed)
    d_rel_h = torch.randn(b, h * w, h, generator=g).to(device=device, dtype=dtype)
    d_rel_w = torch.randn(b, h * w, w, generator=g).to(device=device, dtype=dtype)
    return d_rel_h, d_rel_w


# square and oblong grids, a 1-wide one, widths with and without padding
CASES = [(1, 7, 7, 26), (1, 7, 7, 32), (2, 5, 9, 32), (3, 4, 6, 24), (2, 1, 5, 16), (1, 14, 14, 56)]


@pytest.mark.parametrize("b,h,w,width", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_matches_autograd(b, h, w, width, dtype, monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)
    d_rel_h, d_rel_w = inputs(b, h, w, dtype)
    got = KT.table_grad(d_rel_h, d_rel_w, width)
    assert got.shape == (b * h * w, width) and got.dtype == dtype
    # each element is one input element or zero: exact in any dtype
    assert torch.equal(got.double().cpu(), oracle(d_rel_h, d_rel_w, width))


@pytest.mark.parametrize("b,h,w,width", CASES[:4])
def test_torch_form_and_op_match_autograd(b, h, w, width):
    d_rel_h, d_rel_w = inputs(b, h, w, torch.float32, device="cpu", seed=1)
    want = oracle(d_rel_h, d_rel_w, width)
    assert torch.equal(ops.table_grad(d_rel_h, d_rel_w, width).double(), want)
    assert torch.equal(ops.rel_pos_table_grad(d_rel_h, d_rel_w, width).double(), want)
    compiled = torch.compile(lambda a, c: ops.rel_pos_table_grad(a, c, width), fullgraph=True)
    assert torch.equal(compiled(d_rel_h, d_rel_w).double(), want)


def test_strided_inputs_are_taken():
    d_rel_h, d_rel_w = inputs(2, 5, 6, torch.float32, device="cpu", seed=2)
    wide = torch.cat([d_rel_h, d_rel_w], 2)  # views with row stride H + W, as the entry's rel terms are
    got = KT.table_grad(wide[..., :5], wide[..., 5:], 24)
    assert torch.equal(got.double(), oracle(d_rel_h, d_rel_w, 24))


def test_bad_inputs_are_refused():
    d_rel_h, d_rel_w = inputs(1, 4, 6, torch.float32, device="cpu")
    with pytest.raises(ValueError, match="width"):
        ops.rel_pos_table_grad(d_rel_h, d_rel_w, 10)  # needs 7 + 11
    with pytest.raises(ValueError, match="H x W grid"):
        ops.rel_pos_table_grad(d_rel_h, d_rel_w[:, :, :5], 24)
    with pytest.raises(ValueError, match="3-D"):
        ops.rel_pos_table_grad(d_rel_h[0], d_rel_w, 24)
    with pytest.raises(ValueError, match="dtype"):
        ops.rel_pos_table_grad(d_rel_h, d_rel_w.double(), 24)


def terms_by_loops(t, b, h, w):
    """rel_h[i, kh] = T[i, ih - kh + H - 1], rel_w[i, kw] = T[i, 2H - 1 + iw - kw + W - 1], element by element."""
    t = t.double().cpu().view(b, h * w, -1)
    rel = torch.empty(b, h * w, h + w, dtype=torch.float64)
    for ih in range(h):
        for iw in range(w):
            i = ih * w + iw
            for kh in range(h):
                rel[:, i, kh] = t[:, i, ih - kh + h - 1]
            for kw in range(w):
                rel[:, i, h + kw] = t[:, i, 2 * h - 1 + iw - kw + w - 1]
    return rel


@pytest.mark.parametrize("b,h,w,width", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rel_terms_kernel_matches_the_definition(b, h, w, width, dtype, monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)
    t = torch.randn(b * h * w, width, generator=torch.Generator().manual_seed(3)).to(device=DEVICE, dtype=dtype)
    got = KT.rel_terms(t, h, w)
    assert got.shape == (b, h * w, h + w) and got.dtype == dtype
    assert torch.equal(got.double().cpu(), terms_by_loops(t, b, h, w))


@pytest.mark.parametrize("b,h,w,width", CASES[:4])
def test_rel_terms_torch_form_and_op(b, h, w, width):
    t = torch.randn(b * h * w, width, generator=torch.Generator().manual_seed(4))
    want = terms_by_loops(t, b, h, w)
    assert torch.equal(ops.rel_terms(t, h, w).double(), want)
    assert torch.equal(ops.rel_pos_terms(t, h, w).double(), want)
    compiled = torch.compile(lambda x: ops.rel_pos_terms(x, h, w), fullgraph=True)
    assert torch.equal(compiled(t).double(), want)
    with pytest.raises(ValueError, match="rows"):
        ops.rel_pos_terms(t[1:], h, w)
    with pytest.raises(ValueError, match="columns"):
        ops.rel_pos_terms(t[:, :2 * h - 1], h, w)


@pytest.mark.gpu
@pytest.mark.parametrize("grid", [(7, 7, 64), (14, 14, 8), (28, 28, 4), (48, 48, 2), (56, 56, 1), (64, 64, 1)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_076_grids(grid, dtype, monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)
    h, w, b = grid
    d_rel_h, d_rel_w = inputs(12 * b, h, w, dtype)
    width = (4 * h - 2 + 7) // 8 * 8
    got = ops.rel_pos_table_grad(d_rel_h, d_rel_w, width)
    assert torch.equal(got, ops.table_grad(d_rel_h, d_rel_w, width))
    t = torch.randn(12 * b * h * w, width, device=DEVICE, dtype=dtype)
    assert torch.equal(ops.rel_pos_terms(t, h, w), ops.rel_terms(t, h, w))
