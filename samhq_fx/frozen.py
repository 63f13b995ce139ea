"""`cast_frozen_weights_`: keep a frozen encoder's GEMM and conv weights in the autocast dtype, once.

    samhq_fx.cast_frozen_weights_(model.vision_encoder)       # after freezing, before compiling; bf16 autocast

Under `torch.autocast(dtype=torch.bfloat16)` every `nn.Linear` and `nn.ConvNd` casts its fp32 weight and bias to
bf16 on every call, and a compiled graph does the same: cast kernels on every call (at least 60 `_to_copy` kernels
a step in the compiled frozen ViT-B encoder of SAM-HQ's decoder recipe, H200 profile, benchmarks/DECISIONS.md). A weight
that is never trained needs no fp32 master, so it can be stored in bf16 once. The result is bit-identical:
autocast rounds the fp32 weight to bf16 before the GEMM either way, and a bf16 weight passes through its cast
unchanged. Only frozen parameters (requires_grad False) of modules whose forward is one autocast-cast op on them
are touched; norms, embeddings, rel-pos tables and anything trained keep their dtype (autocast runs norms in
fp32, and the rel-pos tables may be interpolated before they are cast). The frozen weights take half the memory.

A checkpoint written from the model holds those weights in bf16; save from a freshly loaded base (as
examples/samhq_model_io.py does) to keep the original fp32 values.
"""

from __future__ import annotations

import torch

__all__ = ["cast_frozen_weights_"]

# modules whose forward is a single op that autocast casts to the lower precision, on all its floating arguments
# (torch/amp/autocast_mode.py lists: linear, conv1d/2d/3d, conv_transpose1d/2d/3d). Exact types only: a subclass
# may use its weight elsewhere.
_CAST_BY_AUTOCAST = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d,
                     torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d)


def cast_frozen_weights_(module: torch.nn.Module, dtype: torch.dtype = torch.bfloat16) -> int:
    """Cast, in place, the frozen weight and bias of every Linear / ConvNd in `module` whose parameters are all
    frozen to `dtype` (torch.bfloat16 or torch.float16, the autocast dtype the model runs under). Returns the
    number of modules cast. Call it before the first compiled call: a compiled graph guards on its parameters'
    dtypes, so a later cast recompiles."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"cast_frozen_weights_: `module` must be a torch.nn.Module, got {type(module).__name__}")
    if dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"cast_frozen_weights_: `dtype` must be torch.bfloat16 or torch.float16 (an autocast dtype), "
                         f"got {dtype}")
    cast = 0
    for m in module.modules():
        params = list(m.parameters(recurse=False))
        if type(m) not in _CAST_BY_AUTOCAST or not params or any(p.requires_grad for p in params):
            continue
        if all(p.dtype == dtype for p in params):
            continue
        for p in params:  # the same Parameter objects (hooks, PEFT and optimizers that hold them keep working)
            p.data = p.detach().to(dtype)
        cast += 1
    return cast
