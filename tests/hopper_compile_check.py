"""Compile every kernel launch of forward/backward for sm_90, typed as Inductor types user kernels.

Run as a script with TRITON_INTERPRET unset (tests/test_kernels_compile.py does): the host functions
run on meta tensors with wrap_triton replaced by a recorder, then each recorded launch is compiled
by Triton for an H100/H200 target. No GPU needed. Inductor passes Python floats as fp64 scalars, and
ints equal to 1 as constants, so the kernels must compile with exactly those types.
"""

import sys

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

launches = []


class _Recorder:
    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            launches.append((self.kernel, args, kwargs))

        return record


torch.library.wrap_triton = _Recorder
import samhq_fx.kernels.rel_pos_attention as K  # noqa: E402

_SM90_MAX_SHARED = 232448  # bytes per block, opt-in maximum on sm_90
_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}


def compile_launch(kernel, args, kwargs):
    names = [p.name for p in kernel.params]
    sig, consts = {}, {}
    for name, val in zip(names, args):
        if isinstance(val, torch.Tensor):
            sig[name] = _PTR[val.dtype]
        elif isinstance(val, float):
            sig[name] = "fp64"  # what Inductor's user-kernel codegen declares for Python floats
        elif val == 1:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
    for name in names[len(args):]:
        sig[name], consts[name] = "constexpr", kwargs[name]
    src = ASTSource(fn=kernel, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()})
    opts = {k: kwargs[k] for k in ("num_warps", "num_stages") if k in kwargs}
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    # A config that compiles but wants more shared memory than an H100/H200 block may have fails only at
    # launch, on the GPU ("highest" dK/dV at 289 KB, 78b6907); catch it here.
    if compiled.metadata.shared > _SM90_MAX_SHARED:
        raise RuntimeError(f"{kernel.__name__} {kwargs}: {compiled.metadata.shared} bytes of shared memory, "
                           f"sm_90 allows {_SM90_MAX_SHARED}")


def compile_case(dtype, prec, grid, d) -> int:
    """Record every launch of forward + backward on meta tensors, compile each for sm_90; returns the count."""
    torch.set_float32_matmul_precision(prec)
    b, n = 2, grid * grid
    q, k, v = (torch.empty(b, n, d, device="meta", dtype=dtype) for _ in range(3))
    rh, rw = (torch.empty(b, n, grid, device="meta", dtype=dtype) for _ in range(2))
    launches.clear()
    out, lse = K.forward(q, k, v, rh, rw, 0.125)
    K.backward(torch.empty_like(out), q, k, v, rh, rw, out, lse, 0.125)
    for kernel, args, kwargs in launches:
        compile_launch(kernel, args, kwargs)
    return len(launches)


def main():
    # narrow grid (several grid rows per key tile), wide grid (one row per tile), ViT-H head dim (80 = 64 + 16:
    # two chunks) at its window and global grids, and bf16 at SAM's global 64x64 grid (dK/dV with the transposed
    # bias copies)
    cases = [(torch.float32, "high", 7, 64), (torch.float32, "high", 32, 64), (torch.float32, "highest", 64, 64),
             (torch.float32, "highest", 14, 64), (torch.bfloat16, "highest", 14, 80), (torch.bfloat16, "high", 64, 64),
             (torch.bfloat16, "highest", 64, 80), (torch.float32, "highest", 64, 80)]
    for dtype, prec, grid, d in cases:
        for split in (False, True) if d & (d - 1) else (False,):  # head dims padded and in two chunks
            K.tiles.SPLIT_HEAD_DIM = split
            n = compile_case(dtype, prec, grid, d)
            print(f"ok {dtype} {prec} grid={grid} d={d} split={split}: {n} kernels", flush=True)
    K.tiles.SPLIT_HEAD_DIM = False
    # sweep options, so they must compile too: rel_h by selects in dK/dV and dQ (the forward has it by
    # default) at 7x7, and one fused backward launch, bf16 at 64x64 with 128-key dK/dV tiles (R = 2)
    K.configs.OVERRIDES = {"dq": dict(RH_SELECT=True), "dkdv": dict(RH_SELECT=True)}
    n = compile_case(torch.float32, "high", 7, 64)
    print(f"ok RH_SELECT grid=7: {n} kernels", flush=True)
    K.configs.OVERRIDES = {"bwd": dict(FUSED=True), "dkdv": dict(BLOCK_N=128, BLOCK_M=32, RH_SELECT=True)}
    n = compile_case(torch.bfloat16, "high", 64, 64)
    print(f"ok fused bwd grid=64: {n} kernels", flush=True)
    K.configs.OVERRIDES = {}

if __name__ == "__main__":
    sys.exit(main())
