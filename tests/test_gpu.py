"""The backend on a CUDA GPU (run on the H200): Triton kernels inside Inductor graphs, end to end.

Skipped without CUDA (conftest). A SAM-HQ vision model with head_dim 64 (as ViT-B/L), windowed
(padded) and global layers; compiled with backend="samhq" against eager in float64.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from samhq_fx.models import random_init_, tiny_vision_config

from helpers import fresh_compile_state, rel_err

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import sol076  # noqa: E402

pytestmark = pytest.mark.gpu


def _model(impl="sdpa"):
    from transformers import SamHQVisionModel

    cfg = tiny_vision_config(
        impl, hidden_size=128, num_attention_heads=2, image_size=128, patch_size=8, window_size=7,
        global_attn_indexes=[1], num_hidden_layers=2, mlp_dim=256, output_channels=32,
    )  # 16x16 tokens: 7x7 windows over a padded 21x21 grid, then global 16x16; head_dim 64
    return random_init_(SamHQVisionModel(cfg), rel_pos_std=0.5).cuda()


def _run(model, fn, x, w):
    model.zero_grad(set_to_none=True)
    out = fn(x).last_hidden_state
    (out.float() * w).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.fixture(autouse=True)
def ieee_convs():
    # cuDNN convolutions default to TF32 whatever the matmul precision says; the patch embedding is
    # one, so without this "highest" would compare a TF32 model against float64 (rel. error ~7e-4).
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old


@pytest.fixture
def no_fallback(caplog):
    caplog.set_level(logging.INFO, logger="samhq_fx")
    yield
    assert "reference implementation" not in caplog.text, caplog.text


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize("precision,tol", [("highest", 1e-4), ("high", 2e-2)])
def test_vision_model_matches_float64(impl, precision, tol, no_fallback):
    fresh_compile_state()
    torch.set_float32_matmul_precision(precision)
    try:
        model = _model(impl)
        x = torch.randn(2, 3, 128, 128, device="cuda")
        w = torch.randn(2, 32, 16, 16, device="cuda")
        out, grads = _run(model, torch.compile(model, backend="samhq"), x, w)
        assert counters["samhq"]["fused"] == 2
        model64 = model.double()
        ref, ref_grads = _run(model64, model64, x.double(), w.double())
        assert rel_err(out, ref) < tol
        for name, g in grads.items():
            assert rel_err(g, ref_grads[name]) < 5 * tol, name
    finally:
        torch.set_float32_matmul_precision("highest")


def test_triton_op_variant_matches_float64(no_fallback):
    # samhq.triton_op: Inductor compiles and launches the kernels itself
    fresh_compile_state()
    torch.set_float32_matmul_precision("high")
    try:
        model = _model("sdpa")
        x = torch.randn(2, 3, 128, 128, device="cuda")
        w = torch.randn(2, 32, 16, 16, device="cuda")
        f = torch.compile(model, backend="samhq", options={"samhq.triton_op": True})
        out, grads = _run(model, f, x, w)
        assert counters["samhq"]["fused"] == 2
        model64 = model.double()
        ref, ref_grads = _run(model64, model64, x.double(), w.double())
        assert rel_err(out, ref) < 2e-2
        for name, g in grads.items():
            assert rel_err(g, ref_grads[name]) < 1e-1, name
    finally:
        torch.set_float32_matmul_precision("highest")


def test_triton_op_auto_across_image_sizes_matches_float64(no_fallback):
    # "auto": Inductor-launched kernels for the static first size, the opaque op once sizes are symbolic
    fresh_compile_state()
    torch.set_float32_matmul_precision("high")
    try:
        layer = torch.compile(sol076.attention_layer, backend="samhq", options={"samhq.triton_op": "auto"})
        for i, (h, w) in enumerate([(14, 14), (16, 12), (9, 20)]):
            grad_output, *inputs = sol076.make_inputs(h, w, 2, device="cuda", generator=torch.Generator().manual_seed(i))
            got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
            ref = sol076.float64_gradients(grad_output, *inputs)
            for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
                assert rel_err(g, r) < 1e-2, (h, w, name)
        assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_training_matches_fp32(dtype, no_fallback):
    fresh_compile_state()
    model = _model("sdpa")
    x = torch.randn(2, 3, 128, 128, device="cuda")
    w = torch.randn(2, 32, 16, 16, device="cuda")
    ref, ref_grads = _run(model, model, x, w)
    with torch.autocast("cuda", dtype=dtype):
        out, grads = _run(model, torch.compile(model, backend="samhq"), x, w)
    assert counters["samhq"]["fused"] == 2
    assert rel_err(out, ref) < 5e-2
    for name in ("vision_encoder.layers.1.attn.rel_pos_h", "vision_encoder.layers.0.attn.qkv.weight"):
        assert grads[name].dtype == torch.float32  # parameter dtype
        assert rel_err(grads[name], ref_grads[name]) < 1e-1, name


def test_reduce_overhead_mode_runs_cuda_graphs(no_fallback):
    fresh_compile_state()
    model = _model("sdpa")
    f = torch.compile(model, backend="samhq", mode="reduce-overhead")
    w = torch.randn(2, 32, 16, 16, device="cuda")
    for step in range(3):
        x = torch.randn(2, 3, 128, 128, device="cuda")
        torch.compiler.cudagraph_mark_step_begin()
        # gradients must be fresh each step: accumulating into last step's would read a CUDA graph
        # output that this step's replay overwrote
        out, grads = _run(model, f, x, w)
        ref, ref_grads = _run(model, model, x, w)
        assert rel_err(out, ref) < 1e-4
        for name in ("vision_encoder.layers.1.attn.rel_pos_h", "vision_encoder.layers.0.attn.qkv.weight"):
            assert rel_err(grads[name], ref_grads[name]) < 1e-3, name
    assert counters["samhq"]["fused"] == 2


def test_training_step_is_deterministic(no_fallback):
    fresh_compile_state()
    model = _model("sdpa")
    f = torch.compile(model, backend="samhq")
    x = torch.randn(2, 3, 128, 128, device="cuda")
    w = torch.randn(2, 32, 16, 16, device="cuda")
    _, g1 = _run(model, f, x, w)
    _, g2 = _run(model, f, x, w)
    for name in g1:
        if "attn" in name:  # the fused op's gradients and everything upstream of them
            assert torch.equal(g1[name], g2[name]), name


def test_training_runs_are_bitwise_reproducible(no_fallback):
    # Two runs of 3 SGD steps from the same weights and data end in the same bits. cuDNN (the patch
    # embedding) is put in its deterministic mode; the fused op is deterministic by construction.
    old = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    try:
        finals = []
        for _ in range(2):
            fresh_compile_state()
            model = _model("sdpa")  # same seed, same weights
            f = torch.compile(model, backend="samhq")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            g = torch.Generator(device="cuda").manual_seed(3)
            for _ in range(3):
                x = torch.randn(2, 3, 128, 128, device="cuda", generator=g)
                w = torch.randn(2, 32, 16, 16, device="cuda", generator=g)
                _run(model, f, x, w)
                opt.step()
            assert counters["samhq"]["fused"] == 2
            finals.append({n: p.detach().clone() for n, p in model.named_parameters()})
        for name in finals[0]:
            assert torch.equal(finals[0][name], finals[1][name]), name
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = old


def test_host_indices_remove_the_host_syncs(no_fallback):
    # samhq.host_indices (the default): SAM's rel-pos table indices (torch.arange on the host) are built on the GPU, so a
    # compiled forward + backward runs without one host synchronization (it had two per table per step:
    # the gather's index copy and the backward index_put_'s), computes the same gradients, and the tables'
    # gradients (samhq::index_rows, not an atomic scatter) keep the same bits from run to run.
    fresh_compile_state()
    torch.set_float32_matmul_precision("highest")
    model = _model("eager")
    x = torch.randn(2, 3, 128, 128, device="cuda")
    w = torch.randn(2, 32, 16, 16, device="cuda")
    out0, g0 = _run(model, torch.compile(model, backend="samhq", options={"samhq.host_indices": False}), x, w)
    fresh_compile_state()
    f = torch.compile(model, backend="samhq")
    _run(model, f, x, w)  # compiles (which may synchronize)
    assert counters["samhq"]["host_indices"] == 8  # 2 layers x (rel_pos_h, rel_pos_w) x 2 aranges
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out1, g1 = _run(model, f, x, w)
        _, g2 = _run(model, f, x, w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert rel_err(out1, out0) < 1e-6
    for name in g0:
        assert rel_err(g1[name], g0[name]) < 1e-5, name
        if "rel_pos" in name:
            assert torch.equal(g1[name], g2[name]), name
