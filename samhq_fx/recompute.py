"""Joint-graph pass (samhq.recompute_copies): the backward recomputes the copies of q that rel-pos einsums multiply.

SAM computes its rel-pos terms as einsum("bhwc,hkc->bhwk", q, Rh) and einsum("bhwc,wkc->bhwk", q, Rw). Each einsum
lowers to a bmm over a permuted copy of q ([h, B*w, c] for rel_h): an aten.clone. The bmm's backward (the tables'
gradient) reads that copy, and the partitioner saves it: a bmm materializes its inputs, so min-cut never counts the
copy as cheap to rebuild. The fused op saves q itself anyway, so each saved copy is a second q-sized tensor held from
the forward to the backward (2 per global layer, 1 per window layer, where the other einsum reads q through views).

This pass tags those copies MUST_RECOMPUTE (the selective-checkpoint tag, torch.utils.checkpoint.CheckpointPolicy):
the backward copies q again (one elementwise kernel per copy) and the copy's memory is free from the forward's end.
Measured on CPU (Inductor, ViT-B fp32, batch 1), non-parameter bytes saved for the backward: 261.0 -> 235.5 MB at
256 px, 2956.6 -> 2735.5 MB at 1024 px (benchmarks/DECISIONS.md, "Recomputed rel-pos copies").

A copy is tagged only where the einsum belongs to a fused attention: its bmm's output reaches the fused op (or a
call of its Triton kernels, which the triton_op registration is traced into) through layout ops alone, and so does
the tensor the copy reads (q, or a packed qkv it is a view of), which the op saves. Training graphs only: an inference
graph (no tangents) saves nothing. Runs as Inductor's joint_custom_post_pass, before the partitioner (Inductor only:
aot_eager, samhq.inductor=False, has no such hook); its uuid() keys the cache.
"""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters
from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files
from torch.fx import Graph, Node
from torch.utils.checkpoint import CheckpointPolicy

aten = torch.ops.aten
# ops that only move or reinterpret data: a rel-pos term goes through these between its bmm and the fused op
_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.permute.default,
          aten.transpose.int, aten.t.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims,
          aten.squeeze.default, aten.expand.default, aten.alias.default, aten.slice.Tensor, aten.select.int}
_COPIES = {aten.clone.default, aten._to_copy.default, torch.ops.prims.convert_element_type.default}
_LAYOUT = _VIEWS | _COPIES
_BMM = {aten.bmm.default, aten.mm.default}
# what a triton_op's kernel launches become in a traced graph (torch.library.wrap_triton)
_TRITON_CALLS = {getattr(torch.ops.higher_order, name, None)
                 for name in ("triton_kernel_wrapper_functional", "triton_kernel_wrapper_mutation")} - {None}


def _is_sink(node: Node) -> bool:
    """The fused op in the joint graph: samhq's rel_pos_attention ops, or a call of its Triton kernels (the triton_op
    registration, traced)."""
    if node.op != "call_function":
        return False
    if getattr(node.target, "namespace", None) == "samhq":
        return node.target.name().split("::")[-1].startswith("rel_pos_attention")
    if node.target in _TRITON_CALLS:
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        kernel = kernel_side_table.get_kernel(node.kwargs["kernel_idx"])
        module = getattr(getattr(kernel, "fn", kernel), "__module__", "") or ""
        return module.startswith(("samhq_fx.kernels.", "kernels."))  # ours, not another library's
    return False


def _is_tangent(node: Node) -> bool:
    return node.op == "placeholder" and "tangents" in str(node.target)  # AOTAutograd's names, as its partitioner reads


def _sinks_reached(node: Node, memo: dict[Node, frozenset]) -> frozenset:
    """The fused-op nodes that `node`'s value reaches through layout ops alone."""
    if node in memo:
        return memo[node]
    found = set()
    for user in node.users:
        if _is_sink(user):
            found.add(user)
        elif user.op == "call_function" and user.target in _LAYOUT:
            found |= _sinks_reached(user, memo)
    memo[node] = frozenset(found)
    return memo[node]


def _backward_nodes(graph: Graph) -> set[Node]:
    """Nodes that depend on a tangent: the joint graph's backward."""
    seen: set[Node] = set()
    for node in graph.nodes:
        if _is_tangent(node):
            seen.add(node)
        elif any(arg in seen for arg in node.all_input_nodes):
            seen.add(node)
    return seen


def _copy_under_views(node: Node) -> Node | None:
    """The copy (aten.clone) a bmm operand is a view of, if it is one."""
    while node.op == "call_function" and node.target in _VIEWS:
        node = node.args[0]
    return node if node.op == "call_function" and node.target is aten.clone.default else None


def _source(node: Node) -> Node:
    """The tensor a chain of layout ops starts from (q, or the packed qkv it is sliced from)."""
    while node.op == "call_function" and node.target in _LAYOUT:
        node = node.args[0]
    return node


def rel_pos_copies(graph: Graph) -> list[Node]:
    """The forward's copies of q that a fused attention's rel-pos einsum bmms read, in graph order."""
    backward = _backward_nodes(graph)
    if not backward:  # an inference graph (no tangents): nothing is saved for a backward
        return []
    memo: dict[Node, frozenset] = {}
    found: dict[Node, None] = {}
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in _BMM or node in backward:
            continue
        sinks = _sinks_reached(node, memo)
        if not sinks:
            continue
        for operand in node.args[:2]:
            copy = _copy_under_views(operand)  # a forward bmm's operand: a forward node too
            if copy is None:
                continue
            if _sinks_reached(_source(copy), memo) & sinks:  # the copy reads the fused op's q
                found[copy] = None
    return list(found)


class RecomputeRelCopies(CustomGraphPass):
    """Inductor joint_custom_post_pass: tag rel_pos_copies(graph) MUST_RECOMPUTE."""

    def __call__(self, graph: Graph) -> None:
        # a copy an activation-checkpoint policy already tagged (torch.utils.checkpoint) keeps the user's tag
        copies = [node for node in rel_pos_copies(graph) if "recompute" not in node.meta]
        for node in copies:
            node.meta["recompute"] = CheckpointPolicy.MUST_RECOMPUTE
        counters["samhq"]["recomputed_copies"] += len(copies)

    def uuid(self) -> bytes:
        return get_hash_for_files((__file__,))
