"""The TMA + warp-specialized Hopper experiments, kernels/forward_tma.py and backward_tma.py (dK/dV), against
the float64 oracle, alone and switched into the op's host functions (rel_pos_attention.FWD_TMA / DKDV_TMA);
and the Gluon forward and dQ (kernels/forward_gluon.py, backward_gluon.py; FWD_GLUON, DQ_GLUON), GPU only (Gluon
has no interpreter) except their input checks and the dQ's fallback.

On CPU (CI) under TRITON_INTERPRET=1, where descriptors are emulated and `warp_specialize` is ignored, so
these check the kernels' arithmetic and their TMA boxes (zero-filled padded key columns, query rows past
Nq, several query blocks, key rows past the first rel_h group); the `gpu` tests run the compiled kernels,
with and without warp specialization, on the SAM-B global layer and 076 grids. Outputs are poisoned with
NaN before the kernels write them.
"""

from __future__ import annotations

import pytest
import torch

try:
    from samhq_fx.kernels import backward_tma as BT
    from samhq_fx.kernels import forward_tma as T
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root
    from kernels import backward_tma as BT
    from kernels import forward_tma as T
    from kernels import rel_pos_attention as K
from samhq_fx import reference
from test_kernels import DEVICE, make_inputs, rel_err, run_and_check

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
def test_forward_matches_float64(b, n_q, hk, wk, d, dv, dtype, block_m):
    check(b, n_q, hk, wk, d, dv, dtype, block_m=block_m)


def test_forward_unsupported_reason_names_the_shape():
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
def test_gpu_forward_matches_float64_and_forward(b, side, ws):
    if ws and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warp specialization of this kernel is for sm_90")
    out, lse = check(b, side * side, side, side, 64, 64, torch.bfloat16, ws=ws)
    q, k, v, rel_h, rel_w, _ = make_inputs(b, side * side, side, side, 64, 64, torch.bfloat16,
                                           seed=b * 1000 + side * side + 64)
    ref_out, ref_lse = K.forward(q, k, v, rel_h, rel_w, 64 ** -0.5)
    assert (lse - ref_lse).abs().max() < 1e-3
    assert rel_err(out, ref_out) < 1e-2


def inputs_and_float64_grads(b, n_q, hk, wk, d, dtype, seed):
    """Random inputs (q, k, v, rel_h, rel_w, dout), the float64 lse, delta and the five gradients."""
    ins = make_inputs(b, n_q, hk, wk, d, d, dtype, seed=seed)
    c64 = [t.double() for t in ins]
    out64, lse64 = reference.forward(*c64[:5], d ** -0.5)
    grads64 = reference.backward(c64[5], *c64[:5], out64, lse64, d ** -0.5)
    return ins, lse64.float(), (c64[5] * out64).sum(-1).float(), grads64


def assert_close(names, got, ref, dtype):
    for name, g, r in zip(names, got, ref):
        assert g.dtype == dtype and torch.isfinite(g).all(), f"{name}: unwritten or non-finite"
        assert rel_err(g, r) < TOL[dtype], (name, rel_err(g, r))


def check_dkdv(b, n_q, hk, wk, d, dtype, **kw):
    (q, k, v, rel_h, rel_w, dout), lse, delta, grads64 = inputs_and_float64_grads(b, n_q, hk, wk, d, dtype,
                                                                                   7 * b + hk * wk + d)
    assert BT.unsupported_reason(q, k, v, rel_h, rel_w) is None
    got = BT.dkdv_tma(dout, q, k, v, rel_h, rel_w, lse, delta, d ** -0.5, **kw)
    assert_close(("dk", "dv"), got, grads64[1:3], dtype)


# (batch, Nq, grid hk x wk, D, dtype, block_m): R = 128 / wk grid rows per key tile (8, 4, 2), a partial last
# query block (Nq 40), Nq != Nk, key rows in the second rel_h^T group (hk 32)
@pytest.mark.parametrize("b,n_q,hk,wk,d,dtype,block_m", [
    (2, 64, 8, 16, 16, torch.bfloat16, 16),
    (1, 40, 4, 32, 16, torch.float16, 16),
    (1, 64, 2, 64, 32, torch.bfloat16, 32),
    (2, 48, 32, 16, 16, torch.bfloat16, 32),
])
def test_dkdv_matches_float64(b, n_q, hk, wk, d, dtype, block_m):
    check_dkdv(b, n_q, hk, wk, d, dtype, block_m=block_m)


def test_dkdv_unsupported_reason_names_the_shape():
    x = lambda *s: torch.zeros(*s, dtype=torch.bfloat16)  # noqa: E731
    assert "Wk=8" in BT.unsupported_reason(x(1, 64, 16), x(1, 64, 16), x(1, 64, 16), x(1, 64, 8), x(1, 64, 8))
    assert "Hk=3" in BT.unsupported_reason(x(1, 48, 16), x(1, 48, 16), x(1, 48, 16), x(1, 48, 3), x(1, 48, 16))
    assert "16-bit" in BT.unsupported_reason(*(t.float() for t in (x(1, 64, 16),) * 3), x(1, 64, 4), x(1, 64, 16))


