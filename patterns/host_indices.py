"""Index tensors built on the host for a tensor that lives on a GPU.

SAM's `get_rel_pos` (HF transformers, segment-anything, ViTDet, MViTv2 alike) builds its table indices with
`torch.arange(q_size)`, no device, so the gather `rel_pos[relative_coords.long()]` indexes a CUDA table with
CPU indices. Every call then copies those indices to the GPU from pageable memory, which blocks the host
until the GPU has caught up, in the forward gather and again in the backward's `index_put_`: 48
cudaStreamSynchronize per bf16 SAM-HQ ViT-B training step on the H200, 478 us each (torch.profiler,
benchmarks/DECISIONS.md). The host can then never run ahead of the GPU.

`find_host_indices(graph)` returns, per target device, the factory calls (`torch.arange`) and the ops after
them that compute only the index of row gathers `table[idx]` from a table on that device, and those gathers.
Building the indices on that device changes no value: the same integers, computed where they are used.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .fx_utils import value

# factory calls that may be moved: what rel-pos index code uses
FACTORIES = (torch.arange,)


def _row_gather_index(node: Node) -> Node | None:
    """`idx` of a row gather `table[idx]` (operator.getitem with one integer tensor), else None. Only this
    form: the pass swaps it for samhq::index_rows, whose backward stays deterministic."""
    if node.op != "call_function" or node.target is not operator.getitem or not isinstance(node.args[1], Node):
        return None
    idx = value(node.args[1])
    if idx is None or idx.dtype not in (torch.int64, torch.int32) or not isinstance(value(node.args[0]), torch.Tensor):
        return None
    return node.args[1]


def _host_producers(root: Node) -> set[Node] | None:
    """The CPU-tensor nodes that compute `root` from factory calls and Python numbers only; None if
    anything else (an input, a parameter, a factory with an explicit device) feeds it."""
    seen: set[Node] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        v = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(v, (int, torch.SymInt)):
            continue  # a size (an input or computed): no device to move
        if not isinstance(v, torch.Tensor):
            return None
        if n.op not in ("call_function", "call_method") or v.device.type != "cpu":
            return None
        seen.add(n)
        if n.op == "call_function" and n.target in FACTORIES:
            if n.kwargs.get("device") is not None:
                return None  # placed on the host on purpose
            continue
        inputs = n.all_input_nodes
        if not inputs:
            return None  # a tensor from no input that is not a known factory (torch.tensor(...), ...)
        stack.extend(inputs)
    return seen


def find_host_indices(graph: Graph) -> dict[torch.device, tuple[set[Node], list[Node]]]:
    """{device: (the host nodes to build on it, the row gathers they index)}, where every use of those nodes
    stays inside the set or is the index of such a gather (so moving them changes what no other op sees)."""
    per_device: dict[torch.device, set[Node]] = {}
    gathers: dict[torch.device, list[Node]] = {}
    for node in graph.nodes:
        idx = _row_gather_index(node)
        table = value(node.args[0]) if idx is not None else None
        if table is None or table.device.type == "cpu":
            continue
        producers = _host_producers(idx)
        if producers:
            per_device.setdefault(table.device, set()).update(producers)
            gathers.setdefault(table.device, []).append(node)
    out = {}
    for device, nodes in per_device.items():
        allowed = nodes | set(gathers[device])
        # a node with a use outside stays on the host, and with it everything connected to it in the set
        # (what it is computed from, and what is computed from it): no op may see both devices
        leaky = [n for n in nodes if any(u not in allowed for u in n.users)]
        nodes = nodes - _connected(nodes, leaky)
        moved = [g for g in gathers[device] if g.args[1] in nodes]
        if moved:
            out[device] = (nodes, moved)
    return out


def _connected(nodes: set[Node], seeds: list[Node]) -> set[Node]:
    """The nodes of `nodes` connected to `seeds` through producer / user edges inside `nodes`."""
    found: set[Node] = set()
    stack = list(seeds)
    while stack:
        n = stack.pop()
        if n in found or n not in nodes:
            continue
        found.add(n)
        stack.extend(n.all_input_nodes)
        stack.extend(n.users)
    return found
