"""Compile the Gluon forward experiment (kernels/forward_gluon.py) for sm_90 on the CPU and check that the
PTX keeps its schedule: in the key loop two MMAs are issued, then a wait that leaves one in flight (S_j done,
P V running) before the softmax, then a wait for none. Run as a script without TRITON_INTERPRET
(tests/test_kernels_compile.py does). No GPU needed; ptxas's SASS schedule is not checked here (NOTES,
session 10: ptxas moves the second wait up)."""

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

try:
    from samhq_fx.kernels import forward_gluon as G
except ImportError:
    sys.path.insert(0, ".")
    from kernels import forward_gluon as G

CONSTS = ("HK", "BLOCK_M", "BLOCK_N", "D", "STAGES", "num_warps")


def compile_forward(block_m: int, num_warps: int, stages: int, hk: int):
    fn = G._fwd_gluon_kernel
    q_l = gl.NVMMASharedLayout.get_default_for([block_m, 64], gl.bfloat16)
    kv_l = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    sig = {}
    for p in fn.arg_names:
        if p == "q_desc":
            sig[p] = f"tensordesc<bf16[{block_m}, 64],{q_l!r}>"
        elif p in ("k_desc", "v_desc"):
            sig[p] = f"tensordesc<bf16[64, 64],{kv_l!r}>"
        elif p in ("RH", "RW", "O"):
            sig[p] = "*bf16"
        elif p == "LSE":
            sig[p] = "*fp32"
        elif p == "qk_scale":
            sig[p] = "fp32"
        elif p in CONSTS:
            sig[p] = "constexpr"
        else:
            sig[p] = "i32"
    values = dict(HK=hk, BLOCK_M=block_m, BLOCK_N=64, D=64, STAGES=stages, num_warps=num_warps)
    consts = {(fn.arg_names.index(p),): values[p] for p in CONSTS}
    src = GluonASTSource(fn, sig, consts, {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def main():
    for block_m, num_warps, stages, hk in ((64, 4, G.STAGES, 64), (128, 8, 2, 7)):
        compiled = compile_forward(block_m, num_warps, stages, hk)
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", compiled.asm["ptx"])
        if "1" not in waits:
            raise RuntimeError(f"no wait that leaves one MMA in flight: {waits}")
        if compiled.metadata.shared > 232448:
            raise RuntimeError(f"{compiled.metadata.shared} bytes of shared memory")
        print(f"ok forward_gluon {block_m}x{num_warps}w{stages}s hk={hk}: waits {waits}, "
              f"{compiled.metadata.shared} bytes shared", flush=True)


if __name__ == "__main__":
    main()
