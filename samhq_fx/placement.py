"""Where a matched attention runs, decided when the graph is compiled, on the device it is compiled for.

    for_compile(triton_op, patches)
                                what option samhq.triton_op means for one compile (CUDA graphs, compiled autograd)
    misfit(match, heads)        None: the fused op takes it (its output heads-last where heads > 1); else why it is
                                left to Inductor (match report: SKIPPED)
    inductor_launches(match, triton_op)
                                which registration of the op to emit: the triton_op one (Inductor compiles and
                                launches the kernels) or the opaque one (the op launches them itself)

On a CUDA device the fused op runs the Triton kernels and nothing else: an attention that the config table places
with Inductor on that GPU class (configs.py's "place" rows: Inductor measured or estimated faster), or whose launches do
not build or fit it (kernels/fit.py compiles them for its architecture, or finds them in its cache), is left to
Inductor, so it costs what Inductor costs. On other devices (CPU) the op runs its reference: correct, and no faster.
"""

from __future__ import annotations

import math

import torch

from . import op
from .patterns.fx_utils import is_static, value
from .patterns.rel_pos_attention import Match

try:
    from .kernels import arch, fit
    from .kernels import rel_pos_attention as kernels
except ImportError as e:  # no Triton: no kernels, on any device
    arch = fit = kernels = None
    _NO_KERNELS = f"the Triton kernels failed to import ({type(e).__name__}: {e})"


def _hint(size) -> int | None:
    """A size's value: an int, or a SymInt's hint (what this compile was traced with); None if it has none."""
    if isinstance(size, int):
        return size
    hint = getattr(getattr(size, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def _target(m: Match):
    """The Arch the match compiles for (kernels/arch.py), or None off CUDA."""
    q = value(m.q)
    if q is None or arch is None:
        return None
    return arch.of(q.device)


def misfit(m: Match, heads: int = 1) -> str | None:
    """None if the fused op takes this match here, its output written heads-last where heads > 1 (layout.heads_last);
    else the reason it is left to Inductor."""
    q, v = value(m.q), value(m.v)
    if q is None or v is None or q.device.type == "meta":
        return None
    if arch is None:
        return _NO_KERNELS if q.device.type == "cuda" else None
    target = arch.of(q.device)
    if target is None or kernels._INTERPRET:  # CPU and other devices: the reference; the interpreter takes any launch
        return None
    *batch, n_q, d = q.shape
    sizes = [_hint(s) for s in (n_q, d, v.shape[-1], *m.grid)]
    if None in sizes:
        return None  # unbacked sizes: nothing to check them with (the op raises at run time if they do not fit)
    n_q, d, dv, hk, wk = sizes
    meta = dict(device="meta", dtype=q.dtype)
    reason = kernels.unsupported_reason(
        torch.empty(1, n_q, d, **meta), torch.empty(1, hk * wk, d, **meta), torch.empty(1, hk * wk, dv, **meta),
        torch.empty(1, n_q, hk, **meta), torch.empty(1, n_q, wk, **meta))
    if reason is not None:
        return f"the Triton kernels do not take it ({reason})"
    # a static batch is checked as it is; a symbolic one at every batch size whose configs differ
    b = math.prod(batch) if all(map(is_static, batch)) else None
    shape = fit.Shape(b=b, n_q=n_q, hk=hk, wk=wk, d=d, dv=dv, heads=heads)
    precision = torch.get_float32_matmul_precision()
    reason = fit.left_to_inductor(target, q.dtype, precision, shape)  # before compiling anything for it
    if reason is not None:
        return f"the config table places it with Inductor on {target.name} (kernels/configs.py: {reason})"
    reason = fit.misfit(target, q.dtype, precision, shape)
    return None if reason is None else f"the kernels do not fit {target.name}: {reason}"


def for_compile(triton_op: bool | str, patches: dict) -> bool | str:
    """What option samhq.triton_op means for one compile with Inductor config `patches`: True / False as given;
    "auto" is False (the opaque op) under CUDA graphs and compiled autograd, else left to `inductor_launches`."""
    if triton_op != "auto":
        return triton_op
    if patches.get("triton.cudagraphs"):
        # CUDA graphs replay the launches without host work, which is what Inductor's launcher saves
        # ("auto" measured: bf16 train step 71.6 -> 60.7 ms without graphs)
        return False
    if torch._dynamo.config.compiled_autograd:
        # compiled autograd re-traces the backward and opens a triton_op into triton_kernel_wrapper_functional,
        # which Dynamo (torch 2.11) cannot trace: the backward graph broke there and the attention backward
        # ran outside every compiled graph (GPU test). The opaque op stays one node.
        return False
    return "auto"


def dynamic_grids(triton_op: bool | str) -> bool:
    """Whether matches with a symbolic key grid may be fused: not when the triton_op registration is forced (Inductor
    compiles its kernels with the grid as a constant)."""
    return triton_op is not True or not op.HAS_INDUCTOR_VARIANT


def inductor_launches(m: Match, triton_op: bool | str) -> bool:
    """True: emit the triton_op registration. "auto" takes it for static key grids on any CUDA GPU (the match has
    passed `misfit` there, so its kernels build); the opaque op keeps dynamic grids and non-CUDA devices."""
    if triton_op != "auto":
        return bool(triton_op)
    return all(map(is_static, m.grid)) and _target(m) is not None
