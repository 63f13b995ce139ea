"""CPU smoke tests of the benchmark scripts (benchmarks/), run in CI.

The scripts are imported and their main(argv) called in this process (one torch import, one Inductor warm-up
for all tests).  --quick mode: CPU, tiny shapes, one call, no profiler / L2 flush, wall time only.  Also unit
tests of the pieces that only run on the GPU but can be checked without one (splitting a profiler trace into
calls). The SOL-ExecBench 076 runners' tests are tests/test_sol076.py and tests/test_sol076_solution.py.
"""

from __future__ import annotations

import copy
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "tools"))  # sweep_kernels

import common  # noqa: E402
import plot  # noqa: E402

HAVE_SAMHQ = common.samhq_available()


def _rows(payload, **match):
    return [r for r in payload["results"] if all(r.get(k) == v for k, v in match.items())]


# ------------------------------------------------------------------------------------------- pure helpers
def test_split_calls_excludes_flush_and_measures_span():
    M = "at::cuda::(anonymous namespace)::spin_kernel(long)"
    recs = [("fill_flush", 0, 50), (M, 51, 52), ("k1", 60, 70), ("k2", 75, 100), (M, 101, 102),  # call 0: 40 us
            ("fill_flush", 110, 160), (M, 161, 162), ("k1", 170, 175), (M, 176, 177)]        # call 1: 5 us
    spans, kernels = common.split_calls(recs, 2)
    assert spans == [40, 5]
    assert [n for n, _ in kernels[0]] == ["k1", "k2"]
    assert [n for n, _ in kernels[1]] == ["k1"]  # the flush between the calls belongs to neither
    # CUPTI dropping the first records of a session: the calls still bracketed by both markers keep their span
    assert common.split_calls(recs[2:], 2)[0] == [None, 5]
    assert common.split_calls(recs[5:], 2)[0] == [None, 5]
    assert common.split_calls([], 2) == ([None, None], [[], []])
    # with starts: each record's start from the call's first one (k2 starts 15 us after k1)
    assert common.split_calls(recs, 2, starts=True)[1][0] == [("k1", 10, 0), ("k2", 25, 15)]


def test_marker_gaps_and_busy_share():
    # the step's wall on the GPU runs from its opening marker's end to its closing marker's start, idle included
    M = "spin_kernel"
    recs = [(M, 0, 1), ("k1", 11, 21), ("k2", 31, 41), (M, 51, 52), (M, 60, 61), ("k1", 61, 71), (M, 71, 72)]
    assert common.marker_gaps(recs, 2) == [50, 10]
    kernels = common.split_calls(recs, 2)[1]
    assert common.busy_share(kernels[0], 50) == pytest.approx(0.4)  # 20 us of kernels in a 50 us step
    assert common.busy_share(kernels[1], 10) == pytest.approx(1.0)
    assert common.busy_share([], 10) is None and common.busy_share(kernels[0], None) is None
    assert common.marker_gaps(recs[4:], 2) == [None, 10]  # a dropped prefix loses the first call only


def test_peak_memory_replays_the_trace_to_its_peak():
    import peak_memory

    here = {"filename": __file__, "line": 1, "name": "f"}
    inner = {"filename": peak_memory._TORCH_DIR + "/nn/functional.py", "line": 3, "name": "g"}
    trace = [
        {"action": "alloc", "addr": 1, "size": 100, "frames": [inner, here]},
        {"action": "alloc", "addr": 2, "size": 50, "frames": []},
        {"action": "free_requested", "addr": 1, "size": 100},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 3, "size": 120, "frames": [here]},  # 1000 + 50 + 120: the peak
        {"action": "free_completed", "addr": 9, "size": 40},  # a block from before the trace
        {"action": "alloc", "addr": 4, "size": 30, "frames": [here]},  # 1130: below the peak
    ]
    peak, live, at = peak_memory.peak_of(trace, live_before=1000)
    assert peak == 1170 and sorted(live) == [2, 3] and at == 4
    parts = peak_memory.breakdown(live, grads={2: 50})
    here_site = f"{Path(__file__).name}:1 {Path(__file__).read_text().splitlines()[0][:80]}"
    assert parts == {"gradients": 50, here_site: 120}
    # the forward ends at the marker block (index 2 once inserted): only block 3 was allocated after it
    big = [dict(e, size=e["size"] * 1000) for e in trace]
    marked = big[:2] + [{"action": "alloc", "addr": 7, "size": peak_memory.MARKER_BYTES, "frames": []},
                        {"action": "free_completed", "addr": 7, "size": peak_memory.MARKER_BYTES}] + big[2:]
    mark = peak_memory.marker_index(marked)
    peak, live, at = peak_memory.peak_of(marked, live_before=1000)
    assert (mark, peak, at) == (2, 171_000, 6)
    later = {id(e) for i, e in enumerate(marked) if i > mark and e["action"] == "alloc"}
    assert peak_memory.breakdown(live, grads={2: 50_000}, only=later) == {here_site: 120_000}
    assert peak_memory.marker_index(trace) == -1
    assert peak_memory.site([inner]) == "(torch internals)"
    assert peak_memory.site([inner, here, here]).endswith(f" < {Path(__file__).name}:1")


def test_best_per_family_holds_samhq_to_the_fastest_inductor_row():
    rows = [dict(impl=i, compiler=i.split("-")[0], dtype="bf16", batch=4, status=st, ms=ms) for i, ms, st in
            [("inductor", 86.3, "OK"), ("inductor-ro", 77.8, "OK"), ("inductor-eager", 60.0, "ERROR"),
             ("samhq", 50.7, "OK"), ("samhq-ro", 48.6, "OK"), ("none-eager", 150.0, "OK")]]
    (s,) = plot.best_per_family(rows, ("dtype", "batch"), "ms")
    assert s["best_inductor"] == "inductor-ro" and s["best_samhq"] == "samhq-ro"  # ERROR rows never count
    assert s["best_eager"] == "none-eager"  # compiler "none" is the eager family
    assert s["samhq_speedup_vs_inductor"] == round(77.8 / 48.6, 3)
    assert s["samhq_speedup_vs_eager"] == round(150.0 / 48.6, 3)


def test_host_gpu_ms_splits_the_wall_time():
    ks = [("k1", 1500.0), ("k2", 500.0)]  # us
    assert common.host_gpu_ms(ks, 5.0) == {"gpu_ms": 2.0, "host_ms": 3.0}
    assert common.host_gpu_ms(ks, 1.5) == {"gpu_ms": 2.0, "host_ms": 0.0}  # clipped: the profiled call ran longer
    assert common.host_gpu_ms([], 5.0) == {"gpu_ms": None, "host_ms": None}  # no profile (CPU)


