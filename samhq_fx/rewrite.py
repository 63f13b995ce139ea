"""The graph pass: replace each matched rel-pos attention with `torch.ops.samhq.rel_pos_attention`.

`RelPosAttentionPass` is an Inductor `CustomGraphPass`: the backend installs it as
`pre_grad_custom_pass`, so it sees the Dynamo graph (before autograd is traced) and its `uuid()`
keys Inductor's FX graph cache: the cache stays on, and changes to the pass or the op invalidate it.

Emission uses only shape-free ops (flatten / squeeze / unflatten with sizes read from the graph),
so rewritten graphs keep working with a dynamic batch dimension.
"""

from __future__ import annotations

import logging
import operator
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx import Graph, Node

from . import op  # registers torch.ops.samhq.*
from . import placement
from .layout import heads_last
from .patterns.fx_utils import fake_run, is_static, shape, value
from .patterns.rel_pos_attention import Match, RelTerm, find_candidates
from . import debug

log = logging.getLogger("samhq_fx")

_PKG = Path(__file__).resolve().parent


def kernel_switches() -> str:
    """The kernels' import-time switches that change what a traced triton_op computes with (cache key)."""
    try:
        from .kernels import tiles
    except ImportError:  # no triton: no kernels
        return "none"
    return f"split_head_dim={tiles.SPLIT_HEAD_DIM}"


def _source_files() -> tuple[str, ...]:
    """Files whose contents decide what the pass emits and what the op computes."""
    import samhq_fx.kernels as kernels_pkg
    import samhq_fx.patterns as patterns_pkg

    files = [Path(__file__), _PKG / "layout.py", _PKG / "op.py", _PKG / "reference.py"]
    for pkg in (patterns_pkg, kernels_pkg):
        files += sorted(Path(pkg.__file__).parent.glob("*.py"))
    # patterns/host_indices.py serves the backend's host-index pass, which rewrites the graph before Inductor
    # sees it (so Inductor's own key covers it), not this pass
    return tuple(str(f) for f in files if f != Path(patterns_pkg.__file__).parent / "host_indices.py")


class _Emitter:
    """Inserts nodes before `anchor`, giving each a fake value so later passes can read shapes."""

    def __init__(self, graph: Graph, anchor: Node, fake_mode):
        self.graph, self.anchor, self.fake_mode = graph, anchor, fake_mode

    def _meta(self, node: Node) -> Node:
        result = fake_run(node, self.fake_mode)
        node.meta["example_value"] = result
        if "stack_trace" in self.anchor.meta:  # dumps then say which source line was fused
            node.meta["stack_trace"] = self.anchor.meta["stack_trace"]
        return node

    def method(self, name: str, *args) -> Node:
        with self.graph.inserting_before(self.anchor):
            return self._meta(self.graph.call_method(name, args))

    def function(self, fn, *args) -> Node:
        with self.graph.inserting_before(self.anchor):
            return self._meta(self.graph.call_function(fn, args))


def _to_3d(em: _Emitter, node: Node) -> Node:
    # [*batch, N, D] -> [prod(batch), N, D]
    nd = len(shape(node))
    if nd == 3:
        return node
    if nd == 2:
        return em.method("unsqueeze", node, 0)
    return em.method("flatten", node, 0, nd - 3)


def _rel_term(em: _Emitter, term: RelTerm) -> Node:
    # leaf broadcast along one key axis -> [prod(batch), Nq, K], or [prod(batch), Hq, Wq, K] for a 2-D query grid:
    # the op reads the grid's two dims at their strides, where flattening them would copy the term whenever its
    # einsum wrote it grid row by grid row ([h, B*w, k]; one copy kernel a term a layer, 24 a ViT-B call)
    t = em.method("squeeze", term.node, term.squeeze)
    n_batch, n_query = len(term.batch), len(term.query)
    if n_query > 2:
        t = em.method("flatten", t, n_batch, n_batch + n_query - 1)
    if n_batch == 0:
        return em.method("unsqueeze", t, 0)
    if n_batch > 1:
        t = em.method("flatten", t, 0, n_batch - 1)
    return t


def _sum_terms(em: _Emitter, terms: list[RelTerm]) -> Node | None:
    total = None
    for term in terms:
        t = _rel_term(em, term)
        total = t if total is None else em.function(operator.add, total, t)
    return total


def _zeros_along(em: _Emitter, like: Node, size: int) -> Node:
    # A missing rel_h / rel_w: zeros shaped like the other term with `size` keys (batch may be symbolic).
    col = em.method("narrow", like, -1, 0, 1)
    keep = (-1,) * (len(shape(like)) - 1)
    return em.method("contiguous", em.method("expand", em.function(torch.zeros_like, col), *keep, size))


