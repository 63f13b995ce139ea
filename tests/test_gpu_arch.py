"""Every GPU class's config rows, run on the GPU at hand at SAM's shapes against float64 (kernels/configs.py).

SAMHQ_FX_ARCH makes the kernels take another architecture class's configs (kernels/arch.py) while they run on the
real device: each class's blocks, stages and launch choices are then checked for right answers at SAM's shapes
(ViT-B / ViT-L at head dim 64, ViT-H at 80; 14x14 windows and a 64x64 global layer), in bf16, TF32 and 3-pass TF32,
every output (out, lse, dq, dk, dv, d_rel_h, d_rel_w) written and within the mode's bound. A class whose launches
do not fit the real GPU (kernels/fit.py: shared memory, tensor memory) is not run there; the test says so.
"""

from __future__ import annotations

import pytest
import torch

from test_kernels import K, MODES, make_inputs, record_launches, run_and_check, skip_unless_fit

try:
    from samhq_fx.kernels import arch, fit
except ImportError:
    from kernels import arch, fit

pytestmark = pytest.mark.gpu

# (batch * heads run, key-grid side, head dim): ViT-B windows at a 512 px image (9 x 12) and at 1024 px (25 x 12: the
# split backward of many rows), ViT-H windows at 512 px (9 x 16: one fused launch) and 1024 px (25 x 16), ViT-B and
# ViT-H global layers at batch 1, ViT-H's at 512 px (one fused launch at batch 1, split at batch 8) and ViT-B's at
# 256 px (one fused fp32 launch)
SAM = [(108, 14, 64), (300, 14, 64), (144, 14, 80), (400, 14, 80), (12, 64, 64), (16, 64, 80), (16, 32, 80),
       (128, 32, 80), (12, 16, 64)]


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)


@pytest.mark.parametrize("mode", ["bf16", "fp32-high", "fp32-highest"])
@pytest.mark.parametrize("b,grid,d", SAM)
@pytest.mark.parametrize("name", [a for a in arch.ARCHS if a != "sm_90"])  # sm_90's: tests/test_kernels.py
def test_gpu_arch_rows_at_sam_shapes(name, b, grid, d, mode, monkeypatch, matmul_precision):
    dtype, prec, tol = MODES[mode]
    real = arch.of(torch.device("cuda"))
    shape = fit.Shape(b, grid * grid, grid, grid, d, d)
    fp32_prec = "highest" if dtype != torch.float32 else prec
    launches = fit.launches(arch.ARCHS[name], dtype, fp32_prec, shape)
    skip_unless_fit(launches, real, f"{name}'s launches")
    monkeypatch.setenv("SAMHQ_FX_ARCH", name)
    assert K._target(torch.device("cuda")) is arch.ARCHS[name]
    matmul_precision(prec)
    ran = record_launches(monkeypatch)
    run_and_check(*make_inputs(b, grid * grid, grid, grid, d, d, dtype, seed=b + grid + d), tol)
    # what ran is the class's configs: the blocks and warps fit.py recorded for it
    want = [(dict(launch.options)["num_warps"], dict(launch.options)["num_stages"]) for launch in launches]
    assert [(kw["num_warps"], kw["num_stages"]) for kw in ran] == want


@pytest.mark.parametrize("mode", ["bf16", "fp32-high"])
@pytest.mark.parametrize("b,grid,d", [(16, 64, 80), (12, 64, 64), (16, 32, 80)])
@pytest.mark.parametrize("name", ["sm_90", "sm_86"])
def test_gpu_dq_split_row_at_sam_shapes(name, b, grid, d, mode, monkeypatch, matmul_precision):
    # dQ's SPLIT_ROW (each grid row as two key tiles) forced on over a class's rows, at SAM's global layers
    dtype, prec, tol = MODES[mode]
    real = arch.of(torch.device("cuda"))  # before SAMHQ_FX_ARCH names another class
    monkeypatch.setenv("SAMHQ_FX_ARCH", name)
    # 64 queries / 2 stages: fp32's 128-query rows with rel_w loaded in the loop need 238-279 KB on sm_90
    monkeypatch.setattr(K.configs, "OVERRIDES", {"dq": dict(BLOCK_N=grid, BLOCK_M=64, num_warps=4, num_stages=2,
                                                            SPLIT_ROW=True)})
    launches = fit.launches(arch.ARCHS[name], dtype, prec if dtype == torch.float32 else "highest",
                            fit.Shape(b, grid * grid, grid, grid, d, d))
    # the forced 64-query rows are not the table's: on a 99 KB GPU some need more shared memory than it has
    skip_unless_fit(launches, real, f"{name}'s launches with SPLIT_ROW forced")
    matmul_precision(prec)
    ran = record_launches(monkeypatch)
    run_and_check(*make_inputs(b, grid * grid, grid, grid, d, d, dtype, seed=b + grid + d + 1), tol)
    assert any(kw.get("SPLIT_ROW_Q") for kw in ran)
