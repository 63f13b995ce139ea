"""Tests for the fused Triton kernels (kernels/rel_pos_attention.py) against the float64 reference.

On CPU (CI) the kernels run under TRITON_INTERPRET=1 (set by conftest.py) on small shapes chosen so
that several query blocks and key tiles are crossed, the last ones partial, with both key-tile
shapes (R == 1: one grid row per tile; R > 1: several rows per tile). `gpu`-marked tests run the
real kernels on the benchmark and SAM shapes.

Every output buffer is poisoned with NaN at allocation (kernel module test hook), so an element no
kernel writes fails the finiteness check. Each of out, lse, dq, dk, dv, d_rel_h, d_rel_w is compared
with the float64 oracle as ||got - ref|| / ||ref||, bounded per precision mode:
    fp32 "highest" (3-pass TF32 dots)   1e-5   (IEEE dots: ~5e-7)
    fp32 "high" (TF32 dots)             3e-3   (TF32 keeps 10 mantissa bits: ~5e-4 per product)
    fp32 "medium" (TF32 dots, as "high") 3e-3
    bf16 inputs                         2e-2   (bf16 operands, 8 bits: ~4e-3 per rounding, P and dS rounded too)
    fp16 inputs                         5e-3
The denominator has a floor of RMS 1e-2 per element. Gradients that are zero in exact arithmetic
(1x1 grid: softmax over one key, so dS = p * (dp - delta) is pure cancellation of two O(|dout||v|)
fp32 numbers) are instead compared against RMS 1, the magnitude of the terms that cancel.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

try:  # installed package (pytest entry point, editable install)
    from samhq_fx.kernels import arch, fit
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root: samhq_fx/ there has no kernels/
    from kernels import arch, fit
    from kernels import rel_pos_attention as K
from samhq_fx import op, reference

from helpers import grid_terms

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("out", "lse", "dq", "dk", "dv", "d_rel_h", "d_rel_w")

# mode -> (input dtype, float32 matmul precision, rel-error bound)
MODES = {
    "fp32-highest": (torch.float32, "highest", 1e-5),
    "fp32-high": (torch.float32, "high", 3e-3),
    "fp32-medium": (torch.float32, "medium", 3e-3),
    "bf16": (torch.bfloat16, "highest", 2e-2),
    "fp16": (torch.float16, "highest", 5e-3),
}


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)


def make_inputs(b, n_q, hk, wk, d, dv, dtype, layout="contiguous", seed=0):
    """Random inputs; layout 'qkv' gives q/k/v as strided views of one packed projection, 'transposed'
    gives q/k/v/dout whose last-dim stride is not 1."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    n_k = hk * wk

    def rnd(*shape, s=1.0):
        return (torch.randn(*shape, generator=g) * s).to(dtype=dtype, device=DEVICE)

    if layout == "qkv":
        assert n_q == n_k and d == dv
        qkv = rnd(b, n_k, 3, d)  # like SAM's qkv linear output, viewed per head
        q, k, v = qkv.unbind(2)
    elif layout == "transposed":
        q = rnd(b, d, n_q).transpose(1, 2)
        k = rnd(b, d, n_k).transpose(1, 2)
        v = rnd(b, dv, n_k).transpose(1, 2)
    else:
        q, k, v = rnd(b, n_q, d), rnd(b, n_k, d), rnd(b, n_k, dv)
    # rel_h / rel_w in SAM are q . R, same order of magnitude as the scaled scores
    rel_h = rnd(b, n_q, hk, s=0.7)
    rel_w = rnd(b, n_q, wk, s=0.7)
    dout = rnd(b, dv, n_q).transpose(1, 2)  # non-contiguous upstream gradient
    return q, k, v, rel_h, rel_w, dout


def rel_err(got, ref, floor_rms=1e-2):
    ref = ref.double()
    floor = floor_rms * math.sqrt(ref.numel())
    return ((got.double() - ref).norm() / max(ref.norm().item(), floor)).item()


def skip_unless_fit(launches, real: arch.Arch, what: str) -> None:
    """Skip the test where `launches` compile but do not fit the `real` GPU (shared memory, or tensor memory, which
    Triton reports as OutOfResources); fail it where one does not compile."""
    built = fit.build_all([(launch, real) for launch in launches])
    assert not [bt.error for bt in built if bt.error and not bt.error.startswith("OutOfResources")]
    why = next((bt.misfit for bt in built if bt.misfit), None)
    if why:
        pytest.skip(f"{what} do not fit this GPU ({real.name}): {why}")


def run_and_check(q, k, v, rel_h, rel_w, dout, tol, scale=None):
    n_k = k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    assert K.unsupported_reason(q, k, v, rel_h, rel_w) is None
    out, lse = K.forward(q, k, v, rel_h, rel_w, scale)
    grads = K.backward(dout, q, k, v, rel_h, rel_w, out, lse, scale)

    c64 = [t.double() for t in (q, k, v, rel_h, rel_w, dout)]
    out64, lse64 = reference.forward(*c64[:5], scale)
    grads64 = reference.backward(c64[5], *c64[:5], out64, lse64, scale)

    got = (out, lse, *grads)
    ref = (out64, lse64, *grads64)
    inputs = (q, q, q, k, v, rel_h, rel_w)
    errs = {}
    for name, g, r, like in zip(NAMES, got, ref, inputs):
        assert g.shape == r.shape, name
        want_dtype = torch.float32 if name == "lse" else like.dtype
        assert g.dtype == want_dtype, (name, g.dtype)
        assert torch.isfinite(g).all(), f"{name}: non-finite (unwritten or overflow)"
        errs[name] = rel_err(g, r, floor_rms=1.0 if n_k == 1 else 1e-2)
    bad = {n: e for n, e in errs.items() if not e <= tol}
    assert not bad, f"rel errors over {tol}: {bad} (all: {errs})"
    return errs, got


