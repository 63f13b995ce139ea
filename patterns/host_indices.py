"""Index tensors built on the host for a tensor that lives on a GPU.

SAM's `get_rel_pos` (HF transformers, segment-anything, ViTDet, MViTv2 alike) builds its table indices with
`torch.arange(q_size)`, no device, so the gather `rel_pos[relative_coords.long()]` indexes a CUDA table with
CPU indices. Every call then copies those indices to the GPU from pageable memory, which blocks the host
until the GPU has caught up, in the forward gather and again in the backward's `index_put_`: 48
cudaStreamSynchronize per bf16 SAM-HQ ViT-B training step on the H200, 478 us each (torch.profiler,
benchmarks/NOTES.md, session 5). The host can then never run ahead of the GPU.

`find_host_indices(graph)` returns, per target device, the factory calls (`torch.arange`) whose results
reach an indexing op only as index operands of a tensor on that device, through ops that depend on nothing
else. Building them on that device instead changes no value: the same integers, computed where they are used.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Graph, Node

from .fx_utils import value

# factory calls that may be moved: what rel-pos index code uses
FACTORIES = (torch.arange,)


def _index_operands(node: Node) -> list[Node]:
    """Tensor index operands of `x[idx]` (operator.getitem with a tensor or a tuple holding tensors)."""
    if node.op != "call_function" or node.target is not operator.getitem:
        return []
    idx = node.args[1]
    items = idx if isinstance(idx, (tuple, list)) else (idx,)
    return [i for i in items if isinstance(i, Node) and isinstance(value(i), torch.Tensor)]


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


def find_host_indices(graph: Graph) -> dict[torch.device, set[Node]]:
    """{device: the host nodes to build on it}, where every use of those nodes stays inside the set or is
    an index operand of a tensor on that device (so moving them cannot change what any other op sees)."""
    per_device: dict[torch.device, set[Node]] = {}
    index_users: dict[torch.device, set[Node]] = {}
    for node in graph.nodes:
        operands = _index_operands(node)
        indexed = value(node.args[0]) if operands else None
        if not isinstance(indexed, torch.Tensor) or indexed.device.type == "cpu":
            continue
        for idx in operands:
            producers = _host_producers(idx)
            if producers:
                per_device.setdefault(indexed.device, set()).update(producers)
                index_users.setdefault(indexed.device, set()).add(node)
    out = {}
    for device, nodes in per_device.items():
        allowed = nodes | index_users[device]
        # a node with a use outside stays on the host, and with it everything connected to it in the set
        # (what it is computed from, and what is computed from it): no op may see both devices
        leaky = [n for n in nodes if any(u not in allowed for u in n.users)]
        nodes = nodes - _connected(nodes, leaky)
        if any(n.op == "call_function" and n.target in FACTORIES for n in nodes):
            out[device] = nodes
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
