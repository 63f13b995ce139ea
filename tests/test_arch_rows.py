"""The config rows of every GPU class (kernels/configs.py's max_smem / min_cc / max_cc rows) give right answers.

tests/test_kernels.py runs the configs Hopper's rows choose at SAM's shape classes through the interpreter; this file
runs those that another architecture class gets where they differ from Hopper's (smaller blocks, fewer stages, more
warps, split instead of fused launches), forced through OVERRIDES as the GPU table gives them, against float64 with
every output checked (NaN-poisoned buffers, rel-pos gradients included). Each distinct config set runs once, named by
the classes that get it. A pure table check too: a fused launch's dK/dV and dQ agree on warps and stages in every
class.
"""

from __future__ import annotations

import ast
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from test_kernels import K, MODES, make_inputs, run_and_check

arch, configs = K.arch, K.configs
TOOLS = Path(__file__).resolve().parents[1] / "benchmarks" / "tools"  # time_arch_rows.py's folder
KERNELS = ("fwd", "dkdv", "dq", "bwd")

# SAM's shape classes as the GPU table sees them: (batch, grid hk x wk run here, head dim, mode, rows the GPU launch
# has = batch * heads * queries). 14x14: windows of ViT-B/L (12 / 16 heads, D=64) and ViT-H (16 heads, D=80), 25
# windows a 1024 px image (split backward) and 4 a 256 px one (fused); 64, 32 and 16 wide: the global layers at 1024,
# 512 and 256 px, here on a few grid rows (the interpreter's cost grows with N^2)
SAM_CLASSES = [
    (1, 14, 14, 64, mode, 25 * 12 * 196) for mode in ("bf16", "fp32-high", "fp32-highest")
] + [
    (1, 14, 14, 80, mode, 25 * 16 * 196) for mode in ("bf16", "fp32-high", "fp32-highest")
] + [
    (1, 14, 14, 64, mode, 4 * 12 * 196) for mode in ("bf16", "fp32-high", "fp32-highest")
] + [
    (1, 2, 64, d, mode, heads * 4096) for d, heads in ((64, 12), (80, 16)) for mode in ("bf16", "fp32-high",
                                                                                        "fp32-highest")
] + [
    (1, 2, 32, 64, mode, 12 * 1024) for mode in ("bf16", "fp32-high", "fp32-highest")
] + [
    (1, 3, 16, d, mode, 16 * 256) for d in (64, 80) for mode in ("bf16", "fp32-high", "fp32-highest")
]


def facts(a: arch.Arch, wk: int, d: int, mode: str, rows: int) -> dict:
    dtype = MODES[mode][0]
    prec = {"fp32-high": "tf32", "fp32-highest": "tf32x3"}.get(mode, "none")
    return dict(fp32=dtype == torch.float32, prec=prec, wide=d > configs.D_WIDE, wk=wk, rows=rows, interpret=False,
                d=d, smem=a.smem, cc=a.capability)


def gpu_configs(a: arch.Arch, wk: int, d: int, mode: str, rows: int) -> dict:
    f = facts(a, wk, d, mode, rows)
    return {kern: configs.config(kern, **f) for kern in KERNELS}


def distinct_cases() -> list:
    """(case, config set, the classes that get it) for each SAM class where a class's configs are not Hopper's."""
    cases = []
    for case in SAM_CLASSES:
        b, hk, wk, d, mode, rows = case
        hopper = gpu_configs(arch.ARCHS["sm_90"], wk, d, mode, rows)
        by_configs: dict[str, tuple] = {}
        for a in arch.ARCHS.values():
            cfgs = gpu_configs(a, wk, d, mode, rows)
            if cfgs != hopper:
                key = repr(sorted((k, sorted(v.items())) for k, v in cfgs.items()))
                by_configs.setdefault(key, (cfgs, []))[1].append(a.name)
        cases += [pytest.param(case, cfgs, names, id=f"{'+'.join(names)}-{hk}x{wk}-d{d}-{mode}-{rows}")
                  for cfgs, names in by_configs.values()]
    return cases


CASES = distinct_cases()


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setattr(K, "_POISON_OUTPUTS", True)


def test_other_classes_have_rows_of_their_own():
    # the per-class rows exist and reach SAM's shapes: every class but Hopper's gets configs of its own somewhere
    names = {n for _, _, names in (c.values for c in CASES) for n in names}
    assert names >= {"sm_80", "sm_86", "sm_89", "sm_120", "sm_100"}, names


@pytest.mark.parametrize("case,gpu,names", CASES)
def test_class_rows_at_sam_shapes(case, gpu, names, monkeypatch, matmul_precision):
    b, hk, wk, d, mode, rows = case
    dtype, prec, tol = MODES[mode]
    matmul_precision(prec)
    monkeypatch.setattr(K.configs, "OVERRIDES", gpu)
    f = {**facts(arch.DEFAULT, wk, d, mode, rows), "interpret": True}
    for kern, cfg in gpu.items():  # what runs: the class's config, and interpreter-row keys only at their default
        ran = K.configs.config(kern, **f)
        assert {key: val for key, val in ran.items() if key not in cfg and val} == {}, (kern, ran, cfg)
    run_and_check(*make_inputs(b, hk * wk, hk, wk, d, d, dtype, seed=wk + d + rows % 7), tol)