def record_launches(monkeypatch) -> list[dict]:
    """The keyword arguments (constexprs, launch options) of every kernel launch from now on, in order."""
    launched, launch = [], K._launch

    def record(kernel, grid, *args, **kwargs):
        launched.append(kwargs)
        launch(kernel, grid, *args, **kwargs)

    monkeypatch.setattr(K, "_launch", record)
    return launched


# ---------------------------------------------------------------------------------------------
# Interpreter-sized correctness tests (CPU in CI; also run on GPU)
# ---------------------------------------------------------------------------------------------

# (batch, grid hk x wk, head dim, mode). Interpreter blocks are 16 queries x ~16 keys, so 7x7 and 3x7
# run R=2 grid rows per tile (gather path), 5x9 / 4x20 one padded row per tile, 1x1 a single key.
SMALL = [
    (2, 1, 1, 64, "fp32-highest"),
    (2, 7, 7, 64, "fp32-highest"),
    (2, 5, 9, 80, "fp32-highest"),
    (1, 3, 7, 64, "fp32-highest"),
    (1, 4, 20, 64, "fp32-highest"),
    (2, 7, 7, 80, "fp32-high"),
    (1, 5, 9, 64, "fp32-medium"),
    (2, 3, 7, 64, "bf16"),
    (1, 5, 9, 80, "bf16"),
    (1, 7, 7, 64, "fp16"),
    (1, 2, 70, 16, "bf16"),  # grid rows over 64 keys (SAM above 1024 px): one 128-key tile a row, 58 of padding
    (1, 2, 128, 16, "fp32-high"),  # the widest grid row the kernels take
]


