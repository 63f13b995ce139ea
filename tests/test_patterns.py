"""The matcher on hand-written spellings of rel-pos attention, and on look-alikes it must leave alone.

Each spelling is compiled with backend="samhq"; a match must give eager's output and gradients,
a non-match must be reported with its reason and still give eager's numbers (plain Inductor).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from helpers import fresh_compile_state, rel_err

B, HEADS, GH, GW, D = 2, 2, 3, 5, 8  # non-square 3x5 grid, N = 15
N = GH * GW


def inputs(seed=0, heads_dim=False):
    g = torch.Generator().manual_seed(seed)
    shp = (B, HEADS, N, D) if heads_dim else (B * HEADS, N, D)
    q, k, v = (torch.randn(shp, generator=g) for _ in range(3))
    rel_h = torch.randn(*shp[:-2], GH, GW, GH, generator=g)  # [..., qh, qw, kh]
    rel_w = torch.randn(*shp[:-2], GH, GW, GW, generator=g)  # [..., qh, qw, kw]
    return [t.requires_grad_() for t in (q, k, v, rel_h, rel_w)]


# --- spellings that must match -----------------------------------------------------------------


def hf_eager(q, k, v, rel_h, rel_w):  # transformers SamHQVisionAttention
    attn = (q * D**-0.5) @ k.transpose(-2, -1)
    bias = rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]
    attn = attn + bias.reshape_as(attn)
    attn = torch.nn.functional.softmax(attn, dtype=torch.float32, dim=-1).to(q.dtype)
    attn = F.dropout(attn, p=0.0, training=True)
    return attn @ v


def five_d_view(q, k, v, rel_h, rel_w):  # segment-anything / the benchmark: bias on a 5-D view
    attn = (q * D**-0.5) @ k.transpose(-2, -1)
    attn = (attn.view(-1, GH, GW, GH, GW) + rel_h[..., None] + rel_w[..., None, :]).view(-1, N, N)
    return attn.softmax(dim=-1) @ v


def reordered(q, k, v, rel_h, rel_w):  # any order, scale on k^T, torch.add, permute, unsqueeze
    kt = k.permute(0, 2, 1) * (1 / math.sqrt(D))
    scores = torch.matmul(q, kt)
    bias_w = rel_w.unsqueeze(-2).reshape(-1, GH, GW, 1, GW)
    s = torch.add(bias_w, rel_h.unsqueeze(-1)) + scores.view(-1, GH, GW, GH, GW)
    return torch.bmm(torch.softmax(s.reshape(-1, N, N), -1), v)


def post_scaled_4d(q, k, v, rel_h, rel_w):  # [B, heads, N, D] layout, scores divided after the matmul
    scores = (q @ k.transpose(2, 3)) / math.sqrt(D)
    scores = scores + (rel_h[..., None] + rel_w[..., None, :]).flatten(-2).flatten(2, 3)
    return F.softmax(scores, dim=-1) @ v


def hf_sdpa(q, k, v, rel_h, rel_w):  # transformers SamHQVisionSdpaAttention
    bias = (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(B, HEADS, N, N)
    q4, k4, v4 = (t.view(B, HEADS, N, D) for t in (q, k, v))
    return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias)


def sdpa_mask_to_q_dtype(q, k, v, rel_h, rel_w):  # a defensive mask.to(q.dtype) that is a no-op
    bias = (rel_h[..., None] + rel_w[..., None, :]).reshape(B, HEADS, N, N)
    return F.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=bias.to(q.dtype), dropout_p=0.0)


def einsum_products(q, k, v, rel_h, rel_w):  # both products as einsums, q second in the first one
    attn = torch.einsum("bkd,bqd->bqk", k, q * D**-0.5)
    attn = (attn.view(-1, GH, GW, GH, GW) + rel_h[..., None] + rel_w[..., None, :]).view(-1, N, N)
    return torch.einsum("...qk,...kd->...qd", attn.softmax(-1), v)


def baddbmm_scores(q, k, v, rel_h, rel_w):  # bias + scale * q @ k^T in one baddbmm
    bias = (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    return torch.baddbmm(bias, q, k.transpose(1, 2), alpha=D**-0.5).softmax(-1).bmm(v)


def upcast_scores(q, k, v, rel_h, rel_w):  # bias first, scale on k^T by division, scores.float() before softmax
    bias = (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    attn = bias + q @ (k.transpose(-1, -2) / math.sqrt(D))
    return F.softmax(attn.float(), dim=-1).type_as(q) @ v


def mt_expanded_bias(q, k, v, rel_h, rel_w):  # k.mT; each term expanded to the 5-D scores before the add
    full = (B * HEADS, GH, GW, GH, GW)
    bias = rel_h.unsqueeze(-1).expand(full) + torch.broadcast_to(rel_w.unsqueeze(-2), full)
    scores = ((q * D**-0.5) @ k.mT).view(full).add(bias.expand_as(bias))
    return scores.reshape(-1, N, N).softmax(-1) @ v


def swapaxes_contiguous(q, k, v, rel_h, rel_w):  # k^T by swapaxes, then a copy
    attn = (q @ k.swapaxes(-1, -2).contiguous()) * D**-0.5
    return (attn.view(-1, GH, GW, GH, GW) + rel_h[..., None] + rel_w[..., None, :]).view(-1, N, N).softmax(-1) @ v


def mvit_write_back(q, k, v, rel_h, rel_w):  # timm's MViTv2 (no class token): the biased scores written back whole
    attn = (q * D**-0.5) @ k.transpose(-2, -1)
    attn[:, :, 0:, 0:] = (attn[:, :, 0:, 0:].view(B, -1, GH, GW, GH, GW) + rel_h.unsqueeze(-1)
                          + rel_w.unsqueeze(-2)).view(B, -1, N, N)
    return attn.softmax(dim=-1) @ v


MATCHING = [
    (hf_eager, False), (five_d_view, False), (reordered, False), (post_scaled_4d, True), (hf_sdpa, False),
    (einsum_products, False), (baddbmm_scores, False), (upcast_scores, False), (mt_expanded_bias, False),
    (swapaxes_contiguous, False), (mvit_write_back, True), (sdpa_mask_to_q_dtype, True),
]


def check_spelling(fn, heads_dim: bool, device: str = "cpu", tol: float = 1e-5) -> None:
    """fn compiled with backend="samhq": one fused layer, output and all five gradients within tol of float64
    (tests/test_gpu.py runs it on CUDA)."""
    fresh_compile_state()
    args = [t.detach().to(device).requires_grad_() for t in inputs(heads_dim=heads_dim)]
    ref_args = [t.detach().double().requires_grad_() for t in args]
    ref = fn(*ref_args)
    out = torch.compile(fn, backend="samhq", fullgraph=True)(*args)
    assert counters["samhq"]["fused"] == 1, dict(counters["samhq"])
    assert (err := rel_err(out, ref)) < tol, f"output {err:.3g}"  # rel_err: inf for any non-finite value
    dout = torch.randn_like(ref)
    got = torch.autograd.grad(out, args, dout.float())
    exp = torch.autograd.grad(ref, ref_args, dout)
    for name, g, e in zip(("q", "k", "v", "rel_h", "rel_w"), got, exp):
        assert (err := rel_err(g, e)) < tol, f"{name} grad {err:.3g}"


@pytest.mark.parametrize("fn,heads_dim", MATCHING, ids=[f.__name__ for f, _ in MATCHING])
def test_spelling_is_fused_and_exact(fn, heads_dim):
    check_spelling(fn, heads_dim)


# --- the output's layout: heads-last where the model reads heads next to features ---------------

PROJ = torch.randn(HEADS * D, 6, generator=torch.Generator().manual_seed(1))


def _projected(out):  # [B*heads, N, D] or [B, heads, N, D] -> heads next to features, then a projection (SAM's)
    x = out.view(B, HEADS, GH, GW, D).permute(0, 2, 3, 1, 4).reshape(B, GH, GW, HEADS * D)
    return x @ PROJ.to(x.dtype)


def hf_eager_projected(*args):
    return _projected(hf_eager(*args))


def hf_sdpa_projected(*args):
    return _projected(hf_sdpa(*args))


def post_scaled_4d_projected(*args):
    return _projected(post_scaled_4d(*args))


def heads_last_qkv_projected(q, k, v, rel_h, rel_w):  # HF's q / k / v, views of one [B, N, 3, heads, D] projection
    bias = (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(B, HEADS, N, N)
    q4, k4, v4 = (t.view(B, N, HEADS, D).transpose(1, 2) for t in (q, k, v))
    return _projected(F.scaled_dot_product_attention(q4, k4, v4, attn_mask=bias))


def transposed_projected(*args):  # MViTv2's: heads next to features by a transpose
    x = hf_sdpa(*args).transpose(1, 2).reshape(B, N, HEADS * D)
    return x @ PROJ.to(x.dtype)


def two_paths_into_one(*args):  # one node takes the output twice (a * 2 + a): it runs once both inputs are heads-last
    a = hf_eager(*args).view(B, HEADS, GH, GW, D)
    return _projected((a * 2 + a).view(B, HEADS, N, D))


def projected_then_written(*args):  # heads-last would make x a view of the output the op saves for its backward
    x = hf_sdpa(*args).view(B, HEADS, GH, GW, D).permute(0, 2, 3, 1, 4).reshape(B, GH, GW, HEADS * D)
    x.mul_(0.5)
    return x @ PROJ.to(x.dtype)


def heads_merged_with_batch(*args):  # a view heads-last memory cannot give: the output stays heads-first
    return hf_sdpa(*args).view(B * HEADS, N * D).sin()


def reshaped_heads_first(*args):  # a view of heads-first memory that heads-last would turn into a copy
    return hf_sdpa(*args).reshape(B * HEADS, N * D).sin()


# (fn, q with a heads dim, heads the output is written with): a graph output stays heads-first too
LAYOUTS = [(hf_eager_projected, False, HEADS), (hf_sdpa_projected, False, HEADS),
           (post_scaled_4d_projected, True, HEADS), (heads_last_qkv_projected, False, HEADS),
           (transposed_projected, False, HEADS),
           (two_paths_into_one, False, HEADS), (projected_then_written, False, 1), (heads_merged_with_batch, False, 1),
           (reshaped_heads_first, False, 1), (hf_sdpa, False, 1)]


@pytest.mark.parametrize("fn,heads_dim,heads", LAYOUTS, ids=[f.__name__ for f, _, _ in LAYOUTS])
def test_output_is_heads_last_where_the_model_reads_it_so(fn, heads_dim, heads, tmp_path):
    fresh_compile_state()
    args = inputs(heads_dim=heads_dim)
    ref_args = [t.detach().double().requires_grad_() for t in args]
    ref = fn(*ref_args)
    out = torch.compile(fn, backend="samhq", options={"samhq.dump_dir": str(tmp_path)})(*args)
    report = (tmp_path / "graph_1_report.txt").read_text()
    assert counters["samhq"]["fused"] == 1, report
    assert (f"heads-last ({HEADS} heads)" in report) == (heads > 1), report
    assert (err := rel_err(out, ref)) < 1e-5, f"output {err:.3g}"
    dout = torch.randn_like(ref)
    for name, g, e in zip("q k v rel_h rel_w".split(), torch.autograd.grad(out, args, dout.float()),
                          torch.autograd.grad(ref, ref_args, dout)):
        assert (err := rel_err(g, e)) < 1e-5, f"{name} grad {err:.3g}"


def test_heads_last_where_sdpa_wrote_heads_last_already(tmp_path):
    # without grad, SDPA's recorded output on HF's q / k / v is heads-last already (as its CUDA kernels' always is):
    # the reshape after it is a view there, but after the op's heads-first output it would be a copy kernel
    fresh_compile_state()
    args = inputs()
    ref = heads_last_qkv_projected(*[t.detach().double() for t in args])
    with torch.no_grad():
        out = torch.compile(heads_last_qkv_projected, backend="samhq", options={"samhq.dump_dir": str(tmp_path)})(*args)
    report = (tmp_path / "graph_1_report.txt").read_text()
    assert counters["samhq"]["fused"] == 1 and f"heads-last ({HEADS} heads)" in report, report
    assert (err := rel_err(out, ref)) < 1e-5, f"output {err:.3g}"


# --- look-alikes that must be left alone, with a reason --------------------------------------


def returns_probs(q, k, v, rel_h, rel_w):  # output_attentions=True
    attn = (q * D**-0.5) @ k.transpose(-2, -1) + (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    p = attn.softmax(-1)
    return p @ v, p


def active_dropout(q, k, v, rel_h, rel_w):
    attn = (q * D**-0.5) @ k.transpose(-2, -1) + (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    return F.dropout(attn.softmax(-1), p=0.3, training=True) @ v


def extra_dense_mask(q, k, v, rel_h, rel_w):
    attn = (q * D**-0.5) @ k.transpose(-2, -1) + (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    return (attn + q.new_ones(B * HEADS, N, N).triu(1) * -1e4).softmax(-1) @ v


def shared_rel_bias(q, k, v, rel_h, rel_w):  # the same bias for every batch element
    attn = (q * D**-0.5) @ k.transpose(-2, -1) + (rel_h[0, ..., None] + rel_w[0, ..., None, :]).reshape(N, N)
    return attn.softmax(-1) @ v


def no_bias(q, k, v, rel_h, rel_w):
    return ((q * D**-0.5) @ k.transpose(-2, -1)).softmax(-1) @ v


def softmax_over_queries(q, k, v, rel_h, rel_w):
    attn = (q * D**-0.5) @ k.transpose(-2, -1) + (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    return attn.softmax(-2) @ v


def scaled_baddbmm(q, k, v, rel_h, rel_w):  # the scale covers baddbmm's bias too: 0.5 * rel_h + 0.5 * q @ k^T
    bias_h = rel_h[..., None].expand(-1, GH, GW, GH, GW).reshape(-1, N, N)
    attn = (0.5 * torch.baddbmm(bias_h, q, k.transpose(1, 2))).view(-1, GH, GW, GH, GW) + rel_w[..., None, :]
    return attn.view(-1, N, N).softmax(-1) @ v


def expanded_over_batch(q, k, v, rel_h, rel_w):  # one image's terms expanded to every batch element
    full = (B * HEADS, GH, GW, GH, GW)
    bias = rel_h[:1, ..., None].expand(full) + rel_w[:1, ..., None, :].expand(full)
    return (((q * D**-0.5) @ k.transpose(-2, -1)).view(full) + bias).view(-1, N, N).softmax(-1) @ v


def written_in_part(q, k, v, rel_h, rel_w):  # MViTv2 with a class token writes all but its row: not one bias
    attn = (q * D**-0.5) @ k.transpose(-2, -1)
    biased = (attn.view(-1, GH, GW, GH, GW) + rel_h[..., None] + rel_w[..., None, :]).view(-1, N, N)
    attn[:, 1:] = biased[:, 1:]
    return attn.softmax(-1) @ v


def written_and_read(q, k, v, rel_h, rel_w):  # the written-back scores also feed another output
    attn = (q * D**-0.5) @ k.transpose(-2, -1)
    attn[:, 0:] = (attn.view(-1, GH, GW, GH, GW) + rel_h[..., None] + rel_w[..., None, :]).view(-1, N, N)
    return attn.softmax(-1) @ v, attn.amax(-1)


def einsum_reduces_batch(q, k, v, rel_h, rel_w):  # "bqd,bkd->qk" sums over the batch: no batched q @ k^T
    attn = torch.einsum("bqd,bkd->qk", q, k)[None] + (rel_h[..., None] + rel_w[..., None, :]).reshape(-1, N, N)
    return attn.softmax(-1) @ v


LEFT_ALONE = [
    (returns_probs, "used elsewhere"), (active_dropout, "dropout is active"), (extra_dense_mask, "dense terms"),
    (shared_rel_bias, "broadcast over batch"), (no_bias, "no rel-pos bias"), (softmax_over_queries, "not the last"),
    (scaled_baddbmm, "scale over its bias"), (einsum_reduces_batch, "broadcast over batch"),
    (expanded_over_batch, "broadcast over batch"), (written_in_part, "writes part of the scores"),
    (written_and_read, "also read by"),
]


@pytest.mark.parametrize("fn,reason", LEFT_ALONE, ids=[f.__name__ for f, _ in LEFT_ALONE])
def test_look_alike_is_left_alone_with_reason(fn, reason, tmp_path):
    fresh_compile_state()
    args = inputs()
    torch.manual_seed(0)
    ref = fn(*args)
    with torch._inductor.config.patch(fallback_random=True):  # eager's dropout RNG, so numbers compare
        torch.manual_seed(0)
        out = torch.compile(fn, backend="samhq", options={"samhq.dump_dir": str(tmp_path)})(*args)
    assert counters["samhq"]["fused"] == 0
    report = (tmp_path / "graph_1_report.txt").read_text()
    assert "SKIPPED" in report and reason in report, report
    for o, r in zip(out if isinstance(out, tuple) else [out], ref if isinstance(ref, tuple) else [ref]):
        assert rel_err(o, r) < 1e-5


def test_min_seq_len_option_leaves_short_attention_alone():
    fresh_compile_state()
    out = torch.compile(hf_eager, backend="samhq", options={"samhq.min_seq_len": N + 1})(*inputs())
    assert counters["samhq"]["fused"] == 0 and counters["samhq"]["skipped"] == 1
    assert rel_err(out, hf_eager(*inputs())) < 1e-5


@pytest.mark.parametrize("eq,expect", [
    ("bqd,bkd->bqk", ("a", "b", True)), ("bkd,bqd->bqk", ("b", "a", True)), ("bhqd, bhkd -> bhqk", ("a", "b", True)),
    ("...qd,...kd->...qk", ("a", "b", True)), ("qd,kd->qk", ("a", "b", True)),
    ("bqk,bkd->bqd", ("a", "b", False)), ("bkd,bqk->bqd", ("b", "a", False)),
    ("bqd,bkd->bkq", ("b", "a", True)),  # k @ q^T: a matmul all the same, with the roles as written
    ("bqd,bkd->qk", None), ("bqd,bkd->kbq", None), ("bqd,ckd->bqk", None), ("bqd,bkd", None),
    ("bqd,bkd->bqkd", None), ("...qd,bkd->bqk", None), ("bqq,bqd->bqd", None), ("bqd,bqd->bqq", None),
])
def test_einsum_as_matmul_reads_only_batched_matmuls(eq, expect):
    # the matcher takes an einsum for q @ k^T or P @ v only where it is one, over the same leading batch dims
    from samhq_fx.patterns.fx_utils import einsum_as_matmul

    g = torch.fx.Graph()
    a, b = g.placeholder("a"), g.placeholder("b")
    got = einsum_as_matmul(g.call_function(torch.einsum, (eq, a, b)))
    assert (got and (got[0].name, got[1].name, got[2])) == (expect if expect else None)
    assert einsum_as_matmul(g.call_function(torch.einsum, (eq, [a, b]))) == got  # operands as one list


@pytest.mark.parametrize("spelling", ["getattr", "aten.mT", "aten.mT.default"])
def test_k_mT_is_k_transposed_however_dynamo_records_it(spelling):
    # Dynamo records k.mT as an attribute read (torch 2.13) or as a call of aten.mT (torch 2.14): both are k^T
    from samhq_fx.patterns.fx_utils import is_last_two_swapped, op_name

    g = torch.fx.Graph()
    k = g.placeholder("k")
    target = {"getattr": getattr, "aten.mT": torch.ops.aten.mT, "aten.mT.default": torch.ops.aten.mT.default}[spelling]
    node = g.call_function(target, (k, "mT") if spelling == "getattr" else (k,))
    assert op_name(node) == "mT" and is_last_two_swapped(node, 3) and not is_last_two_swapped(node, 1)
