"""The host-index pass (samhq.host_indices): index tensors built with torch.arange on the host, for a tensor
on another device, are built on that device instead; anything else is left alone.

CPU-only: the "other device" is `meta` here (the GPU test in test_gpu.py checks CUDA and the missing syncs).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from samhq_fx.host_indices import move_host_indices
from samhq_fx.patterns.fx_utils import value

from helpers import fresh_compile_state


def _graph(fn, *args):
    """fn's Dynamo graph (one, fullgraph)."""
    graphs = []

    def grab(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    fresh_compile_state()
    torch.compile(fn, backend=grab, fullgraph=True)(*args)
    return graphs[0]


def rel_pos_gather(table):
    # SAM's get_rel_pos: indices from torch.arange without a device
    q = torch.arange(3)[:, None] * 1.0
    k = torch.arange(3)[None, :] * 1.0
    return table[((q - k) + 2.0).long()]


def _aranges(gm):
    return [n for n in gm.graph.nodes if n.target is torch.arange]


def test_builds_rel_pos_indices_on_the_indexed_tensors_device():
    table = torch.randn(5, 4, device="meta")
    gm = _graph(rel_pos_gather, table)
    assert move_host_indices(gm.graph) == 2
    gm.recompile()
    assert [n.kwargs["device"] for n in _aranges(gm)] == [torch.device("meta")] * 2
    gather = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
    index = gather.args[1]
    assert value(index).device.type == "meta" and value(index).dtype == torch.int64  # fake values follow
    assert gather.target is torch.ops.samhq.index_rows.default  # its backward stays deterministic
    (out,) = gm(table)
    assert out.shape == (3, 3, 4) and out.device.type == "meta"
    assert counters["samhq"]["host_indices"] == 2


def test_a_cpu_table_is_left_alone():
    table = torch.randn(5, 4)
    gm = _graph(rel_pos_gather, table)
    assert move_host_indices(gm.graph) == 0
    assert all("device" not in n.kwargs for n in _aranges(gm))


def test_indices_with_another_use_stay_on_the_host():
    # the index is also returned: moving it would change an output's device
    def gather_and_return_index(table):
        idx = (torch.arange(3)[:, None] - torch.arange(3)[None, :] + 2).long()
        return table[idx], idx

    gm = _graph(gather_and_return_index, torch.randn(5, 4, device="meta"))
    assert move_host_indices(gm.graph) == 0


@pytest.mark.parametrize("case", ["explicit_cpu", "from_input"])
def test_indices_not_made_from_bare_aranges_stay_on_the_host(case):
    def explicit_cpu(table, offsets):
        return table[torch.arange(3, device="cpu") + 1]

    def from_input(table, offsets):
        return table[torch.arange(3) + offsets]  # offsets: a CPU input, the caller's choice

    fn = {"explicit_cpu": explicit_cpu, "from_input": from_input}[case]
    gm = _graph(fn, torch.randn(5, 4, device="meta"), torch.ones(3, dtype=torch.long))
    assert move_host_indices(gm.graph) == 0


def test_other_index_forms_stay_on_the_host():
    # only the plain row gather table[idx] is swapped for index_rows; a column gather keeps its host index
    def column_gather(table):
        return table[:, torch.arange(3) + 1]

    gm = _graph(column_gather, torch.randn(4, 5, device="meta"))
    assert move_host_indices(gm.graph) == 0


@pytest.mark.parametrize("opaque_backward", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_index_rows_matches_indexing_with_repeated_rows(compiled, opaque_backward, monkeypatch):
    # the rel-pos index: (i - j + k - 1), each table row gathered many times. The forward equals plain indexing bit
    # for bit; the table gradient equals index_put_'s sum (exactly on integer-valued gradients, where no order of
    # summation rounds), eager and inside an Inductor graph, through the masked sum and the sort-based fallback
    import samhq_fx.index_rows as ir

    if opaque_backward:
        monkeypatch.setattr(ir, "MASKED_SUM_LIMIT", 0)
    idx = (torch.arange(6)[:, None] - torch.arange(6)[None, :] + 5).long()
    table = torch.randn(11, 8, dtype=torch.float64, requires_grad=True)
    fn = torch.ops.samhq.index_rows
    if compiled:
        fresh_compile_state()
        fn = torch.compile(lambda t, i: torch.ops.samhq.index_rows(t, i) * 2.0, fullgraph=True)
    got = fn(table, idx)
    want = table[idx] * (2.0 if compiled else 1.0)
    assert torch.equal(got, want)
    for grad in (torch.randint(-50, 50, (6, 6, 8)).double(), torch.randn(6, 6, 8, dtype=torch.float64)):
        (g_got,) = torch.autograd.grad(got, table, grad, retain_graph=True)
        (g_want,) = torch.autograd.grad(want, table, grad, retain_graph=True)
        if grad.eq(grad.round()).all():
            assert torch.equal(g_got, g_want)
        torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
        (g_again,) = torch.autograd.grad(got, table, grad, retain_graph=True)
        assert torch.equal(g_again, g_got)  # deterministic


def test_index_rows_backward_keeps_negative_indices_and_non_finite_rows():
    # table[-1] is the last row in the gradient too; an inf gradient lands in its own row only (a one-hot product
    # would spread NaN over every row)
    import samhq_fx.index_rows  # noqa: F401

    table = torch.randn(5, 3, requires_grad=True)
    idx = torch.tensor([[0, -1], [2, 4]])
    grad = torch.ones(2, 2, 3)
    grad[1, 0, 1] = float("inf")  # row 2
    (g,) = torch.autograd.grad(torch.ops.samhq.index_rows(table, idx), table, grad)
    (want,) = torch.autograd.grad(table[idx], table, grad)
    assert torch.equal(g, want)
    assert torch.isinf(g[2, 1]) and torch.isfinite(g[[0, 1, 3, 4]]).all()


def test_option_and_env_var(monkeypatch):
    # on by default; SAMHQ_FX_HOST_INDICES=0 turns it off, =1 (or any other non-empty value) on; an option wins
    from samhq_fx.backend import split_options

    monkeypatch.delenv("SAMHQ_FX_HOST_INDICES", raising=False)
    assert split_options(None)[0]["samhq.host_indices"] is True
    assert split_options({"samhq.host_indices": False})[0]["samhq.host_indices"] is False
    for env, want in (("0", False), ("1", True), ("", True)):
        monkeypatch.setenv("SAMHQ_FX_HOST_INDICES", env)
        assert split_options(None)[0]["samhq.host_indices"] is want, env
    monkeypatch.setenv("SAMHQ_FX_HOST_INDICES", "0")
    assert split_options({"samhq.host_indices": True})[0]["samhq.host_indices"] is True


def test_sam_model_graph_moves_its_indices_and_still_fuses():
    # the HF SAM-HQ vision model on the meta device (standing in for a GPU): 2 layers x 2 tables x 2
    # aranges move, the 4 table gathers become index_rows, and the attention rewrite still fuses both layers
    from transformers import SamHQVisionModel

    from samhq_fx.models import tiny_vision_config
    from samhq_fx.rewrite import RelPosAttentionPass

    cfg = tiny_vision_config("eager", hidden_size=32, num_attention_heads=2, image_size=32, patch_size=4,
                             window_size=3, global_attn_indexes=[1], num_hidden_layers=2, output_channels=8)
    model = SamHQVisionModel(cfg).to("meta")
    gm = _graph(model, torch.randn(1, 3, 32, 32, device="meta"))
    assert move_host_indices(gm.graph) == 8
    assert sum(n.target is torch.ops.samhq.index_rows.default for n in gm.graph.nodes) == 4
    RelPosAttentionPass()(gm.graph)
    assert counters["samhq"]["fused"] == 2 and counters["samhq"]["skipped"] == 0