@pytest.mark.parametrize("b,hk,wk,d,mode", SMALL)
def test_small_shapes(b, hk, wk, d, mode, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    run_and_check(*make_inputs(b, hk * wk, hk, wk, d, d, dtype), tol)


@pytest.fixture
def split_head_dim(monkeypatch):
    # head dims in two chunks (tiles.SPLIT_HEAD_DIM) are the default, which SAMHQ_FX_SPLIT_HEAD_DIM=0 turns off;
    # these tests run them whatever the environment says
    monkeypatch.setattr(K.tiles, "SPLIT_HEAD_DIM", True)


def test_head_dim_chunks_switched_off_pad(monkeypatch):
    monkeypatch.setattr(K.tiles, "SPLIT_HEAD_DIM", False)
    assert [K.tiles.split(d) for d in (80, 48, 64)] == [(128, 0), (64, 0), (64, 0)]
    assert [K.tiles.pad(d) for d in (80, 96, 112)] == [128, 128, 128]


def test_head_dim_chunks(split_head_dim):
    # head dims that are a power of two plus a smaller one run as those two chunks; the rest are padded
    split = K.tiles.split
    assert [split(d) for d in (16, 32, 64, 128)] == [(16, 0), (32, 0), (64, 0), (128, 0)]
    assert [split(d) for d in (80, 96, 48)] == [(64, 16), (64, 32), (32, 16)]
    assert [split(d) for d in (1, 24, 40, 72, 100, 112)] == [(16, 0), (32, 0), (64, 0), (128, 0), (128, 0), (128, 0)]
    assert [K.tiles.pad(d) for d in (80, 96, 112)] == [80, 96, 128]


# (batch, grid hk x wk, head dim, value dim, mode): head dims as two chunks (80 = 64 + 16, 48 = 32 + 16,
# 96 = 64 + 32) in q / k, v or both, on R > 1 key tiles (3x7, 7x7) and R == 1 ones (5x9, 4x20); fp32 on grids
# wider than 8 with the K-major copies, whose tiles are split the same way
SPLIT = [
    (2, 3, 7, 80, 80, "bf16"),
    (1, 5, 9, 80, 80, "bf16"),
    (1, 4, 20, 80, 80, "fp32-high"),
    (1, 3, 7, 80, 80, "fp32-highest"),
    (1, 3, 7, 48, 96, "fp32-highest"),
    (1, 5, 9, 96, 48, "bf16"),
    (1, 5, 9, 80, 64, "fp32-highest"),
    (1, 3, 7, 64, 80, "bf16"),
]


@pytest.mark.parametrize("b,hk,wk,d,dv,mode", SPLIT)
def test_split_head_dims(b, hk, wk, d, dv, mode, monkeypatch, matmul_precision, split_head_dim):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    launches = record_launches(monkeypatch)
    run_and_check(*make_inputs(b, hk * wk, hk, wk, d, dv, dtype, seed=d + dv + wk), tol)
    # forward, then dQ and dK/dV in split launches or one fused one (the table's choice for this shape and GPU)
    assert [kw["PART"] if "PART" in kw else "fwd" for kw in launches] in (["fwd", "dq", "dkdv"], ["fwd", "both"])
    for kw in launches:
        assert (kw["D_A"], kw["D_B"], kw["DV_A"], kw["DV_B"]) == (*K.tiles.split(d), *K.tiles.split(dv))


@pytest.mark.parametrize("grid", [(3, 7), (5, 9)])  # R > 1 and R == 1 key tiles
def test_nonfinite_rows_are_nan_as_in_eager(grid, matmul_precision):
    # An inf score, a fully masked query (-inf bias) or a NaN input: NaN exactly where eager has NaN,
    # never finite-looking numbers computed from a row eager's softmax makes NaN. (The forward's online
    # softmax makes such a row's lse NaN, so its backward rows are NaN throughout.)
    matmul_precision("highest")
    hk, wk = grid
    q, k, v, rel_h, rel_w, dout = make_inputs(2, hk * wk, hk, wk, 64, 64, torch.float32, seed=4)
    k[1, 5, 0] = float("inf")  # batch 1: an inf key
    rel_h[0, 3] = float("-inf")  # batch 0, query 3: every key masked
    rel_h[0, 6, 1] = float("-inf")  # batch 0, query 6: one grid row masked (finite)
    q[0, 9, 2] = float("nan")
    scale = 0.125
    out, lse = K.forward(q, k, v, rel_h, rel_w, scale)
    grads = K.backward(dout, q, k, v, rel_h, rel_w, out, lse, scale)
    leaves = [t.double().requires_grad_() for t in (q, k, v, rel_h, rel_w)]
    ref = reference.naive(*leaves, scale)  # the eager formula, float64
    ref_grads = torch.autograd.grad(ref, leaves, dout.double())
    for name, g, r in zip(("out", "dq", "dk", "dv", "d_rel_h", "d_rel_w"), (out, *grads), (ref, *ref_grads)):
        assert torch.equal(torch.isnan(g.cpu()), torch.isnan(r.cpu())), name
        fin = torch.isfinite(r)
        assert torch.allclose(g[fin].double(), r[fin], rtol=1e-4, atol=1e-5), name
    assert torch.isfinite(out[0, 6]).all()


@pytest.mark.parametrize("layout", ["qkv", "transposed"])
def test_strided_inputs(layout, matmul_precision):
    matmul_precision("highest")
    run_and_check(*make_inputs(2, 35, 5, 7, 64, 64, torch.float32, layout=layout), 1e-5)


# (batch * heads, heads, grid hk x wk, head dim, mode, overrides): the fp32 K-major dout copy with and without query
# padding (60 and 48 queries in 16-query blocks), 16-bit split and fused backward launches
HEADS_LAST = [
    (6, 3, 5, 12, 16, "fp32-highest", {}),
    (4, 2, 3, 16, 16, "fp32-high", {}),
    (4, 2, 3, 5, 8, "bf16", {}),
    (6, 3, 3, 7, 16, "fp16", {"bwd": dict(FUSED=True), "dkdv": dict(BLOCK_N=32), "dq": dict(BLOCK_N=32)}),
]


@pytest.mark.parametrize("b,heads,hk,wk,d,mode,overrides", HEADS_LAST)
def test_heads_last_output(b, heads, hk, wk, d, mode, overrides, monkeypatch, matmul_precision):
    # out as [B // heads, N, heads, Dv] (what the rewrite asks for where the model puts heads next to features), and
    # dout read in that shape at any strides: the same bits as the [B, N, Dv] output and its gradients
    dtype, prec, _ = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", overrides)
    q, k, v, rel_h, rel_w, dout = make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=b + wk)
    out, lse = K.forward(q, k, v, rel_h, rel_w, 0.3)
    out4, lse4 = K.forward(q, k, v, rel_h, rel_w, 0.3, heads=heads)
    assert out4.shape == (b // heads, hk * wk, heads, d) and out4.is_contiguous()
    assert torch.equal(out4, out.unflatten(0, (-1, heads)).transpose(1, 2)) and torch.equal(lse4, lse)
    # dout as [B // heads, N, heads, Dv]: features-major memory, heads-last, heads-first, and expanded (sum().backward())
    dout_heads_first = dout.contiguous()
    ones = torch.ones((), dtype=dtype, device=DEVICE)
    upstreams = [(dout, dout.unflatten(0, (-1, heads)).transpose(1, 2)),
                 (dout, dout.unflatten(0, (-1, heads)).transpose(1, 2).contiguous()),
                 (dout_heads_first, dout_heads_first.unflatten(0, (-1, heads)).transpose(1, 2)),
                 (ones.expand(out.shape), ones.expand(out4.shape))]
    for i, (dout3, dout4) in enumerate(upstreams):
        grads = K.backward(dout3, q, k, v, rel_h, rel_w, out, lse, 0.3)
        grads4 = K.backward(dout4, q, k, v, rel_h, rel_w, out4, lse4, 0.3)
        for name, g, g4 in zip(NAMES[2:], grads, grads4):
            assert torch.equal(g4, g), (i, name)


# (batch, grid hk x wk, head dim, mode, overrides): R > 1 and R == 1 key tiles, RH_SELECT, the 16-bit bias copies
# and the fp32 K-major copies (which copy the terms from their grid layout), one fused backward launch
GRID_TERMS = [
    (2, 7, 7, 64, "fp32-highest", {}),
    (2, 5, 9, 64, "bf16", {}),
    (2, 7, 7, 64, "bf16", {k: dict(BLOCK_N=64, RH_SELECT=True) for k in ("fwd", "dkdv", "dq")}),
    (2, 5, 12, 64, "bf16", {"dkdv": dict(BIAS_T=True)}),
    (2, 5, 12, 80, "fp32-high", {k: dict(BLOCK_N=32) for k in ("fwd", "dkdv", "dq")}),
    (2, 3, 7, 64, "bf16", {"bwd": dict(FUSED=True), "dkdv": dict(BLOCK_N=32), "dq": dict(BLOCK_N=32)}),
]


@pytest.mark.parametrize("b,hk,wk,d,mode,overrides", GRID_TERMS)
def test_rel_terms_as_query_grid(b, hk, wk, d, mode, overrides, monkeypatch, matmul_precision):
    # rel_h / rel_w handed over as [B, Hq, Wq, K] at the einsums' strides: right against float64, and the same
    # bits as the same values in [B, Nq, K] rows (the same loads and arithmetic, at other addresses)
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", overrides)
    q, k, v, rel_h, rel_w, dout = make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=11)
    rh4, rw4 = grid_terms(rel_h, rel_w, hk, wk)
    assert K._rel_strides(rh4)[1] == wk and K._rel_strides(rw4)[1] == wk  # the 4-D path, not a flat view
    _, got4 = run_and_check(q, k, v, rh4, rw4, dout, tol)
    _, got3 = run_and_check(q, k, v, rel_h, rel_w, dout, tol)
    for name, g4, g3 in zip(NAMES, got4, got3):
        assert torch.equal(g4.reshape(g3.shape), g3), name
    assert got4[5].shape == rh4.shape and got4[5].is_contiguous()


