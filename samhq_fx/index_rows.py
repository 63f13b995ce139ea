"""`torch.ops.samhq.index_rows`: the row gather `table[index]`, with a backward that stays deterministic.

The host-index pass (host_indices.py) moves SAM's rel-pos table indices to the GPU. With GPU indices Inductor
would compile the gather's backward (an `index_put_` with accumulate) into a scatter with `atomic_add`
(torch/_inductor/lowering.py, `index_put_impl_`), whose float sums change bits from run to run. Behind this
opaque op the backward is PyTorch's own `index_put_(accumulate=True)`, the sort-based kernel on CUDA: the same
bits every run, as with the host indices it replaces.

    index_rows(table, index) -> table[index]
        table: [R, *rest]   index: integer tensor of any shape   out: [*index.shape, *rest]
"""

from __future__ import annotations

import torch


@torch.library.custom_op("samhq::index_rows", mutates_args=())
def index_rows(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return table[index]


@index_rows.register_fake
def _(table, index):
    return table.new_empty((*index.shape, *table.shape[1:]))


@torch.library.custom_op("samhq::index_rows_backward", mutates_args=())
def index_rows_backward(grad: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    # grad: [*index.shape, *rest] -> [rows, *rest], rows summed in a fixed order
    out = grad.new_zeros((rows, *grad.shape[index.dim():]))
    return out.index_put_((index,), grad, accumulate=True)


@index_rows_backward.register_fake
def _(grad, index, rows):
    return grad.new_empty((rows, *grad.shape[index.dim():]))


def _setup_context(ctx, inputs, output):
    table, index = inputs
    ctx.save_for_backward(index)
    ctx.rows = table.shape[0]


def _backward(ctx, grad):
    (index,) = ctx.saved_tensors
    return torch.ops.samhq.index_rows_backward(grad, index, ctx.rows), None


index_rows.register_autograd(_backward, setup_context=_setup_context)
