"""`torch.ops.samhq.index_rows`: the row gather `table[index]`, with a backward that stays deterministic.

The host-index pass (host_indices.py) moves SAM's rel-pos table indices to the GPU. With GPU indices Inductor
would compile the gather's backward (an `index_put_` with accumulate) into a scatter with `atomic_add`
(torch/_inductor/lowering.py, `index_put_impl_`), whose float sums change bits from run to run.

    index_rows(table, index) -> table[index]
        table: [R, *rest]   index: integer tensor of any shape   out: [*index.shape, *rest]

The op is a `torch.library.triton_op` with no kernel of its own: the autograd formula below is what autograd
records, and under torch.compile the op then decomposes into its body, so Inductor fuses the gather with the
index arithmetic and the table's layout copy, and compiles the backward too. The backward is a masked sum:

    d_table[r] = sum over the positions p with index[p] == r of grad[p]

one reduction in a fixed order (no scatter, no atomics): the same bits every run. It touches R x numel(index)
elements, which for SAM's tables (R = 2 * 64 - 1 rows, 64 x 64 indices at 1024x1024) is small; larger gathers
keep PyTorch's sort-based `index_put_(accumulate=True)` behind an opaque op (`index_rows_backward`), also
deterministic. Measured on the H200 (bf16 SAM-HQ ViT-B training step, batch 1, default mode): the opaque op pair
cost 11.3 ms of host time per step, 24 forward and 24 backward calls (torch.profiler and cProfile,
benchmarks/DECISIONS.md, host path).
"""

from __future__ import annotations

import torch

# R x numel(index) above which the backward keeps the sort-based index_put_: the masked sum reads every row of
# grad once per table row (eager and aot_eager would also build the R x numel(index) x C mask product in memory)
MASKED_SUM_LIMIT = 1 << 22


def _gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return table[index]


index_rows = torch.library.triton_op("samhq::index_rows", _gather, mutates_args=())


@torch.library.custom_op("samhq::index_rows_backward", mutates_args=())
def index_rows_backward(grad: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    # grad: [*index.shape, *rest] -> [rows, *rest], rows summed in a fixed order (sort-based on CUDA)
    out = grad.new_zeros((rows, *grad.shape[index.dim():]))
    return out.index_put_((index,), grad, accumulate=True)


@index_rows_backward.register_fake
def _(grad, index, rows):
    return grad.new_empty((rows, *grad.shape[index.dim():]))


def table_grad(grad: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    """The gradient of `table[index]` for a table of `rows` rows: [*index.shape, *rest] -> [rows, *rest]."""
    n = index.numel()
    if rows * n > MASKED_SUM_LIMIT:
        return torch.ops.samhq.index_rows_backward(grad, index, rows)
    rest = grad.shape[index.dim():]
    flat = index.reshape(n)
    flat = torch.where(flat < 0, flat + rows, flat)  # table[-1] is the last row, as in the gather
    hit = flat[None, :] == torch.arange(rows, device=index.device)[:, None]  # [rows, n]
    g = grad.reshape(1, n, -1)  # [1, n, C]
    # where, not a product with a one-hot matrix: a non-finite gradient stays in its own row
    return torch.where(hit[:, :, None], g, torch.zeros((), dtype=grad.dtype, device=grad.device)).sum(1).reshape(
        rows, *rest)


def _setup_context(ctx, inputs, output):
    table, index = inputs
    ctx.save_for_backward(index)
    ctx.rows = table.shape[0]


def _backward(ctx, grad):
    (index,) = ctx.saved_tensors
    return table_grad(grad, index, ctx.rows), None


index_rows.register_autograd(_backward, setup_context=_setup_context)
