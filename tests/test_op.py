"""The op and its reference: numerics against the naive formula and float64, gradcheck, bad input."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import samhq_fx
from samhq_fx import reference

from helpers import grid_terms, rand_inputs, rel_err

SHAPES = [  # (batch*heads, query grid, key grid, head_dim)
    (2, (7, 7), (7, 7), 16),
    (3, (5, 9), (5, 9), 8),  # non-square grid
    (1, (1, 1), (1, 1), 4),  # a single token
    (2, (4, 6), (3, 5), 8),  # Nq != Nk
]


@pytest.mark.parametrize("b,gq,gk,d", SHAPES)
@pytest.mark.parametrize("block", [None, 7])  # 7 queries per block: N is never a multiple of it
def test_reference_matches_naive(b, gq, gk, d, block, monkeypatch):
    if block is not None:
        monkeypatch.setattr(reference, "query_block", lambda *_: block)
    q, k, v, rh, rw = rand_inputs(b, gq, gk, d, dtype=torch.float64, seed=b + d)
    scale = d**-0.5
    out, lse = reference.forward(q, k, v, rh, rw, scale)
    assert rel_err(out, reference.naive(q, k, v, rh, rw, scale)) < 1e-12
    s = (q * scale) @ k.transpose(-2, -1)
    s = (s.view(b, -1, gk[0], gk[1]) + rh[..., :, None] + rw[..., None, :]).flatten(-2)
    assert rel_err(lse, torch.logsumexp(s, -1)) < 1e-6  # lse is stored in fp32

    # backward against autograd through the naive formula, all five gradients
    dout = torch.randn_like(out)
    grads = reference.backward(dout, q, k, v, rh, rw, out, lse, scale)
    leaves = [t.detach().requires_grad_() for t in (q, k, v, rh, rw)]
    expected = torch.autograd.grad(reference.naive(*leaves, scale), leaves, dout)
    for name, got, ref in zip(("dq", "dk", "dv", "d_rel_h", "d_rel_w"), grads, expected):
        assert rel_err(got, ref) < 1e-6, name


def test_query_block_bounds_memory():
    # SAM-B global attention at B=4: 48 heads x 4096 keys; a block must stay O(block x N), not N x N.
    step = reference.query_block(48, 4096, 4096)
    assert 48 * step * 4096 <= reference._BLOCK_ELEMENTS
    assert 1 <= step < 4096


def test_gradcheck_float64():
    inputs = rand_inputs(2, (3, 4), (3, 4), 5, dtype=torch.float64, requires_grad=True, seed=1)
    assert torch.autograd.gradcheck(lambda *a: samhq_fx.rel_pos_attention(*a, scale=0.37), inputs)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_functional_api_against_float64(dtype, tol):
    inputs = rand_inputs(3, (5, 9), (5, 9), 16, dtype=dtype, requires_grad=True, seed=2)
    ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
    out = samhq_fx.rel_pos_attention(*inputs)  # default scale = D ** -0.5
    ref = reference.naive(*ref_inputs, 16**-0.5)
    assert out.dtype == dtype
    assert rel_err(out, ref) < tol
    dout = torch.randn_like(ref)
    for got, exp in zip(torch.autograd.grad(out, inputs, dout.to(dtype)), torch.autograd.grad(ref, ref_inputs, dout)):
        assert got.dtype == dtype
        assert rel_err(got, exp) < tol


def test_rel_terms_as_query_grid_through_the_op():
    # rel_h / rel_w as [B*heads, Hq, Wq, K] views (what the rewrite hands over): the same output as flat rows,
    # gradients in the terms' 4-D shapes, contiguous; opcheck for the fakes of both registrations
    inputs = rand_inputs(2, (3, 4), (3, 4), 8, requires_grad=True, seed=5)
    grid = [*inputs[:3], *grid_terms(inputs[3], inputs[4], 3, 4)]
    assert not grid[3].flatten(1, 2)._is_view()  # flattening it would copy
    out3 = samhq_fx.rel_pos_attention(*inputs, scale=0.4)
    out4 = samhq_fx.rel_pos_attention(*grid, scale=0.4)
    assert torch.equal(out3, out4)
    dout = torch.randn_like(out3)
    for g3, g4, t in zip(torch.autograd.grad(out3, inputs, dout), torch.autograd.grad(out4, grid, dout), grid):
        assert g4.shape == t.shape and g4.is_contiguous()
        assert torch.equal(g3.reshape(g4.shape), g4)
    for name in ("rel_pos_attention", "rel_pos_attention_inductor"):
        fwd, bwd = getattr(torch.ops.samhq, name), getattr(torch.ops.samhq, name + "_backward")
        args = [t.detach() for t in grid]
        torch.library.opcheck(fwd.default, (*args, 0.4))
        out, lse = fwd(*args, 0.4)
        torch.library.opcheck(bwd.default, (dout, *args, out, lse, 0.4))


@pytest.mark.parametrize("name", ["rel_pos_attention", "rel_pos_attention_inductor"])  # opaque, triton_op
def test_heads_last_output_and_its_gradients(name):
    # heads=3: out [B, N, heads, Dv] (the rewrite's choice where the model reads heads next to features), the values of
    # the heads-first output; gradients through it those of the heads-first op; bad heads named before any work
    fwd = getattr(torch.ops.samhq, name)
    inputs = rand_inputs(6, (3, 4), (3, 4), 8, requires_grad=True, seed=7)
    out, _ = fwd(*inputs, 0.4)
    out4, _ = fwd(*inputs, 0.4, 3)
    assert out4.shape == (2, 12, 3, 8) and out4.is_contiguous()
    assert torch.equal(out4, out.unflatten(0, (2, 3)).transpose(1, 2))
    dout = torch.randn_like(out)
    want = torch.autograd.grad(out, inputs, dout)
    got = torch.autograd.grad(out4, inputs, dout.unflatten(0, (2, 3)).transpose(1, 2))
    for name_, g, w in zip(("q", "k", "v", "rel_h", "rel_w"), got, want):
        assert torch.equal(g, w), name_
    args = [t.detach() for t in inputs]
    torch.library.opcheck(fwd.default, (*args, 0.4, 3))
    with pytest.raises(ValueError, match="`heads` must be an int >= 1 dividing q.shape"):
        fwd(*args, 0.4, 4)


def test_compiles_with_inductor_and_dynamic_batch():
    f = torch.compile(lambda *a: samhq_fx.rel_pos_attention(*a, scale=0.5), backend="inductor", dynamic=True)
    for b in (2, 3):
        inputs = rand_inputs(b, (3, 5), (3, 5), 8, requires_grad=True, seed=b)
        out = f(*inputs)
        ref = reference.naive(*[t.double() for t in inputs], 0.5)
        assert rel_err(out, ref) < 1e-5
        out.sum().backward()
        assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in inputs)


def _good():
    return rand_inputs(2, (3, 4), (3, 4), 8, seed=3)


@pytest.mark.parametrize(
    "mutate,error,words",
    [
        (lambda a: a.__setitem__(0, a[0][0]), ValueError, "`q` must be 3-D"),
        (lambda a: a.__setitem__(3, a[3][None, None]), ValueError, "`rel_h` must be 3-D .* or 4-D"),
        (lambda a: a.__setitem__(4, a[4].view(2, 4, 3, 4)[:, :3]), ValueError, "one row per query"),
        (lambda a: a.__setitem__(4, a[4][..., :3]), ValueError, "key grid"),
        (lambda a: a.__setitem__(3, a[3][:, :5]), ValueError, "one row per query"),
        (lambda a: a.__setitem__(2, a[2].double()), TypeError, "one dtype"),
        (lambda a: a.__setitem__(1, a[1].to("meta")), ValueError, "one device"),
        (lambda a: a.__setitem__(1, a[1][:1]), ValueError, r"same batch\*heads"),
        (lambda a: a.__setitem__(0, a[0].long()), TypeError, "dtype"),
        (lambda a: a.__setitem__(2, "v"), TypeError, "`v` must be a torch.Tensor"),
    ],
)
def test_bad_input_names_the_argument(mutate, error, words):
    args = _good()
    mutate(args)
    with pytest.raises(error, match=words):
        samhq_fx.rel_pos_attention(*args, scale=0.3)


def _strided(t):
    # the same values laid out as a permuted view, like q/k/v straight out of a qkv projection
    return t.detach().transpose(0, 1).contiguous().transpose(0, 1).requires_grad_(t.requires_grad)


@pytest.mark.parametrize("name", ["rel_pos_attention", "rel_pos_attention_inductor"])  # opaque, triton_op
def test_opcheck_with_strided_inputs(name):
    # Fake (meta) kernels must agree with the real ones on shapes, dtypes and strides for any input
    # layout; a fake that followed input strides broke Inductor's backward on the H200.
    fwd, bwd = getattr(torch.ops.samhq, name), getattr(torch.ops.samhq, name + "_backward")
    q, k, v, rh, rw = (_strided(t) for t in rand_inputs(3, (3, 4), (3, 4), 8, seed=4))
    assert not q.is_contiguous()
    torch.library.opcheck(fwd.default, (q, k, v, rh, rw, 0.3))
    out, lse = fwd(q, k, v, rh, rw, 0.3)
    dout = _strided(torch.randn_like(out))
    torch.library.opcheck(bwd.default, (dout, q, k, v, rh, rw, out, lse, 0.3))
    for g in bwd(dout, q, k, v, rh, rw, out, lse, 0.3):
        assert g.is_contiguous()


def test_kernel_failure_falls_back_to_reference_with_one_warning(monkeypatch, caplog):
    # Pretend the kernels apply on this device, and make them fail the way a Triton compile error would.
    from samhq_fx import op

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("CompilationError: simulated")

    monkeypatch.setattr(op, "_kernel_skip_reason", lambda *a: None)
    monkeypatch.setattr(op, "_kernels", type("K", (), {"forward": broken, "backward": broken}))
    monkeypatch.setattr(op, "_broken", set())
    inputs = rand_inputs(2, (3, 4), (3, 4), 8, requires_grad=True, seed=5)
    with caplog.at_level("WARNING", logger="samhq_fx"):
        for _ in range(2):  # training keeps going; the broken kernel is not retried
            out = samhq_fx.rel_pos_attention(*inputs, scale=0.3)
            out.sum().backward()
    assert rel_err(out, reference.naive(*[t.double() for t in inputs], 0.3)) < 1e-5
    assert all(torch.isfinite(t.grad).all() for t in inputs)
    assert len(calls) == 2  # forward and backward each failed once, then were not retried
    assert caplog.text.count("Triton kernel failed") == 2


def test_fallback_on_cuda_warns_once_per_reason(monkeypatch, caplog):
    # A CUDA caller asked for the fused kernels: the slow reference must be visible at the default log level.
    # No GPU needed: the level is decided from the device alone.
    from samhq_fx import op

    monkeypatch.setattr(op, "_warned", set())
    cuda = torch.device("cuda", 0)
    with caplog.at_level("INFO", logger="samhq_fx"):
        for _ in range(3):
            op._note_fallback("head dim above 128", cuda)
        op._note_fallback("key grid width 200 above 128", cuda)
    records = [r for r in caplog.records if "reference implementation" in r.getMessage()]
    assert [r.levelname for r in records] == ["WARNING", "WARNING"]  # once per distinct reason
    assert "head dim above 128" in records[0].getMessage()
    assert "key grid width 200" in records[1].getMessage()


def test_fallback_on_cpu_stays_info(monkeypatch, caplog):
    # On CPU the reference is the expected path: one INFO line, never a warning, however often the op runs.
    from samhq_fx import op

    monkeypatch.setattr(op, "_warned", set())
    inputs = rand_inputs(2, (3, 4), (3, 4), 8, seed=7)
    with caplog.at_level("INFO", logger="samhq_fx"):
        for _ in range(3):
            samhq_fx.rel_pos_attention(*inputs, scale=0.3)
    records = [r for r in caplog.records if "reference implementation" in r.getMessage()]
    assert [r.levelname for r in records] == ["INFO"]
    assert "cpu" in records[0].getMessage()


_NO_TRITON = """
import sys