@pytest.mark.parametrize("name", list(arch.ARCHS))
@pytest.mark.parametrize("fp32,prec", [(False, "none"), (True, "tf32"), (True, "tf32x3")])
def test_fused_launch_rows_agree_on_warps_and_stages(name, fp32, prec):
    # a fused launch needs one num_warps / num_stages for dK/dV and dQ; backward() silently splits otherwise, so a
    # class's row that changes one and not the other would turn its fused launches into split ones unseen
    a = arch.ARCHS[name]
    for wk, rows, d in itertools.product((7, 14, 16, 28, 32, 48, 56, 64), (49, 2_352, 8_192, 37_632, 196_608),
                                         (64, 80)):
        f = dict(fp32=fp32, prec=prec, wide=False, wk=wk, rows=rows, interpret=False, d=d, smem=a.smem,
                 cc=a.capability)
        if configs.config("bwd", **f).get("FUSED"):
            kv, q = configs.config("dkdv", **f), configs.config("dq", **f)
            assert (kv["num_warps"], kv["num_stages"]) == (q["num_warps"], q["num_stages"]), (name, wk, rows, d)


def test_sm89_takes_sm86_rows():
    # the same shared memory and no capability condition between them: tests/test_kernels_compile.py compiles sm_86
    # and not sm_89 on that ground
    for case in SAM_CLASSES:
        _, _, wk, d, mode, rows = case
        assert gpu_configs(arch.ARCHS["sm_89"], wk, d, mode, rows) == gpu_configs(arch.ARCHS["sm_86"], wk, d, mode,
                                                                                   rows), case


@pytest.mark.parametrize("name", list(arch.ARCHS))
def test_vit_h_global_dq_splits_rows_on_mma_sync_classes(name):
    # ViT-H's global layer (16 heads, 64x64 keys, head dim 80), bf16: dQ takes SPLIT_ROW on the classes whose plain dQ
    # spills (mma.sync: at most 163 KB a CTA) and Hopper's plain dQ elsewhere; where it is set, the key tile is the one
    # grid row of 64 the host needs to take it (rel_pos_attention.backward: R == 1, WK_PAD >= 32)
    a = arch.ARCHS[name]
    cfg = configs.config("dq", fp32=False, prec="none", wide=False, wk=64, rows=16 * 4096, interpret=False, d=80,
                         smem=a.smem, cc=a.capability)
    assert cfg.get("SPLIT_ROW", False) == (a.smem <= configs.SMEM_163KB), (name, cfg)
    assert K.tiles.tile(64, 64, cfg["BLOCK_N"]) == (64, 1)


def _gpu_table_python(*args: str):
    """python *args in a process of its own, without TRITON_INTERPRET (the GPU table's configs, not the
    interpreter's) or SAMHQ_FX_ARCH (time_arch_rows.py sets it per cell)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "SAMHQ_FX_ARCH")}
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300)


def _time_arch_rows(*args: str):
    """benchmarks/tools/time_arch_rows.py, run by _gpu_table_python."""
    return _gpu_table_python(str(TOOLS / "time_arch_rows.py"), *args)


def test_memcheck_rows_checks_candidate_rows_before_it_runs(tmp_path):
    # benchmarks/tools/memcheck_rows.py refuses rows the table's check refuses (a reason without a figure) on any
    # machine, before it looks for a GPU
    rows = tmp_path / "cand.py"
    rows.write_text('ROWS = [("dq", dict(fp32=False), dict(num_stages=1), "one stage")]\n')
    proc = _gpu_table_python(str(TOOLS / "memcheck_rows.py"), "--shape", "B-global", "--rows", str(rows))
    assert proc.returncode != 0 and "with its figure" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_memcheck_rows_says_when_candidate_rows_change_no_launch(tmp_path):
    # a candidate that never applies to the cells asked for would pass the sanitizer unchecked: the tool finds the
    # cells whose launches a row changes (a bf16 dQ at 1 stage: both; only Hopper's: sm_90's; an fp32 row: none),
    # with the GPU table's configs (no TRITON_INTERPRET)
    code = f"""
import sys
sys.path.insert(0, {str(TOOLS)!r})
import memcheck_rows as m
cells = [("sm_90", "B-global", "bf16"), ("sm_86", "H-windows", "bf16")]
bf16_dq = [("dq", dict(fp32=False), dict(num_stages=1), "one stage: 1 against 3")]
hopper_dq = [("dq", dict(fp32=False, min_cc=90), dict(num_stages=1), "one stage: 1 against 3")]
fp32_dq = [("dq", dict(fp32=True), dict(num_stages=1), "one stage: 1 against 3")]
print(m.changed_cells(bf16_dq, cells) == cells, m.changed_cells(hopper_dq, cells) == cells[:1],
      m.changed_cells(fp32_dq, cells) == [])