def test_nq_differs_from_nk(matmul_precision):
    # queries are only rows: 30 queries against a 5x9 key grid, value dim != head dim
    matmul_precision("highest")
    run_and_check(*make_inputs(2, 30, 5, 9, 64, 32, torch.float32), 1e-5)


def test_other_tile_configs(monkeypatch, matmul_precision):
    # Larger key-tile target: 7x7 then runs R=8 rows per tile (taller than the grid, masked) and
    # 4x20 R=2 rows of 32; query blocks of 32 exercise a different partial last block.
    matmul_precision("highest")
    monkeypatch.setattr(K.configs, "OVERRIDES", {kname: dict(BLOCK_N=64, BLOCK_M=32) for kname in ("fwd", "dkdv", "dq")})
    run_and_check(*make_inputs(1, 49, 7, 7, 64, 64, torch.float32), 1e-5)
    run_and_check(*make_inputs(1, 80, 4, 20, 64, 64, torch.float32), 1e-5)


@pytest.mark.parametrize("hk,wk,layout", [(5, 12, "contiguous"), (4, 16, "transposed")])
@pytest.mark.parametrize("mode", ["fp32-highest", "fp32-high"])
def test_kmajor_operand_copies(hk, wk, layout, mode, monkeypatch, matmul_precision):
    # fp32 grids wider than 8 read V, K, Q, dout and the dK/dV bias from transposed copies. Key tiles of
    # R=2 rows: 5x12 pads the copies' rows (5 -> 6) and columns (12 -> 16), and 60 queries leave a partial
    # query block; 4x16 pads nothing, and with 'transposed' inputs the copies are views of the inputs.
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", {kname: dict(BLOCK_N=32) for kname in ("fwd", "dkdv", "dq")})
    assert K._kmajor(dtype, wk, 64)
    run_and_check(*make_inputs(2, hk * wk, hk, wk, 64, 64, dtype, layout=layout, seed=7), tol)


def test_bias_copies_for_16bit_inputs(monkeypatch, matmul_precision):
    # dK/dV's transposed rel_h / rel_w copies with bf16 inputs (BIAS_T): on a 2x20 grid and a 5x12 grid, whose
    # padded query blocks and rows differ. The GPU table turns them on per shape class (checked below)
    dtype, prec, tol = MODES["bf16"]
    facts = dict(fp32=False, prec="none", wide=False, interpret=False)
    assert K.configs.config("dkdv", wk=20, rows=10, **facts).get("BIAS_T")
    assert K.configs.config("dkdv", wk=14, rows=100 * 12 * 196, **facts).get("BIAS_T")  # SAM's windows, batch 4
    assert not K.configs.config("dkdv", wk=14, rows=12 * 196, **facts).get("BIAS_T")  # small: launch cost
    assert not K.configs.config("dkdv", wk=7, rows=64 * 12 * 49, **facts).get("BIAS_T")
    monkeypatch.setattr(K.configs, "OVERRIDES", {"dkdv": dict(BIAS_T=True)})
    run_and_check(*make_inputs(1, 40, 2, 20, 32, 32, dtype, seed=9), tol)
    run_and_check(*make_inputs(2, 60, 5, 12, 64, 64, dtype, seed=8), tol)


