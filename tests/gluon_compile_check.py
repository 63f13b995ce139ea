"""Compile the Gluon forward experiment (kernels/forward_gluon.py) for sm_90 on the CPU and check that the
PTX keeps its schedule: in the key loop two MMAs are issued, then a wait that leaves one in flight (S_j done,
P V running) before the softmax, then a wait for none. With P through shared memory (P_SMEM) the SASS must
keep it too: ptxas puts the exponentials between the two waits (WARPGROUP.DEPBAR.LE gsb0 1, then 0). With P in
registers it moves the second wait above them (NOTES, session 10), which the check records but allows.
Run as a script without TRITON_INTERPRET (tests/test_kernels_compile.py does). No GPU needed."""

import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

try:
    from samhq_fx.kernels import forward_gluon as G
except ImportError:
    sys.path.insert(0, ".")
    from kernels import forward_gluon as G

CONSTS = ("HK", "BLOCK_M", "BLOCK_N", "D", "STAGES", "P_SMEM", "num_warps")


def compile_forward(block_m: int, num_warps: int, stages: int, hk: int, p_smem: bool):
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
    values = dict(HK=hk, BLOCK_M=block_m, BLOCK_N=64, D=64, STAGES=stages, P_SMEM=p_smem, num_warps=num_warps)
    consts = {(fn.arg_names.index(p),): values[p] for p in CONSTS}
    src = GluonASTSource(fn, sig, consts, {})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps))


def exps_between_waits(cubin: bytes) -> list[int]:
    """Per key-loop step of the SASS: MUFU.EX2 between a 'wait until 1 MMA in flight' and 'wait until 0'."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    counts, inside, n = [], False, 0
    for op in re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x[01]|MUFU\.EX2", sass):
        if op.endswith("0x1"):
            inside, n = True, 0
        elif op.endswith("0x0"):
            if inside:
                counts.append(n)
            inside = False
        else:
            n += inside
    return counts


def main():
    for block_m, num_warps, stages, hk, p_smem in ((64, 4, G.STAGES, 64, False), (128, 8, 2, 7, False),
                                                   (64, 4, G.STAGES, 64, True)):
        compiled = compile_forward(block_m, num_warps, stages, hk, p_smem)
        waits = re.findall(r"wgmma\.wait_group\.sync\.aligned\s+(\d+)", compiled.asm["ptx"])
        if "1" not in waits:
            raise RuntimeError(f"no wait that leaves one MMA in flight: {waits}")
        exps = exps_between_waits(compiled.asm["cubin"])
        if p_smem and (not exps or min(exps) < 32):  # 64 x 64 scores over 128 threads: 32 exponentials a step
            raise RuntimeError(f"P in shared memory, yet the softmax is not under the P V MMA: {exps}")
        if compiled.metadata.shared > 232448:
            raise RuntimeError(f"{compiled.metadata.shared} bytes of shared memory")
        print(f"ok forward_gluon {block_m}x{num_warps}w{stages}s hk={hk} p_smem={p_smem}: waits {waits}, exps between them {exps}, "
              f"{compiled.metadata.shared} bytes shared", flush=True)


if __name__ == "__main__":
    main()
