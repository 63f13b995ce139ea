"""Fused Triton kernels for SAM's decomposed relative-position attention, forward and backward.

This room holds the GPU implementation of the one op samhq-fx fuses. Per batch*head b and query i,
with key j at row j // Wk, column j % Wk of an Hk x Wk key grid:

    s[i, j] = scale * <q[i], k[j]> + rel_h[i, j // Wk] + rel_w[i, j % Wk]
    lse[i]  = log sum_j exp(s[i, j])                  (natural log, fp32)
    out[i]  = sum_j exp(s[i, j] - lse[i]) * v[j]

It is flash attention with the bias built on the fly: no N x N matrix ever reaches memory.

The one idea that makes the bias cheap: every key tile is a whole number R of key-grid rows, with the
row width padded to a power of two WK_PAD (BLOCK_N = R * WK_PAD; padded columns are masked keys). Then
  * the rel_w part of the bias, rel_w[i, n % WK_PAD], is the same for every key tile: it is loaded
    once per query block, before the key loop (dQ's SPLIT_ROW loads it per half-row, to free registers);
  * the rel_h part is rel_h[i, kh0] for the whole tile when R == 1 (grids at least 64 wide: one
    [BLOCK_M] vector load per tile), or R such vectors placed by selects when R > 1 (narrow grids; a
    per-element gather there cost the forward 3x, configs.py);
  * in the backward, d_rel_w[i, :] is the plain elementwise sum of the dS tiles (R == 1) and
    d_rel_h[i, kh0] is one row-sum of the tile (of its two halves with SPLIT_ROW), both owned by the
    program that owns query row i.
The price is the padding: a 48-wide grid runs 64-wide tiles (25% of the keys masked).

Rooms: this file is the host side (what is launched, with which copies); the jitted kernels live in
tiles.py (shared pieces), forward.py and backward.py, the block configs in configs.py (one table, each
row with the measurement behind it).
  _fwd_kernel   grid (query blocks, B)   online softmax over key tiles -> out, lse
  _bwd_kernel   PART "dq"   grid (query blocks, B)  owns a query block, loops over key tiles
                            -> dq, d_rel_h, d_rel_w, and delta[i] = <dout[i], out[i]> for dK/dV
                PART "dkdv" grid (key tiles, B)     owns a key tile, loops over query blocks -> dk, dv
                PART "both" one launch of both kinds of program (each computes delta itself)
The backward uses no atomics: every output element has exactly one writer and a fixed reduction
order, so the same inputs give the same bits (block sizes are fixed per shape, not autotuned, so
that holds across processes too). The price is recomputing P in both backward parts
(7 N*N*D matmuls for the backward instead of FA2's 5 with atomic dq).

Precision: fp16/bf16 operands feed the tensor cores directly; fp32 operands follow
torch.get_float32_matmul_precision() as PyTorch's matmuls do ("highest" -> 3-pass TF32 dots, fp32-accurate,
"high" and "medium" -> TF32). Accumulators and softmax statistics are fp32. "medium" is TF32, not
bf16-cast operands, because that is what PyTorch's own fp32 matmuls do on CUDA in "medium" (cuBLAS has no
bf16 path for fp32 GEMMs), and because bf16 operands fail SOL-ExecBench 076's rtol 1e-3 rule (measured on
the H200: qkv_bias gradient only 89-92% of elements within tolerance; benchmarks/DECISIONS.md).

Head dims: each of D and DV is one power-of-two chunk or two (tiles.split: 80 = 64 + 16, 96 = 64 + 32), each
dot over a head dim one dot per chunk and each head-dim accumulator one per chunk, so ViT-H's 80 costs 80
columns of work, registers and shared memory, not 128.

Operand layout (fp32): TF32 tensor-core products read both operands K-major, so the host passes V, K, Q,
dout (and the dK/dV bias) a second time, transposed and zero-padded to whole tiles (`_keys_kmajor`,
`_queries_kmajor`): every tile then arrives as 16-byte vectors. Without them Triton filled shared memory
4 bytes at a time and the fp32 kernels were load-bound (benchmarks/DECISIONS.md).

All launches go through torch.library.wrap_triton and host functions only allocate, copy (torch ops) and launch, so
they can run inside a torch.library.triton_op traced by Inductor with fake tensors.
"""

