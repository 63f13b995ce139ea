"""The fused op: `torch.ops.samhq.rel_pos_attention` and its backward, registered with torch.library.

    rel_pos_attention(q, k, v, rel_h, rel_w, scale, heads=1) -> (out, lse)
        q: [B*heads, Nq, D]   k: [B*heads, Nk, D]   v: [B*heads, Nk, Dv]
        rel_h: [B*heads, Nq, Hk]   rel_w: [B*heads, Nq, Wk]   with Hk * Wk == Nk (the key grid)
        (either term may be [B*heads, Hq, Wq, K] with Hq * Wq == Nq: the query grid as two dims, which is how
        the rewrite hands over terms whose rows a flat dim cannot view; the kernels read them in place)
        out: [B*heads, Nq, Dv] (q's dtype), or with heads > 1 [B, Nq, heads, Dv]: heads-last, the order the
        projection after attention reads (the rewrite asks for it where the model puts heads next to features,
        which then costs no copy)   lse: [B*heads, Nq] fp32 row log-sum-exp

rel_h / rel_w come in as tensors so the table gather, interpolation and einsums that make them stay
ordinary graph ops for autograd and Inductor; the op's backward returns dq, dk, dv, d_rel_h, d_rel_w.
It saves (out, lse) for a flash-style backward, never the probabilities.

Dispatch happens inside the op: Triton kernels on CUDA, the blocked reference (`reference.py`, O(block x N)
memory) on other devices. On CUDA the reference runs only when asked for (SAMHQ_FX_REFERENCE=1): the rewrite
leaves to Inductor every attention whose kernels do not build or fit the GPU (placement.py), so a call the
kernels cannot take is an error, not a silent slow path. By default the ops are
opaque custom ops: a compiled graph (and its CUDA graph) calls them and they launch the kernels. The
same op is also registered as a `torch.library.triton_op` (`samhq::rel_pos_attention_inductor`), which
Inductor traces into and compiles itself; the rewrite emits it with the backend option
`samhq.triton_op` (or SAMHQ_FX_TRITON_OP=1). The reference is its own opaque op so its loop over query
blocks is never unrolled into a graph.
"""

from __future__ import annotations

import contextlib
import logging
import os

import torch

from . import reference

log = logging.getLogger("samhq_fx")

try:  # Triton (and with it the kernels) exists on Linux; elsewhere the reference serves alone.
    from .kernels import rel_pos_attention as _kernels
    from torch.library import triton_op as _define_op

    _KERNELS_MISSING = None
except ImportError as e:  # pragma: no cover - exercised only where the import fails (tests/test_op.py, a subprocess)
    _kernels = None
    _define_op = None
    # what failed, not a guess: a missing triton, a triton too old for an import the kernels make, a broken install
    _KERNELS_MISSING = f"the Triton kernels failed to import ({type(e).__name__}: {e})"

try:
    from torch._library.triton import set_wrap_triton_enabled as _set_wrap_triton_enabled
except ImportError:  # pragma: no cover
    _set_wrap_triton_enabled = None

_warned: set[tuple[int, str]] = set()

_FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor rel_h, Tensor rel_w, float scale, int heads=1) -> (Tensor, Tensor)")
_BWD_SCHEMA = (
    "(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor rel_h, Tensor rel_w, Tensor out, Tensor lse, "
    "float scale) -> (Tensor, Tensor, Tensor, Tensor, Tensor)"
)


def _direct_triton_launch():
    return _set_wrap_triton_enabled(False) if _set_wrap_triton_enabled else contextlib.nullcontext()