def _mode_rows():
    rows = []
    for model, impl, ms, host, busy, st in [
        ("vit-b", "samhq-eager", 4.9, 1.2, 0.88, "OK"), ("vit-b", "samhq-sdpa", 5.5, 1.0, 0.9, "OK"),
        ("vit-b", "inductor-eager", 8.5, 2.3, 0.93, "OK"), ("vit-b", "inductor", 9.0, 2.0, 0.9, "OK"),
        ("vit-b", "inductor-ro", 3.0, 0.1, 0.99, "OK"),  # faster than any default-mode row: not their peer
        ("vit-b", "samhq-eager-ro", 2.0, 0.1, 0.98, "OK"), ("vit-b", "samhq-sdpa-ro", 1.0, 0.1, 0.99, "FAIL"),
        ("vit-b", "eager-eager", 20.0, None, None, "OK"),
        ("vit-h", "samhq-eager", 30.0, None, None, "OK"),  # another model: its own line, no Inductor peer
    ]:
        mode = "reduce-overhead" if impl.endswith("-ro") else "default"
        rows.append(dict(model=model, dtype="bf16", batch=1, impl=impl, compiler=impl.split("-")[0].replace("eager", "none"),
                         mode=mode, status=st, latency_ms=ms, host_ms=host, gpu_busy=busy))
    return rows


def test_best_by_mode_holds_samhq_to_inductor_of_the_same_mode():
    s = plot.best_by_mode(_mode_rows(), ("model", "dtype", "batch"), "latency_ms")
    assert [(e["model"], e["mode"]) for e in s] == [("vit-b", "default"), ("vit-b", "reduce-overhead"),
                                                    ("vit-h", "default")]
    d, ro, h = s
    assert (d["samhq"], d["inductor"]) == ("samhq-eager", "inductor-eager")  # inductor-ro is the other mode
    assert d["samhq_speedup_vs_inductor"] == round(8.5 / 4.9, 3)
    assert d["line"] == "vit-b bf16 b1 default: samhq-eager 4.9 ms vs inductor-eager 8.5 ms: 1.73x (host 1.2 / 2.3 ms, busy 88% / 93%)"
    assert (ro["samhq"], ro["inductor"], ro["samhq_speedup_vs_inductor"]) == ("samhq-eager-ro", "inductor-ro", 1.5)  # FAIL never counts
    assert h["inductor"] is None and h["samhq_speedup_vs_inductor"] is None and "no Inductor row" in h["line"]


def test_rows_without_model_read_as_vit_b(tmp_path, capsys):
    """Rows written before --model and --img: plot.py reads them as vit-b at 1024, and the impl names give the compiler
    and mode where the rows lack them (the oldest train_step rows); of one cell's rows the last one read wins."""
    rows = [dict(impl=i, batch=1, dtype="bf16", status="OK", ms_per_step=ms) for i, ms in
            [("eager-eager", 100.0), ("inductor", 47.0), ("samhq-eager", 41.0), ("samhq-eager-ro", 16.5)]]
    old = tmp_path / "old" / "train_step.jsonl"
    old.parent.mkdir()
    common.append_rows(str(old), rows)
    new = [dict(rows[2], model="vit-l", ms_per_step=90.0, compiler="samhq", mode="default", img=1024),
           dict(rows[1], ms_per_step=48.0)]  # a later run of vit-b's inductor cell
    common.append_rows(str(tmp_path / "train_step.jsonl"), new)
    plot.main([str(old), str(tmp_path / "train_step.jsonl"), "--gpu", "CPU"])
    out = capsys.readouterr().out
    got = plot.latest(plot.normalize_rows(plot.read_rows([str(old), str(tmp_path / "train_step.jsonl")])),
                      plot.KINDS["train_step"][0])
    assert sorted((r["model"], r["img"], r["impl"], r["ms_per_step"]) for r in got) == [
        ("vit-b", 1024, "eager-eager", 100.0), ("vit-b", 1024, "inductor", 48.0), ("vit-b", 1024, "samhq-eager", 41.0),
        ("vit-b", 1024, "samhq-eager-ro", 16.5), ("vit-l", 1024, "samhq-eager", 90.0)]  # another model: both kept
    assert "vit-b 1024px bf16 b1 default: samhq-eager 41.0 ms vs inductor 48.0 ms: 1.17x" in out
    assert "vit-l 1024px bf16 b1 default: samhq-eager 90.0 ms, no Inductor row" in out
    with pytest.raises(SystemExit, match="plot.py reads the rows of"):
        plot.main([str(tmp_path / "rows.jsonl")])


def test_rows_of_two_gpus_stay_apart(tmp_path, capsys):
    """One cell timed on two GPUs: each GPU keeps its latest row, its summary holds samhq to that GPU's Inductor, and
    the charts draw a panel per GPU."""
    rows = [dict(gpu=g, model="vit-b", img=256, impl=i, batch=1, dtype="tf32", status="OK", ms_per_step=ms)
            for g, i, ms in [("H200", "samhq-sdpa", 39.0), ("H200", "inductor", 40.0), ("H100", "samhq-sdpa", 19.7),
                             ("H100", "inductor-eager", 24.3)]]
    path = tmp_path / "train_step.jsonl"
    common.append_rows(str(path), rows)
    got = plot.latest(plot.normalize_rows(plot.read_rows([str(path)])), plot.KINDS["train_step"][0])
    assert len(got) == 4  # the same (model, img, impl, batch, dtype) on two GPUs: two cells
    plot.main([str(path)])
    out = capsys.readouterr().out
    assert "H200 vit-b 256px tf32 b1 default: samhq-sdpa 39.0 ms vs inductor 40.0 ms: 1.03x" in out
    assert "H100 vit-b 256px tf32 b1 default: samhq-sdpa 19.7 ms vs inductor-eager 24.3 ms: 1.23x" in out
    panels, _ = plot._model_panels(got, ("img", "batch", "dtype"), "ms_per_step", lambda *g: g)
    assert [(title, series) for title, _, series in panels] == [
        ("vit-b, H200", {"samhq-sdpa": [39.0], "inductor": [40.0]}),
        ("vit-b, H100", {"samhq-sdpa": [19.7], "inductor-eager": [24.3]})]


