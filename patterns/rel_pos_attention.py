"""Find decomposed rel-pos attention (SAM, SAM-HQ, ViTDet, MViTv2) in a Dynamo FX graph.

What is matched is the math, not one spelling of it:

    out = softmax(scale * q @ k^T + rel_h[..., :, None] + rel_w[..., None, :]) @ v

over a key grid Hk x Wk, however the graph writes it: explicit softmax (with or without dtype=, or
on scores cast to fp32 first; then casts, then dropout that is off) or SDPA with the bias as
attn_mask; the products as matmul / bmm / @ or as einsums that are batched matmuls, the scores
also as baddbmm(bias, q, k^T, alpha=scale); k^T by transpose, permute, swapaxes or .mT, copied
or not; the scale on q, on k^T or on the scores; the bias added to the [B, N, N] scores through
reshape_as / view, or to a 5-D [B, qh, qw, kh, kw] view of them, each term broadcast by the add
or expanded before it; additions in any order and nesting; the biased scores written back whole
into the scores before the softmax (timm's MViTv2, `attn[:, :, 0:, 0:] = ...`).

How: start at each softmax (dim=-1) and each SDPA with a float mask; walk the tree of additions
and reshapes that feeds the scores, tracking for every leaf the shape it is broadcast into. A leaf
broadcast over the key-grid column is a rel_h term, one broadcast over the key-grid row a rel_w
term, a full leaf must be the q @ k^T product. Reshapes are followed only when they keep the whole
score tensor (row-major regrouping of batch / query / key dims), so every leaf maps to the same
flat [batch, query, key] index space the fused op uses.

Sizes may be symbolic (a dynamic batch, or a dynamic image size after Dynamo's automatic dynamic
shapes saw a second resolution): every size relation is checked with `same_size`, which is true only
when provable from the symbols, so a check never installs a guard. Head dims stay static (the kernels
specialise on them).

A candidate is left alone, with its reason recorded, whenever rewriting could change results:
probabilities used anywhere else (output_attentions=True), active dropout, a dense bias term,
broadcast over batch, mixed dtypes, shapes the op does not take.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field

import torch
from torch.fx import Graph, Node

from .fx_utils import (
    arg, as_number, einsum_as_matmul, is_last_two_swapped, is_static, is_whole_index, numel, op_name, same_shape,
    same_size, shape, single_user, value,
)


class NoMatch(Exception):
    """Raised with a human-readable reason when a candidate is not (safely) rel-pos attention."""


@dataclass
class RelTerm:
    """A rel_h or rel_w leaf: `node` broadcast into a context of shape `ctx`.

    dims index into ctx (== node's own dims): `batch`, `query` and the one key dim kept, `key`;
    `squeeze` is the broadcast (size-1) key dim to drop.
    """

    node: Node
    batch: list[int]
    query: list[int]
    squeeze: int


@dataclass
class Match:
    kind: str  # "softmax" or "sdpa"
    q: Node  # [*batch, Nq, D], unscaled
    k: Node  # [*batch, Nk, D]
    v: Node  # [*batch, Nk, Dv]
    scale: float
    grid: tuple  # (Hk, Wk), ints or SymInts
    rel_h: list[RelTerm]
    rel_w: list[RelTerm]
    output: Node  # node whose value the fused op replaces: [*batch, Nq, Dv]
    nodes: set[Node] = field(default_factory=set)  # matched nodes, erased if dead after rewrite


@dataclass
class Candidate:
    node: Node
    kind: str
    match: Match | None = None
    reason: str | None = None
    heads: int = 1  # the fused op writes its output heads-last where above 1 (layout.heads_last)


# --- the bias tree ----------------------------------------------------------------------------


def _key_query_groups(ctx: tuple, n_q, n_k) -> tuple[list[int], list[int], list[int]]:
    """Split a context shape into (batch dims, query dims, key dims), row-major.

    Key dims are either one dim of size Nk or two dims (Hk, Wk) with Hk * Wk = Nk; query dims are
    the fewest dims before them whose product is Nq; the rest are batch.
    """
    nd = len(ctx)
    if nd >= 1 and same_size(ctx[-1], n_k):
        key = [nd - 1]
    elif nd >= 2 and same_size(ctx[-2] * ctx[-1], n_k):
        key = [nd - 2, nd - 1]
    else:
        raise NoMatch(f"bias reshaped to {ctx}: key dims are not ({n_k},) nor a grid")
    query, prod, i = [], 1, key[0] - 1
    while i >= 0 and not (query and same_size(prod, n_q)):
        prod *= ctx[i]
        query.insert(0, i)
        i -= 1
    if not (query and same_size(prod, n_q)):
        raise NoMatch(f"bias reshaped to {ctx}: query dims do not multiply to {n_q}")
    return list(range(i + 1)), query, key


def _collect_leaves(root: Node, full: int, nodes: set[Node]) -> list[tuple[Node, tuple]]:
    """Leaves of the add/reshape tree under `root`, each with the shape it is broadcast into."""
    leaves: list[tuple[Node, tuple]] = []

    def walk(node, ctx):
        if not isinstance(node, Node):
            raise NoMatch(f"constant {node!r} added to the scores")
        name = op_name(node)
        own = shape(node)
        if own is None:
            raise NoMatch(f"no shape recorded for {node.name}")
        src = node.args[0] if node.args else None
        if name == "add" and same_size(numel(own), full) and arg(node, 2, "alpha", 1) == 1:
            nodes.add(node)
            for operand in node.args[:2]:
                walk(operand, own)
            return
        if name == "expand" and isinstance(src, Node) and len(shape(src) or ()) == len(own) == len(ctx):
            # bias.expand(...) before the add is the add's own broadcast, done early: walk the source in ctx
            nodes.add(node)
            walk(src, ctx)
            return
        if name == "baddbmm" and same_size(numel(own), full) and node.kwargs.get("beta", 1) == 1:
            # baddbmm(bias, q, k^T, alpha=scale) = bias + scale * q @ k^T: the bias is walked like an add's
            # operand, the node itself is the dense leaf that _scores_qk reads as the product
            nodes.add(node)
            walk(node.args[0], own)
            leaves.append((node, ctx))
            return
        if (
            (name in ("reshape", "identity", "cast") or (name == "getitem" and is_whole_index(arg(node, 1, "index"))))
            and value(src) is not None
            and value(src).dtype == value(node).dtype  # x.view(dtype) is a bitcast; a cast here must be a no-op
            and value(src).device == value(node).device  # (bias.to(q.dtype) where it is q's dtype already)
            and same_size(numel(shape(src)), full)
        ):
            nodes.add(node)
            walk(node.args[0], shape(node.args[0]))
            return
        leaves.append((node, ctx))

    walk(root, shape(root))
    return leaves


def _classify(leaf: Node, ctx: tuple, n_q, n_k):
    """('dense', None) or ('h' | 'w', RelTerm, grid) for one leaf of the bias tree."""
    own = shape(leaf)
    if len(own) != len(ctx):
        raise NoMatch(f"{leaf.name} {own} is broadcast over batch into {ctx}")
    batch, query, key = _key_query_groups(ctx, n_q, n_k)
    for d in batch + query:
        if not same_size(own[d], ctx[d]):
            raise NoMatch(f"{leaf.name} {own} is broadcast over batch or query dims of {ctx}")
    full = [same_size(own[d], ctx[d]) for d in key]
    if all(full):
        return "dense", None, None
    if len(key) == 2:
        grid = (ctx[key[0]], ctx[key[1]])
        if full[0] and same_size(own[key[1]], 1):
            return "h", RelTerm(leaf, batch, query, squeeze=key[1]), grid
        if full[1] and same_size(own[key[0]], 1):
            return "w", RelTerm(leaf, batch, query, squeeze=key[0]), grid
    raise NoMatch(f"{leaf.name} {own} is neither per key row nor per key column of {ctx}")


def _bias_terms(root: Node, n_q, n_k, batch_shape: tuple, nodes: set[Node]):
    """Split the tensor `root` (scores + bias, or the SDPA mask) into dense leaves and rel terms."""
    full = numel(batch_shape) * n_q * n_k
    dense, rel_h, rel_w, grids = [], [], [], []
    for leaf, ctx in _collect_leaves(root, full, nodes):
        kind, term, grid = _classify(leaf, ctx, n_q, n_k)
        if kind == "dense":
            dense.append(leaf)
            continue
        grids.append(grid)
        (rel_h if kind == "h" else rel_w).append(term)
    if not rel_h and not rel_w:
        raise NoMatch("no rel-pos bias (no term broadcast along a key-grid axis)")
    if not all(same_size(g[0], grids[0][0]) and same_size(g[1], grids[0][1]) for g in grids):
        raise NoMatch(f"rel-pos terms disagree on the key grid: {grids}")
    if not (rel_h and rel_w) and not all(map(is_static, grids[0])):
        raise NoMatch(f"only one rel-pos axis on a dynamic grid {grids[0]}")
    return dense, rel_h, rel_w, grids[0]


# --- q @ k^T ----------------------------------------------------------------------------------


def _peel_scale(node: Node, nodes: set[Node]) -> tuple[Node, float]:
    """x * c, c * x, x / c  ->  (x, c).  Repeated; c must be a Python constant."""
    factor = 1.0
    while isinstance(node, Node):
        mul_node, name = node, op_name(node)
        a = node.args[0] if node.args else None
        b = arg(node, 1, "other")
        if name == "mul" and isinstance(a, Node) and as_number(b) is not None:
            factor, node = factor * as_number(b), a
        elif name == "mul" and isinstance(b, Node) and as_number(a) is not None:
            factor, node = factor * as_number(a), b
        elif name == "div" and isinstance(a, Node) and as_number(b) and arg(node, 2, "rounding_mode") is None:
            factor, node = factor / as_number(b), a
        else:
            break
        nodes.add(mul_node)
    return node, factor


def _scores_qk(leaf: Node, nodes: set[Node]) -> tuple[Node, Node, float]:
    """The dense leaf must be (a scaled) q @ k^T: a matmul, an einsum that is one, or the product inside a
    baddbmm whose bias _collect_leaves walked. Returns (q, k, scale)."""
    core, s1 = _peel_scale(leaf, nodes)
    einsum = einsum_as_matmul(core)
    if op_name(core) == "baddbmm":
        alpha = as_number(core.kwargs.get("alpha", 1))
        if core is not leaf or core not in nodes or alpha is None:  # a scale over the bias too, or beta != 1
            raise NoMatch(f"{core.name}: baddbmm with a scale over its bias or a non-constant alpha")
        (a, b), s1, k_transposed = core.args[1:3], alpha, False
    elif einsum is not None:
        a, b, k_transposed = einsum
    elif op_name(core) == "matmul":
        (a, b), k_transposed = core.args[:2], False
    else:
        raise NoMatch(f"dense bias term {leaf.name} is not q @ k^T")
    nodes.add(core)
    q, s2 = _peel_scale(a, nodes)
    if k_transposed:  # einsum "...qd,...kd->...qk" reads k as it is
        k, s4 = _peel_scale(b, nodes)
        return q, k, s1 * s2 * s4
    kt, s3 = _peel_scale(b, nodes)
    while op_name(kt) == "identity" and isinstance(kt.args[0], Node):  # k.transpose(-2, -1).contiguous() is k^T
        nodes.add(kt)
        kt, s = _peel_scale(kt.args[0], nodes)
        s3 *= s
    kt_shape = shape(kt)
    if kt_shape is None or not is_last_two_swapped(kt, len(kt_shape)):
        raise NoMatch(f"right operand of {core.name} is not k transposed")
    nodes.add(kt)
    k, s4 = _peel_scale(kt.args[0], nodes)
    return q, k, s1 * s2 * s3 * s4


# --- candidates -------------------------------------------------------------------------------


def _check_qkv(q: Node, k: Node, v: Node, n_q: int, n_k: int, batch_shape: tuple) -> None:
    qs, ks, vs = shape(q), shape(k), shape(v)
    if qs is None or ks is None or vs is None:
        raise NoMatch("q, k or v has no recorded shape")
    if not (len(qs) == len(ks) == len(vs) == len(batch_shape) + 2):
        raise NoMatch(f"q {qs}, k {ks}, v {vs} do not share the scores' batch dims {batch_shape}")
    for s in (qs, ks, vs):
        if not same_shape(s[:-2], batch_shape):
            raise NoMatch(f"q {qs}, k {ks}, v {vs}: batch dims broadcast against {batch_shape}")
    if not all(is_static(s) for s in (qs[-1], ks[-1], vs[-1])):
        raise NoMatch("dynamic head_dim")
    fits = same_size(qs[-2], n_q) and same_size(ks[-2], n_k) and same_size(vs[-2], n_k) and qs[-1] == ks[-1]
    if not fits:
        raise NoMatch(f"q {qs}, k {ks}, v {vs} do not fit scores [{n_q}, {n_k}]")
    dtypes = {value(n).dtype for n in (q, k, v)}
    if len(dtypes) != 1:
        raise NoMatch(f"q, k, v have mixed dtypes {sorted(map(str, dtypes))}")


def _check_rel_dtypes(q: Node, terms: list[RelTerm]) -> None:
    for t in terms:
        if value(t.node).dtype != value(q).dtype:
            raise NoMatch(f"rel-pos term {t.node.name} is {value(t.node).dtype}, q is {value(q).dtype}")


def _probs_to_pv(softmax: Node, nodes: set[Node]) -> tuple[Node, Node]:
    """Follow the probabilities through casts and inactive dropout to `P @ v`. Returns (pv, v)."""
    node = softmax
    while True:
        user = single_user(node)
        if user is None:
            raise NoMatch(f"attention probabilities ({node.name}) are used elsewhere, e.g. output_attentions=True")
        name = op_name(user)
        if name in ("cast", "identity") and same_shape(shape(user), shape(node)):
            pass
        elif name == "dropout":
            p, training = arg(user, 1, "p", 0.5), arg(user, 2, "training", True)
            if p != 0 and training is not False:
                raise NoMatch(f"dropout is active (p={p}, training={training})")
        elif name == "matmul" and user.args[0] is node:
            nodes.add(user)
            return user, user.args[1]
        elif name == "einsum" and (pv := einsum_as_matmul(user)) and pv[0] is node and not pv[2]:
            nodes.add(user)  # "...qk,...kd->...qd"
            return user, pv[1]
        else:
            raise NoMatch(f"attention probabilities feed {user.name} ({user.target}), not P @ v")
        nodes.add(user)
        node = user


def _peel_upcast(x: Node, nodes: set[Node]) -> Node:
    """scores.float() (or .to(torch.float32)) right before the softmax -> scores: the fused op computes the
    softmax in fp32 from fp32 scores, as precise as the upcast or more. Only casts to fp32 from a 16- or 32-bit
    float, same shape and device; anything else stays in the tree (and is a leaf there)."""
    while isinstance(x, Node) and op_name(x) == "cast":
        src, out = value(x.args[0] if x.args else None), value(x)
        if src is None or out is None or out.dtype != torch.float32 or not same_shape(src.shape, out.shape):
            break
        if src.dtype not in (torch.float16, torch.bfloat16, torch.float32) or src.device != out.device:
            break
        nodes.add(x)
        x = x.args[0]
    return x


def _is_setitem_into(node: Node, x: Node) -> bool:
    """node is `x[index] = value`."""
    return node.op == "call_function" and node.target is operator.setitem and node.args[0] is x


def _written_scores(x: Node, softmax: Node) -> Node:
    """The value the softmax reads when the scores were written back whole before it, as timm's MViTv2 does
    (`attn[:, :, 0:, 0:] = (attn[:, :, 0:, 0:].view(...) + rel_h + rel_w).view(...)`): the written value, else x.

    The write itself stays in the graph (the scores are an intermediate, so Inductor drops it once nothing reads
    them); the fused op reads the written value, which is the bias tree. Left alone: a write of part of the scores
    (MViTv2 with a class token), two writes, or other reads of the scores than the ones that build the value.
    """
    writes = [u for u in x.users if _is_setitem_into(u, x)]
    if not writes:
        return x
    if len(writes) > 1:
        raise NoMatch(f"the scores {x.name} are written {len(writes)} times before the softmax")
    write, index, val = writes[0], writes[0].args[1], writes[0].args[2]
    if not is_whole_index(index) or value(val) is None or not same_shape(shape(val), shape(x)) \
            or value(val).dtype != value(x).dtype:
        raise NoMatch(f"{write.name} writes part of the scores {x.name} (index {index})")
    n = write
    while n is not None and n is not softmax and n.op != "output":
        n = n.next
    if n is not softmax:
        raise NoMatch(f"{write.name} writes the scores after the softmax reads them")
    return val


def _check_scores_reads(x: Node, softmax: Node, nodes: set[Node]) -> None:
    """With a write-back (_written_scores), every other read of the scores must be part of this match."""
    for u in x.users:
        if u is not softmax and u not in nodes and not _is_setitem_into(u, x):
            raise NoMatch(f"the scores {x.name} written back are also read by {u.name}")


def _match_softmax(node: Node) -> Match:
    x = node.args[0] if node.args else node.kwargs.get("input")
    xs = shape(x)
    if xs is None or len(xs) < 2:
        raise NoMatch("softmax input has no usable shape")
    dim = arg(node, 1, "dim")
    if not isinstance(dim, int) or dim % len(xs) != len(xs) - 1:
        raise NoMatch(f"softmax over dim {dim}, not the last")
    n_q, n_k = xs[-2], xs[-1]
    nodes = {node}
    written = _written_scores(x, node)
    scores, x = x, _peel_upcast(written, nodes)
    dense, rel_h, rel_w, grid = _bias_terms(x, n_q, n_k, xs[:-2], nodes)
    if len(dense) != 1:
        raise NoMatch(f"{len(dense)} dense terms in the scores (expected exactly q @ k^T)")
    q, k, scale = _scores_qk(dense[0], nodes)
    if written is not scores:
        _check_scores_reads(scores, node, nodes)
    pv, v = _probs_to_pv(node, nodes)
    _check_qkv(q, k, v, n_q, n_k, xs[:-2])
    _check_rel_dtypes(q, rel_h + rel_w)
    if value(dense[0]).dtype != value(q).dtype:
        raise NoMatch("scores dtype differs from q's")
    return Match("softmax", q, k, v, scale, grid, rel_h, rel_w, pv, nodes)


def _match_sdpa(node: Node) -> Match:
    q, k, v = (arg(node, i, n) for i, n in enumerate(("query", "key", "value")))
    mask = arg(node, 3, "attn_mask")
    if not isinstance(mask, Node):
        raise NoMatch("SDPA without attn_mask: no rel-pos bias")
    if arg(node, 4, "dropout_p", 0.0) != 0:
        raise NoMatch(f"SDPA dropout_p={arg(node, 4, 'dropout_p')} is active")
    if arg(node, 5, "is_causal", False) or node.kwargs.get("enable_gqa", False):
        raise NoMatch("SDPA with is_causal or enable_gqa")
    qs, ks = shape(q), shape(k)
    if qs is None or ks is None or value(mask) is None or not value(mask).dtype.is_floating_point:
        raise NoMatch("SDPA mask is not a float tensor")
    n_q, n_k, d = qs[-2], ks[-2], qs[-1]
    if not is_static(d):
        raise NoMatch("dynamic head_dim")
    scale = node.kwargs.get("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else as_number(scale)
    if scale is None:
        raise NoMatch("SDPA scale is not a constant")
    nodes = {node}
    if not same_size(numel(shape(mask)), numel(qs[:-2]) * n_q * n_k):
        raise NoMatch(f"SDPA mask {shape(mask)} is broadcast over batch")
    dense, rel_h, rel_w, grid = _bias_terms(mask, n_q, n_k, qs[:-2], nodes)
    if dense:
        raise NoMatch(f"SDPA mask has a dense term {dense[0].name}")
    _check_qkv(q, k, v, n_q, n_k, qs[:-2])
    _check_rel_dtypes(q, rel_h + rel_w)
    return Match("sdpa", q, k, v, scale, grid, rel_h, rel_w, node, nodes)


def find_candidates(graph: Graph, min_seq_len: int = 1, dynamic_grid: bool = True) -> list[Candidate]:
    """Every softmax / SDPA in `graph`, each with a Match or the reason it was left alone.

    dynamic_grid=False leaves symbolic key grids alone (for an op that needs the grid at compile time).
    """
    found = []
    for node in graph.nodes:
        kind = op_name(node)
        if kind not in ("softmax", "sdpa"):
            continue
        cand = Candidate(node, kind)
        try:
            cand.match = _match_softmax(node) if kind == "softmax" else _match_sdpa(node)
            n_k = shape(cand.match.k)[-2]
            if not dynamic_grid and not all(map(is_static, cand.match.grid)):
                raise NoMatch(f"dynamic key grid {cand.match.grid}")
            if is_static(n_k) and n_k < min_seq_len:  # a symbolic length is let through: no guard on it
                raise NoMatch(f"{n_k} keys < min_seq_len={min_seq_len}")
        except NoMatch as e:
            cand.match, cand.reason = None, str(e)
        found.append(cand)
    return found
