"""Small, composable readers for Dynamo FX graphs (torch-level IR).

Dynamo records one piece of math in many spellings: `a + b`, `torch.add(a, b)`, `a.add(b)`;
`x @ y`, `torch.matmul`, `torch.bmm` (and einsums that are batched matmuls, `einsum_as_matmul`);
`F.softmax`, `torch.softmax`, `x.softmax`. The matcher
asks questions about meaning ("is this an add, and of what?"), so every spelling is folded here
into one canonical op name with normalised arguments. Shapes come from the fake tensors Dynamo
stores in `node.meta["example_value"]`.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import Node

try:  # compare symbolic sizes without installing guards
    from torch.fx.experimental.symbolic_shapes import statically_known_true
except ImportError:  # pragma: no cover
    statically_known_true = None

# call_function targets -> canonical name
_FUNCTIONS: dict[Any, str] = {
    operator.add: "add", operator.iadd: "add", torch.add: "add",
    operator.mul: "mul", operator.imul: "mul", torch.mul: "mul",
    operator.truediv: "div", operator.itruediv: "div", torch.div: "div", torch.true_divide: "div",
    operator.matmul: "matmul", torch.matmul: "matmul", torch.bmm: "matmul",
    torch.einsum: "einsum", torch.baddbmm: "baddbmm",
    F.softmax: "softmax", torch.softmax: "softmax", torch.special.softmax: "softmax",
    F.dropout: "dropout", torch.dropout: "dropout",
    F.scaled_dot_product_attention: "sdpa",
    torch.reshape: "reshape", torch.flatten: "reshape", torch.unflatten: "reshape",
    torch.transpose: "transpose", torch.swapaxes: "transpose", torch.swapdims: "transpose", torch.permute: "permute",
    torch.broadcast_to: "expand",
    torch.unsqueeze: "unsqueeze", torch.t: "t", operator.getitem: "getitem",
    torch.ops.aten.mT: "mT", torch.ops.aten.mT.default: "mT",  # k.mT as Dynamo records it from torch 2.14
}
for _name in ("add", "mul", "div", "matmul", "bmm", "baddbmm", "softmax", "reshape", "transpose", "swapaxes",
              "swapdims", "permute", "unsqueeze", "t", "expand"):
    _FUNCTIONS.setdefault(getattr(torch.Tensor, _name), {"bmm": "matmul", "swapaxes": "transpose",
                                                          "swapdims": "transpose"}.get(_name, _name))

# call_method names -> canonical name
_METHODS = {
    "add": "add", "add_": "add", "__add__": "add", "__radd__": "add",
    "mul": "mul", "mul_": "mul", "__mul__": "mul", "__rmul__": "mul",
    "div": "div", "div_": "div", "__truediv__": "div",
    "matmul": "matmul", "bmm": "matmul", "__matmul__": "matmul", "baddbmm": "baddbmm",
    "softmax": "softmax",
    "reshape": "reshape", "view": "reshape", "reshape_as": "reshape", "view_as": "reshape",
    "flatten": "reshape", "unflatten": "reshape",
    "transpose": "transpose", "swapaxes": "transpose", "swapdims": "transpose", "permute": "permute", "t": "t",
    "unsqueeze": "unsqueeze", "expand": "expand", "expand_as": "expand",
    "to": "cast", "type": "cast", "type_as": "cast", "float": "cast", "half": "cast",
    "bfloat16": "cast", "contiguous": "identity", "clone": "identity",
}


def op_name(node: Node) -> str | None:
    """Canonical name of what `node` computes, or None for anything the matcher does not read."""
    if node.op == "call_function":
        if node.target is getattr and node.args[1:] == ("mT",):  # k.mT: Dynamo records the attribute read
            return "mT"
        return _FUNCTIONS.get(node.target) or _sdpa_alias(node.target)
    if node.op == "call_method":
        return _METHODS.get(node.target)
    return None


def _sdpa_alias(target) -> str | None:
    # torch._C._nn.scaled_dot_product_attention is what Dynamo records for F.sdpa.
    return "sdpa" if getattr(target, "__name__", "") == "scaled_dot_product_attention" else None


def arg(node: Node, index: int, name: str, default: Any = None) -> Any:
    """Argument `index` (positional, counting self for methods) or keyword `name`."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def value(node: Any) -> torch.Tensor | None:
    """The fake tensor Dynamo recorded for `node` (None for non-tensors and non-nodes)."""
    if not isinstance(node, Node):
        return None
    v = node.meta.get("example_value", node.meta.get("val"))
    return v if isinstance(v, torch.Tensor) else None


def shape(node: Any) -> tuple | None:
    v = value(node)
    return None if v is None else tuple(v.shape)


def is_static(size: Any) -> bool:
    return isinstance(size, int)