from __future__ import annotations

import os

import torch
import triton

from . import arch, configs, launcher, tiles
from .backward import _bwd_kernel
from .forward import _fwd_kernel

try:  # False inside op.py's direct-launch block: real tensors, no trace, so launches may skip wrap_triton
    from torch._library.triton import is_wrap_triton_enabled as _wrap_triton_enabled
except ImportError:  # pragma: no cover - older torch: always through wrap_triton and JITFunction.run
    def _wrap_triton_enabled() -> bool:
        return True

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

# Test hook: when True, every output buffer is filled with NaN right after allocation, so an element
# a kernel fails to write shows up as NaN in the tests. Never set in production.
_POISON_OUTPUTS = False

_MAX_HEAD_DIM = 128  # head dims beyond this (D_A + D_B, DV_A + DV_B) would blow the register budget
_MAX_WK = 128  # one key-grid row must fit in one key tile


# ----------------------------------------------------------------------------------------------
# Host functions: allocate and launch only (traced with fake tensors inside a triton_op)
# ----------------------------------------------------------------------------------------------

# "highest" runs 3-pass TF32 (a = hi + lo split; error ~ fp32 rounding): Triton's "ieee" dot runs on
# FMA units at < 1 TFLOP/s on the H200 (213 ms for the SAM-B global layer, benchmarks/DECISIONS.md).
_FP32_PREC = {"highest": "tf32x3", "high": "tf32", "medium": "tf32"}


def _dot_precision(dtype: torch.dtype, precision: str | None = None) -> str:
    # fp32 follows torch's matmul precision setting (`precision`, else read at call (= trace) time)
    if dtype == torch.float32:
        return _FP32_PREC[precision or torch.get_float32_matmul_precision()]
    return "none"


def _facts(dtype: torch.dtype, prec: str, d_pad: int, dv_pad: int, wk: int, rows: int, target: arch.Arch) -> dict:
    """The shape class configs.py's rows are matched against (its module docstring): rows = batch * queries, d_pad /
    dv_pad the head dims as the kernels see them (tiles.pad: 80 = 64 + 16 stays 80). 80 runs the head-dim-64 rows
    (refined by the table's min_d rows); 96 and above the `wide` rows, tuned for 128."""
    d = max(d_pad, dv_pad)
    return dict(fp32=dtype == torch.float32, prec=prec, wide=d > configs.D_WIDE, d=d, wk=wk, rows=rows,
                interpret=_INTERPRET, smem=target.smem, cc=target.capability)


def _config(kernel: str, dtype: torch.dtype, prec: str, d_pad: int, dv_pad: int, wk: int, rows: int,
            target: arch.Arch) -> dict:
    """Block config of one kernel for this shape class (_facts) on the `target` GPU class (the table in configs.py).
    A lookup walks the whole table in Python (~20 us a kernel on the H200's host): read once per call signature, in
    its plan (_plan)."""
    return configs.config(kernel, **_facts(dtype, prec, d_pad, dv_pad, wk, rows, target))


def inductor_reason(dtype: torch.dtype, precision: str, d: int, dv: int, wk: int, rows: int,
                    target: arch.Arch) -> str | None:
    """Why the rewrite leaves this shape class to Inductor on `target` (the table's "place" rows, configs.py), or None;
    precision: torch's fp32 matmul setting, rows = batch * queries. Asked at compile time (kernels/fit.py); a direct
    call of the op does not ask."""
    prec = _dot_precision(dtype, precision)
    return configs.inductor_reason(**_facts(dtype, prec, tiles.pad(d), tiles.pad(dv), wk, rows, target))


_tile, _pad = tiles.tile, tiles.pad


def _target(device: torch.device) -> arch.Arch:
    """The GPU class whose configs apply (kernels/arch.py); the interpreter's and CPU's are Hopper's."""
    return arch.of(device) or arch.DEFAULT


