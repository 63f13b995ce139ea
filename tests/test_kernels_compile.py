"""The kernels compile and fit on every GPU architecture class, with the argument types Inductor gives user kernels.

tests/cross_compile.py records every launch at SAM's shapes and compiles each for sm_80 to sm_120 on the CPU (Triton's
bundled ptxas, no GPU), with this suite's Triton and with Tritons 3.6 (the GPU image's), 3.7 and 3.8 (the series torch
2.12 and 2.14 install), typed as Inductor types user kernels: seen on the H200, a Python float argument is an fp64
scalar under Inductor, which silently turned the scores and accumulators fp64 and failed a tl.dot type check that a
direct launch never hits.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def run_check(script: str | Path, *args: str, env: dict | None = None, timeout: int = 600,
              cwd: Path | None = None) -> str:
    """Run a compile-check script (a name next to this file, a path, or "-c" and the code) without TRITON_INTERPRET
    (real compiles), with `env` added to the environment, in `cwd`; its stdout."""
    pytest.importorskip("triton.backends.nvidia")
    full_env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    full_env.update(env or {})
    target = str(Path(__file__).with_name(script)) if isinstance(script, str) and script != "-c" else str(script)
    proc = subprocess.run([sys.executable, target, *args], env=full_env, capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


ROOT = Path(__file__).resolve().parents[1]
# what CI compiles (a cold compile of each launch is 1-5 s on CI's 2 cores): every class but sm_89 (it takes sm_86's
# rows: same shared memory, no capability condition between them; tests/test_arch_rows.py checks that), bf16 / TF32 /
# 3-pass TF32 (fp16 takes bf16's configs: the table tells 16-bit dtypes apart by fp32=False only), ViT-B and ViT-H
# (ViT-L's launches are ViT-B's at other row counts, the same classes), batch 1. This suite's Triton: 1024 and 256 px
# (split and fused launches, wide and narrow grids) and the extras. Left to the full run: 512 px (32x32 grids, key
# tiles of two grid rows), batch 8 (split fp32 launches on 16x16 grids), sm_89, fp16, ViT-L; `python
# tests/cross_compile.py` compiles it all. A cold CI run, these compiles included, took 25 minutes on 2 cores
CI_ARGS = ("--arch", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120", "--mode", "bf16", "tf32", "tf32x3",
           "--model", "B", "H", "--batch", "1", "--quiet")
CI_ARGS_OWN = CI_ARGS + ("--px", "1024", "256")
# other Tritons beside the suite's own -> the image sizes compiled with each: 3.6, the GPU image's, at 1024 px (the
# global and window layers SAM is trained at); 3.7 and 3.8, what torch 2.12 and 2.14 install, at 256 px too (where
# 3.8 needed more shared memory than 3.9). .ci/run installs each with pip --target in .ci-triton<major><minor>
OTHER_TRITONS = {"3.6.0": ("1024",), "3.7.1": ("1024", "256"), "3.8.0": ("1024", "256")}


def triton_folder(version: str) -> Path:
    return ROOT / (".ci-triton" + "".join(version.split(".")[:2]))


def cross_compile(tmp_path, args: tuple, env: dict | None = None) -> list[dict]:
    out = tmp_path / "rows.json"
    stdout = run_check("cross_compile.py", *args, "--json", str(out), env=env, timeout=1800)
    rows = json.loads(out.read_text())
    assert rows and not [r for r in rows if r["failed"]], stdout[-3000:]
    return rows


def test_every_launch_fits_every_architecture(tmp_path):
    # every launch at SAM's shapes, compiled for each architecture class by this suite's Triton: fits shared memory
    # and tensor memory, and no bf16 launch spills but where cross_compile.ALLOWED_SPILLS says so with the figure
    import triton

    rows = cross_compile(tmp_path, CI_ARGS_OWN)
    assert {r["triton"] for r in rows} == {triton.__version__}
    assert {r["arch"] for r in rows} == {"sm_80", "sm_86", "sm_90", "sm_100", "sm_120"}
    assert {r["mode"] for r in rows} == {"bf16", "tf32", "tf32x3"}
    # the sweeps' OVERRIDES and head dim 80 padded to 128 compile and fit on sm_90 too
    assert any("padded to 128" in r["shapes"][0] for r in rows) and any("RH_SELECT" in r["shapes"][0] for r in rows)


@pytest.mark.parametrize("version", list(OTHER_TRITONS))
def test_every_launch_fits_with_other_tritons(tmp_path, version):
    # the same with the GPU image's Triton and with torch 2.12's and 2.14's: another version allocates registers,
    # shared and tensor memory its own way (3.6 gave the sm_100 'highest' dQ 640 tensor-memory columns where 3.9 gives
    # 256; 3.8 needed 112 KB for the 99 KB classes' 'highest' dQ at 2 stages where 3.9 needs 96)
    folder = triton_folder(version)
    if not (folder / "triton").is_dir():
        pytest.skip(f"no Triton {version} in {folder} (.ci/run installs it: pip install --no-deps --target "
                    f"{folder.name} triton=={version})")
    args = CI_ARGS + ("--px", *OTHER_TRITONS[version], "--no-extras")
    rows = cross_compile(tmp_path, args, env={"PYTHONPATH": os.pathsep.join(
        [str(folder), *filter(None, [os.environ.get("PYTHONPATH")])])})
    assert {r["triton"] for r in rows} == {version}
    assert {r["arch"] for r in rows} == {"sm_80", "sm_86", "sm_90", "sm_100", "sm_120"}


def test_fp32_dkdv_of_the_table_fits_two_ctas_per_sm():
    # at 4 stages the fp32 dK/dV needed 190 KB of shared memory, one CTA of 4 warps per SM, and the backward was
    # 1.2x slower on the H200; a table change that brings that back should fail here, not on the GPU
    code = ("import torch; from samhq_fx.kernels import arch, fit; a = arch.ARCHS['sm_90']; "
            "ls = fit.launches(a, torch.float32, 'high', fit.Shape(b=12, n_q=4096, hk=64, wk=64, d=64, dv=64)); "
            "print(min(fit.build(l, a).ctas_per_sm for l in ls if l.kernel == 'bwd:dkdv'))")
    out = run_check("-c", code)
    assert int(out.strip().splitlines()[-1]) >= 2, out


def test_any_image_size_names_its_grid_and_windows():
    # cross_compile.py --px takes any multiple of 16 px: a px/16-wide global grid, that grid padded to whole 14x14
    # windows (the figures of the sizes --help names), and refuses a size SAM's 16-px patches cannot tile, naming it
    # (in a process of its own: importing cross_compile unsets TRITON_INTERPRET)
    code = """