def apply_match(graph: Graph, m: Match, fused_op=torch.ops.samhq.rel_pos_attention.default,
                layout: tuple[int, dict] | None = None) -> Node:
    """Rewrite one match in place with `fused_op` (op.fused_op()), its output heads-last as `layout` (heads_last(m),
    worked out here if not given) says; returns the fused node."""
    heads, uses = heads_last(m) if layout is None else layout
    em = _Emitter(graph, m.output, value(m.q).fake_mode)
    q, k, v = (_to_3d(em, n) for n in (m.q, m.k, m.v))
    rel_h, rel_w = _sum_terms(em, m.rel_h), _sum_terms(em, m.rel_w)
    if rel_h is None:
        rel_h = _zeros_along(em, rel_w, m.grid[0])
    if rel_w is None:
        rel_w = _zeros_along(em, rel_h, m.grid[1])
    if heads > 1:
        fused = em.function(fused_op, q, k, v, rel_h, rel_w, float(m.scale), heads)
    else:
        fused = em.function(fused_op, q, k, v, rel_h, rel_w, float(m.scale))
    out = em.function(operator.getitem, fused, 0)
    target = shape(m.output)
    if heads > 1:  # [B', N, heads, Dv] -> [B', heads, N, Dv]: B' is target's dims before heads
        out = em.method("transpose", out, 1, 2)
    batch = target[:-3] if heads > 1 else target[:-2]
    if len(target) == 2:
        out = em.method("squeeze", out, 0)
    elif len(batch) > 1:
        sizes = tuple(s if is_static(s) else em.method("size", m.v, i) for i, s in enumerate(batch))
        out = em.method("unflatten", out, 0, sizes)
    if value(m.output).dtype != value(out).dtype:
        out = em.method("to", out, value(m.output).dtype)
    m.output.replace_all_uses_with(out)
    for user, result in uses.items():  # their recorded values, with the strides they now have
        user.meta["example_value" if "example_value" in user.meta else "val"] = result
    _erase_dead(graph, m.nodes)
    return fused


def _erase_dead(graph: Graph, nodes: set[Node]) -> None:
    # Only the nodes this match made dead; never a global DCE (the graph may hold side effects).
    changed = True
    while changed:
        changed = False
        for n in list(nodes):
            if not n.users and n.op in ("call_function", "call_method"):
                graph.erase_node(n)
                nodes.discard(n)
                changed = True


class RelPosAttentionPass(CustomGraphPass):
    """Inductor pre-grad pass: fuse every rel-pos attention of the graph it is given."""

    def __init__(self, min_seq_len: int = 1, dump_dir: str | None = None, triton_op: bool | str = False):
        self.min_seq_len = int(min_seq_len)
        self.dump_dir = dump_dir
        # which registration of the op (op.py) to emit: False the opaque op, True the triton_op one,
        # "auto" as placement.inductor_launches decides per match
        self.triton_op = "auto" if triton_op == "auto" else bool(triton_op)
        # Only plain data here: Inductor deep-copies its config, this pass included (torch 2.11).
        self._done: set[int] = set()

    def __call__(self, graph: Graph) -> None:
        # The backend runs the pass itself (so counters and dumps exist even when Inductor's cache
        # hits), then hands it to Inductor for its uuid; Inductor's call on the same graph is a no-op.
        if id(graph) in self._done:
            return
        self._done.add(id(graph))
        before = debug.graph_source(graph) if self.dump_dir else None
        candidates = find_candidates(graph, self.min_seq_len, dynamic_grid=placement.dynamic_grids(self.triton_op))
        for cand in candidates:
            if cand.match is not None:
                layout = heads_last(cand.match)
                reason = placement.misfit(cand.match, heads=layout[0])  # decided here, on the device compiled for
                if reason is not None:
                    cand.match, cand.reason = None, f"left to Inductor: {reason}"
                    continue
                fused_op = op.fused_op(placement.inductor_launches(cand.match, self.triton_op))
                apply_match(graph, cand.match, fused_op, layout)
                cand.heads = layout[0]
        graph.lint()
        fused = sum(c.match is not None for c in candidates)
        counters["samhq"]["fused"] += fused
        counters["samhq"]["skipped"] += len(candidates) - fused
        counters["samhq"]["graphs"] += 1
        index = counters["samhq"]["graphs"]
        log.info("samhq_fx: graph %d: fused %d of %d attention candidates", index, fused, len(candidates))
        for cand in candidates:
            if cand.match is None:
                log.debug("samhq_fx: graph %d: left %s alone: %s", index, cand.node.name, cand.reason)
        if self.dump_dir:
            debug.write_dump(self.dump_dir, index, before, debug.graph_source(graph), candidates)

    def uuid(self) -> bytes:
        return get_hash_for_files(_source_files()) + (
            f"|min_seq_len={self.min_seq_len}|triton_op={self.triton_op}"
            f"|{kernel_switches()}").encode()
