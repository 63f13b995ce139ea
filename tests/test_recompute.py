"""samhq.recompute_copies (samhq_fx/recompute.py): which copies of q the pass tags, and what the tags change in a
compiled SAM encoder (fewer bytes saved for the backward, the same outputs and gradients)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import CheckpointPolicy

from samhq_fx.recompute import RecomputeRelCopies, rel_pos_copies

from helpers import fresh_compile_state, no_compile_caches, rel_err

aten = torch.ops.aten


def _foreign_kernel(x_ptr):  # a Triton kernel of another library: its calls are not the fused op
    pass


def _einsum_graph(sink: str, training: bool = True) -> tuple[torch.fx.Graph, dict]:
    """A joint graph as AOTAutograd writes SAM's rel_h einsum: q [B*heads, h*w, c] -> a permuted copy [h, B*w, c]
    -> bmm with the table -> a view into `sink` ("samhq": the fused op; "triton": a call of its Triton kernels, as
    the triton_op registration is traced; "foreign": another library's Triton kernel; "add": attention left
    unfused), q into the sink as well. Also a copy of another tensor feeding a bmm into the same sink, and in the
    backward (after a tangent; training=False: an inference graph, none) the same einsum pattern into the sink's
    backward."""
    import triton
    from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

    from samhq_fx.kernels import forward

    g = torch.fx.Graph()
    q, k, table, other, tangent = (g.placeholder(n) for n in ("q", "k", "table", "other",
                                                              "tangents_1" if training else "x"))

    def call(*args):
        if sink == "samhq":
            return g.call_function(torch.ops.samhq.rel_pos_attention.default, args)
        if sink in ("triton", "foreign"):
            kernel = forward._fwd_kernel if sink == "triton" else triton.jit(_foreign_kernel)
            return g.call_function(torch.ops.higher_order.triton_kernel_wrapper_functional, (), dict(
                kernel_idx=kernel_side_table.add_kernel(kernel), constant_args_idx=0, grid=[(1, 1, 1)],
                tma_descriptor_metadata={}, kwargs={f"a{i}": a for i, a in enumerate(args)}, tensors_to_clone=[]))
        return g.call_function(aten.add.Tensor, args[:2])

    def rel_term(x):  # view -> bmm with the table -> view: SAM's einsum as AOTAutograd lowers it
        return g.call_function(aten.view.default, (g.call_function(aten.bmm.default, (
            g.call_function(aten.view.default, (x, [4, 2, 8])), table)), [2, 16, 4]))

    copy = g.call_function(aten.clone.default, (g.call_function(aten.permute.default, (q, [1, 0, 2])),))
    foreign = g.call_function(aten.clone.default, (g.call_function(aten.permute.default, (other, [1, 0, 2])),))
    out = call(q, rel_term(copy), k, k, g.call_function(aten.bmm.default, (foreign, table)))
    back = g.call_function(aten.clone.default, (g.call_function(aten.permute.default, (tangent, [1, 0, 2])),))
    grad = call(tangent, rel_term(back), q, k)  # the backward: the same pattern, from the tangent into the op
    g.output((out, grad))
    return g, dict(copy=copy, foreign=foreign, back=back)


@pytest.mark.parametrize("sink", ["samhq", "triton"])
def test_tags_the_copy_of_q_that_a_fused_rel_pos_einsum_reads(sink):
    g, nodes = _einsum_graph(sink)
    assert rel_pos_copies(g) == [nodes["copy"]]  # not a copy of another tensor, nor one in the backward
    RecomputeRelCopies()(g)
    assert nodes["copy"].meta["recompute"] == CheckpointPolicy.MUST_RECOMPUTE
    assert "recompute" not in nodes["foreign"].meta and "recompute" not in nodes["back"].meta


@pytest.mark.parametrize("sink", ["add", "foreign"])
def test_leaves_einsums_of_attention_it_did_not_fuse(sink):
    g, _ = _einsum_graph(sink)
    assert rel_pos_copies(g) == []


def test_leaves_inference_graphs_alone():
    # no tangents: nothing is partitioned or saved, and nothing is counted
    from torch._dynamo.utils import counters

    g, nodes = _einsum_graph("samhq", training=False)
    before = counters["samhq"]["recomputed_copies"]
    RecomputeRelCopies()(g)
    assert "recompute" not in nodes["copy"].meta and counters["samhq"]["recomputed_copies"] == before


def test_keeps_the_tag_an_activation_checkpoint_policy_gave():
    g, nodes = _einsum_graph("samhq")
    nodes["copy"].meta["recompute"] = CheckpointPolicy.MUST_SAVE
    RecomputeRelCopies()(g)
    assert nodes["copy"].meta["recompute"] == CheckpointPolicy.MUST_SAVE


def test_uuid_is_stable_bytes():
    assert RecomputeRelCopies().uuid() == RecomputeRelCopies().uuid() and isinstance(RecomputeRelCopies().uuid(), bytes)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_recomputed_copies_save_less_with_the_same_results(device, monkeypatch):
    # the tiny SAM-HQ encoder (a window layer: 1 copy; a global layer: 2) under Inductor: less saved for the
    # backward, bit-identical outputs, gradients within rounding (a recomputed copy feeds the bmm afresh). On CUDA
    # the fused op is the triton_op registration, which the joint graph holds as Triton kernel calls
    pytest.importorskip("transformers")
    import os

    from torch._dynamo.utils import counters
    from transformers import SamHQVisionModel

    from samhq_fx.models import random_init_, tiny_vision_config

    monkeypatch.syspath_prepend(os.path.join(os.path.dirname(__file__), "..", "benchmarks", "tools"))
    from saved_activations import saved_bytes

    model = random_init_(SamHQVisionModel(tiny_vision_config("eager")), rel_pos_std=0.5).to(device)
    x = torch.randn(1, 3, model.config.image_size, model.config.image_size, device=device)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    got = {}
    for on in (False, True):
        fresh_compile_state()
        compiled = torch.compile(model, backend="samhq", options={"samhq.recompute_copies": on})
        with no_compile_caches():
            out, _, rest = saved_bytes(compiled, x, params)
        model.zero_grad()
        out.last_hidden_state.pow(2).mean().backward()
        assert counters["samhq"]["fused"] == 2
        assert counters["samhq"]["recomputed_copies"] == (3 if on else 0)
        got[on] = rest, out.last_hidden_state.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    (rest_off, out_off, grads_off), (rest_on, out_on, grads_on) = got[False], got[True]
    assert 0 < rest_on < rest_off, (rest_on, rest_off)
    assert torch.equal(out_on, out_off) if device == "cpu" else rel_err(out_on, out_off) < 1e-6
    for name, grad in grads_off.items():
        assert rel_err(grads_on[name], grad) < (1e-6 if device == "cpu" else 1e-3), name