class NoTriton:  # as if triton were not installed
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, NoTriton())
import torch
from samhq_fx import op

q, rh = torch.zeros(1, 4, 8), torch.zeros(1, 4, 2)
print(op._kernel_skip_reason(q, q, q, rh, rh))
print(op.HAS_INDUCTOR_VARIANT)
"""


def test_kernel_import_failure_names_what_failed():
    # The reason the reference runs says which import failed and how, not a guess at the cause.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _NO_TRITON], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reason, has_variant = proc.stdout.strip().splitlines()[-2:]
    assert reason == "the Triton kernels failed to import (ModuleNotFoundError: No module named 'triton')", reason
    assert has_variant == "False"


def test_backward_kernel_failure_keeps_the_forward_kernel(monkeypatch):
    # A backward that does not fit must not move the forward to the reference mid-run: its output bits
    # would change between the first step and the next.
    from samhq_fx import op

    fwd_calls = []

    def forward(*args, heads=1):
        fwd_calls.append(1)
        return reference.forward(*args)

    def broken(*args, **kwargs):
        raise RuntimeError("OutOfResources: simulated")

    monkeypatch.setattr(op, "_kernel_skip_reason", lambda *a: None)
    monkeypatch.setattr(op, "_kernels", type("K", (), {"forward": forward, "backward": broken}))
    monkeypatch.setattr(op, "_broken", set())
    inputs = rand_inputs(2, (3, 4), (3, 4), 8, requires_grad=True, seed=6)
    for _ in range(2):
        samhq_fx.rel_pos_attention(*inputs, scale=0.3).sum().backward()
    assert len(fwd_calls) == 2
    assert all(torch.isfinite(t.grad).all() for t in inputs)


def test_torch_export_keeps_the_op():
    # A module that calls the functional op exports with the fused op as one node and runs the same.
    class Attn(torch.nn.Module):
        def forward(self, q, k, v, rh, rw):
            return samhq_fx.rel_pos_attention(q, k, v, rh, rw, 0.25)

    args = tuple(rand_inputs(2, (3, 4), (3, 4), 8, seed=5))
    ep = torch.export.export(Attn(), args)
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert "samhq.rel_pos_attention.default" in targets, targets
    assert rel_err(ep.module()(*args), Attn()(*args)) < 1e-6


def test_reference_oom_names_the_shape_and_the_kernel_path(monkeypatch):
    def oom(*args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")

    monkeypatch.setattr(reference, "forward", oom)
    q, k, v, rh, rw = rand_inputs(2, (3, 4), (3, 4), 8, seed=3)
    with pytest.raises(torch.OutOfMemoryError, match=r"q \(2, 12, 8\).*key grid 3x4.*kernel path") as info:
        samhq_fx.rel_pos_attention(q, k, v, rh, rw)
    assert "no kernel for device cpu" in str(info.value) and "4.00 GiB" in str(info.value)


@pytest.mark.parametrize("poison", ["nan_q", "inf_k", "masked_row"])
def test_nonfinite_inputs_behave_as_eager(poison):
    # NaN / inf must propagate as in the eager formula, never turn into silent zeros (or vice versa).
    q, k, v, rh, rw = (t.requires_grad_() for t in rand_inputs(2, (3, 4), (3, 4), 8, seed=9))
    with torch.no_grad():
        if poison == "nan_q":
            q[0, 5, 2] = float("nan")  # one query row NaN
        elif poison == "inf_k":
            k[1, 7, 0] = float("inf")
        else:
            rh[1, 2] = float("-inf")  # every key masked for query 2 of batch 1: eager gives NaN there
            rh[0, 4, 1] = float("-inf")  # one key-grid row masked for query 4: finite
    got = samhq_fx.rel_pos_attention(q, k, v, rh, rw, 0.3)
    ref = reference.naive(q, k, v, rh, rw, 0.3)
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    fin = torch.isfinite(ref)
    assert fin.any() and torch.allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-6)
    dout = torch.randn_like(ref)
    g_got = torch.autograd.grad(got, (q, k, v, rh, rw), dout)
    g_ref = torch.autograd.grad(ref, (q, k, v, rh, rw), dout)
    for name, a, b in zip(("dq", "dk", "dv", "d_rel_h", "d_rel_w"), g_got, g_ref):
        assert torch.equal(torch.isnan(a), torch.isnan(b)), name


def test_eager_autograd_function_matches_the_custom_op():
    # On CUDA an eager call skips the custom op's dispatch (op._EagerRelPosAttention); same outputs and gradients
    from samhq_fx import op

    inputs = rand_inputs(2, (3, 4), (3, 4), 8, requires_grad=True, seed=11)
    dout = torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(12))
    fast = op._EagerRelPosAttention.apply(*inputs, 0.3)
    grads_fast = torch.autograd.grad(fast, inputs, dout)
    ref, _ = torch.ops.samhq.rel_pos_attention(*inputs, 0.3)
    grads_ref = torch.autograd.grad(ref, inputs, dout)
    torch.testing.assert_close(fast, ref, rtol=0, atol=0)
    for a, b in zip(grads_fast, grads_ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
