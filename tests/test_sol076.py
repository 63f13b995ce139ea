"""SOL-ExecBench 076 in benchmarks/sol076/: its definition (definition.py), the runner that compares implementations
on it (compare_impls.py) and the one that times the entry by the benchmark's rules (time_entry.py), as CPU smoke
runs; and the samhq backend on its layer (one SAM-HQ ViT-B attention layer whose 7 gradients the benchmark checks
against float64): options, the triton_op registration, new image sizes, Inductor's caches across processes, and
(marked gpu) the kernels on CUDA. The entry itself: tests/test_sol076_solution.py.
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

from helpers import capture_compile_fx, fresh_compile_state, rel_err

SOL076 = Path(__file__).resolve().parents[1] / "benchmarks" / "sol076"
sys.path.insert(0, str(SOL076.parent))  # common, plot
sys.path.insert(0, str(SOL076))

import common  # noqa: E402
import compare_impls as bench  # noqa: E402
import definition  # noqa: E402
import plot  # noqa: E402

HAVE_SAMHQ = common.samhq_available()


def test_samhq_mode_with_other_options_runs_through_torch_compile(tmp_path, monkeypatch):
    # torch.compile refuses mode= with options= whatever the backend; options={"samhq.mode": ...} is the
    # documented spelling for a mode plus samhq options, and reaches Inductor as that mode's settings
    seen = capture_compile_fx(monkeypatch)
    fresh_compile_state()
    grad_output, *inputs = definition.make_inputs(4, 4, 2, generator=torch.Generator().manual_seed(0))
    with pytest.raises(RuntimeError, match="Either mode or options"):
        torch.compile(definition.attention_layer, backend="samhq", mode="reduce-overhead",
                      options={"samhq.dump_dir": str(tmp_path)})
    options = {"samhq.mode": "reduce-overhead", "samhq.dump_dir": str(tmp_path)}
    layer = torch.compile(definition.attention_layer, backend="samhq", options=options)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    assert seen["triton.cudagraphs"] is True  # reduce-overhead's setting
    assert seen["pre_grad_custom_pass"].triton_op is False  # "auto" keeps the opaque op under CUDA graphs
    assert counters["samhq"]["fused"] == 1 and (tmp_path / "graph_1_report.txt").exists()
    ref = definition.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(definition.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name


def test_sol076_layer_all_seven_gradients_against_float64():
    fresh_compile_state()
    grad_output, *inputs = definition.make_inputs(7, 7, 1, generator=torch.Generator().manual_seed(0))
    layer = torch.compile(definition.attention_layer, backend="samhq", fullgraph=True)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    assert counters["samhq"]["fused"] == 1
    ref = definition.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(definition.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name
    assert definition.check(got, ref, atol=definition.WORKLOADS[(7, 7, 1)]) == (True, "ok")


def test_new_image_sizes_stay_fused_under_automatic_dynamic_shapes():
    # A second resolution makes Dynamo recompile with symbolic H, W (automatic dynamic shapes). The
    # rewrite must hold on that graph too, or every later size silently runs the O(N^2) attention.
    fresh_compile_state()
    layer = torch.compile(definition.attention_layer, backend="samhq")
    for i, (h, w) in enumerate([(4, 4), (5, 6), (7, 3), (4, 4)]):
        grad_output, *inputs = definition.make_inputs(h, w, 2, generator=torch.Generator().manual_seed(i))
        got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
        ref = definition.float64_gradients(grad_output, *inputs)
        for name, g, r in zip(definition.INPUT_NAMES, got, ref):
            assert rel_err(g, r) < 1e-5, (h, w, name)
    assert counters["samhq"]["graphs"] == 2  # static 4x4, then one dynamic graph for every other size
    assert counters["samhq"]["fused"] == 2 and counters["samhq"]["skipped"] == 0


def test_triton_op_option_emits_the_inductor_compiled_registration(tmp_path):
    # samhq.triton_op: the rewrite emits samhq::rel_pos_attention_inductor, which Inductor traces into
    # (on CPU its body calls the reference); the numbers are the same op's.
    fresh_compile_state()
    grad_output, *inputs = definition.make_inputs(4, 5, 2, generator=torch.Generator().manual_seed(1))
    options = {"samhq.triton_op": True, "samhq.dump_dir": str(tmp_path)}
    layer = torch.compile(definition.attention_layer, backend="samhq", options=options)
    got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
    after = (tmp_path / "graph_1_after.py").read_text()
    assert "samhq.rel_pos_attention_inductor.default" in after
    ref = definition.float64_gradients(grad_output, *inputs)
    for name, g, r in zip(definition.INPUT_NAMES, got, ref):
        assert rel_err(g, r) < 1e-5, name


def test_triton_op_auto_picks_the_registration_per_grid(tmp_path, monkeypatch):
    # "auto": the triton_op registration for a static key grid (graph 1, 4x4), the opaque op once Dynamo
    # recompiles with symbolic H, W (graph 2, 5x6), which the triton_op one cannot take. On CPU "auto" would
    # keep the opaque op throughout (it takes the triton_op one on CUDA GPUs only): pretend this device is one.
    from samhq_fx import placement

    monkeypatch.setattr(placement.arch, "of", lambda device: placement.arch.ARCHS["sm_90"])
    fresh_compile_state()
    layer = torch.compile(definition.attention_layer, backend="samhq",
                          options={"samhq.triton_op": "auto", "samhq.dump_dir": str(tmp_path)})
    for i, (h, w) in enumerate([(4, 4), (5, 6)]):
        grad_output, *inputs = definition.make_inputs(h, w, 2, generator=torch.Generator().manual_seed(i))
        got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
        ref = definition.float64_gradients(grad_output, *inputs)
        for name, g, r in zip(definition.INPUT_NAMES, got, ref):
            assert rel_err(g, r) < 1e-5, (h, w, name)
    assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    assert "samhq.rel_pos_attention_inductor.default" in (tmp_path / "graph_1_after.py").read_text()
    second = (tmp_path / "graph_2_after.py").read_text()
    assert "samhq.rel_pos_attention.default" in second and "rel_pos_attention_inductor" not in second
    monkeypatch.undo()
    assert placement.arch.of(torch.device("cpu")) is None


# Inductor's caches across processes: a second process with the same layer hits the FX graph and AOT autograd
# caches, keeps the rewrite (fused count, same gradients), and a change to the samhq pass (here: one of its settings,
# which enters its uuid like its source does) misses them. Each run is a fresh Python process on the same
# TORCHINDUCTOR_CACHE_DIR, as a restarted training job is.
SCRIPT = f"""
import json, sys, torch
sys.path.insert(0, {str(SOL076)!r})
import definition
from torch._dynamo.utils import counters
go, *inp = definition.make_inputs(4, 4, 2, generator=torch.Generator().manual_seed(0))
layer = torch.compile(definition.attention_layer, backend="samhq")
grads = definition.layer_backward(go, *inp, layer=layer)
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
    # and the cached code computes the cold process's gradients; not to the bit, since a CPU GEMM's summation order
    # may follow its buffers' alignment, which differs between processes (2e-5 apart elementwise on a CI machine):
    # the whole gradient's relative error, at fp32's summation-order level
    for g_warm, g_cold in zip(warm["grads"], cold["grads"]):
        assert rel_err(torch.tensor(g_warm), torch.tensor(g_cold)) < 1e-4
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
        layer = torch.compile(definition.attention_layer, backend="samhq", options={"samhq.triton_op": "auto"})
        for i, (h, w) in enumerate([(14, 14), (16, 12), (9, 20)]):
            grad_output, *inputs = definition.make_inputs(h, w, 2, device="cuda", generator=torch.Generator().manual_seed(i))
            got = torch.autograd.grad(layer(*inputs), inputs, grad_output)
            ref = definition.float64_gradients(grad_output, *inputs)
            for name, g, r in zip(definition.INPUT_NAMES, got, ref):
                assert rel_err(g, r) < 1e-2, (h, w, name)
        assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    finally:
        torch.set_float32_matmul_precision("highest")


