"""The einsum that makes a rel-pos term, read as a product and a sum that Inductor can fuse.

SAM's rel-pos terms are einsums of the queries with a gathered table, one per key axis:

    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, Rh)        # HF SAM / SAM-HQ, segment-anything, ViTDet
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, Rw)

Inductor lowers each to a batched GEMM over the query-grid axis (h or w), whose output is laid out
[h, b*w, k]; the fused op reads the term as [b, h*w, k], which that layout cannot give as a view, so every
term was copied once more before the fused kernel (2 launches per layer), and the GEMM itself, with its 14
output columns (28-byte rows in bf16 at SAM's 14x14 windows), falls off cuBLAS's Hopper kernels onto an sm80
WMMA one. The same math as `(r_q[..., None, :] * Rh[None, :, None]).sum(-1)` is one Inductor reduction over c
whose output is written in the fused op's order directly; its backward is reductions too (over k, and over
b*w), with no GEMM. The products are formed in fp32 from the einsum's own operands and the sum accumulates in
fp32, as the GEMM does; the result is cast to the einsum's dtype.

`reduction_of(node)` says whether an einsum node has that form (two operands, one contracted label, the
output's labels all from the operands, no ellipsis or repeats) and how to emit it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import Node

from .fx_utils import value

_EINSUM = (torch.einsum, torch.functional.einsum)
# the view-like ops that may stand between an einsum and the term leaf the matcher found
_PASS_THROUGH = {"getitem", "unsqueeze", "view", "reshape"}


@dataclass
class EinsumReduction:
    node: Node  # the einsum
    a: Node
    b: Node
    a_labels: str
    b_labels: str
    out_labels: str
    summed: str  # the contracted labels


def _labels(node: Node) -> tuple[str, list] | None:
    if node.op != "call_function" or node.target not in _EINSUM or node.kwargs:
        return None
    eq, *ops = node.args
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = list(ops[0])
    if not isinstance(eq, str) or len(ops) != 2 or not all(isinstance(o, Node) for o in ops):
        return None
    return eq.replace(" ", ""), ops


def reduction_of(node: Node) -> EinsumReduction | None:
    """The einsum `node` as a product and a sum over its contracted label, or None if it has another form."""
    parsed = _labels(node)
    if parsed is None:
        return None
    eq, (a, b) = parsed
    if "->" not in eq or "." in eq:
        return None
    ins, out = eq.split("->")
    if ins.count(",") != 1:
        return None
    la, lb = ins.split(",")
    va, vb, vo = value(a), value(b), value(node)
    if va is None or vb is None or vo is None or va.dim() != len(la) or vb.dim() != len(lb):
        return None
    if any(len(set(s)) != len(s) for s in (la, lb, out)) or not set(out) <= set(la) | set(lb):
        return None
    summed = "".join(c for c in la if c in lb and c not in out)
    if len(summed) != 1 or set(la) | set(lb) != set(out) | set(summed):
        return None
    if not (va.dtype.is_floating_point and vb.dtype.is_floating_point):
        return None
    return EinsumReduction(node, a, b, la, lb, out, summed)


def einsum_source(leaf: Node) -> Node | None:
    """The einsum whose value `leaf` is, through single-user view-like ops, or None."""
    from .fx_utils import op_name

    n = leaf
    for _ in range(4):
        if n.op == "call_function" and n.target in _EINSUM:
            return n if len(n.users) == 1 or n is leaf else None
        if op_name(n) not in _PASS_THROUGH and not (n.op == "call_method" and n.target in _PASS_THROUGH):
            return None
        src = n.args[0] if n.args and isinstance(n.args[0], Node) else None
        if src is None or len(src.users) != 1:
            return None
        n = src
    return None


def expand_order(labels: str, full: str) -> tuple[list[int], list[int]]:
    """(permutation of `labels` into `full`'s order, positions of `full` to unsqueeze): how an operand with
    `labels` is laid over the product's axes `full` (output labels, then the summed one)."""
    present = [c for c in full if c in labels]
    perm = [labels.index(c) for c in present]
    missing = [i for i, c in enumerate(full) if c not in labels]
    return perm, missing
