"""Compile the TMA / warp-specialized experiments (kernels/forward_tma.py, backward_tma.py) for sm_90, no GPU.

Run as a script with TRITON_INTERPRET unset (tests/test_kernels_compile.py does). For each kernel, with and
without warp specialization: it compiles, fits an sm_90 block's shared memory, and with WS the TTGIR has the
producer / consumer split with each query-side (forward) or key-side (dK/dV) tensor map's box halved to the
consumer's 64 rows (query side for forward and dQ, key side for dK/dV): the spelling that Triton 3.6 splits correctly (forward_tma.py's comments). A Triton
upgrade that stops splitting (twice the work) or splits differently fails here, before a GPU sees it.
"""

import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import samhq_fx.kernels.backward_tma as BT
import samhq_fx.kernels.forward_tma as FT

_SM90_MAX_SHARED = 232448


def compile_kernel(fn, consts: dict, descs: dict, ints: tuple, floats: tuple, num_warps: int):
    sig, constexprs = {}, {}
    for i, p in enumerate(fn.arg_names):
        if p in consts:
            sig[p], constexprs[(i,)] = "constexpr", consts[p]
        elif p in descs:
            dtype, block = descs[p]
            sig[p] = f"tensordesc<{dtype}[{', '.join(map(str, block))}]>"
        elif p in ints:
            sig[p] = "i32"
        elif p in floats:
            sig[p] = "fp32"
        else:
            sig[p] = "*fp32" if p in ("LSE", "DELTA") else "*bf16"
    compiled = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps))
    if compiled.metadata.shared > _SM90_MAX_SHARED:
        raise RuntimeError(f"{fn.__name__}: {compiled.metadata.shared} bytes of shared memory")
    return compiled.asm["ttgir"], compiled.metadata.shared


def check_split(ttgir: str, name: str, maps: tuple) -> None:
    if "ttg.warp_specialize" not in ttgir:
        raise RuntimeError(f"{name}: no warp specialization in the TTGIR")
    boxes = dict(re.findall(r"tensormap_create %(\w+?)(?:_\d+)?, %\w+, \[%c\d+_i32, %c(\d+)_i32\]", ttgir))
    for desc in maps:
        if boxes.get(desc) != "64":
            raise RuntimeError(f"{name}: {desc}'s box has {boxes.get(desc)} rows, not the consumer's 64 ({boxes})")


def main():
    d, grid = 64, 64
    for ws in (False, True):
        consts = dict(HK=grid, WK=grid, WK_PAD=grid, D=d, DV=d, BLOCK_M=128, WS=ws)
        descs = {"k_desc": ("bf16", [1, grid, d]), "v_desc": ("bf16", [1, grid, d])}
        ttgir, smem = compile_kernel(FT._fwd_tma_kernel, consts, descs, ("so_b", "so_n", "slse_b", "N_Q", "N_ROWS"),
                                     ("qk_scale",), 8 if not ws else 4)
        if ws:
            check_split(ttgir, "forward_tma", ("q_desc", "rw_desc", "rh_desc"))
        print(f"ok forward_tma ws={ws}: {smem} bytes shared", flush=True)

        consts = dict(HK=grid, WK=grid, D=d, DV=d, BLOCK_M=64, BLOCK_N=BT.BLOCK_KEYS, WS=ws)
        descs = {"q_desc": ("bf16", [64, d]), "do_desc": ("bf16", [64, d]), "lse_desc": ("fp32", [1, 64]),
                 "delta_desc": ("fp32", [1, 64]), "rht_desc": ("bf16", [16, 64])}
        ttgir, smem = compile_kernel(BT._dkdv_tma_kernel, consts, descs, ("N_Q", "N_K", "N_KEY_ROWS", "N_RWT_ROWS"),
                                     ("qk_scale", "scale"), 8 if not ws else 4)
        if ws:
            check_split(ttgir, "dkdv_tma", ("k_desc", "v_desc", "rwt_desc"))
        print(f"ok dkdv_tma ws={ws}: {smem} bytes shared", flush=True)

        consts = dict(HK=grid, WK=grid, WK_PAD=grid, HK_PAD=grid, D=d, DV=d, BLOCK_M=128, WS=ws)
        descs = {"k_desc": ("bf16", [1, grid, d]), "v_desc": ("bf16", [1, grid, d])}
        ttgir, smem = compile_kernel(BT._dq_tma_kernel, consts, descs, ("N_Q", "N_ROWS"), ("qk_scale", "scale"),
                                     8 if not ws else 4)
        if ws:
            check_split(ttgir, "dq_tma", ("q_desc", "do_desc", "rw_desc", "rh_desc"))
        print(f"ok dq_tma ws={ws}: {smem} bytes shared", flush=True)


if __name__ == "__main__":
    sys.exit(main())
