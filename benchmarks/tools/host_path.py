"""The op's host work per call, without a GPU: what `samhq_fx.rel_pos_attention` does in Python around its launches.

    python benchmarks/tools/host_path.py [--iters 300] [--out FILE.jsonl]

Results: benchmarks/results/host_path.jsonl (rows appended; --out elsewhere).

Method: SAM-B's windows layer (300 = 25 windows x 12 heads, 14x14 keys, head dim 64, bf16) on CPU tensors, with the
kernel launches replaced by a no-op (kernels/rel_pos_attention._launch) and the kernels' CPU gate opened
(TRITON_INTERPRET=1), so each row times the host code alone: the kernels' host functions (configs, copies,
allocations, argument lists), the op's checks and the autograd Function around them. Mean of `iters` calls after 20
warm-up calls, best of 7 (a shared CI host's noise lasts seconds; `op fwd + bwd` still varies by +-25% between runs).
The blocks are the interpreter's (kernels/configs.py): at this shape two split backward launches and no bias
copies; the H200's rows differ (tools/eager_op.py counts 7 GPU launches a call there, copies included). The
allocations run as CPU work here (on a GPU they are the caching allocator's), so `backward` and `op fwd + bwd`
include that CPU memory traffic. What Triton's launches cost is not in these rows: that needs a GPU
(tools/eager_op.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["TRITON_INTERPRET"] = "1"  # before the kernels import: their CPU gate

import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # benchmarks/: common
import common  # noqa: E402
from samhq_fx import op  # noqa: E402
from samhq_fx.kernels import rel_pos_attention as K  # noqa: E402

B, H, W, D = 300, 14, 14, 64


def us_per_call(f, iters: int) -> float:
    for _ in range(20):
        f()
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(iters):
            f()
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    return best


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", default=os.path.join(common.RESULTS_DIR, "host_path.jsonl"), help="JSON lines to append to")
    args = ap.parse_args(argv)
    K._launch = lambda *a, **kw: None
    op._kernel_skip_reason = lambda *ts: K.unsupported_reason(*ts)  # CPU tensors take the kernels' host path
    torch.manual_seed(0)
    n, dt = H * W, torch.bfloat16
    ts = [torch.randn(s, dtype=dt).requires_grad_() for s in [(B, n, D)] * 3 + [(B, n, H), (B, n, W)]]
    det = [t.detach() for t in ts]
    dout = torch.randn(B, n, D, dtype=dt)
    scale = D ** -0.5
    out, lse = K.forward(*det, scale)

    def op_call():
        o = op._EagerRelPosAttention.apply(*ts, scale)
        torch.autograd.grad(o, ts, dout)

    parts = {
        "forward": lambda: K.forward(*det, scale),  # kernels' host function
        "backward": lambda: K.backward(dout, *det, out, lse, scale),
        "op checks": lambda: op._check_inputs(*det, scale),
        "op fwd + bwd": op_call,  # autograd Function, checks, fallback guard, both host functions
    }
    meta = common.row_meta(common.env_info(), torch.device("cpu"))
    rows = [dict(meta, part=name, us=round(us_per_call(f, args.iters), 1), shape="windows", dtype="bf16",
                 cpus=os.cpu_count()) for name, f in parts.items()]
    common.append_rows(args.out, rows)
    for r in rows:
        print(f"{r['part']:14s} {r['us']:8.1f} us")


if __name__ == "__main__":
    main()