@pytest.mark.parametrize("mode", ["fp32-highest", "bf16"])
def test_rel_h_select_variant(mode, monkeypatch, matmul_precision):
    # RH_SELECT (the fp32 forward's default, here forced on in dK/dV and dQ and for bf16 too): rel_h as R
    # row / column loads + selects instead of a tile gather; 7x7 runs R=8 rows per tile at this target
    # (some past the grid), 4x20 R=2.
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", {kname: dict(BLOCK_N=64, RH_SELECT=True) for kname in ("fwd", "dkdv", "dq")})
    run_and_check(*make_inputs(2, 49, 7, 7, 64, 64, dtype, seed=6), tol)
    run_and_check(*make_inputs(1, 80, 4, 20, 64, 64, dtype, seed=7), tol)


# (batch, grid hk x wk, head dim, value dim, mode, rel terms as the query grid, fused launch): dQ's SPLIT_ROW
# (one-row key tiles as two halves) with the upper half partly padding (20 -> 32, 40 -> 64, 80 -> 128: SAM's 1280 px
# global grid, where the table takes it at D=80) or none (32), head dims in two chunks (80 = 64 + 16, 48 = 32 + 16),
# fp32's K-major key copy, the 4-D terms and the fused launch
SPLIT_ROW = [
    (2, 3, 20, 80, 80, "bf16", False, False),
    (1, 2, 80, 80, 80, "bf16", False, False),
    (1, 2, 32, 64, 32, "fp32-high", False, False),
    (2, 2, 40, 48, 48, "fp16", True, False),
    (1, 3, 20, 64, 64, "bf16", True, True),
    (1, 2, 24, 80, 80, "fp32-highest", False, True),
]


@pytest.mark.parametrize("b,hk,wk,d,dv,mode,grid,fused", SPLIT_ROW)
def test_dq_split_row(b, hk, wk, d, dv, mode, grid, fused, monkeypatch, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    same = dict(num_warps=4, num_stages=2)  # a fused launch needs dQ and dK/dV to agree on these (GPU rows differ)
    monkeypatch.setattr(K.configs, "OVERRIDES", {"dq": dict(BLOCK_N=16, SPLIT_ROW=True, **same), "dkdv": same,
                                                 "bwd": dict(FUSED=fused)})
    launched = record_launches(monkeypatch)
    q, k, v, rel_h, rel_w, dout = make_inputs(b, hk * wk, hk, wk, d, dv, dtype, seed=13)
    if grid:
        rel_h, rel_w = grid_terms(rel_h, rel_w, hk, wk)
    run_and_check(q, k, v, rel_h, rel_w, dout, tol)
    parts = [kw["PART"] for kw in launched if "PART" in kw and kw["SPLIT_ROW_Q"]]
    assert parts == (["both"] if fused else ["dq", "dkdv"])  # the split-row dQ ran, in every backward launch


def test_dq_split_row_needs_wide_one_row_tiles(monkeypatch):
    # a key tile of several grid rows (7x7: R > 1) or one row under 32 columns keeps the plain dQ loop
    monkeypatch.setattr(K.configs, "OVERRIDES", {"dq": dict(BLOCK_N=16, SPLIT_ROW=True), "bwd": dict(FUSED=False)})
    launched = record_launches(monkeypatch)
    for hk, wk in ((7, 7), (3, 16)):
        launched.clear()
        run_and_check(*make_inputs(1, hk * wk, hk, wk, 32, 32, torch.bfloat16, seed=3), MODES["bf16"][2])
        assert [kw["SPLIT_ROW_Q"] for kw in launched if "PART" in kw] == [False, False]


# (batch, grid hk x wk, head dim, mode, key-tile target): R > 1 and R == 1 tiles, partial query blocks,
# fp32 with and without the K-major copies, 16-bit with the bias copies (wk >= 17)
FUSED = [
    (2, 7, 7, 64, "fp32-highest", 16),
    (1, 5, 12, 64, "fp32-high", 32),
    (2, 3, 7, 64, "bf16", 32),
    (1, 2, 20, 32, "bf16", 32),
    (1, 5, 9, 80, "fp16", 16),
    (1, 5, 12, 80, "fp32-high", 32),
]


@pytest.mark.parametrize("b,hk,wk,d,mode,bn", FUSED)
def test_fused_backward_launch(b, hk, wk, d, mode, bn, monkeypatch, matmul_precision):
    # dK/dV and dQ programs in one launch, each computing delta itself: same gradients as the split
    # launches (which the rest of this file checks) within the mode's bound, and every output written
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", {"bwd": dict(FUSED=True), "dkdv": dict(BLOCK_N=bn),
                                                 "dq": dict(BLOCK_N=bn)})
    launches = []
    real = torch.library.wrap_triton
    monkeypatch.setattr(torch.library, "wrap_triton", lambda kern: launches.append(kern) or real(kern))
    run_and_check(*make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=hk + wk), tol)
    assert [kern.__name__ for kern in launches] == ["_fwd_kernel", "_bwd_kernel"]  # one backward launch