def _kernel_skip_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if the Triton kernels take this call; otherwise why the reference runs instead."""
    if _kernels is None:
        return _KERNELS_MISSING
    if q.device.type != "cuda":
        return f"no kernel for device {q.device.type}"
    return _kernels.unsupported_reason(q, k, v, rel_h, rel_w)


def _log_once(msg: str, level: int = logging.INFO) -> None:
    # One log line per distinct message and level, not one per call.
    if (level, msg) not in _warned:
        _warned.add((level, msg))
        log.log(level, "samhq_fx: %s", msg)


def _reference_allowed(device: torch.device) -> bool:
    """Whether the reference may stand in for the kernels here: off CUDA always; on CUDA only if asked for."""
    return device.type != "cuda" or os.environ.get("SAMHQ_FX_REFERENCE", "") not in ("", "0")


def _no_kernel(reason: str, q) -> ValueError:
    return ValueError(
        f"samhq_fx: rel_pos_attention on {q.device}: the Triton kernels cannot take q {tuple(q.shape)} "
        f"({q.dtype}): {reason}. Compiled models leave such attention to Inductor; for a direct call, set "
        f"SAMHQ_FX_REFERENCE=1 to run the PyTorch reference instead (slow, O(block x N) memory)")


def _note_fallback(reason: str, device: torch.device) -> None:
    """Say once per reason that the reference runs. On CUDA that is a WARNING: the user asked for the fused
    kernels and gets the slow path (a shape, dtype or GPU they do not cover); on other devices the reference is
    the expected path, so INFO."""
    level = logging.WARNING if device.type == "cuda" else logging.INFO
    _log_once(f"rel_pos_attention uses the reference implementation ({reason})", level)


# --- reference path: opaque custom ops --------------------------------------------------------


@contextlib.contextmanager
def _explain_oom(q, k, v, rel_h, rel_w):
    # The reference holds one [B*heads, block, N] score tile at a time; running out of memory here says
    # the kernels did not take this call, which is what the user can change.
    try:
        yield
    except torch.OutOfMemoryError as e:
        reason = _kernel_skip_reason(q, k, v, rel_h, rel_w) or "kernel failed earlier for this shape"
        raise torch.OutOfMemoryError(
            f"samhq_fx: out of memory in the reference rel_pos_attention for q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, key grid {rel_h.shape[-1]}x{rel_w.shape[-1]}, {q.dtype} on {q.device} "
            f"(the Triton kernels did not take it: {reason}). The kernel path (CUDA; fp16, bf16 or fp32; "
            f"head dim <= 128) needs no N x N memory; or use a smaller batch. Original error: {e}"
        ) from e


@torch.library.custom_op("samhq::rel_pos_attention_reference", mutates_args=())
def _reference_fwd(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    with _explain_oom(q, k, v, rel_h, rel_w):
        return reference.forward(q, k, v, rel_h, rel_w, scale)


_reference_fwd.register_fake(lambda *args: _fwd_fake(*args))


@torch.library.custom_op("samhq::rel_pos_attention_reference_backward", mutates_args=())
def _reference_bwd(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor,
    rel_w: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    with _explain_oom(q, k, v, rel_h, rel_w):
        return reference.backward(dout, q, k, v, rel_h, rel_w, out, lse, scale)


_reference_bwd.register_fake(lambda *args: _bwd_fake(*args))


# --- the public ops: kernel or reference, chosen per call ---------------------------------------


def _shape_key(q, k, v, rel_h, rel_w) -> tuple:
    # What decides which kernel binary runs: a compile failure for one key says nothing of others.
    return (q.device.type, q.dtype, q.shape[-1], v.shape[-1], rel_h.shape[-1], rel_w.shape[-1],
            torch.get_float32_matmul_precision())


_broken: set[tuple] = set()


def _with_kernel_fallback(kernel_call, reference_call, inputs, direction: str):
    """Run kernel_call; if the kernels fail to compile or launch here, warn once and use the reference where it is
    allowed (`_reference_allowed`: off CUDA, or asked for), else raise. An
    out-of-memory error is re-raised: the reference would need more memory, not less. Forward and
    backward fail separately: a backward kernel that does not fit must not switch the forward over
    mid-run (that changed the forward's bits between the first step and the next, on the H200).
    """
    key = (direction, *_shape_key(*inputs))
    if key not in _broken:
        try:
            return kernel_call()
        except torch.OutOfMemoryError:
            raise
        except Exception as e:  # Triton CompilationError, OutOfResources, driver launch errors
            if not _reference_allowed(inputs[0].device):
                raise RuntimeError(
                    f"samhq_fx: the Triton {direction} kernel failed for {key} ({type(e).__name__}). Set "
                    f"SAMHQ_FX_REFERENCE=1 to run the PyTorch reference instead") from e
            _broken.add(key)
            log.warning(
                "samhq_fx: Triton kernel failed for %s (%s: %s); using the reference implementation for it",
                key, type(e).__name__, str(e).splitlines()[0] if str(e) else "",
            )
    return reference_call()


def _heads_last(out: torch.Tensor, heads: int) -> torch.Tensor:
    # [B*heads, N, Dv] -> [B, N, heads, Dv] (a copy)
    return out.unflatten(0, (-1, heads)).transpose(1, 2).contiguous() if heads > 1 else out


def _heads_first(t: torch.Tensor) -> torch.Tensor:
    # [B, N, heads, Dv] -> [B*heads, N, Dv] (a copy); 3-D tensors as they are
    return t.transpose(1, 2).flatten(0, 1) if t.dim() == 4 else t


def _check_heads(q: torch.Tensor, heads: int) -> None:
    if not isinstance(heads, int) or heads < 1 or q.shape[0] % heads:
        raise ValueError(f"samhq_fx: rel_pos_attention: `heads` must be an int >= 1 dividing q.shape[0] "
                         f"(batch*heads) = {q.shape[0]}, got {heads!r}")


def _fwd_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor, rel_w: torch.Tensor, scale: float,
    heads: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_heads(q, heads)
    reason = _kernel_skip_reason(q, k, v, rel_h, rel_w)

    def reference_call():
        out, lse = torch.ops.samhq.rel_pos_attention_reference(q, k, v, rel_h, rel_w, scale)
        return _heads_last(out, heads), lse

    if reason is None:
        kernel_call = lambda: _kernels.forward(q, k, v, rel_h, rel_w, scale, heads=heads)  # noqa: E731
        return _with_kernel_fallback(kernel_call, reference_call, (q, k, v, rel_h, rel_w), "forward")
    if not _reference_allowed(q.device):
        raise _no_kernel(reason, q)
    _note_fallback(reason, q.device)
    return reference_call()


def _bwd_impl(
    dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel_h: torch.Tensor,
    rel_w: torch.Tensor, out: torch.Tensor, lse: torch.Tensor, scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (dout, q, k, v, rel_h, rel_w, out, lse, scale)
    # out, dout: [B, N, heads, Dv] where the forward ran with heads > 1 (the reference takes them heads-first)
    reference_call = lambda: torch.ops.samhq.rel_pos_attention_reference_backward(  # noqa: E731
        _heads_first(dout), q, k, v, rel_h, rel_w, _heads_first(out), lse, scale)
    reason = _kernel_skip_reason(q, k, v, rel_h, rel_w)
    if reason is None:
        kernel_call = lambda: _kernels.backward(*args)  # noqa: E731
        return _with_kernel_fallback(kernel_call, reference_call, (q, k, v, rel_h, rel_w), "backward")
    if not _reference_allowed(q.device):
        raise _no_kernel(reason, q)
    return reference_call()


def _fwd_fake(q, k, v, rel_h, rel_w, scale, heads=1):
    _check_heads(q, heads)
    b, n_q, _ = q.shape
    out = q.new_empty((b // heads, n_q, heads, v.shape[-1]) if heads > 1 else (b, n_q, v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32)


def _bwd_fake(dout, q, k, v, rel_h, rel_w, out, lse, scale):
    # Contiguous, whatever the inputs' strides: Inductor may hand the op inputs laid out differently
    # from eager, so output strides must not depend on them (kernels and reference allocate alike).
    return tuple(t.new_empty(t.shape) for t in (q, k, v, rel_h, rel_w))


def _opaque(fn):
    # Launch the kernels straight through Triton's JIT (no wrap_triton HOP dispatch in eager).
    def run(*args):
        with _direct_triton_launch():
            return fn(*args)

    return run


def _setup_context(ctx, inputs, output):
    q, k, v, rel_h, rel_w, scale, *_heads = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, rel_h, rel_w, out, lse)
    ctx.scale = scale
    ctx.mark_non_differentiable(lse)


def _autograd_via(backward_op):
    def backward(ctx, dout, _dlse):
        q, k, v, rel_h, rel_w, out, lse = ctx.saved_tensors
        return (*backward_op(dout, q, k, v, rel_h, rel_w, out, lse, ctx.scale), None, None)

    return backward


# Two registrations of the same op, chosen per compile by the rewrite (backend option samhq.triton_op):
#   samhq::rel_pos_attention            opaque custom op: the compiled graph (and its CUDA graph) calls it,
#                                       it launches the kernels through Triton. The default.
#   samhq::rel_pos_attention_inductor   torch.library.triton_op: Inductor traces into it and compiles and
#                                       launches the kernels from its own generated code. The kernels then
#                                       specialise on the key grid at compile time, so the rewrite leaves
#                                       dynamic grids alone in that mode.
# Each has its own backward op, so autograd never mixes the two.
rel_pos_attention_op = torch.library.custom_op(
    "samhq::rel_pos_attention", mutates_args=(), schema=_FWD_SCHEMA
)(_opaque(_fwd_impl))
rel_pos_attention_op.register_fake(_fwd_fake)
rel_pos_attention_backward_op = torch.library.custom_op(
    "samhq::rel_pos_attention_backward", mutates_args=(), schema=_BWD_SCHEMA
)(_opaque(_bwd_impl))
rel_pos_attention_backward_op.register_fake(_bwd_fake)
rel_pos_attention_op.register_autograd(
    _autograd_via(torch.ops.samhq.rel_pos_attention_backward.default), setup_context=_setup_context
)

HAS_INDUCTOR_VARIANT = _kernels is not None
if HAS_INDUCTOR_VARIANT:
    rel_pos_attention_inductor_op = _define_op("samhq::rel_pos_attention_inductor", mutates_args=())(_fwd_impl)
    _define_op("samhq::rel_pos_attention_inductor_backward", mutates_args=())(_bwd_impl)
    rel_pos_attention_inductor_op.register_autograd(
        _autograd_via(torch.ops.samhq.rel_pos_attention_inductor_backward.default), setup_context=_setup_context
    )


def fused_op(triton_op: bool):
    """The forward op the rewrite emits: the triton_op registration if asked for and available."""
    if triton_op and HAS_INDUCTOR_VARIANT:
        return torch.ops.samhq.rel_pos_attention_inductor.default
    if triton_op:
        _log_once(f"samhq.triton_op needs the Triton kernels, and {_KERNELS_MISSING}; using the opaque op")
    return torch.ops.samhq.rel_pos_attention.default


# --- functional API -----------------------------------------------------------------------------


def _check_inputs(q, k, v, rel_h, rel_w, scale) -> None:
    """Raise a clear error for inputs the op cannot take. Every call asks; a signature that passed is not checked
    again (the checks read only types, shapes, dtypes and devices). Not while Dynamo traces the call: the lookup would
    specialize every size (and guard on the set), so a dynamic batch would recompile per value."""
    if torch.compiler.is_compiling():
        return _check_signature(q, k, v, rel_h, rel_w, scale)
    try:
        key = (type(scale), *[(type(t), t.shape, t.dtype, t.device) for t in (q, k, v, rel_h, rel_w)])
        if key in _CHECKED:
            return
    except (AttributeError, TypeError):  # not tensors, or a symbolic size: checked below, not kept
        key = None
    _check_signature(q, k, v, rel_h, rel_w, scale)
    if key is not None:
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED.add(key)


_CHECKED: set[tuple] = set()


def _check_signature(q, k, v, rel_h, rel_w, scale) -> None:
    named = {"q": q, "k": k, "v": v, "rel_h": rel_h, "rel_w": rel_w}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rel_pos_attention: `{name}` must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 and not (name.startswith("rel_") and t.dim() == 4):
            grid = " or 4-D [batch*heads, query rows, query columns, key rows or columns]" if name.startswith(
                "rel_") else ""
            raise ValueError(
                f"rel_pos_attention: `{name}` must be 3-D [batch*heads, tokens, features]{grid}, got shape "
                f"{tuple(t.shape)}"
            )
    b, n_q, d = q.shape
    if k.shape[0] != b or v.shape[0] != b or rel_h.shape[0] != b or rel_w.shape[0] != b:
        raise ValueError(
            "rel_pos_attention: all inputs need the same batch*heads (dim 0); got "
            + ", ".join(f"{n}={tuple(t.shape)}" for n, t in named.items())
        )
    if k.shape[2] != d:
        raise ValueError(f"rel_pos_attention: `k` must have q's head_dim {d} in dim 2, got shape {tuple(k.shape)}")
    if v.shape[1] != k.shape[1]:
        raise ValueError(f"rel_pos_attention: `v` must have as many tokens as `k` ({k.shape[1]}), got {tuple(v.shape)}")
    if reference.query_rows(rel_h) != n_q or reference.query_rows(rel_w) != n_q:
        raise ValueError(
            f"rel_pos_attention: `rel_h` and `rel_w` must have one row per query ({n_q}), got "
            f"{tuple(rel_h.shape)} and {tuple(rel_w.shape)}"
        )
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    if hk * wk != k.shape[1]:
        raise ValueError(
            f"rel_pos_attention: key grid rel_h.shape[-1] x rel_w.shape[-1] = {hk} x {wk} = {hk * wk} must equal "
            f"the number of keys k.shape[1] = {k.shape[1]}"
        )
    dtypes = {n: t.dtype for n, t in named.items()}
    if len(set(dtypes.values())) != 1:
        raise TypeError(f"rel_pos_attention: all inputs must share one dtype, got {dtypes}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"rel_pos_attention: inputs must be floating point, got {q.dtype}")
    devices = {n: t.device for n, t in named.items()}
    if len(set(devices.values())) != 1:
        raise ValueError(f"rel_pos_attention: all inputs must be on one device, got {devices}")
    if not isinstance(scale, (int, float)):
        raise TypeError(f"rel_pos_attention: `scale` must be a Python float, got {type(scale).__name__}")


def rel_pos_attention(q, k, v, rel_h, rel_w, scale: float | None = None) -> torch.Tensor:
    """softmax(scale * q @ k^T + rel_h[..., :, None] + rel_w[..., None, :]) @ v, fused.

    q: [B*heads, Nq, D], k: [B*heads, Nk, D], v: [B*heads, Nk, Dv], rel_h: [B*heads, Nq, Hk],
    rel_w: [B*heads, Nq, Wk] with Hk * Wk == Nk (either term may be [B*heads, Hq, Wq, K] with Hq * Wq == Nq,
    read at its strides); scale defaults to D ** -0.5.
    Returns [B*heads, Nq, Dv]. Differentiable in all five tensors.
    """
    if scale is None and isinstance(q, torch.Tensor) and q.dim() == 3:
        scale = q.shape[-1] ** -0.5
    _check_inputs(q, k, v, rel_h, rel_w, scale)
    if q.device.type == "cuda" and not torch.compiler.is_compiling():
        return _EagerRelPosAttention.apply(q, k, v, rel_h, rel_w, float(scale))
    out, _lse = torch.ops.samhq.rel_pos_attention(q, k, v, rel_h, rel_w, float(scale))
    return out


class _EagerRelPosAttention(torch.autograd.Function):
    """The op called eagerly on CUDA: the same implementation as torch.ops.samhq.rel_pos_attention, without the
    custom op's dispatch (its Python layers cost more host time than the attention's GPU time at SAM's windows).
    Traced code (Dynamo, export) keeps the custom op, one node."""

    @staticmethod
    def forward(ctx, q, k, v, rel_h, rel_w, scale):
        with _direct_triton_launch():
            out, lse = _fwd_impl(q, k, v, rel_h, rel_w, scale)
        ctx.save_for_backward(q, k, v, rel_h, rel_w, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, dout):
        with _direct_triton_launch():
            grads = _bwd_impl(dout, *ctx.saved_tensors, ctx.scale)
        return (*grads, None)