def _launch(kernel, grid, *args, cache: dict | None = None, **kwargs):
    """Every kernel launch goes through here (kernels/fit.py records them on meta tensors instead). cache: the
    launch site's compiled kernels in its call plan (_plan), for launches outside any trace (launcher.py)."""
    if cache is not None and launcher.ENABLED and not _INTERPRET and not _wrap_triton_enabled():
        launcher.launch(kernel, grid, cache, args, kwargs)
    else:
        torch.library.wrap_triton(kernel)[grid](*args, **kwargs)


class _Plan:
    """What every call of one signature (_plan) shares: block configs, tile geometry, constexprs, grids, and per
    launch site the compiled kernels (launcher.py) and the integer arguments (strides, sizes): the signature fixes the
    inputs' strides, and the outputs and copies a call makes have the same strides on every call."""

    def __init__(self, **fields):
        self.__dict__.update(fields)
        self.compiled = {"fwd": {}, "dq": {}, "dkdv": {}, "both": {}}
        self.ints: dict[str, tuple] = {}


def _kept(cache: dict, key, compute):
    """cache[key], computed by compute() the first time (a cache of more than 4096 entries starts over); a key that
    does not hash (a symbolic size, in a trace with dynamic shapes) is computed afresh and not kept. What compute()
    raises is raised again and nothing is kept."""
    try:
        return cache[key]
    except KeyError:
        pass
    except TypeError:
        return compute()
    value = compute()
    if len(cache) > 4096:
        cache.clear()
    cache[key] = value
    return value


def _plan(build, *ts, heads: int = 1) -> _Plan:
    """build(*ts, target, heads), kept per signature: the inputs' shapes, strides and dtypes, heads, the GPU class,
    torch's fp32 matmul precision and the head-dim chunking (everything build reads), for the config table in use (by
    identity: each entry holds the table and overrides it was built from, so their ids cannot recur while it lives)."""
    target = _target(ts[0].device)
    key = (build, target, heads, torch.get_float32_matmul_precision(), tiles.SPLIT_HEAD_DIM, id(configs.TABLE),
           id(configs.OVERRIDES), *[(t.shape, t.stride(), t.dtype) for t in ts])
    return _kept(_PLANS, key, lambda: (configs.TABLE, configs.OVERRIDES, build(*ts, target, heads)))[2]


# signature -> (the table and overrides it was built from, plan): the host's per-call Python (configs, head-dim
# chunks, strides) was an eighth of the eager op's wall time at SAM-B's windows (benchmarks/README.md, eager op)
_PLANS: dict[tuple, tuple] = {}


def _chunks(d: int, dv: int) -> dict:
    """The kernels' head-dim constexprs: D and DV each as one or two power-of-two chunks (tiles.split)."""
    (d_a, d_b), (dv_a, dv_b) = tiles.split(d), tiles.split(dv)
    return dict(D_A=d_a, D_B=d_b, DV_A=dv_a, DV_B=dv_b)