@pytest.mark.parametrize("fp32,prec", [(False, "none"), (True, "tf32"), (True, "tf32x3")])
def test_fused_backward_rows_agree_on_warps_and_stages(fp32, prec):
    # a fused launch needs one num_warps / num_stages for dK/dV and dQ; backward() silently splits
    # otherwise, so a table row that asks for FUSED where they differ would never take effect
    configs = K.configs
    fused = 0
    for wk, rows, d in itertools.product((7, 14, 16, 28, 32, 48, 56, 64), (49, 2_352, 8_192, 37_632, 196_608),
                                         (64, 80)):  # 80: the head-dim-64 rows and its own (min_d)
        facts = dict(fp32=fp32, prec=prec, wide=False, wk=wk, rows=rows, interpret=False, d=d)
        if configs.config("bwd", **facts).get("FUSED"):
            fused += 1
            kv, q = configs.config("dkdv", **facts), configs.config("dq", **facts)
            assert (kv["num_warps"], kv["num_stages"]) == (q["num_warps"], q["num_stages"]), (wk, rows, d, kv, q)
    assert fused  # the table does fuse somewhere


# SAM's shape classes as the GPU table configures them: (batch, grid hk x wk run here, head dim, mode, rows the
# GPU launch has = batch * heads * queries[, the GPU class, sm_90 where not named]). 14x14: the windows of ViT-B/L
# (12 / 16 heads, D=64) and ViT-H (16 heads, D=80), 25 windows at batch 1; 64 wide: the global blocks' class, here on
# 2 of the 64 grid rows (the interpreter's cost grows with N^2)
SAM_CLASSES = [
    (2, 14, 14, 64, "bf16", 25 * 12 * 196),
    (2, 14, 14, 64, "fp32-high", 25 * 12 * 196),
    (2, 14, 14, 80, "bf16", 25 * 16 * 196),
    (2, 14, 14, 80, "fp32-high", 25 * 16 * 196),
    (1, 14, 14, 80, "fp32-highest", 25 * 16 * 196),
    (1, 2, 64, 64, "bf16", 16 * 4096),
    (1, 2, 64, 80, "bf16", 16 * 4096),
    (1, 2, 64, 80, "fp32-high", 16 * 4096),
    # ViT-H's 512 px global layer (32 wide, batch 1: one fused backward launch), Hopper's rows and a 99 KB class's
    (1, 3, 32, 80, "bf16", 16 * 1024),
    (1, 3, 32, 80, "bf16", 16 * 1024, "sm_86"),
    # TF32 and 3-pass global dQ on the 99 KB classes (3-pass: sm_90's too): 64-query blocks of one or two grid rows
    (1, 2, 64, 64, "fp32-high", 12 * 4096, "sm_86"),
    (1, 2, 64, 80, "fp32-high", 16 * 4096, "sm_86"),
    (1, 3, 32, 80, "fp32-high", 16 * 1024, "sm_86"),
    (1, 2, 64, 80, "fp32-highest", 16 * 4096, "sm_86"),
    (1, 2, 64, 64, "fp32-highest", 12 * 4096),
    (1, 2, 64, 80, "fp32-highest", 16 * 4096),  # and sm_90's ViT-H 3-pass dK/dV at 1 stage
]


@pytest.mark.parametrize("b,hk,wk,d,mode,rows,on", [c if len(c) == 7 else (*c, "sm_90") for c in SAM_CLASSES])
def test_gpu_rows_at_sam_shapes(b, hk, wk, d, mode, rows, on, monkeypatch, matmul_precision):
    # the blocks, key tiles and switches (BLOCK_N=16 at D=80, RH_SELECT, BIAS_T, FUSED, ...) that the GPU's rows
    # choose at SAM's shapes are right too, not only the interpreter's small blocks: each kernel's GPU config on
    # the class `on`, forced through OVERRIDES
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    target = arch.ARCHS[on]
    facts = dict(fp32=dtype == torch.float32, prec=K._dot_precision(dtype), wide=False, wk=wk, rows=rows,
                 interpret=False, d=d, smem=target.smem, cc=target.capability)
    gpu = {kern: K.configs.config(kern, **facts) for kern in ("fwd", "dkdv", "dq", "bwd")}
    monkeypatch.setattr(K.configs, "OVERRIDES", gpu)
    for kern, cfg in gpu.items():  # what runs: the GPU config, and interpreter-row keys only at the kernels' default
        ran = K.configs.config(kern, **{**facts, "interpret": True})
        assert {key: val for key, val in ran.items() if key not in cfg and val} == {}, (kern, ran, cfg)
    run_and_check(*make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=wk + d), tol)


def test_unsupported_reason():
    q, k, v, rh, rw, _ = make_inputs(1, 12, 3, 4, 16, 16, torch.float32)
    assert K.unsupported_reason(q, k, v, rh, rw) is None
    c64 = [t.double() for t in (q, k, v, rh, rw)]
    assert K.unsupported_reason(*c64)  # fp64: the reference handles it
    assert K.unsupported_reason(q, k, v, rh[..., :2], rw)  # grid 2x4 != 12 keys
    assert K.unsupported_reason(q, k[:, :6], v, rh, rw)  # k and v lengths differ
    assert K.unsupported_reason(q, k[..., :8], v, rh, rw)  # head dims differ
    assert K.unsupported_reason(q[:1, :5], k, v, rh, rw)  # rel_h rows != queries
    assert K.unsupported_reason(q, k, v.half(), rh, rw)  # mixed dtypes
    assert K.unsupported_reason(q[..., None], k, v, rh, rw)  # rank
    big = torch.empty(1, 12, 256, device=DEVICE)
    assert K.unsupported_reason(big, big, big, rh, rw)  # head dim too large


