"""SOL-ExecBench L2/076 as a leaderboard entry: the layer's backward written out, one CUDA graph per call.

The benchmark's call is "forward, then torch.autograd.grad of 7 inputs". Through autograd (even compiled,
even with CUDA graphs) that is two graph replays with the autograd engine's host work between them: on the
small workloads the GPU idles most of the call (benchmarks/DECISIONS.md). Here the same gradients
come from one function with no autograd in it:

    sol076_backward(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias,
                    rel_pos_h, rel_pos_w, scale) -> the 7 gradients (definition.INPUT_NAMES order)

built from samhq-fx's pieces (the fused op's forward and backward, `torch.ops.samhq.*`) and plain GEMMs,
for any grid, batch and head count (heads = hidden // head_dim, head_dim = rel_pos_h.shape[1]).
`solution(...)` compiles it with torch.compile(mode="reduce-overhead", fullgraph=True): forward recompute
and backward are one captured graph, replayed with no host work between its kernels.

How the rel-pos terms are computed (no table gather in the forward, no scatter in the backward):
SAM's rel_h[b, i, j, kh] = <q[b, i, j], rel_pos_h[i - kh + H - 1]>. So one GEMM against both tables,
T = q @ [rel_pos_h; rel_pos_w; zero rows]^T ([B*heads*N, width], width = (2H-1) + (2W-1) rounded up to 8 so
cuBLAS gets 16-byte aligned rows), gives every product, and rel_h / rel_w are T's entries at a shifted column
(`samhq::rel_pos_terms`, one Triton kernel). The backward mirrors it: d_rel_h / d_rel_w are shifted back into
dT (`samhq::rel_pos_table_grad`; each (query row, table row) pair has at most one key row, so this is a gather
with a mask, not a scatter-add: deterministic, no atomics), then dq += dT @ tables and d_tables = dT^T @ q are
two more plain GEMMs. The price: T and dT are about twice the size of rel_h + rel_w (the shifted columns that
no key row uses). Both shifts are kernels of ours (rel_pos_tables.py) because Inductor's versions of
them were slow: int64 remainders in dT (71 us at 56x56x1, now 11), and the forward gather fused into the
transposed bias copies of the dK/dV kernel (77 us at 32x32x8).

The projection bias gradient rides in its weight-gradient GEMM: the merged attention output is copied into
[B*N, hidden + 4] anyway (heads-major -> token-major), so that copy also writes a column of ones (and three
of zeros, keeping fp32 rows 16-byte aligned), and grad_output^T @ it gives [dW_proj | db_proj] (fp32 compute;
bf16 compute takes both bias gradients from exact fp32 sums instead, below). The QKV bias
gradient is a column sum of dqkv, which Inductor can fuse into the kernel that assembles dqkv.

make_solution(compute="bf16", staged=True) is the fastest entry (537 us "high" mean against 2195 for Inductor
reduce-overhead, one H200 process, 2026-12-01; the graph-tree bf16 entry: 629, 2026-12-01): it owns its CUDA
graph instead of using Inductor's graph trees. The graph starts with entry_stage's kernel, which casts the fresh inputs into the buffers the rest reads, and before each
replay that kernel's node is pointed at the call's inputs (graph_kernel_args), so a call is one graph launch with
no input copy. Inside it, the projection's gradients and the last GEMMs run on two side streams (_StagedParts), at
a lower priority than the main branch (NODE_PRIORITY).

The fused op comes in two registrations (samhq_fx/op.py): "triton_op" lets Inductor trace into the host
function, so the fp32 kernels' operand copies (K-major q, k, v, dout, bias) become Inductor kernels that it
may fuse with the copies around them; "opaque" launches them from inside the op, as the transparent path
does. `fused="auto"` takes "triton_op" where op.py would (Hopper, kernels available), "opaque" elsewhere.
"""

from __future__ import annotations

import contextlib
import logging

import torch
import torch.nn.functional as F

