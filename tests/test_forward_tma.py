"""kernels/forward_tma.py (the TMA + warp-specialized Hopper forward experiment) against the float64 oracle.

On CPU (CI) under TRITON_INTERPRET=1, where descriptors are emulated and `warp_specialize` is ignored, so
these check the kernel's arithmetic and its TMA boxes (zero-filled padded key columns, query rows past Nq,
several query blocks); the `gpu` test runs the compiled kernel, with and without warp specialization,
on the SAM-B global layer and 076 grids. Outputs are poisoned with NaN before the kernel writes them.
"""

from __future__ import annotations

import pytest
import torch

try:
    from samhq_fx.kernels import forward_tma as T
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root
    from kernels import forward_tma as T
    from kernels import rel_pos_attention as K
from samhq_fx import reference
from test_kernels import DEVICE, make_inputs, rel_err

TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)


def check(b, n_q, hk, wk, d, dv, dtype, **kw):
    q, k, v, rel_h, rel_w, _ = make_inputs(b, n_q, hk, wk, d, dv, dtype, seed=b * 1000 + hk * wk + d)
    assert T.unsupported_reason(q, k, v, rel_h, rel_w) is None
    scale = d ** -0.5
    out, lse = T.forward_tma(q, k, v, rel_h, rel_w, scale, **kw)
    out64, lse64 = reference.forward(*(t.double() for t in (q, k, v, rel_h, rel_w)), scale)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "unwritten or non-finite output"
    assert rel_err(out, out64) < TOL[dtype], rel_err(out, out64)
    assert rel_err(lse, lse64) < 1e-4, rel_err(lse, lse64)
    return out, lse


# (batch, Nq, grid hk x wk, D, Dv, dtype, block_m): a padded key tile (wk 8 -> 16, 24 -> 32), a partial last
# query block (Nq 40, 72, 96), Nq != Nk, Dv != D, key rows past the first rel_h column group (hk 16)
@pytest.mark.parametrize("b,n_q,hk,wk,d,dv,dtype,block_m", [
    (2, 64, 8, 8, 16, 16, torch.bfloat16, 32),
    (3, 40, 8, 8, 32, 32, torch.bfloat16, 16),
    (1, 72, 8, 24, 16, 32, torch.float16, 32),
    (2, 96, 16, 8, 16, 16, torch.bfloat16, 64),
    (1, 256, 16, 16, 64, 64, torch.bfloat16, 64),
])
def test_matches_float64(b, n_q, hk, wk, d, dv, dtype, block_m):
    check(b, n_q, hk, wk, d, dv, dtype, block_m=block_m)


def test_unsupported_reason_names_the_shape():
    x = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt)  # noqa: E731
    assert "16-bit" in T.unsupported_reason(x(1, 64, 16, dt=torch.float32), x(1, 64, 16), x(1, 64, 16),
                                            x(1, 64, 8), x(1, 64, 8))
    assert "Wk=14" in T.unsupported_reason(x(1, 196, 16), x(1, 196, 16), x(1, 196, 16), x(1, 196, 14), x(1, 196, 14))
    assert "D=80" in T.unsupported_reason(x(1, 64, 80), x(1, 64, 80), x(1, 64, 80), x(1, 64, 8), x(1, 64, 8))
    assert "grid" in T.unsupported_reason(x(1, 64, 16), x(1, 60, 16), x(1, 60, 16), x(1, 64, 8), x(1, 64, 8))


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("b,side", [(12, 64), (48, 32), (12, 48), (12, 56), (384, 16)])
def test_gpu_matches_float64_and_forward(b, side, ws):
    if ws and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warp specialization of this kernel is for sm_90")
    out, lse = check(b, side * side, side, side, 64, 64, torch.bfloat16, ws=ws)
    q, k, v, rel_h, rel_w, _ = make_inputs(b, side * side, side, side, 64, 64, torch.bfloat16,
                                           seed=b * 1000 + side * side + 64)
    ref_out, ref_lse = K.forward(q, k, v, rel_h, rel_w, 64 ** -0.5)
    assert (lse - ref_lse).abs().max() < 1e-3
    assert rel_err(out, ref_out) < 1e-2