import cross_compile as cc
fixed = {1024: (64, 25), 512: (32, 9), 256: (16, 4), 384: (24, 4), 640: (40, 9), 768: (48, 16), 1280: (80, 36)}
for px, sw in fixed.items():
    assert cc.resolution(px) == sw, px
assert cc.resolution(896) == (56, 16) and cc.resolution(16) == (1, 1)
for bad in (900, 0, 8192):
    try:
        cc.resolution(bad)
        raise AssertionError(bad)
    except ValueError as e:
        assert f"image size {bad}" in str(e), e
s = cc.SamShape("H", "window", 896, 2).fit_shape()
assert (s.b, s.n_q, s.d) == (2 * 16 * 16, 196, 80), s
print("ok")
"""
    assert run_check("-c", code, cwd=Path(__file__).parent).strip().endswith("ok")


def test_fit_verdict_follows_the_table_in_use():
    # fit.misfit keeps its verdicts per config table: candidate rows (a benchmark's --rows) get their own, and the
    # table's comes back after them. SAM-B at 1280 px in TF32 on sm_90: the table's 64-query, 1-stage dQ fits; a
    # candidate 128 x 128 / 8 warps / 3 stages dQ needs 352 KB
    code = """
import torch
from samhq_fx.kernels import arch, configs, fit
a, shape = arch.ARCHS["sm_90"], fit.Shape(b=12, n_q=6400, hk=80, wk=80, d=64, dv=64)
table = configs.TABLE
print(fit.misfit(a, torch.float32, "high", shape))
configs.TABLE = table + [("dq", dict(prec="tf32", min_wk=65), dict(BLOCK_M=128, num_warps=8, num_stages=3), "x: 3")]
print(fit.misfit(a, torch.float32, "high", shape))
configs.TABLE = table
print(fit.misfit(a, torch.float32, "high", shape))
"""
    table, rows, back = run_check("-c", code).strip().splitlines()[-3:]
    assert table == "None" and back == "None", (table, back)
    assert "bwd:dq needs" in rows and "sm_90 has 227 KB" in rows, rows
