"""Tests for the op's host path: what it keeps per call signature (kernels/rel_pos_attention.py `_plan`, the kernels'
`unsupported_reason`, the op's input checks) is rebuilt when anything it read changes, and never hides an error.
"""

from __future__ import annotations

import pytest
import torch

try:
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root
    from kernels import rel_pos_attention as K
from samhq_fx import op


def _inputs(b=2, hk=3, wk=5, d=16, dtype=torch.float32):
    n = hk * wk
    q, k, v = (torch.randn(b, n, d, dtype=dtype) for _ in range(3))
    return q, k, v, torch.randn(b, n, hk, dtype=dtype), torch.randn(b, n, wk, dtype=dtype)


def test_plan_is_kept_per_signature_and_rebuilt_when_what_it_read_changes(monkeypatch):
    ts = _inputs()
    first = K._plan(K._fwd_plan, *ts)
    assert K._plan(K._fwd_plan, *_inputs()) is first  # same signature, other data
    assert K._plan(K._fwd_plan, *_inputs(wk=6)) is not first  # another key grid
    q, *rest = ts
    assert K._plan(K._fwd_plan, q.transpose(1, 2).contiguous().transpose(1, 2), *rest) is not first  # other strides
    monkeypatch.setattr(K.configs, "OVERRIDES", {"fwd": dict(BLOCK_M=32)})  # another config table
    swapped = K._plan(K._fwd_plan, *ts)
    assert swapped is not first and swapped.consts["BLOCK_M"] == 32
    monkeypatch.setattr(K.tiles, "SPLIT_HEAD_DIM", not K.tiles.SPLIT_HEAD_DIM)
    assert K._plan(K._fwd_plan, *ts) is not swapped


def test_plan_follows_matmul_precision(matmul_precision):
    ts = _inputs()
    matmul_precision("highest")
    assert K._plan(K._fwd_plan, *ts).consts["PREC"] == "tf32x3"
    matmul_precision("high")
    assert K._plan(K._fwd_plan, *ts).consts["PREC"] == "tf32"


def test_unsupported_reason_is_kept_per_signature():
    ts = _inputs()
    assert K.unsupported_reason(*ts) is None
    bad = _inputs(d=130)
    assert "head dim" in K.unsupported_reason(*bad)
    assert "head dim" in K.unsupported_reason(*bad)  # from the cache: the same answer


def test_input_checks_kept_only_for_signatures_that_passed():
    good = _inputs()
    op._check_inputs(*good, 0.25)
    op._check_inputs(*_inputs(), 0.25)  # the same signature: not checked again, and still no error
    q, k, v, rh, rw = good
    for _ in range(2):  # a failing signature is never kept: it raises every time
        with pytest.raises(TypeError, match="share one dtype"):
            op._check_inputs(q, k, v.double(), rh, rw, 0.25)
        with pytest.raises(TypeError, match="scale"):
            op._check_inputs(*good, "0.25")