SWITCHES = {"FWD_TMA": (T, "forward_tma"), "DQ_TMA": (BT, "dq_tma"), "DKDV_TMA": (BT, "dkdv_tma")}


def switch_on(switch, monkeypatch) -> list:
    """Turn the op's switch on and record each call of the TMA host function it routes to."""
    module, name = SWITCHES[switch]
    calls, fn = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    monkeypatch.setattr(K, switch, True)
    return calls


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_switched_into_the_op_all_outputs_match_float64(switch, monkeypatch):
    # through K.forward / K.backward: out, lse and all five gradients (dQ's delta feeds the TMA dK/dV; the
    # TMA dQ gets delta from a torch reduction, which the shipped dK/dV then reads)
    calls = switch_on(switch, monkeypatch)
    q, k, v, rel_h, rel_w, dout = make_inputs(1, 64, 8, 16, 16, 16, torch.bfloat16, seed=3)
    run_and_check(q, k, v, rel_h, rel_w, dout, 2e-2)
    assert calls == [1]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("b,side", [(12, 64), (48, 32), (384, 16)])
def test_gpu_dkdv_matches_float64(b, side, ws):
    if ws and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warp specialization of this kernel is for sm_90")
    check_dkdv(b, side * side, side, side, 64, torch.bfloat16, ws=ws)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("switch", list(SWITCHES))
def test_gpu_switched_into_the_op(switch, monkeypatch):
    calls = switch_on(switch, monkeypatch)
    q, k, v, rel_h, rel_w, dout = make_inputs(12, 4096, 64, 64, 64, 64, torch.bfloat16, seed=5)
    run_and_check(q, k, v, rel_h, rel_w, dout, 2e-2)
    assert calls == [1]


def check_dq(b, n_q, hk, wk, d, dtype, **kw):
    (q, k, v, rel_h, rel_w, dout), lse, delta, grads64 = inputs_and_float64_grads(b, n_q, hk, wk, d, dtype,
                                                                                   11 * b + hk * wk + d)
    assert BT.dq_unsupported_reason(q, k, v, rel_h, rel_w) is None
    got = BT.dq_tma(dout, q, k, v, rel_h, rel_w, lse, delta, d ** -0.5, **kw)
    assert_close(("dq", "d_rel_h", "d_rel_w"), got, (grads64[0], *grads64[3:]), dtype)


# (batch, Nq, grid hk x wk, D, dtype, block_m): padded key tiles (wk 8 -> 16, 24 -> 32), partial last query
# blocks (Nq 40, 96, 48), d_rel_h past the first 16 key rows (hk 16, 24)
@pytest.mark.parametrize("b,n_q,hk,wk,d,dtype,block_m", [
    (2, 64, 8, 16, 16, torch.bfloat16, 16),
    (1, 40, 8, 8, 16, torch.float16, 16),
    (1, 96, 16, 24, 32, torch.bfloat16, 64),
    (2, 48, 24, 16, 16, torch.bfloat16, 32),
])
def test_dq_matches_float64(b, n_q, hk, wk, d, dtype, block_m):
    check_dq(b, n_q, hk, wk, d, dtype, block_m=block_m)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("ws", [False, True])
@pytest.mark.parametrize("b,side", [(12, 64), (48, 32), (12, 48), (384, 16)])
def test_gpu_dq_matches_float64(b, side, ws):
    if ws and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("warp specialization of this kernel is for sm_90")
    check_dq(b, side * side, side, side, 64, torch.bfloat16, ws=ws)


# ---- the Gluon forward (forward_gluon.py): no CPU interpreter, so only its input checks run in CI
def test_gluon_forward_unsupported_reason_names_the_shape():
    G = pytest.importorskip("samhq_fx.kernels.forward_gluon")
    x = lambda *s, dt=torch.bfloat16: torch.zeros(*s, dtype=dt)  # noqa: E731
    ok = (x(1, 128, 64), x(1, 128, 64), x(1, 128, 64), x(1, 128, 2), x(1, 128, 64))
    assert "fp16 / bf16" in G.unsupported_reason(*(t.float() for t in ok[:3]), *ok[3:])
    assert "head dim" in G.unsupported_reason(x(1, 128, 32), x(1, 128, 32), x(1, 128, 32), *ok[3:])
    assert "64 wide" in G.unsupported_reason(*ok[:3], x(1, 128, 4), x(1, 128, 32))
    assert "multiple" in G.unsupported_reason(x(1, 100, 64), *ok[1:3], x(1, 100, 2), x(1, 100, 64))
    assert "contiguous" in G.unsupported_reason(x(1, 64, 128).transpose(1, 2), *ok[1:])
    assert "Hopper" in G.unsupported_reason(*ok)  # CPU tensors


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("p_smem,schedule,maxnreg", [(False, "p_ahead", None), (True, "p_ahead", None),
                                                     (False, "s_ahead", None), (False, "s_ahead", 168)])