# ---------------------------------------------------------------------------------------------
# GPU: benchmark and SAM shapes, every precision mode, determinism
# ---------------------------------------------------------------------------------------------

BENCH_GRIDS = [7, 14, 16, 28, 32, 48, 56, 64]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "fp32-high"])
@pytest.mark.parametrize("grid", BENCH_GRIDS)
def test_gpu_bench_grids(grid, mode, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    run_and_check(*make_inputs(12, grid * grid, grid, grid, 64, 64, dtype, layout="qkv", seed=grid), tol)


# key grids over 64 wide (SAM above 1024 px: 80x80 at 1280), one 128-key tile a grid row, and a 100-wide one: the
# launches the table gives them where they fit this GPU, as a direct call of the op runs them (the rewrite leaves fp32
# there to Inductor: configs.py's "place" rows, tests/test_placement.py; bf16 runs them with spills, DECISIONS.md)
@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "fp32-high", "fp32-highest"])
@pytest.mark.parametrize("grid,d", [(80, 64), (80, 80), (100, 64)])
def test_gpu_grids_over_64_wide(grid, d, mode, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    if dtype == torch.float32:  # 16-bit launches fit every class at these grids: those always run
        real = arch.of(torch.device("cuda"))
        skip_unless_fit(fit.launches(real, dtype, prec, fit.Shape(12, grid * grid, grid, grid, d, d)), real,
                        "fp32 launches (left to Inductor by the rewrite)")
    run_and_check(*make_inputs(12, grid * grid, grid, grid, d, d, dtype, seed=grid + d), tol)


# SAM: ViT-B/L (D=64) and ViT-H (D=80); 14x14 windows (batch*windows*heads large), 64x64 global and ViT-H's 32x32
# global at 512 px (300 windows x heads: enough rows for the bf16 table's split backward on narrow grids)
SAM = [(24, 14, 64), (24, 14, 80), (300, 14, 64), (12, 64, 64), (12, 64, 80), (16, 32, 80)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("b,grid,d", SAM)
def test_gpu_sam_shapes(b, grid, d, mode, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    run_and_check(*make_inputs(b, grid * grid, grid, grid, d, d, dtype, seed=d + grid), tol)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "fp32-high", "fp32-highest"])
@pytest.mark.parametrize("b,grid,d", SAM)
def test_gpu_rel_terms_as_query_grid(b, grid, d, mode, matmul_precision):
    # the SAM shapes with rel_h / rel_w in the einsums' layouts (what the rewrite hands over): float64-right and
    # the same bits as flat rows, through every config the GPU table picks for them
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    q, k, v, rel_h, rel_w, dout = make_inputs(b, grid * grid, grid, grid, d, d, dtype, seed=d + grid + 1)
    _, got4 = run_and_check(q, k, v, *grid_terms(rel_h, rel_w, grid, grid), dout, tol)
    _, got3 = run_and_check(q, k, v, rel_h, rel_w, dout, tol)
    for name, g4, g3 in zip(NAMES, got4, got3):
        assert torch.equal(g4.reshape(g3.shape), g3), name


# head dims as two chunks (tiles.split) at SAM's layers and on a mid-size grid, with q / k and v dims apart; 72 / 40,
# whose chunks would not be whole, is padded (its chunked bf16 forward was wrong on the H200: tiles.split)
SPLIT_GPU = [(16, 64, 80, 80), (400, 14, 80, 80), (12, 32, 48, 48), (12, 32, 96, 96), (12, 32, 80, 64),
             (24, 14, 64, 80), (12, 48, 72, 40)]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "fp32-high", "fp32-highest"])
@pytest.mark.parametrize("b,grid,d,dv", SPLIT_GPU)
def test_gpu_split_head_dims(b, grid, d, dv, mode, matmul_precision, split_head_dim):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    run_and_check(*make_inputs(b, grid * grid, grid, grid, d, dv, dtype, seed=d + dv + grid), tol)


# the small non-square grids and head dims of tests/test_encoders.py and test_patterns.py (which run the kernels
# inside compiled encoders from test_gpu.py), here alone: a failure there is then the kernels' or the compile's
ENCODER_GRIDS = [(4, 6, 5, 16), (8, 6, 5, 8), (4, 3, 5, 8), (4, 10, 9, 16), (16, 7, 7, 16)]  # (b, hk, wk, d)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["fp32-highest", "bf16"])
@pytest.mark.parametrize("b,hk,wk,d", ENCODER_GRIDS)
def test_gpu_small_encoder_grids(b, hk, wk, d, mode, matmul_precision):
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    q, k, v, rel_h, rel_w, dout = make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=b + hk + wk + d)
    run_and_check(q, k, v, rel_h, rel_w, dout, tol)
    run_and_check(q, k, v, *grid_terms(rel_h, rel_w, hk, wk), dout, tol)


