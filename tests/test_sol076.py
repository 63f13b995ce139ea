"""The samhq backend on SOL-ExecBench 076's layer (benchmarks/sol076.py): one SAM-HQ ViT-B attention layer whose 7
gradients the benchmark checks against float64, compiled with backend="samhq" -- options, the triton_op registration,
new image sizes, Inductor's caches across processes, and (marked gpu) the kernels on CUDA.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import samhq_fx.op

from helpers import fresh_compile_state, rel_err

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))
import sol076  # noqa: E402


def _capture_compile_fx(monkeypatch) -> dict:
    """Stand in for Inductor's compile_fx: record the config patches the backend hands it, run the graph as is."""
    import torch._inductor.compile_fx

    seen = {}

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        seen.update(config_patches)
        return gm.forward

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fake_compile_fx)
    return seen


def test_samhq_mode_with_other_options_runs_through_torch_compile(tmp_path, monkeypatch):
    # torch.compile refuses mode= with options= whatever the backend; options={"samhq.mode": ...} is the
    # documented spelling for a mode plus samhq options, and reaches Inductor as that mode's settings
    seen = _capture_compile_fx(monkeypatch)
    fresh_compile_state()
    grad_output, *inputs = sol076.make_inputs(4, 4, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(sol076.attention_layer, backend="samhq", mode="reduce-overhead",
                      options={"samhq.dump_dir": str(tmp_path)})
    options = {"samhq.mode": "reduce-overhead", "samhq.dump_dir": str(tmp_path)}
    layer = torch.compile(sol076.attention_layer, backend="samhq", options=options)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    assert seen["triton.cudagraphs"] is True  # reduce-overhead's setting
    assert seen["pre_grad_custom_pass"].triton_op is False  # "auto" keeps the opaque op under CUDA graphs
    assert counters["samhq"]["fused"] == 1 and (tmp_path / "graph_1_report.txt").exists()
    ref = sol076.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name


def test_sol076_layer_all_seven_gradients_against_float64():
    fresh_compile_state()
    grad_output, *inputs = sol076.make_inputs(7, 7, 1, generator=torch.Generator().manual_seed(0))
    layer = torch.compile(sol076.attention_layer, backend="samhq", fullgraph=True)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    assert counters["samhq"]["fused"] == 1
    ref = sol076.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name
    assert sol076.check(got, ref, atol=sol076.WORKLOADS[(7, 7, 1)]) == (True, "ok")


def test_new_image_sizes_stay_fused_under_automatic_dynamic_shapes():
    # A second resolution makes Dynamo recompile with symbolic H, W (automatic dynamic shapes). The
    # rewrite must hold on that graph too, or every later size silently runs the O(N^2) attention.
    fresh_compile_state()
    layer = torch.compile(sol076.attention_layer, backend="samhq")
    for i, (h, w) in enumerate([(4, 4), (5, 6), (7, 3), (4, 4)]):
        grad_output, *inputs = sol076.make_inputs(h, w, 2, generator=torch.Generator().manual_seed(i))
        got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
        ref = sol076.float64_gradients(grad_output, *inputs)
        for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
            assert rel_err(g, r) < 1e-5, (h, w, name)
    assert counters["samhq"]["graphs"] == 2  # static 4x4, then one dynamic graph for every other size
    assert counters["samhq"]["fused"] == 2 and counters["samhq"]["skipped"] == 0


def test_triton_op_option_emits_the_inductor_compiled_registration(tmp_path):
    # samhq.triton_op: the rewrite emits samhq::rel_pos_attention_inductor, which Inductor traces into
    # (on CPU its body calls the reference); the numbers are the same op's.
    fresh_compile_state()
    grad_output, *inputs = sol076.make_inputs(4, 5, 2, generator=torch.Generator().manual_seed(1))
    options = {"samhq.triton_op": True, "samhq.dump_dir": str(tmp_path)}
    layer = torch.compile(sol076.attention_layer, backend="samhq", options=options)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    after = (tmp_path / "graph_1_after.py").read_text()
    assert "samhq.rel_pos_attention_inductor.default" in after
    ref = sol076.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name


def test_triton_op_auto_picks_the_registration_per_grid(tmp_path, monkeypatch):
    # "auto": the triton_op registration for a static key grid (graph 1, 4x4), the opaque op once Dynamo
    # recompiles with symbolic H, W (graph 2, 5x6), which the triton_op one cannot take. On CPU "auto" would
    # keep the opaque op throughout (the kernels are verified for Hopper only): pretend this device is one.
    monkeypatch.setattr(samhq_fx.op, "kernels_verified_for", lambda device: True)
    fresh_compile_state()
    layer = torch.compile(sol076.attention_layer, backend="samhq",
                          options={"samhq.triton_op": "auto", "samhq.dump_dir": str(tmp_path)})
    for i, (h, w) in enumerate([(4, 4), (5, 6)]):
        grad_output, *inputs = sol076.make_inputs(h, w, 2, generator=torch.Generator().manual_seed(i))
        got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
        ref = sol076.float64_gradients(grad_output, *inputs)
        for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
            assert rel_err(g, r) < 1e-5, (h, w, name)
    assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    assert "samhq.rel_pos_attention_inductor.default" in (tmp_path / "graph_1_after.py").read_text()
    second = (tmp_path / "graph_2_after.py").read_text()
    assert "samhq.rel_pos_attention.default" in second and "rel_pos_attention_inductor" not in second
    monkeypatch.undo()
    assert not samhq_fx.op.kernels_verified_for(torch.device("cpu"))


# Inductor's caches across processes: a second process with the same layer hits the FX graph and AOT autograd
# caches, keeps the rewrite (fused count, same gradients), and a change to the samhq pass (here: one of its settings,
# which enters its uuid like its source does) misses them. Each run is a fresh Python process on the same
# TORCHINDUCTOR_CACHE_DIR, as a restarted training job is.
SCRIPT = f"""
import json, sys, torch
sys.path.insert(0, {str(BENCH)!r})
import sol076
from torch._dynamo.utils import counters
go, *inp = sol076.make_inputs(4, 4, 2, generator=torch.Generator().manual_seed(0))
layer = torch.compile(sol076.attention_layer, backend="samhq")
grads = sol076.layer_backward(go, *inp, layer=layer)
print(json.dumps({{
    "fused": counters["samhq"]["fused"],
    "fx_hit": counters["inductor"]["fxgraph_cache_hit"], "fx_miss": counters["inductor"]["fxgraph_cache_miss"],
    "aot_hit": counters["aot_autograd"]["autograd_cache_hit"],
    "grads": [g.double().flatten().tolist() for g in grads],
}}))
"""


def _run_process(cache_dir, **env) -> dict:
    full_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=full_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_caches_and_keeps_the_rewrite(tmp_path):
    cold = _run_process(tmp_path)
    assert cold["fused"] == 1 and cold["fx_miss"] >= 1 and cold["fx_hit"] == 0
    warm = _run_process(tmp_path)
    assert warm["fused"] == 1  # the rewrite runs in the backend, before the cache lookup
    assert warm["fx_hit"] >= 1 and warm["fx_miss"] == 0
    assert warm["aot_hit"] >= 1
    for g_warm, g_cold in zip(warm["grads"], cold["grads"]):  # the cached code is the rewritten code
        assert g_warm == pytest.approx(g_cold, rel=1e-5, abs=1e-7)
    changed = _run_process(tmp_path, SAMHQ_FX_MIN_SEQ_LEN="2")  # another pass uuid: no stale hit
    assert changed["fused"] == 1 and changed["fx_miss"] >= 1


@pytest.fixture
def no_fallback(caplog):
    caplog.set_level(logging.INFO, logger="samhq_fx")
    yield
    assert "reference implementation" not in caplog.text, caplog.text


@pytest.mark.gpu
def test_triton_op_auto_across_image_sizes_matches_float64(no_fallback):
    # "auto": Inductor-launched kernels for the static first size, the opaque op once sizes are symbolic
    fresh_compile_state()
    torch.set_float32_matmul_precision("high")
    try:
        layer = torch.compile(sol076.attention_layer, backend="samhq", options={"samhq.triton_op": "auto"})
        for i, (h, w) in enumerate([(14, 14), (16, 12), (9, 20)]):
            grad_output, *inputs = sol076.make_inputs(h, w, 2, device="cuda", generator=torch.Generator().manual_seed(i))
            got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
            ref = sol076.float64_gradients(grad_output, *inputs)
            for name, g, r in zip(sol076.INPUT_NAMES, got, ref):
                assert rel_err(g, r) < 1e-2, (h, w, name)
        assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    finally:
        torch.set_float32_matmul_precision("highest")
