"""Where a matched attention runs: the fused op's kernels where they build and fit the GPU, decided at compile time
for its architecture, else Inductor (SKIPPED in the match report); never the reference on CUDA unless asked for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._dynamo.utils import counters

import samhq_fx
from samhq_fx import op, placement
from helpers import fresh_compile_state, rand_inputs, rel_err


def layer(q, k, v, rel_h, rel_w):
    # q, k, v: [B*heads, H*W, D]  rel_h: [B*heads, H, W, H]  rel_w: [B*heads, H, W, W]
    b, n, d = q.shape
    h, w = rel_h.shape[1], rel_h.shape[2]
    attn = (q * d**-0.5) @ k.transpose(-2, -1)
    attn = (attn.view(b, h, w, h, w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).view(b, n, n)
    return attn.softmax(dim=-1) @ v


def _grid_inputs(b, h, w, d, seed, dtype=torch.float32):
    q, k, v, rh, rw = rand_inputs(b, (h, w), (h, w), d, dtype=dtype, seed=seed)
    return q, k, v, rh.view(b, h, w, h), rw.view(b, h, w, w)


def test_a_layer_that_does_not_fit_is_left_to_inductor(tmp_path, monkeypatch):
    reason = "the kernels do not fit sm_86: bwd:dq needs 176 KB of shared memory, sm_86 has 99 KB"
    monkeypatch.setattr(placement, "misfit", lambda m, heads=1: reason)
    fresh_compile_state()
    compiled = torch.compile(layer, backend="samhq", options={"samhq.dump_dir": str(tmp_path)})
    inputs = _grid_inputs(2, 3, 4, 8, seed=1)
    assert rel_err(compiled(*inputs), layer(*[t.double() for t in inputs])) < 1e-6
    assert counters["samhq"]["fused"] == 0 and counters["samhq"]["skipped"] == 1
    report = (tmp_path / "graph_1_report.txt").read_text()
    assert f"left to Inductor: {reason}" in report, report
    assert "samhq.rel_pos_attention" not in (tmp_path / "graph_1_after.py").read_text()


def test_cuda_runs_the_reference_only_when_asked(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.delenv("SAMHQ_FX_REFERENCE", raising=False)
    assert not op._reference_allowed(cuda) and op._reference_allowed(torch.device("cpu"))
    monkeypatch.setenv("SAMHQ_FX_REFERENCE", "1")
    assert op._reference_allowed(cuda)


def test_an_input_the_kernels_cannot_take_on_cuda_is_an_error_naming_why(monkeypatch):
    # CPU tensors stand in for CUDA ones: what the op does is decided by _reference_allowed and the skip reason
    monkeypatch.setattr(op, "_reference_allowed", lambda device: False)
    monkeypatch.setattr(op, "_kernel_skip_reason", lambda *a: "head dim above 128")
    inputs = rand_inputs(2, (3, 4), (3, 4), 8, seed=2)
    with pytest.raises(ValueError, match="head dim above 128.*SAMHQ_FX_REFERENCE=1"):
        samhq_fx.rel_pos_attention(*inputs)


def test_a_kernel_failure_on_cuda_is_an_error_not_a_silent_fallback(monkeypatch):
    def broken(*args):
        raise RuntimeError("OutOfResources: simulated")

    monkeypatch.setattr(op, "_reference_allowed", lambda device: False)
    monkeypatch.setattr(op, "_kernel_skip_reason", lambda *a: None)
    monkeypatch.setattr(op, "_kernels", type("K", (), {"forward": broken, "backward": broken}))
    monkeypatch.setattr(op, "_broken", set())
    with pytest.raises(RuntimeError, match="forward kernel failed.*SAMHQ_FX_REFERENCE=1"):
        samhq_fx.rel_pos_attention(*rand_inputs(2, (3, 4), (3, 4), 8, seed=3))


# Each architecture faked for the CPU device: the rewrite compiles the layer's kernels for it (real Triton compiles,
# so no interpreter) and either fuses the layer or leaves it to Inductor with the reason fit.py gives.
_PER_ARCH = r"""
import sys, tempfile, pathlib
import torch
from torch._dynamo.utils import counters
sys.path.insert(0, sys.argv[1])
from test_placement import layer, _grid_inputs
from samhq_fx import placement
from samhq_fx.kernels import arch, fit

for name in sys.argv[2].split(","):
    placement.arch.of = lambda device, a=arch.ARCHS[name]: a if device.type == "cpu" else None
    for dtype, precision in ((torch.bfloat16, "high"), (torch.float32, "highest")):
        torch.set_float32_matmul_precision(precision)
        torch._dynamo.reset(); counters.clear()
        d = tempfile.mkdtemp()
        compiled = torch.compile(layer, backend="samhq", options={"samhq.dump_dir": d, "samhq.inductor": False})
        inputs = _grid_inputs(1, 64, 64, 64, seed=0, dtype=dtype)
        compiled(*inputs)  # compiles (the rewrite asks fit.py for this architecture), then runs on the CPU
        report = (pathlib.Path(d) / "graph_1_report.txt").read_text().splitlines()[-1]
        want = fit.misfit(arch.ARCHS[name], dtype, precision, fit.Shape(b=1, n_q=4096, hk=64, wk=64, d=64, dv=64))
        print(name, dtype, precision, "FUSED" if report.startswith("FUSED") else "SKIPPED", want, "|", report)