def _launch_options(cfg: dict) -> dict:
    """Triton launch options of a config: warps, stages, and a register cap where the row sets MAXNREG (a cap
    lets ptxas fit one more CTA per SM; only a direct launch takes it: wrap_triton traced by Inductor passes
    num_warps / num_stages on, but not maxnreg)."""
    opts = dict(num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    if cfg.get("MAXNREG"):
        opts["maxnreg"] = cfg["MAXNREG"]
    return opts


# fp32 operands: TF32 wgmma reads both operands K-major from shared memory (only 16-bit types may be
# transposed), so a B operand whose contiguous axis is not the reduction axis (V in P @ V, dO and Q in
# the dV / dK products, K in dS @ K) was copied into shared memory 4 bytes at a time, with 8-way bank
# conflicts (ncu on the H200: L1 87% busy, the SMs 9% busy; benchmarks/DECISIONS.md). The host hands those
# operands over a second time, transposed, so the kernels read them as 16-byte vectors. Costs one extra
# read and write of q, k, v and dout per call.
# The dK/dV kernel reads rel_h / rel_w as [keys, queries] tiles, against their memory order, in every dtype
# (bf16 PTX: 2- and 4-byte loads). With K-major fp32 it gets copies with queries contiguous; 16-bit inputs
# get them where the config table's dK/dV row says BIAS_T (configs.py).


def _kmajor(dtype: torch.dtype, wk: int, d_pad: int) -> bool:
    # not for key grids <= 8 wide: at 7x7 the copies cost more than they save (fwd + bwd 1.5x slower,
    # 7x7x64 on the H200), those tiles being mostly padding and the call mostly launch time. Not for
    # head dims above 80 (64 + 16) either: the extra tiles do not fit shared memory beside the wide configs
    # (and those were measured without them).
    return dtype == torch.float32 and wk > 8 and (d_pad <= 80 or _INTERPRET)


def _keys_kmajor(x, hk: int, wk: int, wk_pad: int, r: int):
    """x: [B, HK*WK, D] -> [B, D, HK_PAD*WK_PAD], keys contiguous and laid out as the key tiles see them
    (grid rows padded to WK_PAD, grid padded to whole tiles of R rows), zeros in the padding."""
    b, _, d = x.shape
    hk_pad = triton.cdiv(hk, r) * r
    if hk_pad == hk and wk_pad == wk:
        return x.transpose(1, 2).contiguous()
    xt = x.new_zeros((b, d, hk_pad, wk_pad))
    xt[:, :, :hk, :wk] = x.unflatten(1, (hk, wk)).permute(0, 3, 1, 2)
    return xt.view(b, d, hk_pad * wk_pad)


def _queries_kmajor(x, block_m: int, heads: int = 1):
    """x: [B, N, D] or [B, H, W, D] (N = H * W), or with heads > 1 [B // heads, N, heads, D] (the heads-last out
    and dout) -> [B, D, N_PAD], queries contiguous, N padded with zeros to whole query blocks. One copy kernel
    whatever x's strides."""
    if heads > 1:
        b_h, n, _, d = x.shape
        xt_heads = x.permute(0, 2, 3, 1)  # [B // heads, heads, D, N]
        n_pad = triton.cdiv(n, block_m) * block_m
        if n_pad == n:  # contiguous: a reshape can be a view of dout's memory (heads-first, or expanded)
            return xt_heads.reshape(b_h * heads, d, n).contiguous()
        xt = x.new_zeros((b_h * heads, d, n_pad))
        xt[:, :, :n].view(b_h, heads, d, n).copy_(xt_heads)
        return xt
    b, d = x.shape[0], x.shape[-1]
    n = query_rows(x)
    xt_grid = x.movedim(-1, 1)  # [B, D, N] or [B, D, H, W]
    n_pad = triton.cdiv(n, block_m) * block_m
    if n_pad == n:
        return xt_grid.reshape(b, d, n).contiguous()
    if x.dim() == 3:  # one kernel: the copy and the zero padding together
        return torch.nn.functional.pad(xt_grid, (0, n_pad - n))
    xt = x.new_zeros((b, d, n_pad))
    xt[:, :, :n].view(xt_grid.shape).copy_(xt_grid)
    return xt


def query_rows(t) -> int:
    """Query rows of a rel-pos term: [B, Nq, K] or [B, Hq, Wq, K] (the query grid as two dims). The op has the same
    in samhq_fx.reference: kernels/ imports nothing of samhq_fx."""
    return t.shape[1] if t.dim() == 3 else t.shape[1] * t.shape[2]


def _rel_strides(t):
    """(strides (batch, grid row, row, key), QW) of a rel-pos term as the kernels read it (tiles._rows): a 3-D
    term, or a 4-D one whose (Hq, Wq) dims a flat row dim can view, gives QW = 0 (rows at one stride, the
    kernels' code of old); any other 4-D term QW = Wq, read in place instead of copied into rows."""
    if t.dim() == 3:
        return (t.stride(0), 0, t.stride(1), t.stride(2)), 0
    _, hq, wq, _ = t.shape
    sb, sh, sw, sk = t.stride()
    if wq == 1:
        return (sb, 0, sh, sk), 0
    if hq == 1 or sh == wq * sw:
        return (sb, 0, sw, sk), 0
    return (sb, sh, sw, sk), wq


def _empty(shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    if _POISON_OUTPUTS:
        t.fill_(float("nan"))
    return t


def unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    """None if the kernels handle these inputs; else a short reason (the caller then uses the reference). Asked on
    every call of the op: the answer is kept per shapes, dtypes and devices."""
    key = tuple([(t.shape, t.dtype, t.device) for t in (q, k, v, rel_h, rel_w)])
    return _kept(_REASONS, key, lambda: _unsupported_reason(q, k, v, rel_h, rel_w))


_REASONS: dict[tuple, str | None] = {}


def _unsupported_reason(q, k, v, rel_h, rel_w) -> str | None:
    ts = (q, k, v, rel_h, rel_w)
    if any(t.dim() != 3 for t in (q, k, v)) or any(t.dim() not in (3, 4) for t in (rel_h, rel_w)):
        return "expected q, k, v of rank 3 and rel_h, rel_w of rank 3 or 4"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype} not supported by the Triton kernels"
    if any(t.dtype != q.dtype for t in (k, v)):
        return "q, k, v must share a dtype"
    if any(t.dtype not in (torch.float16, torch.bfloat16, torch.float32) for t in (rel_h, rel_w)):
        return f"rel_h/rel_w dtype {rel_h.dtype}/{rel_w.dtype} not supported"
    if any(t.device != q.device for t in ts):
        return "inputs on different devices"
    if q.device.type not in ("cuda", "meta") and not _INTERPRET:  # meta: asked at compile time (fit.py)
        return f"device {q.device.type} (Triton kernels need CUDA)"
    b, n_q, d = q.shape
    n_k = k.shape[1]
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    if k.shape[0] != b or v.shape[0] != b or rel_h.shape[0] != b or rel_w.shape[0] != b:
        return "batch sizes differ"
    if k.shape[2] != d:
        return "q and k head dims differ"
    if v.shape[1] != n_k:
        return "k and v lengths differ"
    if query_rows(rel_h) != n_q or query_rows(rel_w) != n_q:
        return "rel_h/rel_w rows must equal the number of queries"
    if hk * wk != n_k:
        return f"key grid {hk}x{wk} does not match {n_k} keys"
    if n_q == 0 or n_k == 0 or d == 0 or v.shape[2] == 0:
        return "empty input"
    if max(d, v.shape[2]) > _MAX_HEAD_DIM:
        return f"head dim above {_MAX_HEAD_DIM}"
    if wk > _MAX_WK:
        return f"key grid width {wk} above {_MAX_WK}"
    return None


def _fwd_plan(q, k, v, rel_h, rel_w, target: arch.Arch, heads: int) -> _Plan:
    b, n_q, d = q.shape
    dv = v.shape[2]
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    prec = _dot_precision(q.dtype)
    (rh_s, rh_qw), (rw_s, rw_qw) = _rel_strides(rel_h), _rel_strides(rel_w)
    cfg = _config("fwd", q.dtype, prec, _pad(d), _pad(dv), wk, b * n_q, target)
    wk_pad, r = _tile(hk, wk, cfg["BLOCK_N"])
    kmajor = _kmajor(q.dtype, wk, max(_pad(d), _pad(dv)))
    consts = dict(HK=hk, WK=wk, D=d, DV=dv, WK_PAD=wk_pad, R=r, **_chunks(d, dv), BLOCK_M=cfg["BLOCK_M"], PREC=prec,
                  KMAJOR=kmajor, RH_SELECT=cfg.get("RH_SELECT", False), RH_QW=rh_qw, RW_QW=rw_qw, HEADS=heads,
                  **_launch_options(cfg))
    return _Plan(grid=(triton.cdiv(n_q, cfg["BLOCK_M"]), b), hk=hk, wk=wk, wk_pad=wk_pad, r=r, kmajor=kmajor,
                 rel_strides=(*rh_s, *rw_s), consts=consts)


def _strides_bhnd(t) -> tuple:
    """(batch, head, query, feature) strides of out or dout: [B, N, DV] (head 0), or [B // heads, N, heads, DV]."""
    if t.dim() == 3:
        return t.stride(0), 0, t.stride(1), t.stride(2)
    return t.stride(0), t.stride(2), t.stride(1), t.stride(3)


def forward(q, k, v, rel_h, rel_w, scale: float, heads: int = 1):
    """q: [B, Nq, D], k: [B, Nk, D], v: [B, Nk, Dv], rel_h: [B, Nq, Hk], rel_w: [B, Nq, Wk] (each term may also
    be [B, Hq, Wq, K], the query grid as two dims: read at its strides, not copied).

    Returns out [B, Nq, Dv] in q.dtype, or with heads > 1 (dividing B) [B // heads, Nq, heads, Dv], and lse [B, Nq]
    fp32 (natural log). Inputs may be strided.
    """
    p = _plan(_fwd_plan, q, k, v, rel_h, rel_w, heads=heads)
    b, n_q, _ = q.shape
    vt = _keys_kmajor(v, p.hk, p.wk, p.wk_pad, p.r) if p.kmajor else v  # unused unless KMAJOR
    out_shape = (b // heads, n_q, heads, v.shape[2]) if heads > 1 else (b, n_q, v.shape[2])
    out = _empty(out_shape, q.dtype, q.device)
    lse = _empty((b, n_q), torch.float32, q.device)
    ints = _kept(p.ints, "fwd", lambda: (*q.stride(), *k.stride(), *v.stride(), vt.stride(0), vt.stride(1),
                                         *p.rel_strides, *_strides_bhnd(out), lse.stride(0), n_q))
    _launch(_fwd_kernel, p.grid, q, k, v, vt, rel_h, rel_w, out, lse, *ints, scale * 1.4426950408889634,
            cache=p.compiled["fwd"], **p.consts)
    return out, lse


def _bwd_plan(q, k, v, rel_h, rel_w, dout, out, lse, target: arch.Arch, heads: int) -> _Plan:
    # dout, out, lse are not read here: they are in the plan's key because the launches pass their strides
    b, n_q, d = q.shape
    dv = v.shape[2]
    hk, wk = rel_h.shape[-1], rel_w.shape[-1]
    prec = _dot_precision(q.dtype)
    d_pad, dv_pad = _pad(d), _pad(dv)
    cfg_kv = _config("dkdv", q.dtype, prec, d_pad, dv_pad, wk, b * n_q, target)
    cfg_q = _config("dq", q.dtype, prec, d_pad, dv_pad, wk, b * n_q, target)
    # one launch needs one num_warps / num_stages for both kinds of program
    fused = _config("bwd", q.dtype, prec, d_pad, dv_pad, wk, b * n_q, target).get("FUSED", False) and all(
        cfg_kv[key] == cfg_q[key] for key in ("num_warps", "num_stages"))
    wk_pad, r_kv = _tile(hk, wk, cfg_kv["BLOCK_N"])
    _, r_q = _tile(hk, wk, cfg_q["BLOCK_N"])
    # one-row dQ key tiles as two halves (configs.py SPLIT_ROW): only where each half is a whole dot (>= 16 keys)
    split_row = cfg_q.get("SPLIT_ROW", False) and r_q == 1 and wk_pad >= 32
    kmajor = _kmajor(q.dtype, wk, max(d_pad, dv_pad))
    # dK/dV reads the bias transposed ([keys, queries] tiles): give it copies with queries contiguous,
    # passed as [B, N_Q padded, Hk] / [B, N_Q padded, Wk] views so the kernel's stride arithmetic is unchanged.
    # The gradients d_rel_h / d_rel_w come out contiguous in the terms' shapes (3-D or 4-D)
    bias_t = kmajor or (q.dtype != torch.float32 and cfg_kv.get("BIAS_T", False))
    (rh_s, rh_qw), (rw_s, rw_qw) = _rel_strides(rel_h), _rel_strides(rel_w)
    consts = dict(HK=hk, WK=wk, D=d, DV=dv, WK_PAD=wk_pad, **_chunks(d, dv), PREC=prec, KMAJOR=kmajor,
                  R_KV=r_kv, BLOCK_M_KV=cfg_kv["BLOCK_M"], RH_SELECT_KV=cfg_kv.get("RH_SELECT", False),
                  BIAS_T=bias_t, R_Q=r_q, BLOCK_M_Q=cfg_q["BLOCK_M"], RH_SELECT_Q=cfg_q.get("RH_SELECT", False),
                  RH_QW=rh_qw, RW_QW=rw_qw, SPLIT_ROW_Q=split_row, HEADS=heads)
    return _Plan(hk=hk, wk=wk, wk_pad=wk_pad, r_q=r_q, kmajor=kmajor, bias_t=bias_t, fused=fused,
                 bm_kv=cfg_kv["BLOCK_M"], n_kv=triton.cdiv(hk, r_kv), n_qb=triton.cdiv(n_q, cfg_q["BLOCK_M"]),
                 rel_strides=(*rh_s, *rw_s),
                 # d_rel_h, d_rel_w: allocated contiguous in the terms' shapes, read as (batch, row, key)
                 grad_strides=(n_q * hk, hk, 1, n_q * wk, wk, 1),
                 consts=consts, options_kv=_launch_options(cfg_kv), options_q=_launch_options(cfg_q))


def backward(dout, q, k, v, rel_h, rel_w, out, lse, scale: float):
    """Gradients for forward()'s saved (out, lse); out and dout heads-last [B // heads, Nq, heads, Dv] where the
    forward ran with heads > 1. Returns (dq, dk, dv, d_rel_h, d_rel_w) in input dtypes."""
    heads = out.shape[2] if out.dim() == 4 else 1
    p = _plan(_bwd_plan, q, k, v, rel_h, rel_w, dout, out, lse, heads=heads)
    b, n_q, _ = q.shape
    dq = _empty(q.shape, q.dtype, q.device)
    dk = _empty(k.shape, k.dtype, k.device)
    dv = _empty(v.shape, v.dtype, v.device)
    drh = _empty(rel_h.shape, rel_h.dtype, rel_h.device)
    drw = _empty(rel_w.shape, rel_w.dtype, rel_w.device)
    # delta: [B, Nq] fp32, written by the dQ launch for the dK/dV launch; a fused launch's programs compute it
    # themselves and never touch DELTA, so it gets lse's pointer instead of an allocation
    delta = lse if p.fused else _empty((b, n_q), torch.float32, q.device)

    def kv_copies():  # dK/dV's operands: (qT, doT, rel_h^T, rel_w^T); the originals where unused
        bm = p.bm_kv
        return (_queries_kmajor(q, bm) if p.kmajor else q, _queries_kmajor(dout, bm, heads) if p.kmajor else dout,
                _queries_kmajor(rel_h, bm).transpose(1, 2) if p.bias_t else rel_h,
                _queries_kmajor(rel_w, bm).transpose(1, 2) if p.bias_t else rel_w)

    def launch(part, grid, qt, dot, rh_t, rw_t, kt, options):
        def arguments():  # (integer arguments, constexprs) of this launch site, the same on every call of the plan
            (rht_s, rht_qw), (rwt_s, rwt_qw) = _rel_strides(rh_t), _rel_strides(rw_t)
            ints = (*q.stride(), *k.stride(), *v.stride(), *p.rel_strides, *rht_s, *rwt_s,
                    *_strides_bhnd(dout), *_strides_bhnd(out), *lse.stride(), delta.stride(0),
                    *dq.stride(), *dk.stride(), *dv.stride(), *p.grad_strides,
                    qt.stride(0), qt.stride(1), dot.stride(0), dot.stride(1), kt.stride(0), kt.stride(1), n_q)
            return ints, dict(PART=part, RHT_QW=rht_qw, RWT_QW=rwt_qw, **p.consts, **options)

        ints, consts = _kept(p.ints, part, arguments)
        _launch(
            _bwd_kernel, grid, q, k, v, rel_h, rel_w, rh_t, rw_t, dout, out, lse, delta, dq, dk, dv, drh, drw, qt, dot, kt,
            *ints, scale * 1.4426950408889634, scale, cache=p.compiled[part], **consts,
        )

    kt = _keys_kmajor(k, p.hk, p.wk, p.wk_pad, p.r_q) if p.kmajor else k  # dQ's K-major copy
    if p.fused:
        launch("both", (p.n_kv + p.n_qb, b), *kv_copies(), kt, p.options_kv)
    else:
        # dQ first: it writes delta for dK/dV. Each launch's copies are released before the next one's,
        # so the two sets never add up in the peak (same stream: the caching allocator reuses the memory
        # only after the launch has read it)
        launch("dq", (p.n_qb, b), q, dout, rel_h, rel_w, kt, p.options_q)
        del kt
        launch("dkdv", (p.n_kv, b), *kv_copies(), k, p.options_kv)
    return dq, dk, dv, drh, drw
