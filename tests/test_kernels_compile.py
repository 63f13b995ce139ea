"""The kernels compile for Hopper (sm_90) with the argument types Inductor gives user kernels.

Seen on the H200: under Inductor a Python float argument is an fp64 scalar, which silently turned the
scores and accumulators fp64 and failed a tl.dot type check that a direct launch never hits. This
compiles every launch of forward/backward for sm_90 on the CPU (Triton's bundled ptxas, no GPU).
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


def test_kernels_compile_for_sm90_with_inductor_argument_types():
    out = run_check("hopper_compile_check.py")
    assert out.count("ok ") == 13, out  # 8 cases, the 3 at head dim 80 padded and split, 2 sweep options


def test_fp32_dkdv_of_the_table_fits_two_ctas_per_sm():
    # 93a1135: at the old 4 stages the fp32 dK/dV needed 190 KB of shared memory, one CTA of 4 warps per SM, and
    # the backward was 1.2x slower; a table change that brings that back should fail here, not on the H200
    pytest.importorskip("triton.backends.nvidia")
    from samhq_fx.kernels import configs

    c = configs.config("dkdv", fp32=True, prec="tf32", wide=False, wk=64, rows=12 * 4096, interpret=False)
    code = ("import json, offline_sm90 as O; c, w = O.compile_tl('bwd', 'fp32', 'dkdv', json.loads('%s')); "
            "print(json.dumps(O.report(c, w)))" % json.dumps(dict(num_warps=c["num_warps"], num_stages=c["num_stages"],
                                                                   BLOCK_M_KV=c["BLOCK_M"])))
    out = run_check("-c", code, cwd=Path(__file__).resolve().parents[1] / "benchmarks" / "tools")
    report = json.loads(out.strip().splitlines()[-1])
    assert report["ctas_per_sm"] >= 2, report


def test_every_head_dim_80_launch_fits_shared_memory():
    # f6b9dbe: the one fp32 backward launch at 24 x 14x14, head dim 80 in chunks, asked for 253 KB of shared memory
    # (227 KB is a CTA's most) and failed at launch on the H200; this compiles every launch configs.py picks at SAM's
    # shape classes for sm_90 and fails on any that is over
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "tools" / "offline_sm90.py"
    out = run_check(tool, "--table", "80", env={"SAMHQ_FX_SPLIT_HEAD_DIM": "1"}, timeout=900)
    assert out.count("ok ") == 45, out  # 3 modes x 6 shapes x (forward + 1 or 2 backward launches)