import graph_kernel_args
import rel_pos_ops  # noqa: F401  (registers torch.ops.samhq.rel_pos_terms, rel_pos_table_grad)
import samhq_fx.op as samhq_op  # registers torch.ops.samhq.rel_pos_attention*
import entry_stage

_log = logging.getLogger("samhq_fx")

FUSED_CHOICES = ("auto", "triton_op", "opaque")
COMPUTE_CHOICES = ("fp32", "bf16")


def fused_ops(fused: str, device: torch.device):
    """(forward op, backward op) of the fused attention for `fused` in FUSED_CHOICES."""
    if fused not in FUSED_CHOICES:
        raise ValueError(f"fused={fused!r}; choose from {FUSED_CHOICES}")
    if fused == "auto":
        fused = "triton_op" if samhq_op.HAS_INDUCTOR_VARIANT and device.type == "cuda" else "opaque"
    if fused == "triton_op" and samhq_op.HAS_INDUCTOR_VARIANT:
        return (torch.ops.samhq.rel_pos_attention_inductor.default,
                torch.ops.samhq.rel_pos_attention_inductor_backward.default)
    return torch.ops.samhq.rel_pos_attention.default, torch.ops.samhq.rel_pos_attention_backward.default


def sol076_backward(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w,
                    scale: float, fused: str = "opaque", max_rows: int | None = None, compute: str = "fp32"):
    """The 7 gradients of the SAM-HQ attention layer (definition.attention_layer), forward recomputed.

    Plain tensor code: no autograd, traceable with fullgraph=True. Returns them in definition.INPUT_NAMES order.
    Self-attention over a B x H x W grid with SAM's table sizes (2H-1, 2W-1: interpolation is the identity).

    max_rows: at most this many attention rows (images x heads x queries) at once. The batch is then taken
    in chunks of whole images and the weight gradients summed in chunk order (the same order every call:
    deterministic): every intermediate (qkv, q / k / v, T and dT, the kernels' operand copies, dq / dk / dv)
    exists for one chunk at a time. None: the whole batch at once.

    compute: "fp32" computes in the inputs' dtype (fp32: the GEMMs and the attention kernels follow
    torch's float32 matmul precision, so TF32 under "high"); "bf16" runs every GEMM and the attention
    kernels on bf16 operands (fp32 accumulation, fp32 softmax statistics) and returns fp32 gradients.
    The benchmark checks each output against atol + 1e-3 |ref| and not the precision used inside (its
    speed-of-light is priced at the 16-bit tensor rate); what "bf16" costs in accuracy is measured per
    workload by time_entry.py's check (benchmarks/DECISIONS.md).
    """
    if compute not in COMPUTE_CHOICES:
        raise ValueError(f"compute={compute!r}; choose from {COMPUTE_CHOICES}")
    B, H, W, C = hidden_states.shape
    per_image = (C // rel_pos_h.shape[1]) * H * W
    chunk = B if max_rows is None else max(1, min(B, max_rows // per_image))
    if chunk >= B:
        return _backward(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h,
                         rel_pos_w, scale, fused, compute)
    parts = [_backward(grad_output[b0:b0 + chunk], hidden_states[b0:b0 + chunk], qkv_weight, qkv_bias, proj_weight,
                       proj_bias, rel_pos_h, rel_pos_w, scale, fused, compute) for b0 in range(0, B, chunk)]
    sums = []
    for i in range(1, 7):  # weight and table gradients: summed in chunk order
        total = parts[0][i]
        for part in parts[1:]:
            total = total + part[i]
        sums.append(total)
    return (torch.cat([part[0] for part in parts]), *sums)


def _backward(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w,
              scale: float, fused: str, compute: str):
    """sol076_backward for one chunk of the batch (all of it unless max_rows splits it)."""
    B, H, W, C = hidden_states.shape
    d = rel_pos_h.shape[1]
    rows_h, rows_w = 2 * H - 1, 2 * W - 1
    _validate(hidden_states, rel_pos_h, rel_pos_w)
    out_dtype = hidden_states.dtype
    bias_sums = None
    if compute == "bf16":
        # Two bias gradients are sums over all tokens of values of one sign pattern (|sum| >> the benchmark's
        # atol): bf16 rounding of their terms breaks the tolerance (v's bias: 52% of elements at 14x14x1).
        # Both are fp32 sums of grad_output, exactly: d proj_bias = sum_t g_t, and d v_bias = sum_t dv_t =
        # sum_t sum_i P[i, t] dout_i = (sum_i g_i) @ proj_weight, since every row of P sums to one.
        g_sum = grad_output.reshape(B * H * W, C).sum(0)
        bias_sums = (g_sum, g_sum @ proj_weight)
        # then every operand once to bf16 (grad_output and hidden_states: one pass each)
        grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, rel_pos_h, rel_pos_w = (
            t.to(torch.bfloat16) for t in (grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, rel_pos_h,
                                           rel_pos_w))
    # [width, d]: zero rows pad T's rows (and dT's) to a multiple of 8 elements, 16-byte aligned, which cuBLAS
    # needs for its fast kernels: T, dT @ tables and dT^T @ q each ran ~2x faster on the H200 (2026-12-01)
    width = entry_stage.table_width(rows_h, rows_w)
    tables = torch.cat([rel_pos_h, rel_pos_w, rel_pos_h.new_zeros(width - rows_h - rows_w, d)])
    return _core(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, tables, scale, fused, out_dtype,
                 bias_sums)


def _core(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, tables, scale: float, fused: str,
          out_dtype: torch.dtype, bias_sums):
    """The 7 gradients from operands in the compute dtype. tables: [width, d], rel_pos_h's 2H-1 rows, rel_pos_w's
    2W-1, then zero rows; bias_sums: None, or fp32 (d proj_bias, d v_bias) computed by the caller (bf16)."""
    B, H, W, C = hidden_states.shape
    M, dev = B * H * W, hidden_states.device
    q, k, v, rel, out, lse = _recompute(hidden_states, qkv_weight, qkv_bias, tables, scale, fused)
    # ---- output projection: [dW_proj | db_proj] in one GEMM (ones column)
    # (pad + a constant column mask: one pointwise kernel; a cat with ones() writes the constant part apart).
    # bf16 compute takes db_proj from the fp32 sum above, so no ones column: a [M, C + 4] bf16 operand has
    # 8-byte aligned rows, and cuBLAS's kernel for it took 2x the aligned one's time (2026-12-01)
    o2 = _token_major(out, B, C)
    o_ext = o2 if bias_sums is not None else F.pad(o2, (0, 4)) + (torch.arange(C + 4, device=dev) == C)
    dwb_proj = _mm(grad_output.reshape(M, C).t(), o_ext, out_dtype)
    dx, dw_qkv, db_qkv, d_rel_pos_h, d_rel_pos_w = _gradients(
        grad_output, hidden_states, qkv_weight, proj_weight, tables, q, k, v, rel, out, lse, scale, fused, out_dtype,
        3 if bias_sums is None else 2)
    if bias_sums is None:
        db_proj = dwb_proj[:, C]
    else:  # q's and k's thirds from dqkv, v's and the projection's from the fp32 sums
        db_qkv, db_proj = torch.cat([db_qkv, bias_sums[1]]), bias_sums[0]
    return dx, dw_qkv, db_qkv, dwb_proj[:, :C], db_proj, d_rel_pos_h, d_rel_pos_w


def _recompute(hidden_states, qkv_weight, qkv_bias, tables, scale: float, fused: str):
    """The forward, recomputed: q, k, v head-major [B*heads, N, d], rel = [rel_h | rel_w] [B*heads, N, H + W],
    the attention's out [B*heads, N, d] and lse."""
    B, H, W, C = hidden_states.shape
    d = tables.shape[1]
    nh, N = C // d, H * W
    M, BH = B * N, B * nh
    fwd_op, _ = fused_ops(fused, hidden_states.device)
    # q, k, v: three copies, not one of all qkv: k and v can be freed while q still serves the table GEMM, each
    # has the size of the kernels' K-major copies of it (so Inductor may fuse the two), and at B == 1 they are
    # views, no copy.
    qkv = torch.addmm(qkv_bias, hidden_states.reshape(M, C), qkv_weight.t())
    q, k, v = (t.permute(0, 2, 1, 3).reshape(BH, N, d) for t in qkv.view(B, N, 3, nh, d).unbind(2))
    t = torch.mm(q.reshape(BH * N, d), tables.t())  # [BH * N, width]
    # rel = [rel_h | rel_w] out of T's shifted columns: one kernel (rel_pos_tables.py; as a gather,
    # Inductor fused it into the transposed bias copies that the dK/dV kernel takes, at ~300 GB/s)
    rel = torch.ops.samhq.rel_pos_terms(t, H, W)  # [BH, N, H + W]
    out, lse = fwd_op(q, k, v, rel[..., :H], rel[..., H:], scale)
    return q, k, v, rel, out, lse


def _token_major(out, B: int, C: int):
    """The attention's out [B*heads, N, d] as the merged heads [B*N, C]."""
    _, N, d = out.shape
    return out.view(B, C // d, N, d).permute(0, 2, 1, 3).reshape(B * N, C)


def _gradients(grad_output, hidden_states, qkv_weight, proj_weight, tables, q, k, v, rel, out, lse, scale: float,
               fused: str, out_dtype: torch.dtype, bias_thirds: int):
    """Everything after the recompute but the output projection's own gradients: dx, dW_qkv, the qkv bias
    gradient's first `bias_thirds` thirds (column sums of dqkv), and the two tables' gradients."""
    B, H, W, C = hidden_states.shape
    dqkv, dt = _attention_grads(grad_output, proj_weight, tables, q, k, v, rel, out, lse, scale, fused)
    # the GEMMs that make gradients give them in the inputs' dtype (fp32), also under bf16 compute
    dx = _mm(dqkv, qkv_weight, out_dtype).view(B, H, W, C)
    db_qkv = dqkv[:, :bias_thirds * C].sum(0, dtype=torch.float32)
    return (dx, _mm(dqkv.t(), hidden_states.reshape(-1, C), out_dtype), db_qkv,
            *_table_grads(dt, q, tables.shape[1], H, W, out_dtype))


def _attention_grads(grad_output, proj_weight, tables, q, k, v, rel, out, lse, scale: float, fused: str):
    """dout, the attention backward and the rel-pos terms' way back: dqkv token-major [B*N, 3C] and dT."""
    B, H, W, C = grad_output.shape
    d, width = tables.shape[1], tables.shape[0]
    nh, N = C // d, H * W
    M, BH = B * N, B * nh
    _, bwd_op = fused_ops(fused, grad_output.device)
    dout = torch.mm(grad_output.reshape(M, C), proj_weight).view(B, N, nh, d).permute(0, 2, 1, 3).reshape(BH, N, d)
    # the attention backward, then the rel terms back into dT (a masked gather: key row kh = i - r + H - 1),
    # one kernel (rel_pos_tables.py; zeros in the padding columns)
    dq, dk, dv, drh, drw = bwd_op(dout, q, k, v, rel[..., :H], rel[..., H:], out, lse, scale)
    dt = torch.ops.samhq.rel_pos_table_grad(drh, drw, width)  # [BH * N, width]
    dq = dq + torch.mm(dt, tables).view(BH, N, d)
    return dqkv_token_major(dq, dk, dv, B), dt


def dqkv_token_major(dq, dk, dv, B: int):
    """dq, dk, dv head-major [B*heads, N, d] -> dqkv [B*N, 3C], as the QKV projection's output is laid out."""
    BH, N, d = dq.shape
    return torch.stack([dq, dk, dv]).view(3, B, BH // B, N, d).permute(1, 3, 0, 2, 4).reshape(B * N, 3 * BH // B * d)


def _table_grads(dt, q, d: int, H: int, W: int, out_dtype: torch.dtype):
    """d rel_pos_h, d rel_pos_w = the table rows of dT^T @ q."""
    d_tables = _mm(dt.t(), q.reshape(-1, d), out_dtype)
    return d_tables[:2 * H - 1], d_tables[2 * H - 1:2 * H - 1 + 2 * W - 1]


def _bias_sums(g_part, wp32):
    """The staged entry's two fp32 bias gradients (sol076_backward's bf16 note): d proj_bias = sum_t g_t, out of
    the staging kernel's block partials, and d v_bias = that @ proj_weight. They need only the inputs."""
    g_sum = g_part.sum(0)
    return g_sum, g_sum @ wp32


def _proj_weight_grad(g16, out):
    """dW_proj = grad_output^T @ merged heads, fp32: needs only the inputs and the attention's out."""
    B, H, W, C = g16.shape
    return _mm(g16.reshape(-1, C).t(), _token_major(out, B, C), torch.float32)


# device type -> whether torch.mm takes out_dtype there (CUDA, torch >= 2.8: fp32 out of bf16 operands in the
# GEMM's epilogue). Filled by make_solution's wrapper before the first call, outside the traced function.
_MM_OUT_DTYPE: dict[str, bool] = {}


def _mm_out_dtype_works(device: torch.device) -> bool:
    try:
        a = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def _mm(a, b, dtype: torch.dtype):
    """a @ b as `dtype`. bf16 operands with fp32 wanted: one cuBLAS call writing fp32 where torch.mm takes
    out_dtype (each cast kernel after a GEMM cost its run time and a launch gap: ~4 us a kernel on the small
    workloads, the H200, 2026-12-01), else a GEMM then a cast."""
    if a.dtype == dtype:
        return torch.mm(a, b)
    if _MM_OUT_DTYPE.get(a.device.type, False):
        return torch.mm(a, b, out_dtype=dtype)
    return torch.mm(a, b).to(dtype)


def make_solution(mode: str | None = "reduce-overhead", fused: str = "auto", backend: str = "inductor",
                  dynamic: bool | None = False, options: dict | None = None, max_rows: int | None = None,
                  compute: str = "fp32", staged: bool = False, side_streams: bool = True):
    """The entry: a callable with the benchmark's signature (grad_output, the 7 inputs, scale) -> 7 gradients.

    sol076_backward compiled whole (fullgraph) with `mode`; mode=None gives the eager function. `options`
    (Inductor config) are added to the mode's, e.g. {"combo_kernels": True}; `max_rows` is
    sol076_backward's (batch chunks), `compute` its operand precision ("fp32" or "bf16"). Inputs may require
    grad (the benchmark's do): they are detached, so the compiled graph has no autograd in it.

    staged=True (compute="bf16", no max_rows): the inputs go through entry_stage's one kernel into buffers that
    the graph owns, and a mode with CUDA graphs ("reduce-overhead") captures the compiled function over those
    buffers with torch.cuda.graph itself, so a call is one replay (no graph trees: no input copies, no casts in
    the graph, no Python between kernels); side_streams=False keeps all of it on one stream (_StagedParts).
    Each call returns tensors that the next call of a CUDA-graph build may overwrite (clone to keep them)."""
    if staged:
        if compute != "bf16" or max_rows is not None:
            raise ValueError(f"staged=True needs compute='bf16' and max_rows=None; got {compute!r}, {max_rows!r}")
        return _make_staged(mode, fused, backend, dynamic, options, side_streams)

    def fn(grad_output, *inputs, scale, fused_):
        return sol076_backward(grad_output, *inputs, scale=scale, fused=fused_, max_rows=max_rows, compute=compute)

    if mode is None:
        compiled = fn
    else:  # torch.compile takes a mode or options, not both: spell the mode out as its options
        opts = {**torch._inductor.list_mode_options(mode), **(options or {})}
        compiled = torch.compile(fn, backend=backend, options=opts, fullgraph=True, dynamic=dynamic)
    first_call = _FirstCall(fused)

    def solution(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w,
                 scale: float = 64**-0.5):
        args = [t.detach() for t in (grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias,
                                     rel_pos_h, rel_pos_w)]
        key, fused_ = first_call.key(args, scale)
        if compiled is fn or key in first_call.seen:
            return compiled(*args, scale=float(scale), fused_=fused_)
        first_call.seen.add(key)
        with _recompile_limit():
            return compiled(*args, scale=float(scale), fused_=fused_)

    return solution


class _FirstCall:
    """Per device, "auto" resolved to a concrete registration (a constant to Dynamo) and torch.mm's out_dtype
    probed, once; per workload, whether it was seen (its first call compiles)."""

    def __init__(self, fused: str):
        self.fused, self.resolved, self.seen = fused, {}, set()

    def key(self, args, scale):
        dev = args[1].device
        if dev not in self.resolved:
            self.resolved[dev] = _resolve(self.fused, dev)
            _MM_OUT_DTYPE.setdefault(dev.type, dev.type == "cuda" and _mm_out_dtype_works(dev))
        return (dev, float(scale), *(t.shape for t in args)), self.resolved[dev]


def _recompile_limit():
    # A new workload compiles a new graph (static shapes). Past Dynamo's recompile limit (8 per function)
    # the call would silently run uncompiled, and the benchmark runs its 16 workloads in one process.
    limit = max(64, torch._dynamo.config.recompile_limit)
    return torch._dynamo.config.patch(recompile_limit=limit, accumulated_recompile_limit=max(256, limit))


def _make_staged(mode, fused, backend, dynamic, options, side_streams: bool):
    """make_solution(staged=True): stage, then the compiled recompute and gradients, captured by hand per workload."""
    opts = {**torch._inductor.list_mode_options(mode or "default"), **(options or {})}
    own_graph = bool(opts.pop("triton.cudagraphs", False))  # the capture below replaces Inductor's graph trees

    def compile_(fn):
        return fn if mode is None else torch.compile(fn, backend=backend, options=opts, fullgraph=True,
                                                     dynamic=dynamic)

    parts = _StagedParts(compile_(_staged_recompute), compile_(_staged_gradients))
    first_call = _FirstCall(fused)
    graphs = {}  # workload key -> _StagedGraph
    shared = []  # one memory pool and one set of streams for all of this entry's graphs (calls are sequential)

    def solution(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w,
                 scale: float = 64**-0.5):
        del proj_bias  # no gradient depends on it
        args = [t.detach() for t in (grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, rel_pos_h,
                                     rel_pos_w)]
        _validate(hidden_states, rel_pos_h, rel_pos_w)
        key, fused_ = first_call.key(args, scale)
        if key in graphs:  # the steady state: one replay
            return graphs[key](args)
        buffers = entry_stage.stage_buffers(grad_output, qkv_weight, rel_pos_h, rel_pos_w)
        if key not in first_call.seen or mode is None or not own_graph or args[1].device.type != "cuda":
            # first call (compiles; its buffers are temporary, so a peak-memory reading taken after it counts
            # the graph's own, allocated at the capture in the second call), or no graph for this build
            first_call.seen.add(key)
            entry_stage.stage(buffers, *args)
            with _recompile_limit():
                return parts(buffers, float(scale), fused_)
        if not shared:
            shared.append(_Capture(side_streams))
        graphs[key] = _StagedGraph(parts, buffers, args, float(scale), fused_, shared[0])
        solution.staging[key] = graphs[key].staging
        return graphs[key].outs

    solution.staging = {}  # workload key -> "in graph" or "before the graph" (what the capture achieved)
    return solution


def _staged_recompute(x16, wq16, bq16, tables16, scale: float, fused_: str):
    q, k, v, rel, out, lse = _recompute(x16, wq16, bq16, tables16, scale, fused_)
    # q also as the T GEMM's operand [B*heads*N, d] (Inductor's copy of it): the tables' gradient GEMM reuses it,
    # where reshaping the returned view copied it again, beside the last GEMMs (7x7x1: 2.5 us; 2026-12-01)
    return q, k, v, rel, out, lse, q.reshape(-1, tables16.shape[1])


def _staged_gradients(g16, wp16, tables16, q, k, v, rel, out, lse, db_v, scale: float, fused_: str):
    C = g16.shape[-1]
    dqkv, dt = _attention_grads(g16, wp16, tables16, q, k, v, rel, out, lse, scale, fused_)
    # q's and k's thirds of the bias gradient from dqkv, v's from the fp32 sum (_bias_sums)
    return dqkv, dt, torch.cat([dqkv[:, :2 * C].sum(0, dtype=torch.float32), db_v])


class _StagedParts:
    """The staged entry's work on entry_stage's buffers, in the benchmark's output order.

    Compiled: the recompute, and the attention's gradients (dqkv, dT). Plain torch calls: the bias sums, the
    output projection's weight gradient, and the last three GEMMs (dx, dW_qkv, the tables'). Given two `sides`
    streams (the graph capture), the plain calls run beside the compiled ones wherever their inputs allow: the
    bias sums beside the recompute, dW_proj beside the attention backward, the three last GEMMs at once (dx's node
    first). On the small workloads every kernel is latency-bound and leaves most SMs idle, so this shortens the
    call's path (7x7x1: ~20 us of ~60 us of kernels run beside others). Where the side work goes matters: beside
    the attention backward's few programs it tripled that kernel's time (7x7x1: 6.5 -> 16.5 us; 2026-12-01), and
    the main branch runs at a higher priority than the sides (NODE_PRIORITY)."""

    def __init__(self, recompute, gradients):
        self.recompute, self.gradients = recompute, gradients

    def __call__(self, buffers, scale: float, fused_: str, sides=None):
        g16, x16, wq16, tables16 = (buffers[n] for n in ("g16", "x16", "wq16", "tables16"))
        main = torch.cuda.current_stream() if sides else None
        side1, side2 = sides or (None, None)

        def on(stream, fn, *args):  # fn(*args) on `stream`, after all that the main stream has issued so far
            if stream is None:
                return fn(*args)
            stream.wait_stream(main)
            with torch.cuda.stream(stream):
                return fn(*args)

        g_sum, db_v = on(side1, _bias_sums, buffers["g_part"], buffers["wp32"])
        q, k, v, rel, out, lse, q2 = self.recompute(x16, wq16, buffers["bq16"], tables16, scale, fused_)
        dw_proj = on(side2, _proj_weight_grad, g16, out)
        if main is not None:
            main.wait_stream(side1)  # db_v
        dqkv, dt, db_qkv = self.gradients(g16, buffers["wp16"], tables16, q, k, v, rel, out, lse, db_v, scale, fused_)
        B, H, W, C = g16.shape
        if main is not None:  # the side streams wait for dqkv first, so that dx's graph node comes before theirs
            side1.wait_stream(main)
            side2.wait_stream(main)
        dx = _mm(dqkv, wq16, torch.float32).view(B, H, W, C)
        with _on_stream(side2):
            d_rel_pos_h, d_rel_pos_w = _table_grads(dt, q2, tables16.shape[1], H, W, torch.float32)
        with _on_stream(side1):
            dw_qkv = _mm(dqkv.t(), x16.reshape(-1, C), torch.float32)
        if main is not None:
            main.wait_stream(side1)
            main.wait_stream(side2)
        return dx, dw_qkv, db_qkv, dw_proj, g_sum, d_rel_pos_h, d_rel_pos_w


def _on_stream(stream):
    return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()


# Capture the main branch on a high-priority stream (the side streams keep the default, lowest, priority) and
# replay through an exec that keeps node priorities (graph_kernel_args.PriorityExec), so that where the side
# branches run beside the main one the block scheduler serves the main one first. A switch so benchmarks can compare.
NODE_PRIORITY = True


class _Capture:
    """What an entry's graphs are captured with, made once per entry: a memory pool, and the streams. A stream
    that runs a cuBLAS call gets a workspace of its own, so new streams per graph cost each workload's graph that
    memory again. The main branch is captured on a stream of the highest priority, the sides keep the lowest."""

    def __init__(self, side_streams: bool):
        self.pool = torch.cuda.graph_pool_handle()
        self.sides = (torch.cuda.Stream(), torch.cuda.Stream()) if side_streams else None
        self.main = torch.cuda.Stream(priority=-100 if (NODE_PRIORITY and self.sides) else 0)  # clamped to the range


class _StagedGraph:
    """One workload's CUDA graph: the staging kernel, then _StagedParts over the staged buffers (two streams).

    The staging kernel reads the caller's inputs, which move every call, so the graph's copy of that launch is
    pointed at each call's inputs before the replay (graph_kernel_args: the CUDA driver's kernel node update).
    Where that is not available (an older torch or driver), the graph holds the rest only and the staging
    kernel is launched before each replay (one log line says so). The replay goes through an exec that keeps
    the node priorities (NODE_PRIORITY), or torch's where that cannot be made (one log line)."""

    def __init__(self, parts, buffers, args, scale, fused_, capture: _Capture):
        self.buffers = buffers
        args = [t.contiguous() for t in args]  # so that the capture holds no copy kernel of the caller's tensors
        entry_stage.stage(buffers, *args)
        # a warm-up run off the capture, on its streams (lazy initialisations, cuBLAS workspaces among them, must
        # not be captured)
        capture.main.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(capture.main):
            parts(buffers, scale, fused_, capture.sides)
        torch.cuda.current_stream().wait_stream(capture.main)
        self.args = self.exec = None
        try:
            self.graph = torch.cuda.CUDAGraph(keep_graph=True)
            with torch.cuda.graph(self.graph, pool=capture.pool, stream=capture.main):
                srcs = entry_stage.stage(buffers, *args)
                self.outs = parts(buffers, scale, fused_, capture.sides)
            self.graph.instantiate()
            self.exec = self._priority_exec() if capture.sides else None
            self.args = graph_kernel_args.KernelNodePointers(self.graph, [t.data_ptr() for t in srcs],
                                                             self.exec.handle if self.exec else None)
            self.staging = "in graph" + (f", node priorities {self.exec.priorities}" if self.exec else "")
        except (TypeError, graph_kernel_args.GraphArgsUnavailable) as e:
            _log.info("sol076 entry: the staging kernel runs before the graph (%s)", e)
            self.exec = None
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, pool=capture.pool, stream=capture.main):
                self.outs = parts(buffers, scale, fused_, capture.sides)
            self.staging = "before the graph"
        self(args)

    def _priority_exec(self):
        if not NODE_PRIORITY:
            return None
        try:
            return graph_kernel_args.PriorityExec(self.graph)
        except graph_kernel_args.GraphArgsUnavailable as e:
            _log.info("sol076 entry: replayed without node priorities (%s)", e)
            return None

    def __call__(self, args):
        if self.args is None:
            entry_stage.stage(self.buffers, *args)
        else:
            self.args.set([t.data_ptr() for t in entry_stage.sources(self.buffers, *args)])
        if self.exec is not None:
            self.exec.launch(torch.cuda.current_stream().cuda_stream)
        else:
            self.graph.replay()
        return self.outs


def _validate(hidden_states, rel_pos_h, rel_pos_w):
    B, H, W, C = hidden_states.shape
    d = rel_pos_h.shape[1]
    if (C // d) * d != C or rel_pos_h.shape[0] != 2 * H - 1 or rel_pos_w.shape != (2 * W - 1, d):
        raise ValueError(f"hidden {C}, tables {tuple(rel_pos_h.shape)} / {tuple(rel_pos_w.shape)} for a {H}x{W} grid")


def _resolve(fused: str, device: torch.device) -> str:
    fwd, _ = fused_ops(fused, device)
    return "triton_op" if fwd is not torch.ops.samhq.rel_pos_attention.default else "opaque"
