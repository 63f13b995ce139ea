"""The examples run (CPU) and do what they claim: fuse every vision attention layer, train, dump."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from helpers import fresh_compile_state

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
pytest.importorskip("transformers")


def test_dump_graphs_example(tmp_path, capsys):
    import dump_graphs

    fresh_compile_state()
    dump_graphs.main(["--dump-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "1 of 1 attention candidates fused" in out and "torch.ops.samhq.rel_pos_attention" in out


def test_finetune_example_trains_with_fused_attention(tmp_path, capsys):
    """The README's first command as it runs (Inductor, generated mask folder), shortened to 3 steps."""
    import finetune_samhq

    fresh_compile_state()
    result = finetune_samhq.main(["--steps", "3", "--device", "cpu", "--out", str(tmp_path)])
    assert result["fused"] == 2  # one windowed + one global layer
    assert all(math.isfinite(l) for l in result["losses"])
    assert result["evals"][0]["step"] == 0 and result["evals"][-1]["step"] == 3  # before and after training
    assert (tmp_path / "data" / "images").is_dir() and (tmp_path / "checkpoint-3" / "model").is_dir()
    out = capsys.readouterr().out
    assert "check: eager loss" in out and "attention blocks fused by samhq: 2" in out