def test_impl_recipes_spell_modes_the_way_torch_compile_takes_them():
    import impls

    ro = impls.IMPLS["samhq-eager-ro"]
    assert impls.compile_kwargs(ro) == {"backend": "samhq", "dynamic": False, "mode": "reduce-overhead"}
    # with options, the mode goes in as samhq.mode (torch.compile refuses mode= with options=)
    kw = impls.compile_kwargs(ro, {"samhq.dump_dir": "d"})
    assert "mode" not in kw and kw["options"] == {"samhq.dump_dir": "d", "samhq.mode": "reduce-overhead"}
    assert impls.compile_kwargs(impls.IMPLS["inductor-eager-ro"])["mode"] == "reduce-overhead"
    r = impls.recipe(impls.IMPLS["samhq-eager-ca-ro"], "forward_backward")
    assert "backend='samhq'" in r and "reduce-overhead" in r and "compiled_autograd=True" in r
    assert impls.recipe(impls.IMPLS["eager-sdpa"], "model").endswith("not compiled")
    # an impl's own options, merged with the caller's
    mem = impls.IMPLS["samhq-eager-mem"]
    assert impls.compile_kwargs(mem, {"samhq.dump_dir": "d"})["options"] == {"samhq.memory_budget": 0.2,
                                                                            "samhq.dump_dir": "d"}
    assert "options={'samhq.memory_budget': 0.2}" in impls.recipe(mem, "model")
    with pytest.raises(SystemExit, match="unknown impls"):
        impls.parse("samhq,bogus", ())


def test_impls_take_compile_options_as_suffixes():
    import impls

    known = dict(impls.IMPLS)
    name = "samhq-sdpa-ro+reorder_for_peak_memory=False+samhq.memory_budget=0.5"
    assert impls.parse(f"inductor,{name}", (), known) == ("inductor", name)
    assert known[name].options == (("reorder_for_peak_memory", False), ("samhq.memory_budget", 0.5))
    assert impls.compile_kwargs(known[name])["options"] == {"reorder_for_peak_memory": False,
                                                            "samhq.memory_budget": 0.5, "samhq.mode": "reduce-overhead"}
    assert name not in impls.IMPLS  # added to the table given, not to the module's
    with pytest.raises(SystemExit, match="is not KEY=VALUE"):
        impls.parse("samhq-sdpa+reorder_for_peak_memory", (), known)
    with pytest.raises(SystemExit, match="is not KEY=VALUE"):
        impls.parse("samhq-sdpa+max_autotune=yes", (), known)  # not a Python literal
    with pytest.raises(SystemExit, match="unknown impls"):  # uncompiled, or no such base
        impls.parse("eager-sdpa+max_autotune=True,bogus+max_autotune=True", (), known)


def test_shard_balances_cost():
    cost = {"a": 90, "b": 20, "c": 20, "d": 20, "e": 20, "f": 3}.__getitem__
    shards = common.shard(list("abcdef"), cost, 3)
    assert sorted(c for s in shards for c in s) == list("abcdef")  # every cell exactly once
    assert ["a"] in shards  # the 90 s cell alone; the rest spread over the other two
    assert common.shard(["a"], cost, 4) == [["a"]]


def test_shard_groups_keeps_a_workload_on_one_gpu():
    cells = ["high/7x7x1/eager", "high/7x7x1/samhq", "high/64x64x4/eager", "high/64x64x4/samhq", "medium/7x7x1/flex"]
    cost = {"eager": 3, "samhq": 20, "flex": 30}
    shares = common.shard_groups(cells, lambda c: cost[c.split("/")[2]], 2, group=lambda c: c.rsplit("/", 1)[0])
    assert sorted(c for s in shares for c in s) == sorted(cells)
    for wl in ("high/7x7x1", "high/64x64x4"):
        assert sum(any(c.startswith(wl + "/") for c in s) for s in shares) == 1  # not split over GPUs
    assert ["medium/7x7x1/flex"] in shares  # 30 s alone; the two 23 s workloads together
    assert common.shard_groups(cells, lambda c: 1.0, 1, group=lambda c: c) == [cells]  # one GPU: order kept


