"""DDP and FSDP2 around a samhq-compiled model: 2 CPU processes (gloo) through torchrun.

Dynamo's DDP optimizer splits the graph at gradient-bucket boundaries and compiles each piece with the
backend separately; a split through an attention block would silently lose the fusion. FSDP2 puts its
all-gather / reduce-scatter hooks around every encoder layer. The rewrite is followed by aot_eager here
(samhq.inductor=False) to keep CPU compile time low; the numerics must equal the same run without the
rewrite, and FSDP2 must train to the same parameters as DDP.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "train_distributed.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, name, *args) -> dict:
    out = tmp_path / f"{name}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(_free_port()), str(EXAMPLE), "--device", "cpu", "--json", str(out), *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC")}
    env["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only: the host name may resolve to an unreachable address
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def ddp_samhq(tmp_path_factory):
    return _torchrun(tmp_path_factory.mktemp("ddp"), "samhq", "--samhq-aot-eager", "--steps", "3")


def test_ddp_samhq_matches_ddp_without_rewrite(tmp_path, ddp_samhq):
    fused = ddp_samhq
    plain = _torchrun(tmp_path, "plain", "--backend", "aot_eager", "--steps", "3")
    assert fused["fused_per_rank"] == [2, 2] and plain["fused_per_rank"] == [0, 0]
    assert fused["losses"] == pytest.approx(plain["losses"], rel=1e-4, abs=1e-6)
    assert fused["param_checksum"] == pytest.approx(plain["param_checksum"], rel=1e-6)


def test_ddp_bucket_splits_keep_every_attention_block_fused(tmp_path):
    # ViT-B parameter sizes: ~15 buckets of 25 MB, so the graph is split into several pieces per rank
    result = _torchrun(tmp_path, "vitb", "--model", "vit-b-256", "--samhq-aot-eager", "--steps", "1", "--batch", "1")
    assert all(g > 1 for g in result["graphs_per_rank"]), result
    assert result["fused_per_rank"] == [12, 12], result


def test_fsdp2_samhq_trains_like_ddp(tmp_path, ddp_samhq):
    # Same seeds and data as the DDP run: sharding changes where gradients are reduced, not their values
    fsdp = _torchrun(tmp_path, "fsdp2", "--engine", "fsdp2", "--samhq-aot-eager", "--steps", "3")
    assert fsdp["fused_per_rank"] == [2, 2], fsdp
    assert fsdp["losses"] == pytest.approx(ddp_samhq["losses"], rel=1e-4, abs=1e-6)
    assert fsdp["param_checksum"] == pytest.approx(ddp_samhq["param_checksum"], rel=1e-6)
