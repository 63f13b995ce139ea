"""Inductor's caches across processes: a second process with the same model hits the FX graph and AOT
autograd caches, keeps the rewrite (fused count, same gradients), and a change to the samhq pass
(here: one of its settings, which enters its uuid like its source does) misses them.

Each run is a fresh Python process on the same TORCHINDUCTOR_CACHE_DIR, as a restarted training job is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

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


def _run(cache_dir, **env) -> dict:
    full_env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **env}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, env=full_env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_second_process_hits_caches_and_keeps_the_rewrite(tmp_path):
    cold = _run(tmp_path)
    assert cold["fused"] == 1 and cold["fx_miss"] >= 1 and cold["fx_hit"] == 0
    warm = _run(tmp_path)
    assert warm["fused"] == 1  # the rewrite runs in the backend, before the cache lookup
    assert warm["fx_hit"] >= 1 and warm["fx_miss"] == 0
    assert warm["aot_hit"] >= 1
    for g_warm, g_cold in zip(warm["grads"], cold["grads"]):  # the cached code is the rewritten code
        assert g_warm == pytest.approx(g_cold, rel=1e-5, abs=1e-7)
    changed = _run(tmp_path, SAMHQ_FX_MIN_SEQ_LEN="2")  # another pass uuid: no stale hit
    assert changed["fused"] == 1 and changed["fx_miss"] >= 1