def same_size(a: Any, b: Any) -> bool:
    """a == b for sizes that may be symbolic, true only if provably equal (no guard installed)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if statically_known_true is None:
        return False
    return bool(statically_known_true(a == b))


def same_shape(a: tuple | None, b: tuple | None) -> bool:
    """Shapes provably equal, dim by dim (same_size: symbolic sizes compared without a guard)."""
    return a is not None and b is not None and len(a) == len(b) and all(map(same_size, a, b))


def numel(shp: tuple) -> Any:
    return math.prod(shp) if shp else 1


def as_number(x: Any) -> float | None:
    """A Python constant usable as a scale factor (not a tensor, not a SymFloat)."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return None


def is_last_two_swapped(node: Node, ndim: int) -> bool:
    """transpose(-2, -1) (or swapaxes) / permute(..., n-1, n-2) / .t() / .mT: the k -> k^T of attention scores."""
    name = op_name(node)
    if name == "t":
        return ndim == 2
    if name == "mT":
        return ndim >= 2
    if name == "transpose":
        d0, d1 = arg(node, 1, "dim0"), arg(node, 2, "dim1")
        if not (isinstance(d0, int) and isinstance(d1, int)):
            return False
        return {d0 % ndim, d1 % ndim} == {ndim - 2, ndim - 1}
    if name == "permute":
        dims = node.args[1:] if node.op == "call_method" else [arg(node, 1, "dims")]
        if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
            dims = dims[0]
        dims = [d % ndim for d in dims] if all(isinstance(d, int) for d in dims) else None
        return dims == [*range(ndim - 2), ndim - 1, ndim - 2]
    return False


def einsum_as_matmul(node: Node) -> tuple[Node, Node, bool] | None:
    """A two-operand einsum that is a batched matmul: (a, b, b_transposed) such that the einsum is a @ b, or
    a @ b^T when b_transposed, over the same leading batch dims; None for any other einsum.

    "bqd,bkd->bqk" is q @ k^T, "bqk,bkd->bqd" is P @ v, and so is either with its operands swapped
    ("bkd,bqd->bqk" is q @ k^T with q second). Batch letters, or a leading "...", must be the same, in the same
    order, in both operands and the output; anything else (a sum over a batch letter, a reordered output, one
    operand) is not a matmul and returns None.
    """
    if op_name(node) != "einsum" or not node.args or not isinstance(node.args[0], str):
        return None
    ops = node.args[1:]
    if len(ops) == 1 and isinstance(ops[0], (list, tuple)):
        ops = tuple(ops[0])
    eq = node.args[0].replace(" ", "")
    if len(ops) != 2 or not all(isinstance(o, Node) for o in ops) or eq.count("->") != 1:
        return None
    lhs, out = eq.split("->")
    if lhs.count(",") != 1:
        return None
    subs = lhs.split(",") + [out]
    if all(s.startswith("...") for s in subs):
        subs = [s[3:] for s in subs]
    if any("." in s or len(s) < 2 or len(set(s)) != len(s) for s in subs):
        return None
    so = subs[2]
    for (a, sa), (b, sb) in (((ops[0], subs[0]), (ops[1], subs[1])), ((ops[1], subs[1]), (ops[0], subs[0]))):
        batch = sa[:-2]
        if sb[:-2] != batch or so[:-2] != batch:
            continue
        (i, j), (x, y), (o1, o2) = sa[-2:], sb[-2:], so[-2:]
        if o1 != i or len({*batch, i, j, x, y}) != len(batch) + 3:  # i, j and the free letter: new, distinct
            continue
        if x == j and o2 == y:  # a @ b: [.., i, j] x [.., j, y] -> [.., i, y]
            return a, b, False
        if y == j and o2 == x:  # a @ b^T: [.., i, j] x [.., x, j] -> [.., i, x]
            return a, b, True
    return None


def is_whole_index(index: Any) -> bool:
    """x[index] is all of x: slices `:` or `0:` (and Ellipsis) only, as in timm's MViTv2 `attn[:, :, 0:, 0:]`."""
    parts = index if isinstance(index, tuple) else (index,)
    whole = lambda p: p is Ellipsis or (isinstance(p, slice) and p.start in (None, 0) and p.stop is None  # noqa: E731
                                        and p.step in (None, 1))
    return all(map(whole, parts))


def single_user(node: Node) -> Node | None:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def fake_run(node: Node, fake_mode, env: dict | None = None):
    """Run `node`'s call on fake values: its arguments' recorded ones, or env[arg] where given."""
    env = env or {}

    def fake(a):
        if not isinstance(a, Node):
            return a
        return env[a] if a in env else a.meta.get("example_value", a.meta.get("val"))

    args = torch.fx.node.map_aggregate(node.args, fake)
    kwargs = torch.fx.node.map_aggregate(node.kwargs, fake)
    with fake_mode:
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return node.target(*args, **kwargs)
