"""The one-pass backward experiment (kernels/backward_onepass.py) against the float64 oracle: every gradient,
ordered and atomic accumulation, outputs poisoned with NaN first.

On CPU (CI) under TRITON_INTERPRET=1 the ordered accumulation runs in plain program order (the interpreter runs
programs one after another); the `gpu` tests run the rotated order on the SAM-B global grid and 076 grids and check
that it gives the same bits twice.
"""

from __future__ import annotations

import pytest
import torch

try:
    from samhq_fx.kernels import backward_onepass as OP
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root
    from kernels import backward_onepass as OP
    from kernels import rel_pos_attention as K
from samhq_fx import reference
from test_kernels import DEVICE, make_inputs, rel_err

TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}
NAMES = ("dq", "dk", "dv", "d_rel_h", "d_rel_w")


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)


def check(b, n_q, hk, wk, d, dtype, accum, cfg=None):
    q, k, v, rel_h, rel_w, dout = make_inputs(b, n_q, hk, wk, d, d, dtype, seed=11 * b + hk * wk + d)
    assert OP.unsupported_reason(q, k, v, rel_h, rel_w) is None
    scale = d ** -0.5
    out, lse = K.forward(q, k, v, rel_h, rel_w, scale)
    got = OP.backward_onepass(dout, q, k, v, rel_h, rel_w, out, lse, scale, accum=accum, cfg=cfg)
    c64 = [t.double() for t in (q, k, v, rel_h, rel_w, dout)]
    out64, lse64 = reference.forward(*c64[:5], scale)
    ref = reference.backward(c64[5], *c64[:5], out64, lse64, scale)
    for name, g, r, like in zip(NAMES, got, ref, (q, k, v, rel_h, rel_w)):
        assert g.shape == r.shape and g.dtype == like.dtype, name
        assert torch.isfinite(g).all(), f"{name}: unwritten or non-finite"
        assert rel_err(g, r) < TOL[dtype], (name, rel_err(g, r))
    return got


# (batch, Nq, grid hk x wk, D, dtype): one grid row per key tile (wk 16), several (wk 8 -> R 2), a padded grid row
# (wk 12 -> 16), a partial last query block (Nq 40), Nq != Nk, a partial last key tile (hk 3 with R 2)
@pytest.mark.parametrize("accum", ["ordered", "atomic"])  # "tma": GPU only (the interpreter has no bulk reduce)
@pytest.mark.parametrize("b,n_q,hk,wk,d,dtype", [
    (2, 64, 4, 16, 16, torch.bfloat16),
    (1, 40, 3, 8, 32, torch.float16),
    (2, 48, 4, 12, 16, torch.bfloat16),
])
def test_onepass_matches_float64(b, n_q, hk, wk, d, dtype, accum):
    check(b, n_q, hk, wk, d, dtype, accum)


def test_onepass_ordered_same_bits_twice():
    a = check(1, 64, 4, 16, 16, torch.bfloat16, "ordered")
    b = check(1, 64, 4, 16, 16, torch.bfloat16, "ordered")
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_onepass_rejects_fp32_and_bad_accum():
    x = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt, device=DEVICE)  # noqa: E731
    assert "16-bit" in OP.unsupported_reason(*(x(1, 64, 16, dt=torch.float32),) * 3, x(1, 64, 8, dt=torch.float32),
                                             x(1, 64, 8, dt=torch.float32))
    with pytest.raises(ValueError, match="accum"):
        OP.backward_onepass(*(x(1, 64, 16),) * 4, x(1, 64, 8), x(1, 64, 8), x(1, 64, 16), x(1, 64), 0.25,
                            accum="fast")


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("accum", ["ordered", "atomic", "tma"])
@pytest.mark.parametrize("b,side", [(12, 64), (24, 32), (12, 56), (12, 14)])
def test_gpu_onepass_matches_float64(b, side, accum):
    a = check(b, side * side, side, side, 64, torch.bfloat16, accum)
    if accum == "ordered":  # rotated order on the GPU: the same bits again
        b2 = check(b, side * side, side, side, 64, torch.bfloat16, accum)
        assert all(torch.equal(x, y) for x, y in zip(a, b2))