def test_run_on_gpus_merges_each_gpus_rows(tmp_path, monkeypatch):
    """Each share runs in its own process with CUDA_VISIBLE_DEVICES = its index and appends its rows to its own
    --out .jsonl; rows come back merged, and a process that dies keeps what it wrote (checked with a stand-in script,
    so no GPU is needed)."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # all GPUs visible: share k -> GPU k
    script = tmp_path / "fake_bench.py"
    script.write_text(
        "import json, os, sys\n"
        "a = sys.argv[1:]; cells = a[a.index('--cells') + 1].split(';'); out = a[a.index('--out') + 1]\n"
        "rows = [{'cell': c, 'gpu': os.environ['CUDA_VISIBLE_DEVICES'], 'extra': a[-1]} for c in cells if c != 'crash']\n"
        "open(out, 'a').write(''.join(json.dumps(r) + '\\n' for r in rows))\n"
        "if 'hang' in cells: import time; time.sleep(60)\n"
        "sys.exit(3 if 'crash' in cells else 0)\n")
    rows = common.run_on_gpus(str(script), [["a", "b"], ["c", "crash"]], ["--flag"], timeout=60)
    assert sorted((r["cell"], r["gpu"], r["extra"]) for r in rows) == [
        ("a", "0", "--flag"), ("b", "0", "--flag"), ("c", "1", "--flag")]
    # a run started on a subset of GPUs keeps to it: share k goes to the k-th visible one
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    rows = common.run_on_gpus(str(script), [["a"], ["b"]], ["--flag"], timeout=60)
    assert sorted((r["cell"], r["gpu"]) for r in rows) == [("a", "3"), ("b", "5")]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    # a process still running at the timeout is stopped; what it wrote is kept
    rows = common.run_on_gpus(str(script), [["d", "hang"]], ["--flag"], timeout=3)
    assert [(r["cell"], r["gpu"]) for r in rows] == [("d", "0"), ("hang", "0")]


def test_rows_carry_the_run_metadata_and_append(tmp_path, monkeypatch):
    """row_meta: commit, date, GPU (None on CPU) and versions, in that order, and the emulated GPU class under
    SAMHQ_FX_ARCH; results_path: --out a file, a directory (<dir>/<harness>.jsonl), or the results folder (none for a
    --quick run without --out); append_rows adds lines."""
    monkeypatch.delenv("SAMHQ_FX_ARCH", raising=False)
    env = common.env_info()
    meta = common.row_meta(env, torch.device("cpu"))
    assert tuple(meta) == common.META and meta["gpu"] is None and meta["torch"] == torch.__version__
    assert meta["commit"] == env["git"] and meta["date"] == env["date"]
    assert common.row_meta({**env, "device": "NVIDIA H200"}, torch.device("cuda"))["gpu"] == "NVIDIA H200"
    monkeypatch.setenv("SAMHQ_FX_ARCH", "sm_86")
    assert common.row_meta(env, torch.device("cpu"))["emulated_arch"] == "sm_86"
    monkeypatch.delenv("SAMHQ_FX_ARCH")
    assert common.results_path("sol076", str(tmp_path)) == str(tmp_path / "sol076.jsonl")
    assert common.results_path("sol076", str(tmp_path / "r.jsonl")) == str(tmp_path / "r.jsonl")
    assert common.results_path("sol076", str(tmp_path / "new")) == str(tmp_path / "new" / "sol076.jsonl")
    assert common.results_path("sol076", None) == str(Path(common.RESULTS_DIR) / "sol076.jsonl")
    assert common.results_path("sol076", None, default=False) is None
    path = str(tmp_path / "sub" / "r.jsonl")
    common.append_rows(path, [{**meta, "a": 1}])
    common.append_rows(path, [{**meta, "a": 2}, {**meta, "a": float("nan")}])
    common.append_rows(None, [{"a": 3}])  # nowhere to write: nothing happens
    rows = common.load_rows(path)
    assert [r["a"] for r in rows[:2]] == [1, 2] and rows[2]["a"] != rows[2]["a"]
    assert common.load_rows(str(tmp_path / "missing.jsonl")) == []


def test_every_results_file_is_rows_of_one_harness_with_their_metadata():
    """benchmarks/results holds one .jsonl per harness (and charts): every row an object that starts with the run's
    commit, date, GPU and versions (null where the run did not record one)."""
    results = Path(common.RESULTS_DIR)
    files = sorted(results.iterdir())
    assert {f.suffix for f in files} <= {".jsonl", ".png"}
    names = {f.stem for f in files if f.suffix == ".jsonl"}
    assert {"train_step", "inference", "profile_host", "bench_attention_core", "sweep_kernels", "sol076",
            "sol076_entry", "saved_activations"} <= names
    for f in files:
        if f.suffix != ".jsonl":
            continue
        rows = common.load_rows(str(f))
        assert rows, f.name
        for r in rows:
            assert tuple(r)[:len(common.META)] == common.META, (f.name, list(r)[:8])
            assert r["date"] is None or re.match(r"\d{4}-\d\d-\d\d", r["date"]), (f.name, r["date"])
    for name in ("train_step", "inference"):  # the summaries' groups are there in every row
        rows = common.load_rows(str(results / f"{name}.jsonl"))
        assert all({"model", "img", "dtype", "batch", "impl", "status"} <= set(r) for r in rows), name


def test_gpus_capped_at_visible_devices():
    assert common.usable_gpus(4, torch.device("cpu")) == 1
    assert common.usable_gpus(1, torch.device("cpu")) == 1


# ------------------------------------------------------------------------------------------- train step
@pytest.mark.slow
def test_train_step_quick(tmp_path, capsys):
    import train_step

    pytest.importorskip("transformers")
    p = train_step.main(["--quick", "--out", str(tmp_path)])
    on_disk = common.load_rows(str(tmp_path / "train_step.jsonl"))
    assert [r["impl"] for r in on_disk] == [r["impl"] for r in p["results"]]
    assert all(tuple(r)[:len(common.META)] == common.META for r in on_disk)
    impls = {r["impl"]: r for r in p["results"]}
    assert set(impls) == {"eager-eager", "samhq-eager"}
    assert impls["eager-eager"]["status"] == "OK", impls["eager-eager"]["detail"]
    assert impls["eager-eager"]["ms_per_step"] > 0
    assert all(r["optimizer"] == "adamw-fused" and r["graph_breaks"] == 0 for r in p["results"])  # a full step
    for r in p["results"]:  # the tiny model, and no profile on CPU: the host / GPU split is recorded as unknown
        assert r["model"] == "tiny" and r["img"] == 32 and r["gpu_ms"] is None and r["host_ms"] is None
    if HAVE_SAMHQ:
        r = impls["samhq-eager"]
        assert r["status"] == "OK", r["detail"]
        assert r["fused"] >= 1  # the tiny model has a windowed and a global attention layer
        assert r["loss_rel_diff"] < 1e-3 and r["grad_rel_diff"] < 1e-3
        assert "torch.compile(model, backend='samhq', dynamic=False)" in r["recipe"]
        (s,) = p["summary"]
        assert s["best_samhq"] == "samhq-eager" and s["samhq_speedup_vs_eager"] > 0
        (m,) = p["summary_by_mode"]  # one cell, one mode; no Inductor row in the quick set
        assert {k: m[k] for k in ("model", "img", "dtype", "batch", "mode", "samhq", "inductor")} == dict(
            model="tiny", img=32, dtype="tf32", batch=1, mode="default", samhq="samhq-eager", inductor=None)
        assert m["line"].startswith("tiny 32px tf32 b1 default: samhq-eager ")
        assert capsys.readouterr().out.rstrip().endswith(m["line"])  # printed last
    else:
        assert impls["samhq-eager"]["status"] == "ERROR"


def test_layer_peers_times_one_layer_against_inductor(capsys, tmp_path, monkeypatch):
    # benchmarks/tools/layer_peers.py: one encoder layer at a size the harnesses do not take, samhq and Inductor in
    # one process; samhq rewrites its one attention, Inductor none, and both compute the same loss and gradient; with
    # --rows one more samhq build whose rewrite decides under the table plus the candidate row, Inductor's caches off
    # (on CPU the reference runs: the placement calls show what the rewrite saw)
    pytest.importorskip("transformers")
    if not HAVE_SAMHQ:
        pytest.skip("samhq backend not importable")
    import layer_peers
    from samhq_fx import placement
    from samhq_fx.kernels import configs

    seen, misfit = [], placement.misfit

    def recording(m, heads=1):
        seen.append((len(configs.TABLE), torch._inductor.config.force_disable_caches))
        return misfit(m, heads)

    monkeypatch.setattr(placement, "misfit", recording)
    cand = tmp_path / "cand.py"
    cand.write_text('ROWS = [("dq", dict(prec="tf32"), dict(num_stages=1), "one stage: 1 against 3")]\n')
    rc = layer_peers.main(["--img", "64", "--dtype", "tf32", "--builds", "samhq-eager", "inductor-eager",
                           "--iters", "1", "--warmup", "1", "--device", "cpu", "--rows", str(cand),
                           "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line.startswith("tf32 ")}
    assert set(rows) == {"samhq-eager", "inductor-eager", "samhq+rows"}, out
    assert [rows[b][4] for b in ("samhq-eager", "inductor-eager", "samhq+rows")] == ["1", "0", "1"], out  # fused
    assert float(rows["inductor-eager"][6]) < 1e-2 and float(rows["samhq+rows"][6]) < 1e-2, out  # the check column
    n = len(configs.TABLE)
    assert seen == [(n, torch._inductor.config.force_disable_caches), (n + 1, True)], seen  # samhq, then samhq+rows
    recorded = {r["build"]: r for r in common.load_rows(str(tmp_path / "layer_peers.jsonl"))}  # a row per build
    assert set(recorded) == set(rows), recorded
    assert [recorded[b]["fused"] for b in ("samhq-eager", "inductor-eager", "samhq+rows")] == [1, 0, 1], recorded
    assert recorded["samhq+rows"]["rows"] == [["dq", {"prec": "tf32"}, {"num_stages": 1}, "one stage: 1 against 3"]]
    assert recorded["samhq-eager"]["rows"] is None and recorded["samhq-eager"]["img"] == 64, recorded


@pytest.mark.slow
def test_train_step_resume_counts_only_this_gpus_cells(tmp_path):
    """--resume skips the cells a results file finished on this GPU (CPU here), not those another GPU timed."""
    import train_step

    pytest.importorskip("transformers")
    args = ["--quick", "--impls", "eager-eager"]
    (row,) = train_step.main(args + ["--out", str(tmp_path / "a.jsonl")])["results"]
    for gpu, runs in ((None, False), ("NVIDIA H200", True)):
        common.append_rows(str(tmp_path / f"{gpu}.jsonl"), [dict(row, gpu=gpu)])
        out = tmp_path / f"{gpu}-new.jsonl"
        train_step.main(args + ["--resume", str(tmp_path / f"{gpu}.jsonl"), "--out", str(out)])
        assert [r["impl"] for r in common.load_rows(str(out))] == (["eager-eager"] if runs else []), gpu


def test_train_step_attention_class_selection():
    """attn_implementation is honoured at construction (transformers 5.x): eager vs SDPA attention modules."""
    pytest.importorskip("transformers")
    import train_step

    for attn, cls in (("eager", "SamHQVisionAttention"), ("sdpa", "SamHQVisionSdpaAttention")):
        model, _ = train_step.build_model(attn, quick=True, device=torch.device("cpu"))
        assert type(model.vision_encoder.layers[0].attn).__name__ == cls


def test_model_sizes_and_modes_parse():
    """--model picks one of SAM-HQ's encoders (the tables match samhq_fx.models), --modes the compiled impls of
    some modes; both default sets hold samhq and Inductor on both attention classes in both modes."""
    pytest.importorskip("transformers")
    import impls
    import inference
    import train_step

    from samhq_fx.models import VIT_SIZES

    assert train_step.MODELS == inference.MODELS == tuple(VIT_SIZES)
    assert train_step.MODEL_LAYERS == {k: v["num_hidden_layers"] for k, v in VIT_SIZES.items()}
    for mod in (train_step, inference):
        d = mod.parse_args([])
        assert d.model == "vit-b" and set(impls.COMPARED) | {"eager-eager", "eager-sdpa"} == set(d.impls)
        assert mod.parse_args(["--model", "vit-h"]).model == "vit-h"
        assert mod.parse_args(["--quick"]).model == "tiny"
        ro = mod.parse_args(["--modes", "ro"]).impls
        assert set(ro) == {"eager-sdpa", "eager-eager", "inductor-ro", "inductor-eager-ro", "samhq-eager-ro", "samhq-sdpa-ro"}
        assert mod.parse_args(["--modes", "default,reduce-overhead"]).impls == d.impls
        with pytest.raises(SystemExit):
            mod.parse_args(["--modes", "max-autotune"])


def test_img_parses_for_the_full_size_models_only():
    """--img (train_step, inference): the image size the model is built for, 1024 by default, 256 and 512 too; the
    --quick model keeps its own size; any other size is refused by name."""
    pytest.importorskip("transformers")
    import inference
    import train_step

    for mod in (train_step, inference):
        assert mod.parse_args([]).img == 1024 and mod.parse_args(["--img", "512"]).img == 512
        for bad in (["--img", "300"], ["--quick", "--img", "256"]):
            with pytest.raises(SystemExit):
                mod.parse_args(bad)
    assert train_step.parse_args(["--quick"]).img == train_step.QUICK_CONFIG["image_size"]
    assert inference.parse_args(["--quick"]).img is None  # recorded from the small model's config


def test_image_size_grid_classes():
    """SAM's encoder at image size S: an S/16 grid for the global layers, 14x14 windows over that grid padded to a
    multiple of 14 for the others; only 256, 512 and 1024 are taken."""
    import image_size

    assert image_size.grid_classes(1024) == [("global", 64, 1), ("window", 14, 25)]
    assert image_size.grid_classes(512) == [("global", 32, 1), ("window", 14, 9)]  # 32 padded to 42: 3 x 3 windows
    assert image_size.grid_classes(256) == [("global", 16, 1), ("window", 14, 4)]  # 16 padded to 28: 2 x 2
    with pytest.raises(ValueError, match="--img must be one of 256, 512, 1024, got 300"):
        image_size.check(300)


@pytest.mark.slow
def test_models_are_built_for_the_image_size(tmp_path):
    """The ViT-B encoder at 256 (train_step's build and profile_host's) and the whole SamHQModel at 512
    (inference's): positional embedding and rel-pos tables sized for the img/16 grid, the prompt encoder's image
    embedding too, and an inference run at 256 feeds 256x256 images and records img 256 in its rows."""
    pytest.importorskip("transformers")
    import inference
    import profile_host
    import train_step
    from transformers import SamHQModel

    import image_size
    from samhq_fx.models import random_init_

    model, cfg = train_step.build_model("eager", False, torch.device("cpu"), "vit-b", 256)
    enc = model.vision_encoder
    assert cfg.image_size == 256 and tuple(enc.pos_embed.shape) == (1, 16, 16, 768)
    assert [tuple(enc.layers[i].attn.rel_pos_h.shape) for i in (0, 2)] == [(27, 64), (31, 64)]  # window 14, global 16
    enc = profile_host.build_encoder("vit-b", "eager", "tf32", "infer", torch.device("cpu"), 256)
    assert profile_host.attention_shapes(enc, 2) == {"window": (2 * 4 * 12, 14, 64), "global": (2 * 12, 16, 64)}
    full = random_init_(SamHQModel(image_size.sam_hq_config("sdpa", "vit-b", 512)))
    assert full.config.prompt_encoder_config.image_embedding_size == 32
    assert tuple(full.vision_encoder.pos_embed.shape) == (1, 32, 32, 768)
    del model, enc, full
    p = inference.main(["--img", "256", "--impls", "eager-eager", "--dtype", "tf32", "--batch", "1", "--iters", "1",
                        "--warmup", "1", "--time-budget", "0", "--no-chart", "--out", str(tmp_path)])
    (row,) = p["results"]
    assert row["status"] == "OK" and (row["model"], row["img"]) == ("vit-b", 256), row["detail"]
    assert common.load_rows(str(tmp_path / "inference.jsonl"))[0]["img"] == 256


def test_sam_sizes_time_every_grid_class(monkeypatch):
    """bench_attention_core --sam-sizes: each SAM size at the global and window layers of 1024, 512 and 256 (checked
    with stand-ins for the GPU pieces: the shapes it makes, the rows it records)."""
    import bench_attention_core as B

    made = []

    def fake_make(b, side, dtype, d=64):
        made.append((b, side, d))
        return (torch.zeros(b, side * side, d),) * 6

    monkeypatch.setattr(B, "make", fake_make)
    monkeypatch.setattr(B, "ours_fns", lambda *a: (None, None, None))
    monkeypatch.setattr(B, "graph_bench", lambda fn: 1.0)
    rows = B.sam_sizes({}, modes=("fp32-tf32",))
    vit_b = [(r["img"], r["layer"], r["grid"], r["batch"]) for r in rows if r["model"] == "vit-b"]
    assert vit_b == [(1024, "global", 64, 1), (1024, "window", 14, 25), (512, "global", 32, 1), (512, "window", 14, 9),
                     (256, "global", 16, 1), (256, "window", 14, 4)]
    assert made[:6] == [(12 * w, g, 64) for _, _, g, w in vit_b]  # heads x windows per image
    assert len(rows) == 6 * len(B.SAM_SIZES)


def test_train_step_cells_parse():
    import train_step

    a = train_step.parse_args(["--cells", "bf16/4/samhq-sdpa;tf32/1/inductor"])
    assert a.cells == {("samhq-sdpa", 4, "bf16"), ("inductor", 1, "tf32")}
    assert set(a.dtype) == {"bf16", "tf32"} and set(a.batch) == {1, 4}
    # the default peers: Inductor on both attention classes, with and without CUDA graphs
    d = train_step.parse_args([])
    assert {"inductor", "inductor-eager", "inductor-ro", "inductor-eager-ro", "samhq-eager-ro"} <= set(d.impls)
    assert d.optimizer == "adamw-fused" and not any("-ca" in i for i in d.impls)


def _assert_rotated(row: dict, field: str) -> None:
    # a rotated cell: ROTATE_ROUNDS round medians, the in-cell timing kept beside them, the figure their median
    rounds = row[f"{field}_by_round"]
    assert len(rounds) == common.ROTATE_ROUNDS and row[f"{field}_in_cell"] > 0
    assert row[field] == pytest.approx(sorted(rounds)[1], rel=1e-2)


@pytest.mark.slow
def test_train_step_rotates_the_default_mode_compiled_cells(tmp_path):
    # default-mode compiled cells are timed again in rotation after the last cell of their dtype and batch; the
    # eager baseline is not, nor a compiled-autograd cell (its global switch is its own cell's)
    import train_step

    pytest.importorskip("transformers")
    p = train_step.main(["--quick", "--impls", "eager-eager,inductor-eager,samhq-eager", "--steps", "2",
                         "--no-chart", "--out", str(tmp_path)])
    rows = {r["impl"]: r for r in p["results"]}
    assert all(r["status"] == "OK" for r in rows.values()) and rows["samhq-eager"]["fused"] == 2
    assert "ms_per_step_by_round" not in rows["eager-eager"]
    for name in ("inductor-eager", "samhq-eager"):
        _assert_rotated(rows[name], "ms_per_step")


# ------------------------------------------------------------------------------------------- inference
@pytest.mark.slow
def test_inference_quick(tmp_path, capsys):
    """The CI smoke run: the small SamHQModel's image encoder, eager and samhq, forward only under no_grad; the
    chart and the table come from the JSON (plot.py) and merging it again gives the same rows."""
    import inference

    pytest.importorskip("transformers")
    p = inference.main(["--quick", "--out", str(tmp_path)])
    rows = {r["impl"]: r for r in p["results"]}
    assert set(rows) == {"eager-eager", "samhq-eager"}
    for r in rows.values():
        assert r["status"] == "OK", r["detail"]
        assert r["images_per_s"] == pytest.approx(1e3 / r["latency_ms"], rel=1e-3)  # batch 1
        assert r["target"] == "encoder" and r["graph_breaks"] == 0
    assert rows["samhq-eager"]["fused"] == 2 and rows["samhq-eager"]["check_rel_diff"] < 1e-4
    assert all(r["model"] == "tiny" and r["img"] == 64 and r["gpu_ms"] is None and r["host_ms"] is None
               for r in rows.values())
    assert "backend='samhq'" in rows["samhq-eager"]["recipe"]
    (s,) = p["summary"]
    assert s["best_samhq"] == "samhq-eager" and s["best_eager"] == "eager-eager"
    (m,) = p["summary_by_mode"]  # (model, img, target, dtype, batch, mode); no Inductor row in the quick set
    assert {k: m[k] for k in ("model", "img", "target", "dtype", "batch", "mode", "samhq", "inductor")} == dict(
        model="tiny", img=64, target="encoder", dtype="tf32", batch=1, mode="default", samhq="samhq-eager",
        inductor=None)
    assert capsys.readouterr().out.rstrip().endswith(m["line"])  # printed last
    assert m["line"].startswith("tiny 64px encoder tf32 b1 default: samhq-eager ")
    path = str(tmp_path / "inference.jsonl")
    assert [(r["impl"], r["status"]) for r in common.load_rows(path)] == [(r["impl"], r["status"]) for r in p["results"]]
    plot.main([path, path])  # the same rows twice: one per cell is kept
    out = capsys.readouterr().out
    assert "images_per_s" in out and "samhq-eager" in out
    assert out.count(m["line"]) == 1


@pytest.mark.slow
def test_inference_rotates_the_default_mode_compiled_cells(tmp_path):
    # the default-mode compiled cells of a group are timed again in rotation after the group's last cell; the
    # eager baseline is not; --no-rotate keeps the single in-cell timing
    import inference

    pytest.importorskip("transformers")
    p = inference.main(["--quick", "--impls", "eager-eager,inductor,samhq-eager", "--iters", "2", "--no-chart",
                        "--out", str(tmp_path)])
    rows = {r["impl"]: r for r in p["results"]}
    assert all(r["status"] == "OK" for r in rows.values()) and rows["samhq-eager"]["fused"] == 2
    assert "latency_ms_by_round" not in rows["eager-eager"]
    for name in ("inductor", "samhq-eager"):
        _assert_rotated(rows[name], "latency_ms")
    p = inference.main(["--quick", "--impls", "inductor,samhq-eager", "--no-rotate", "--no-chart",
                        "--out", str(tmp_path)])
    assert not any("latency_ms_by_round" in r for r in p["results"])


def test_plot_imports_no_runner():
    # charts depend on results only: plot.py must not import the scripts that produce them
    src = (Path(plot.__file__)).read_text()
    for runner in ("compare_impls", "time_entry", "train_step", "inference", "bench_attention_core", "common"):
        assert not re.search(rf"^\s*(import|from)\s+{runner}\b", src, re.M), runner


# ------------------------------------------------------------------------------- sweep_kernels bookkeeping
# The sweeps time on the GPU only; their bookkeeping (which config each call ran under, and that it is
# restored) is checked here with a fake timer, so a slip costs CI time, not device time.
def _fake_sweep(monkeypatch):
    import sweep_kernels as S

    seen = []

    def fake_time_call(kernels, q, k, v, rh, rw, do, which):
        seen.append(dict(which=which, overrides=dict(S.K.configs.OVERRIDES), table=S.K.configs.TABLE))
        return 1e-3 * len(seen)

    monkeypatch.setattr(S, "time_call", fake_time_call)
    made = []
    monkeypatch.setattr(S, "make", lambda n, side, dtype, d=64: made.append((n, side, d)) or (None,) * 6)
    monkeypatch.setattr(S, "made", made, raising=False)  # the (b, side, d) of every make(), for the test to read
    return S, seen


def test_sweep_d80_times_vit_h_shapes(monkeypatch):
    # --d80-fp32: 16 heads of head dim 80 on ViT-H's global grid and its 25 windows of 14x14
    S, seen = _fake_sweep(monkeypatch)
    rows = S.sweep_narrow({}, "fp32-tf32", S.D80_SHAPES, S.D80_CANDS, "sweep_d80_fp32", heads=16, d=80)
    assert S.made == [(16, 64, 80), (400, 14, 80)]
    assert len(rows) == 2 * (1 + sum(map(len, S.D80_CANDS.values())))


def test_sweep_narrow_runs_each_candidate_under_its_config(monkeypatch):
    S, seen = _fake_sweep(monkeypatch)
    shapes = S.NARROW_BF16[:1]
    rows = S.sweep_narrow({}, "bf16", shapes, S.NARROW_CANDS_BF16)
    n_cands = sum(map(len, S.NARROW_CANDS_BF16.values()))
    assert len(rows) == 1 + n_cands and len(seen) == 2 + n_cands  # shipped times bwd and fwd
    assert rows[0]["kernel"] == "shipped" and seen[0]["overrides"] == {}
    for row, call in zip(rows[1:], seen[2:]):
        assert call["overrides"] == {row["kernel"]: row["cfg"]}
        assert call["which"] == ("fwd" if row["kernel"] == "fwd" else "bwd")
    assert any(c["overrides"].get("dkdv", {}).get("BIAS_T") for c in seen)  # the bias-copy candidates ran with it
    assert S.K.configs.OVERRIDES == {}  # restored


def test_sweep_tables_times_the_old_table_then_restores_the_new(monkeypatch, tmp_path):
    S, seen = _fake_sweep(monkeypatch)
    new = S.K.configs.TABLE
    old_file = tmp_path / "old_configs.py"
    old_file.write_text("TABLE = [('fwd', {}, {'BLOCK_M': 16}, 'old')]\n")
    rows = S.sweep_tables({}, str(old_file), shapes=[(7, 1)])
    assert len(rows) == 2  # bf16 and fp32 "high"
    assert [c["table"] is new for c in seen[:4]] == [False, False, True, True]  # old fwd, bwd; new fwd, bwd
    assert {"old_fwd", "old_bwd", "new_fwd", "new_bwd"} <= set(rows[0]) and set(S.VARIANTS["bf16"]) <= set(rows[0])
    assert S.K.configs.TABLE is new


def test_default_mode_rows_and_chart_from_profile_host_results(tmp_path, capsys):
    # profile_host.py rows (one per build of a run) -> one line per (cell, build) with host = wall - GPU; a build cut
    # before its timing (no wall) is left out; the CLI prints the lines and draws the chart (or says matplotlib is
    # missing)
    def run(date, walls, batch=1, img=1024):
        return [dict(date=date, model="vit-b", what="infer", dtype="bf16", batch=batch, img=img, build=b,
                     **({"wall_ms": w, "gpu_ms": 3.0} if w else {"compile_s": 30.0})) for b, w in walls.items()]

    first = run("2026-12-02", {"samhq": 6.0, "inductor-sdpa": 7.0, "inductor-eager": None})
    lines = plot.default_mode_rows(first)
    assert [r["build"] for r in lines] == ["samhq", "inductor-sdpa"]
    assert lines[0]["host_ms"] == pytest.approx(3.0) and lines[1]["gpu_busy"] == pytest.approx(3 / 7)
    assert lines[0]["cell"] == "vit-b infer bf16 B=1"
    path = tmp_path / "profile_host.jsonl"
    common.append_rows(str(path), first)
    plot.main([str(path), "--default-mode", str(tmp_path / "chart.png")])
    out = capsys.readouterr().out
    assert "inductor-sdpa" in out and "3.00" in out
    assert (tmp_path / "chart.png").exists() or "matplotlib not importable" in out
    # several runs of one cell: one process per panel, the latest date wins, a tie goes to the run read last
    later, tie = run("2026-12-03", {"samhq": 5.0, "inductor-sdpa": 8.0}), run("2026-12-03", {"samhq": 9.0, "inductor-sdpa": 8.0})
    tie = [dict(r, source="other") for r in tie]  # the same date: told apart by where the rows came from
    assert [(r["cell"], r["wall_ms"]) for r in plot.default_mode_rows(later + first + tie)] == [
        ("vit-b infer bf16 B=1", 9.0), ("vit-b infer bf16 B=1", 8.0)]
    # other batch sizes and image sizes are other cells
    cells = [r["cell"] for r in plot.default_mode_rows(first + run("2026-12-02", {"samhq": 1.0}, batch=8, img=512))]
    assert cells == ["vit-b infer bf16 B=1"] * 2 + ["vit-b 512px infer bf16 B=8"]
    # a later A/B of samhq's own options (no Inductor build) does not replace a comparison, and stands alone
    ab = run("2026-12-04", {"samhq": 4.0, "samhq-triton-launcher": 5.0})
    assert [r["build"] for r in plot.default_mode_rows(first + ab)] == ["samhq", "inductor-sdpa"]
    assert [r["build"] for r in plot.default_mode_rows(ab)] == ["samhq", "samhq-triton-launcher"]


def test_profile_host_decoder_step_trains_only_the_decoder_and_held_weights_keep_its_bits():
    # the decoder recipe's step that profile_host times: the frozen encoder and prompt encoder stay as they are, the
    # mask decoder moves, and the "-held" build (frozen weights in bf16) computes the same losses bit for bit
    pytest.importorskip("transformers")
    import profile_host
    from transformers import SamHQModel

    import samhq_fx
    from samhq_fx.models import random_init_, sam_hq_config

    core = random_init_(SamHQModel(sam_hq_config("sdpa")))
    for name, p in core.named_parameters():
        p.requires_grad_(name.startswith("mask_decoder."))
    held = copy.deepcopy(core)
    assert samhq_fx.cast_frozen_weights_(held) > 0
    before = {k: v.clone() for k, v in core.state_dict().items()}
    steps = [profile_host.decoder_step(m, 2, torch.device("cpu")) for m in (core, held)]
    losses = [[step().item() for _ in range(2)] for step in steps]
    assert losses[0] == losses[1] and all(torch.isfinite(torch.tensor(losses[0])))
    moved = {k for k, v in core.state_dict().items() if not torch.equal(v, before[k])}
    assert moved and all(k.startswith("mask_decoder.") for k in moved)


def test_profile_kernels_summarizes_an_ncu_export(tmp_path):
    # ncu --csv --page details: its log lines first, then one row per (launch, metric); units as ncu writes them
    import profile_kernels
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    rows = [("0", "_fwd_kernel", "Duration", "ns", "251,300"),
            ("0", "_fwd_kernel", "Dynamic Shared Memory Per Block", "byte/block", "81,920"),
            ("0", "_fwd_kernel", "Block Limit Registers", "block", "2"),  # not a summary column
            ("1", "_bwd_kernel(int)", "Duration", "msecond", "1.20"),
            ("1", "_bwd_kernel(int)", "Achieved Occupancy", "%", "12.3")]
    text = "==PROF== Connected to process 1\n" + head + "\n" + "\n".join(
        ",".join(f'"{x}"' for x in (i, k, "s", m, u, v)) for i, k, m, u, v in rows) + "\n"
    (tmp_path / "p.csv").write_text(text)
    got = profile_kernels.summarize(str(tmp_path / "p.csv"))
    assert got == [{"kernel": "_fwd_kernel", "us": pytest.approx(251.3), "smem KB": pytest.approx(80.0)},
                   {"kernel": "_bwd_kernel", "us": pytest.approx(1200.0), "occ %": pytest.approx(12.3)}]


def test_eager_op_parts_time_each_piece_of_the_call(monkeypatch):
    # eager_op --parts on CPU tensors (the interpreter runs the kernels' host functions): every piece is timed
    import eager_op

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    ts = [torch.randn(s).requires_grad_() for s in [(2, 16, 16)] * 3 + [(2, 16, 4), (2, 16, 4)]]
    parts = eager_op.parts_ms(ts, torch.randn(2, 16, 16), iters=1)
    assert list(parts) == ["op fwd + bwd", "op fwd (no grad)", "kernels fwd", "kernels bwd", "8 allocations",
                           "autograd, no kernels"]
    assert all(ms > 0 for ms in parts.values()), parts


def test_saved_activations_tool_splits_parameters_from_the_rest(tmp_path):
    # the memory-budget measurement: a smaller budget saves fewer non-parameter bytes, every block stays fused
    import saved_activations

    rows = saved_activations.main(["--model", "tiny", "--batch", "2", "--budgets", "none,0.1", "--peers",
                                   "--out", str(tmp_path / "saved.jsonl")])
    assert [(r["backend"], r["attn_implementation"], r["budget"]) for r in rows] == [
        ("samhq", "eager", None), ("samhq", "eager", 0.1), ("aot_eager", "sdpa", None), ("aot_eager", "eager", None)]
    assert [r["fused"] for r in rows] == [2, 2, 0, 0]
    assert 0 < rows[1]["saved_rest_mib"] < rows[0]["saved_rest_mib"]
    # without the rewrite the eager class saves its softmax probabilities: more than samhq's op keeps
    assert rows[3]["saved_rest_mib"] > rows[0]["saved_rest_mib"]
    assert common.load_rows(str(tmp_path / "saved.jsonl")) == rows


@pytest.mark.parametrize("options", [{"samhq.inductor": False}, {}])
def test_memory_budget_recomputes_instead_of_saving(options):
    # samhq.memory_budget, counted with saved_activations.saved_bytes: AOTAutograd's partitioner keeps a fraction of
    # what it saves by default and recomputes the rest in the backward, for this compile only; every block still
    # fused, gradients unchanged
    pytest.importorskip("transformers")
    import torch._functorch.config as functorch_config
    from saved_activations import saved_bytes
    from torch._dynamo.utils import counters
    from transformers import SamHQVisionModel

    from samhq_fx.models import random_init_, tiny_vision_config

    from helpers import fresh_compile_state, rel_err

    cfg = tiny_vision_config("eager", image_size=64, patch_size=8, num_hidden_layers=2, mlp_dim=128)
    model = random_init_(SamHQVisionModel(cfg), rel_pos_std=0.5)
    x = torch.randn(2, 3, 64, 64)

    def loss_and_grads(fn):
        model.zero_grad()
        out = fn(x)
        out.last_hidden_state.pow(2).mean().backward()
        return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref, ref_grads = loss_and_grads(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}
    for budget in (None, 0.2):
        fresh_compile_state()
        compiled = torch.compile(model, backend="samhq", options={**options, "samhq.memory_budget": budget})
        model.zero_grad()
        out, weights, rest = saved_bytes(compiled, x, params)
        saved[budget] = weights + rest
        out.last_hidden_state.pow(2).mean().backward()
        assert counters["samhq"]["fused"] == 2, budget
        assert rel_err(out.last_hidden_state, ref.last_hidden_state) < 1e-5, budget
        for name, p in model.named_parameters():
            if name in ref_grads:
                assert rel_err(p.grad, ref_grads[name]) < 1e-4, (budget, name)
    assert 0 < saved[0.2] < 0.6 * saved[None], saved
    assert functorch_config.activation_memory_budget == 1.0  # set for the compile only
