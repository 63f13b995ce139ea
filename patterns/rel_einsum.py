"""Find the einsums that make a fused attention's rel-pos terms, where their key axis leaves cuBLAS's fast kernels.

SAM computes each term as `einsum("bhwc,hkc->bhwk", q, R)` (and "bhwc,wkc->bhwk"): one batched GEMM per query
row (or column) whose output rows are k elements long. With k = 14 (the 14x14 windows) a bf16 row is 28 bytes,
and cuBLAS leaves its Hopper kernels for an sm80 WMMA GEMM (`cutlass_80_wmma_tensorop_bf16_s161616gemm`, 16x16
tiles): 869 us of a ViT-B bf16 batch-1 training step on the H200 (benchmarks/NOTES.md, kernels). A key axis padded
to a multiple of 8 gives 16-byte rows.

Found from the rel-term leaves the matcher gives (Match.rel_h / rel_w), through the view-like nodes the model
puts between (HF: `rel_h[:, :, :, :, None]`), to an einsum of two operands whose second is [x, k, c]: x a batch
label of the first operand and of the output, c contracted, k the output's last label and nothing else's. Any
other spelling of the term is left as it is.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from .fx_utils import is_static, value

_EINSUMS = (torch.einsum, torch.functional.einsum)
_VIEW_FUNCTIONS = (operator.getitem, torch.squeeze, torch.flatten, torch.reshape, torch.unsqueeze)
_VIEW_METHODS = ("squeeze", "flatten", "unsqueeze", "reshape", "view", "contiguous", "to")
ALIGN = 8  # elements: 16-byte rows in bf16 / fp16, 32-byte in fp32


def rel_term_einsum(leaf: Node) -> Node | None:
    """The einsum whose value the rel-term leaf is, through view-like nodes (their first argument), or None."""
    node = leaf
    while isinstance(node, Node):
        if node.op == "call_function" and node.target in _EINSUMS:
            return node
        if not ((node.op == "call_function" and node.target in _VIEW_FUNCTIONS) or (
                node.op == "call_method" and node.target in _VIEW_METHODS)):
            return None
        node = node.args[0] if node.args else None
    return None


def key_axis_to_pad(einsum: Node) -> int | None:
    """The key-axis size k of a rel-pos term einsum (see the module docstring) when k is not a multiple of ALIGN;
    None for any other einsum, or when sizes are not static."""
    if len(einsum.args) != 3 or einsum.kwargs or not isinstance(einsum.args[0], str):
        return None
    eq = einsum.args[0].replace(" ", "")
    if "." in eq or "->" not in eq or eq.count(",") != 1:
        return None
    (lhs_a, lhs_b), out = eq.split("->")[0].split(","), eq.split("->")[1]
    if len(lhs_b) != 3:
        return None
    x, k, c = lhs_b
    if not (out.endswith(k) and k not in lhs_a and c in lhs_a and c not in out and x in lhs_a and x in out):
        return None
    q, r = value(einsum.args[1]), value(einsum.args[2])
    if q is None or r is None or r.dim() != 3 or not is_static(r.shape[1]):
        return None
    size = int(r.shape[1])
    return size if size > 1 and size % ALIGN else None