"""
    proc = _gpu_table_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["True", "True", "True"], proc.stdout


@pytest.mark.gpu
def test_memcheck_rows_runs_a_cell_on_the_gpu():
    # the script compute-sanitizer wraps (here run without it): one cell's forward + backward under an emulated
    # class's rows, finite gradients, every cell run
    proc = _gpu_table_python(str(TOOLS / "memcheck_rows.py"), "--arch", "sm_86", "--shape", "H-global-256",
                             "--mode", "bf16", "tf32x3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("gradients finite: True") == 2, proc.stdout[-2000:]
    assert "2 of 2 cells ran" in proc.stdout, proc.stdout[-2000:]


def test_time_arch_rows_dry_run_lists_what_it_would_time():
    # benchmarks/tools/time_arch_rows.py without a GPU: each class's cells, the ones whose launches an earlier class
    # has marked "same" (sm_89 takes sm_86's), and what it would time with the GPU table's configs, not the
    # interpreter's (a process of its own, without TRITON_INTERPRET)
    proc = _time_arch_rows("--dry-run", "--shape", "B-global", "H-windows", "--mode", "bf16", "tf32x3")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = {tuple(line.split()[:3]): line for line in proc.stdout.splitlines()[1:]}
    assert len(cells) == len(arch.ARCHS) * 2 * 2, proc.stdout
    assert "same: sm_86's launches" in cells[("sm_89", "B-global", "bf16")]
    assert "time: would time" in cells[("sm_90", "H-windows", "tf32x3")]
    assert "'num_stages': 2" in cells[("sm_86", "B-global", "bf16")]  # the 99 KB rows, not the interpreter's 1 stage


def test_time_arch_rows_dry_run_marks_the_cells_candidate_rows_change(tmp_path):
    # --rows: candidate rows after the table's; only the cells whose launches they change are timed again (here
    # sm_86's, which sm_89 shares), and a file without ROWS is refused
    rows = tmp_path / "cand.py"
    rows.write_text('ROWS = [("dq", dict(fp32=False, max_smem=101376, max_cc=89, min_wk=9, max_wk=16), '
                    'dict(num_stages=2), "a candidate: 2 stages, 1 figure")]\n')
    proc = _time_arch_rows("--dry-run", "--rows", str(rows), "--shape", "B-windows", "--mode", "bf16", "tf32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    cells = {tuple(line.split()[:3]): line for line in proc.stdout.splitlines()[1:]}
    changed = {key for key, line in cells.items() if "| rows: time" in line}
    assert changed == {("sm_86", "B-windows", "bf16"), ("sm_89", "B-windows", "bf16")}, proc.stdout
    assert "'num_stages': 2" in cells[("sm_86", "B-windows", "bf16")].split("| rows:")[1]
    rows.write_text("OTHER = []\n")
    proc = _time_arch_rows("--dry-run", "--rows", str(rows))
    assert proc.returncode != 0 and "defines no ROWS" in proc.stderr


def test_time_arch_rows_names_any_sam_layer():
    # MODEL-LAYER-PX[-bBATCH]: the global grid is px / 16 wide, the windows that grid padded to whole 14x14 windows;
    # SAM's 1024 px names agree with the fixed ones, and a name that says nothing real is refused with the format
    sys.path.insert(0, str(TOOLS.parent))
    sys.path.insert(0, str(TOOLS))
    import time_arch_rows as t

    assert t.shape_spec("B-global-1024") == t.SHAPES["B-global"] == (12, 64, 64)
    assert t.shape_spec("H-windows-1024") == t.SHAPES["H-windows"] == (400, 14, 80)
    assert t.shape_spec("H-global-512-b8") == t.SHAPES["H-global-512-b8"]
    assert t.shape_spec("L-global-768-b8") == (8 * 16, 48, 64)
    assert t.shape_spec("B-windows-640-b2") == (2 * 9 * 12, 14, 64)  # 40 wide: 3 x 3 windows of 14
    for bad in ("X-global-640", "B-global-650", "B-global-640-b0", "B-window-640"):
        with pytest.raises(ValueError, match="MODEL-LAYER-PX"):
            t.shape_spec(bad)


def test_time_arch_rows_times_candidate_rows_once_per_shape():
    # a candidate's timing is shared by classes with the same launches at one shape (sm_89 takes sm_86's), never
    # across shapes: batch 1 and batch 8 of a layer make the same launches (a launch does not carry the batch)
    code = (f"import sys; sys.path[:0] = [{str(TOOLS.parent)!r}, {str(TOOLS)!r}]; import time_arch_rows as t\n"
            "rows = [('dq', dict(prec='tf32', max_smem=101376, min_wk=17), dict(BLOCK_M=32, num_stages=2), 'a, 2')]\n"
            "cells = t.plan(['sm_86', 'sm_89'], ['H-global-512', 'H-global-512-b8'], ['tf32'], None, rows)\n"
            "print({(c['arch'], c['shape']): c['rows_key'] for c in cells if c['rows_key'] is not None})")
    proc = _gpu_table_python("-c", code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    keys = ast.literal_eval(proc.stdout)
    assert keys[("sm_86", "H-global-512")] == keys[("sm_89", "H-global-512")]
    assert keys[("sm_86", "H-global-512")] != keys[("sm_86", "H-global-512-b8")]