def test_sdpa_and_flex_layers_match_reference():
    args = definition.make_inputs(4, 6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ref = definition.layer_backward(*args)
    got = definition.layer_backward(*args, layer=bench.sdpa_layer)
    ok, why = definition.check(got, ref, atol=1e-5, rtol=1e-5)
    assert ok, why
    # FlexAttention has no CPU backward; its forward (eager, unfused) checks the score_mod indexing
    inputs = [t.detach() for t in args[1:]]
    torch.testing.assert_close(bench.flex_layer(*inputs), definition.attention_layer(*inputs), rtol=1e-6, atol=1e-6)


def test_compare_impls_parse_args():
    a = bench.parse_args(["--workloads", "64x64x4,7x7x1", "--impls", "fast", "--precision", "all"])
    assert list(a.workloads) == [(64, 64, 4), (7, 7, 1)]
    assert "inductor-max-autotune" not in a.impls and len(a.impls) == len(bench.IMPLS) - 1
    assert a.precision == ("highest", "high", "medium")
    assert bench.parse_args([]).precision == ("high",)
    with pytest.raises(SystemExit):
        bench.parse_args(["--workloads", "5x5x5"])
    # --cells (one GPU's share under --gpus): exactly those cells, the loops cover their union
    c = bench.parse_args(["--cells", "high/7x7x1/samhq;medium/64x64x4/flex"])
    assert c.cells == {("high", "7x7x1", "samhq"), ("medium", "64x64x4", "flex")}
    assert c.precision == ("high", "medium") and set(c.impls) == {"samhq", "flex"}
    with pytest.raises(SystemExit):
        bench.parse_args(["--cells", "high/7x7x1"])


def test_compare_impls_cells_runs_only_those(tmp_path):
    p = bench.main(["--quick", "--cells", "high/7x7x1/eager;high/4x4x2/eager", "--out", str(tmp_path)])
    assert sorted((r["workload"], r["impl"], r["status"]) for r in p["results"]) == [
        ("4x4x2", "eager", "PASS"), ("7x7x1", "eager", "PASS")]


def test_compare_impls_budget_and_resume(tmp_path, capsys):
    # eager only: fast.  A zero-ish budget skips everything and writes no row.
    path = str(tmp_path / "sol076.jsonl")
    p = bench.main(["--quick", "--impls", "eager", "--out", str(tmp_path), "--time-budget", "1e-9"])
    assert p["results"] == [] and len(p["skipped"]) == 1 and common.load_rows(path) == []
    p = bench.main(["--quick", "--impls", "eager", "--out", str(tmp_path)])
    (row,) = p["results"]
    assert row["status"] == "PASS" and row["wall_us"] > 0
    assert common.load_rows(path) == [json.loads(json.dumps(row, default=str))]
    # resuming from that file runs nothing new, keeps the row and appends nothing
    p2 = bench.main(["--quick", "--impls", "eager", "--out", path, "--resume", path])
    assert p2["results"] == [json.loads(json.dumps(row, default=str))] and p2["skipped"] == []
    assert len(common.load_rows(path)) == 1
    # plot.py reads the rows back; without matplotlib it says so instead of failing
    plot.main([path, path])
    out = capsys.readouterr().out
    assert "7x7x1" in out and ("matplotlib not importable" in out or "wrote" in out)


def test_compare_impls_quick(tmp_path, capsys):
    """The CI smoke run: 7x7x1 with eager, inductor and samhq on CPU; every row checked against fp64."""
    p = bench.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    on_disk = common.load_rows(str(tmp_path / "sol076.jsonl"))
    assert on_disk == json.loads(json.dumps(p["results"], default=str))
    assert all(r["torch"] == torch.__version__ and r["gpu"] is None and r["iters"] == 1 for r in on_disk)
    impls = {r["impl"]: r for r in p["results"]}
    assert set(impls) == {"eager", "inductor", "samhq"}
    for name in ("eager", "inductor"):
        assert impls[name]["status"] == "PASS", impls[name]["detail"]
        assert impls[name]["wall_us"] > 0
        assert (impls[name]["span_us"] is None) == (not torch.cuda.is_available())  # no profiler on CPU
    if HAVE_SAMHQ:
        assert impls["samhq"]["status"] == "PASS", impls["samhq"]["detail"]
        assert impls["samhq"]["fused"] >= 1
    else:  # backend not registered: recorded as an error, the run still completes
        assert impls["samhq"]["status"] == "ERROR"
    assert p["summary"]["high"]["eager"]["n_pass"] == 1
    assert "suite" in out and "samhq fused attention blocks" in out


def test_time_entry_fresh_copies_are_distinct():
    import time_entry

    inputs = definition.make_inputs(4, 4, 1, generator=torch.Generator().manual_seed(0))
    copies = time_entry.fresh_copies(inputs, 3)
    ptrs = {t.data_ptr() for c in copies for t in c} | {t.data_ptr() for t in inputs}
    assert len(ptrs) == 4 * len(inputs)  # no two calls (nor the original) share an address
    for c in copies:
        assert [t.requires_grad for t in c] == [t.requires_grad for t in inputs]
        assert all(a.is_leaf and torch.equal(a, b) for a, b in zip(c, inputs))


def test_time_entry_targets_and_summary():
    """The target lines read the right cells: a suite mean only when all 16 passed; wins counted per workload."""
    import time_entry

    rows = []
    for k, wl in enumerate(map(bench.wl_name, definition.WORKLOADS)):
        rows.append({"precision": "high", "workload": wl, "impl": "inductor-reduce-overhead", "status": "PASS",
                     "span_us": 1000.0})
        rows.append({"precision": "high", "workload": wl, "impl": "solution", "status": "PASS",
                     "span_us": 1500.0 if wl == "32x32x1" else 50.0 + k, "peak_mib": 650.0})
    summary = time_entry.summarize(rows)
    s = summary["high"]["solution"]
    assert (s["n_pass"], s["faster_than_inductor_ro"], s["n_compared"]) == (16, 15, 16)
    t = {name.split(" ")[0] + name.split(" ")[1]: (value, met) for name, value, met in time_entry.targets(rows, summary)}
    mean = (sum(50.0 + k for k in range(16)) - (50.0 + 8) + 1500.0) / 16
    assert t["'high'mean"] == (mean, mean <= 600)
    assert t["7x7x1span"] == (50.0, True) and t["64x64x4peak"] == (650.0, True)
    assert t["fasterthan"] == ("15/16", False) and t["'highest'mean"] == (None, None)
    rows[-1]["status"] = "FAIL"  # 64x64x4 fails: no suite mean, and its peak is not counted
    t = {name.split(" ")[0] + name.split(" ")[1]: (value, met) for name, value, met in
         time_entry.targets(rows, time_entry.summarize(rows))}
    assert t["'high'mean"] == (None, None) and t["64x64x4peak"] == (None, None) and t["everycell"] == ("15/16", False)


def test_time_entry_quick(tmp_path, capsys):
    """CPU smoke run of the exact-rules runner: eager and the compiled entry at 4x4x2, both checked against fp64;
    the entry is one Dynamo graph (fullgraph, no autograd)."""
    import time_entry

    p = time_entry.main(["--quick", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    on_disk = common.load_rows(str(tmp_path / "sol076_entry.jsonl"))
    assert on_disk == json.loads(json.dumps(p["results"], default=str))
    assert all(tuple(r)[:len(common.META)] == common.META for r in on_disk)
    rows = {r["impl"]: r for r in p["results"]}
    assert set(rows) == {"eager", "solution"}
    for r in rows.values():
        assert r["status"] == "PASS", r["detail"]
        assert r["wall_us"] > 0 and r["span_us"] is None  # no profiler on CPU
    assert rows["solution"]["graphs"] == 1
    assert "targets (solution)" in out and "every cell passes ('high')" in out
    assert "| 4x4x2 | " in out  # the markdown table for benchmarks/README.md
    # resuming from that file runs nothing and keeps the rows
    p2 = time_entry.main(["--quick", "--out", str(tmp_path / "again.jsonl"),
                          "--resume", str(tmp_path / "sol076_entry.jsonl")])
    assert p2["results"] == on_disk and not (tmp_path / "again.jsonl").exists()