@pytest.mark.gpu
def test_gpu_odd_shapes(matmul_precision):
    matmul_precision("high")
    run_and_check(*make_inputs(5, 300, 9, 23, 80, 80, torch.float32, layout="transposed"), 3e-3)
    run_and_check(*make_inputs(3, 4096, 1, 1, 64, 64, torch.bfloat16), 2e-2)
    run_and_check(*make_inputs(3, 1000, 37, 100, 64, 32, torch.bfloat16), 2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["bf16", "fp32-high"])
# split launches but for (96, 14, 64): one fused launch
@pytest.mark.parametrize("b,grid,d", [(12, 64, 64), (24, 14, 80), (96, 14, 64), (16, 64, 80)])
def test_gpu_backward_deterministic(b, grid, d, mode, matmul_precision):
    dtype, prec, _ = MODES[mode]
    matmul_precision(prec)
    q, k, v, rh, rw, dout = make_inputs(b, grid * grid, grid, grid, d, d, dtype, seed=7)
    scale = d ** -0.5
    out, lse = K.forward(q, k, v, rh, rw, scale)
    out2, lse2 = K.forward(q, k, v, rh, rw, scale)
    assert torch.equal(out, out2) and torch.equal(lse, lse2)
    g1 = K.backward(dout, q, k, v, rh, rw, out, lse, scale)
    g2 = K.backward(dout, q, k, v, rh, rw, out, lse, scale)
    for name, a, c in zip(NAMES[2:], g1, g2):
        assert torch.equal(a, c), f"{name} differs between runs"


@pytest.mark.gpu
# windows (one fused backward launch in bf16), a global layer (split dQ / dK/dV launches), a split head dim with
# K-major copies (fp32), packed q / k / v views
@pytest.mark.parametrize("b,grid,d,layout,mode", [
    (96, 14, 64, "contiguous", "bf16"), (12, 64, 64, "contiguous", "bf16"), (12, 32, 80, "transposed", "fp32-high"),
    (96, 14, 64, "qkv", "bf16")])
def test_gpu_direct_launch_bits(b, grid, d, layout, mode, matmul_precision, monkeypatch):
    # launches outside a trace (the eager op's and the opaque op's: kernels/launcher.py) give JITFunction.run's bits,
    # on a signature's first call (through JITFunction.run) and its later ones (its cached binaries), and with a
    # pointer 2-4 bytes off 16-byte alignment (another binary for the same signature)
    monkeypatch.setattr(K.launcher, "ENABLED", True)
    dtype, prec, _ = MODES[mode]
    matmul_precision(prec)
    scale = d ** -0.5
    ts = make_inputs(b, grid * grid, grid, grid, d, d, dtype, layout=layout, seed=3)

    def call(q, k, v, rh, rw, dout):
        out, lse = K.forward(q, k, v, rh, rw, scale)
        return (out, lse, *K.backward(dout, q, k, v, rh, rw, out, lse, scale))

    def same(got, want):
        for name, g, w in zip(NAMES, got, want):
            assert torch.equal(g, w), name

    variants = [ts]
    if layout == "contiguous":
        q = ts[0]
        off = torch.empty(q.numel() + 1, dtype=dtype, device=DEVICE)[1:].view(q.shape).copy_(q)
        assert off.data_ptr() % 16 != 0 and off.stride() == q.stride()
        variants.append((off, *ts[1:]))
    jit_runs = []
    for kernel in (K._fwd_kernel, K._bwd_kernel):  # count the launches that go through JITFunction.run
        monkeypatch.setattr(kernel, "run", lambda *a, _run=kernel.run, **kw: (jit_runs.append(1), _run(*a, **kw))[1])
    for inputs in variants:
        want = call(*inputs)  # wrap_triton -> JITFunction.run
        with op._direct_triton_launch():
            same(call(*inputs), want)  # the signature's first direct call: through JITFunction.run
            jit_runs.clear()
            same(call(*inputs), want)  # its binaries
            assert not jit_runs, "a later direct call went through JITFunction.run"
    plan = K._plan(K._fwd_plan, *ts[:5])
    assert len(plan.compiled["fwd"]) == len(variants)  # one binary per alignment


def test_config_lookups_follow_table_and_overrides(monkeypatch):
    # a sweep or test that swaps the table or the overrides gets their configs, and callers get their own copy
    args = ("dq", torch.bfloat16, "none", 64, 64, 64, 12 * 4096, K.arch.ARCHS["sm_86"])
    first = K._config(*args)
    first["BLOCK_M"] = -1
    assert K._config(*args)["BLOCK_M"] != -1
    monkeypatch.setattr(K.configs, "OVERRIDES", {"dq": {"BLOCK_M": 16}})
    assert K._config(*args)["BLOCK_M"] == 16
    monkeypatch.setattr(K.configs, "OVERRIDES", {})
    assert K._config(*args) == K.configs.config("dq", fp32=False, prec="none", wide=False, d=64, wk=64,
                                                rows=12 * 4096, interpret=K._INTERPRET, smem=101376, cc=86)