@pytest.mark.parametrize("b,hk", [(12, 64), (2, 7), (48, 64), (3, 4)])
def test_gpu_gluon_forward_matches_float64_and_forward(b, hk, p_smem, schedule, maxnreg, monkeypatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward is for sm_90")
    from samhq_fx.kernels import forward_gluon as G

    monkeypatch.setattr(G, "P_SMEM", p_smem)
    monkeypatch.setattr(G, "SCHEDULE", schedule)
    monkeypatch.setattr(G, "MAXNREG", maxnreg)
    if schedule == "s_ahead" and hk % 2:
        assert "even" in G.unsupported_reason(*make_inputs(b, hk * 64, hk, 64, 64, 64, torch.bfloat16)[:5])
        return

    q, k, v, rel_h, rel_w, _ = make_inputs(b, hk * 64, hk, 64, 64, 64, torch.bfloat16, seed=b + hk)
    assert G.unsupported_reason(q, k, v, rel_h, rel_w) is None
    out, lse = G.forward_gluon(q, k, v, rel_h, rel_w, 0.125)
    out64, lse64 = reference.forward(*(t.double() for t in (q, k, v, rel_h, rel_w)), 0.125)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all(), "unwritten or non-finite output"
    assert rel_err(out, out64) < TOL[torch.bfloat16] and rel_err(lse, lse64) < 1e-4
    ref_out, ref_lse = K.forward(q, k, v, rel_h, rel_w, 0.125)
    assert (lse - ref_lse).abs().max() < 1e-3 and rel_err(out, ref_out) < 1e-2


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_gpu_gluon_switched_into_the_op(monkeypatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon forward is for sm_90")
    from samhq_fx.kernels import forward_gluon as G

    calls, fn = [], G.forward_gluon
    monkeypatch.setattr(G, "forward_gluon", lambda *a, **kw: calls.append(1) or fn(*a, **kw))
    monkeypatch.setattr(K, "FWD_GLUON", True)
    q, k, v, rel_h, rel_w, dout = make_inputs(12, 4096, 64, 64, 64, 64, torch.bfloat16, seed=5)
    run_and_check(q.contiguous(), k, v, rel_h, rel_w, dout, 2e-2)
    assert calls == [1]


def test_gluon_dq_that_fails_to_build_falls_back_with_one_log_line(monkeypatch, caplog):
    # a ptxas crash (seen offline with ptxas 12.8 on some shapes) must not stop training: the Triton dQ runs
    BG = pytest.importorskip("samhq_fx.kernels.backward_gluon")

    def crash(*args):
        raise RuntimeError("PTXAS error: `ptxas` failed with error code -11")

    monkeypatch.setattr(BG, "unsupported_reason", lambda *a: None)
    monkeypatch.setattr(BG, "dq_gluon", crash)
    monkeypatch.setattr(K, "DQ_GLUON", True)
    q, k, v, rel_h, rel_w, dout = make_inputs(1, 64, 8, 16, 16, 16, torch.bfloat16, seed=4)
    with caplog.at_level("WARNING", logger="samhq_fx"):
        run_and_check(q, k, v, rel_h, rel_w, dout, 2e-2)
    assert len([r for r in caplog.records if "did not run" in r.getMessage()]) == 1


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
@pytest.mark.parametrize("b,hk", [(12, 64), (2, 6), (48, 64)])
def test_gpu_gluon_dq_matches_float64(b, hk):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon dQ is for sm_90")
    from samhq_fx.kernels import backward_gluon as BG

    # scale = 64 ** -0.5 = 0.125, as inputs_and_float64_grads uses
    (q, k, v, rel_h, rel_w, dout), lse, delta, grads64 = inputs_and_float64_grads(b, hk * 64, hk, 64, 64,
                                                                                   torch.bfloat16, 7 * b + hk)
    dout = dout.contiguous()
    out, _ = K.forward(q, k, v, rel_h, rel_w, 0.125)
    assert BG.unsupported_reason(q, k, v, rel_h, rel_w, dout, out) is None
    dq, drh, drw, got_delta = BG.dq_gluon(dout, q, k, v, rel_h, rel_w, out, lse, 0.125)
    assert torch.isfinite(got_delta).all() and rel_err(got_delta, delta) < 1e-2
    assert_close(("dq", "d_rel_h", "d_rel_w"), (dq, drh, drw), (grads64[0], *grads64[3:]), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_gpu_gluon_dq_switched_into_the_op(monkeypatch):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon dQ is for sm_90")
    from samhq_fx.kernels import backward_gluon as BG

    calls, fn = [], BG.dq_gluon
    monkeypatch.setattr(BG, "dq_gluon", lambda *a: calls.append(1) or fn(*a))
    monkeypatch.setattr(K, "DQ_GLUON", True)
    q, k, v, rel_h, rel_w, dout = make_inputs(12, 4096, 64, 64, 64, 64, torch.bfloat16, seed=5)
    run_and_check(q, k, v, rel_h, rel_w, dout.contiguous(), 2e-2)
    assert calls == [1]
