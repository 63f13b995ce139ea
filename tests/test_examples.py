"""The examples run (CPU) and do what they claim: fuse every vision attention layer, train, dump."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from helpers import fresh_compile_state, rel_err, whole_samhq_model_and_loss

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
    # the eager baseline's ms/step beside samhq's, and what CPU numbers are worth
    assert "first batch, forward + backward, median of 3 (no optimizer step): eager " in out
    assert "note: on CPU samhq is checked for correctness, not speed" in out


def test_whole_samhq_model_builder_fuses_on_cpu(tmp_path):
    # the builder behind the GPU whole-model CUDA-graph test, kept working in CI: the example's model and batch,
    # the whole SamHQModel compiled with samhq, both attention blocks fused, loss and a gradient equal to eager
    import torch
    from torch._dynamo.utils import counters

    fresh_compile_state()
    model, loss_fn = whole_samhq_model_and_loss(tmp_path, "cpu")
    ref = loss_fn(model)
    ref.backward()
    name, param = next((n, p) for n, p in model.named_parameters() if "rel_pos_h" in n)
    ref_grad = param.grad.clone()
    model.zero_grad(set_to_none=True)
    loss = loss_fn(torch.compile(model, backend="samhq"))
    loss.backward()
    assert counters["samhq"]["fused"] == 2
    assert rel_err(loss, ref) < 1e-5
    assert rel_err(param.grad, ref_grad) < 1e-4, name


def test_readme_sections_the_examples_name_exist():
    # a docstring that sends the reader to "the README's X section" names a heading the README has
    import re

    root = Path(__file__).resolve().parents[1]
    headings = set(re.findall(r"^#+ (.+)$", (root / "README.md").read_text(), re.M))
    named = {(path.name, m) for path in (root / "examples").glob("*.py")
             for m in re.findall(r"README's (\w[\w -]*?) section", path.read_text())}
    assert ("finetune_samhq.py", "Limitations") in named
    assert {m for _, m in named} <= headings, sorted(named)