"""


@pytest.mark.slow
def test_each_architecture_fuses_or_leaves_the_layer_to_inductor_with_the_reason():
    pytest.importorskip("triton.backends.nvidia")
    names = "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PER_ARCH, os.path.dirname(__file__), names], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("sm_")]
    assert len(rows) == 12, proc.stdout
    for row in rows:
        head, report = row.split(" | ", 1)
        name, dtype, precision, verdict, want = head.split(" ", 4)
        if want == "None":  # every launch fits: fused
            assert verdict == "FUSED", row
        else:  # left to Inductor, with fit.py's reason in the report
            assert verdict == "SKIPPED" and f"left to Inductor: the kernels do not fit {name}: {want}" in report, row
        if dtype == "torch.bfloat16":  # bf16 fits every architecture's shared memory at SAM's global layer
            assert verdict == "FUSED", row


# The config table's "place" rows: fp32 on key grids past 64 wide (SAM above 1024 px) is left to Inductor on every
# class, decided from the table before anything compiles; bf16 there, and fp32 at 64 wide, are not placed so
_PLACED = r"""
import sys, tempfile, pathlib
import torch
from torch._dynamo.utils import counters
sys.path.insert(0, sys.argv[1])
from test_placement import layer, _grid_inputs
from samhq_fx import placement
from samhq_fx.kernels import arch, fit

def no_compile(*args, **kwargs):
    raise AssertionError("compiled kernels for a layer the table places with Inductor")

fit.build_all = no_compile
for name in ("sm_86", "sm_90"):
    placement.arch.of = lambda device, a=arch.ARCHS[name]: a if device.type == "cpu" else None
    torch._dynamo.reset(); counters.clear()
    d = tempfile.mkdtemp()
    compiled = torch.compile(layer, backend="samhq", options={"samhq.dump_dir": d, "samhq.inductor": False})
    compiled(*_grid_inputs(1, 4, 80, 8, seed=0))  # fp32, an 80-wide key grid (4 rows: a small CPU reference)
    print(name, counters["samhq"]["fused"], counters["samhq"]["skipped"], "|",
          (pathlib.Path(d) / "graph_1_report.txt").read_text().splitlines()[-1])
for dtype, wk in ((torch.bfloat16, 80), (torch.float32, 64)):
    print("table", dtype, wk, fit.left_to_inductor(arch.ARCHS["sm_86"], dtype, "highest",
                                                   fit.Shape(b=12, n_q=wk * wk, hk=wk, wk=wk, d=64, dv=64)))
"""


def test_fp32_past_64_wide_grids_is_placed_with_inductor_before_compiling():
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _PLACED, os.path.dirname(__file__)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for name in ("sm_86", "sm_90"):
        (row,) = [line for line in lines if line.startswith(name + " ")]
        assert row.startswith(f"{name} 0 1 |"), row  # none fused, one skipped
        assert f"left to Inductor: the config table places it with Inductor on {name}" in row, row
        assert "fp32 past 64-wide grids" in row, row
    assert [line.split()[-1] for line in lines if line.startswith("table ")] == ["None", "None"], proc.stdout


@pytest.mark.parametrize("race", ["SystemError: AST constructor recursion depth mismatch (before=40, after=39)",
                                  "CompilationError: at 48:8: (from SystemError: AST constructor recursion depth "
                                  "mismatch (before=40, after=39))"])  # in a called jit function (fit._error_text)
def test_a_launch_that_lost_a_thread_race_in_cpythons_ast_is_built_again(race, monkeypatch):
    # two threads parsing kernels at once can trip CPython's AST recursion counter (a SystemError, seen in CI): the
    # launch is built again, alone, instead of being reported as not building (the layer then left to Inductor)
    from samhq_fx.kernels import arch, fit

    target = arch.ARCHS["sm_86"]
    launches = ["fwd", "bwd:dq", "bwd:dkdv"]  # stand-ins: build() is replaced, nothing compiles
    calls = []

    def build(launch, a):
        calls.append(launch)
        return fit.Built(launch, a, error=race if calls.count(launch) == 1 and launch is launches[0] else None)

    monkeypatch.setattr(fit, "build", build)
    built = fit.build_all([(launch, target) for launch in launches], workers=2)
    assert [b.error for b in built] == [None] * len(launches) and calls.count(launches[0]) == 2


def test_a_thread_race_inside_a_called_jit_function_is_kept_in_the_error():
    # Triton raises an error in a called jit function as CompilationError("at 48:8:", the caller's source) from it, so
    # the race's text is only in the cause: a build's error keeps the cause's first line, which build_all's retry reads
    import ast

    from triton.compiler.errors import CompilationError

    from samhq_fx.kernels import fit

    try:
        try:
            raise SystemError("AST constructor recursion depth mismatch (before=40, after=39)")
        except SystemError as cause:
            raise CompilationError("y = f(x)\n" * 48, ast.parse("y = f(x)").body[0], None) from cause
    except CompilationError as e:
        text = fit._error_text(e)
    assert text == ("CompilationError: at 1:0: (from SystemError: AST constructor recursion depth mismatch "
                    "(before=40, after=39))"), text
    assert fit._THREAD_RACE in text
    assert fit._error_text(ValueError("no\nmore")) == "ValueError: no"  # no cause: the error's own first line
    try:
        try:
            raise KeyError("context")
        except KeyError:
            raise CompilationError("y = f(x)", ast.parse("y = f(x)").body[0], "the real message") from None
    except CompilationError as e:  # suppressed context: not named; the message Triton gave is the line taken
        assert fit._error_text(e) == "CompilationError: the real message"
