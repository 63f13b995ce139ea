"""The einsums that make rel-pos terms, re-emitted by the rewrite as a product and a sum (patterns/rel_einsum.py)."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

from helpers import fresh_compile_state, rel_err

GRID, HEADS, D = 5, 2, 8


def _tables():
    g = torch.Generator().manual_seed(1)
    return [torch.randn(GRID, GRID, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2)]


def sam_attention(q, k, v, rh_table, rw_table, equations=("bhwc,hkc->bhwk", "bhwc,wkc->bhwk")):
    # SAM's decomposed rel-pos attention with the einsum spelling of segment-anything / HF (the table first
    # where the equation names it first)
    b, n, d = q.shape
    r_q = q.reshape(b, GRID, GRID, d)

    def term(eq, table):
        return torch.einsum(eq, r_q, table) if eq.startswith("bhwc") else torch.einsum(eq, table, r_q)

    rel_h, rel_w = term(equations[0], rh_table), term(equations[1], rw_table)
    attn = (q * d ** -0.5) @ k.transpose(-2, -1)
    attn = attn.view(b, GRID, GRID, GRID, GRID) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]
    return attn.view(b, n, n).softmax(-1) @ v


def _inputs():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(HEADS, GRID * GRID, D, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]


@pytest.mark.parametrize("equations", [("bhwc,hkc->bhwk", "bhwc,wkc->bhwk"), ("hkc,bhwc->bhwk", "wkc,bhwc->bhwk")])
def test_rel_einsums_become_reductions_and_stay_exact(equations):
    fresh_compile_state()
    q, k, v = _inputs()
    tables = _tables()
    ref = sam_attention(q, k, v, *tables, equations=equations)
    ref_grads = torch.autograd.grad(ref.square().mean(), [q, k, v, *tables])
    fn = torch.compile(lambda *a: sam_attention(*a, equations=equations), backend="samhq",
                       options={"samhq.inductor": False, "samhq.rel_einsum": True})
    out = fn(q, k, v, *tables)
    grads = torch.autograd.grad(out.square().mean(), [q, k, v, *tables])
    assert counters["samhq"]["fused"] == 1 and counters["samhq"]["rel_einsums"] == 2
    assert rel_err(out, ref) < 1e-6  # the op keeps lse in fp32
    for g, r in zip(grads, ref_grads):  # the tables' gradients flow through the reductions
        assert rel_err(g, r) < 1e-6


def test_rel_einsums_stay_einsums_by_default():
    fresh_compile_state()
    q, k, v = _inputs()
    out = torch.compile(sam_attention, backend="samhq", options={"samhq.inductor": False})(q, k, v, *_tables())
    assert counters["samhq"]["fused"] == 1 and counters["samhq"]["rel_einsums"] == 0
    assert rel_err(out, sam_attention(q, k, v, *_tables())) < 1e-6


def test_other_einsum_forms_are_left_as_einsums():
    from torch.fx import symbolic_trace

    from samhq_fx.patterns.rel_einsum import reduction_of

    def forms(a, b, c):
        return (torch.einsum("bhwc,hkc->bhwk", a, b),       # the rel-pos form
                torch.einsum("...c,hkc->...k", a, b),        # ellipsis
                torch.einsum("bhwc,hkd->bhwk", a, c),        # two labels summed away (c and d)
                torch.einsum("bhwc,hkc,hkc->bhwk", a, b, b))  # three operands

    a, b, c = torch.randn(2, 3, 4, 8), torch.randn(3, 5, 8), torch.randn(3, 5, 6)
    gm = symbolic_trace(forms)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, FakeTensorMode()).propagate(a, b, c)
    for node in gm.graph.nodes:
        if node.op == "call_function":
            node.meta.setdefault("example_value", node.meta.get("val"))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            node.meta["example_value"] = node.meta.get("val")
    einsums = [n for n in gm.graph.nodes if n.op == "call_function" and "einsum" in str(n.target)]
    assert [reduction_of(n) is not None for n in einsums] == [True, False, False, False]
