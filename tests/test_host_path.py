"""Tests for the op's host path: what it keeps per call signature (kernels/rel_pos_attention.py `_plan`, the kernels'
`unsupported_reason`, the op's input checks) is rebuilt when anything it read changes, and never hides an error; and
the direct launches of compiled kernels (kernels/launcher.py), whose bookkeeping runs here against a stand-in kernel
(the first launch of a key through JITFunction.run, later ones through the compiled binary with the constexprs
appended in parameter order, a new binary per pointer alignment, Triton's launch hooks honoured). That real Triton
binaries give the same bits both ways is a GPU test (test_kernels.py, test_gpu_direct_launch_bits).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

try:
    from samhq_fx.kernels import launcher
    from samhq_fx.kernels import rel_pos_attention as K
except ImportError:  # `python -m pytest` from the repo root
    from kernels import launcher
    from kernels import rel_pos_attention as K
from samhq_fx import op


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the kernels take CPU tensors only under the interpreter


def _inputs(b=2, hk=3, wk=5, d=16, dtype=torch.float32):
    n = hk * wk
    q, k, v, rel_h, rel_w = (torch.randn(b, n, c, dtype=dtype, device=DEVICE) for c in (d, d, d, hk, wk))
    return q, k, v, rel_h, rel_w


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


def test_launch_arguments_kept_in_a_plan_are_a_fresh_calls_and_the_scale_is_not_kept(monkeypatch):
    calls = []
    monkeypatch.setattr(K, "_launch", lambda kernel, grid, *args, cache=None, **kw: calls.append((grid, args, kw)))

    def launches(scale):  # forward + backward, kernels stubbed: what each launch was given but its tensors
        calls.clear()
        ts = _inputs(hk=7, wk=10)  # fp32 over 8 keys wide: the K-major and transposed-bias copies are made
        out, lse = K.forward(*ts, scale)
        K.backward(torch.randn_like(out), *ts, out, lse, scale)
        return [(grid, [a for a in args if not isinstance(a, torch.Tensor)], kw) for grid, args, kw in calls]

    K._PLANS.clear()
    cold = launches(0.25)
    kept = launches(0.5)  # the plan the first call built
    K._PLANS.clear()
    fresh = launches(0.5)
    assert len(kept) >= 2 and kept == fresh
    assert [c[1] for c in cold] != [c[1] for c in kept]  # the scale differs: it is an argument of each call


def test_unsupported_reason_is_kept_per_signature():
    ts = _inputs()
    assert K.unsupported_reason(*ts) is None
    bad = _inputs(d=130)
    assert "head dim" in K.unsupported_reason(*bad)
    assert "head dim" in K.unsupported_reason(*bad)  # from the cache: the same answer


def test_input_checks_traced_without_the_memo_keep_a_dynamic_batch_dynamic():
    # under Dynamo the kept-signature lookup would specialize every size: one frame for every batch size here
    from torch._dynamo.testing import CompileCounter

    torch._dynamo.reset()
    counter = CompileCounter()
    f = torch.compile(lambda *ts: op.rel_pos_attention(*ts, scale=0.25), backend=counter, dynamic=True)
    for b in (2, 3, 4, 5):
        f(*_inputs(b=b))
    assert counter.frame_count == 1


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


class _Kernel:
    """Stands in for a JITFunction: params (name, default) and kernel[grid](...) returning a compiled kernel."""

    def __init__(self):
        self.params = [SimpleNamespace(name=n, default=d) for n, d in
                       (("X", None), ("n", None), ("BLOCK", None), ("FLAG", False))]
        self.jit_launches, self.binary_launches, self.pre_run_hooks = [], [], []
        self.returns_binary = True

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_launches.append((grid, args, kwargs))
            if not self.returns_binary:
                return None
            return SimpleNamespace(run=lambda *a: self.binary_launches.append(a),
                                   function=f"fn{len(self.jit_launches)}", packed_metadata="meta")

        return run


@pytest.fixture
def stub_driver(monkeypatch):
    active = SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 1234)
    monkeypatch.setattr(launcher, "driver", SimpleNamespace(active=active))


@pytest.mark.parametrize("value, on", [(None, True), ("", True), ("1", True), ("0", False)])
def test_direct_launches_are_on_unless_turned_off(monkeypatch, value, on):
    import importlib

    if value is None:
        monkeypatch.delenv("SAMHQ_FX_DIRECT_LAUNCH", raising=False)
    else:
        monkeypatch.setenv("SAMHQ_FX_DIRECT_LAUNCH", value)
    try:
        assert importlib.reload(launcher).ENABLED is (on and launcher._CALL_LAYOUT_READ)
    finally:
        monkeypatch.undo()
        importlib.reload(launcher)


def test_second_launch_of_a_key_calls_the_binary_with_constexprs_in_order(stub_driver):
    kernel, cache, x = _Kernel(), {}, torch.zeros(8)
    launcher.launch(kernel, (3, 2), cache, (x, 5), dict(BLOCK=16, num_warps=4))
    assert len(kernel.jit_launches) == 1 and not kernel.binary_launches
    launcher.launch(kernel, (3, 2), cache, (x, 5), dict(BLOCK=16, num_warps=4))
    assert len(kernel.jit_launches) == 1
    # grid padded to 3 dims, the stream, the binary, no launch metadata or hooks, then every argument in order
    # (FLAG from its default; num_warps is a launch option, not an argument)
    assert kernel.binary_launches == [(3, 2, 1, 1234, "fn1", "meta", None, None, None, x, 5, 16, False)]


def test_another_pointer_alignment_compiles_again(stub_driver):
    kernel, cache = _Kernel(), {}
    buf = torch.zeros(64)
    launcher.launch(kernel, (1,), cache, (buf[:8], 5), dict(BLOCK=16))
    launcher.launch(kernel, (1,), cache, (buf[1:9], 5), dict(BLOCK=16))  # 4 bytes past a 16-byte boundary
    assert len(kernel.jit_launches) == 2 and not kernel.binary_launches
    launcher.launch(kernel, (1,), cache, (buf[4:12], 5), dict(BLOCK=16))  # 16 bytes in: aligned again
    assert len(kernel.jit_launches) == 2 and kernel.binary_launches[0][4] == "fn1"


def test_launch_hooks_take_every_launch_through_jit(stub_driver, monkeypatch):
    kernel, cache, x = _Kernel(), {}, torch.zeros(8)
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    monkeypatch.setattr(launcher.knobs.runtime, "launch_enter_hook", lambda *a: None)
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    assert len(kernel.jit_launches) == 2 and not kernel.binary_launches


def test_a_launch_no_binary_came_back_for_is_not_kept(stub_driver):
    kernel, cache, x = _Kernel(), {}, torch.zeros(8)
    kernel.returns_binary = False  # as JITFunction.run does where a jit_cache_hook took the launch
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    assert len(kernel.jit_launches) == 2 and not cache


def test_pre_run_hooks_take_every_launch_through_jit(stub_driver):
    kernel, cache, x = _Kernel(), {}, torch.zeros(8)
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    kernel.pre_run_hooks.append(lambda *a, **kw: None)
    launcher.launch(kernel, (1,), cache, (x, 5), dict(BLOCK=16))
    assert len(kernel.jit_launches) == 2 and not kernel.binary_launches
