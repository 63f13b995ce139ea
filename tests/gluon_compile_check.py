"""Compile the Gluon experiments (kernels/forward_gluon.py, backward_gluon.py) for sm_90 on the CPU and check
their schedule (the dQ: every exponential between its two waits, no spills; the forward's s_ahead schedule: a
softmax after a wait that leaves one MMA in flight).
In the PTX of the key loop: two MMAs issued, a wait that leaves one in flight (S_j done, P V running) before the
softmax, then a wait for none. With P through shared memory (P_SMEM) the SASS must keep it too: ptxas puts the
exponentials between the two waits. With P in registers it moves the second wait above them (NOTES, session 10),
which the check records but allows. Run as a script without TRITON_INTERPRET (tests/test_kernels_compile.py
does); the compiling and SASS reading is benchmarks/offline_sm90.py's. No GPU needed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import offline_sm90 as O  # noqa: E402

try:
    from samhq_fx.kernels import backward_gluon as BG
    from samhq_fx.kernels import forward_gluon as G
except ImportError:
    from kernels import backward_gluon as BG
    from kernels import forward_gluon as G


def main():
    for block_m, num_warps, stages, hk, p_smem in ((64, 4, G.STAGES, 64, False), (128, 8, 2, 7, False),
                                                   (64, 4, G.STAGES, 64, True)):
        r = O.report(O.compile_gluon_forward(block_m, num_warps, stages, hk, p_smem), num_warps)
        if "1" not in r["waits"]:
            raise RuntimeError(f"no wait that leaves one MMA in flight: {r['waits']}")
        exps = r["exps_between_waits"]
        if p_smem and (not exps or min(exps) < 32):  # 64 x 64 scores over 128 threads: 32 exponentials a step
            raise RuntimeError(f"P in shared memory, yet the softmax is not under the P V MMA: {exps}")
        if r["ctas_per_sm"] < 1 or r["local"]:
            raise RuntimeError(f"does not fit, or spills: {r}")
        print(f"ok forward_gluon {block_m}x{num_warps}w{stages}s hk={hk} p_smem={p_smem}: {r}", flush=True)
    # the s_ahead schedule (session 15): not serialized by ptxas, and a whole tile's softmax (32 exponentials a
    # thread) after a wait that leaves one MMA in flight
    r = O.report(O.compile_gluon_forward(64, 4, 4, 64, False, "s_ahead", 168), 4)
    if not r["exps_after_partial_waits"] or max(r["exps_after_partial_waits"]) < 32 or r["local"]:
        raise RuntimeError(f"the s_ahead forward lost its schedule or spills: {r}")
    print(f"ok forward_gluon s_ahead 64x4w4s maxnreg 168: {r}", flush=True)
    # the dQ (backward_gluon.py) at its shipped config: every exponential under the dQ MMA (8 warps: 16 a thread)
    r = O.report(O.compile_gluon_dq(BG.BLOCK_M, BG.NUM_WARPS, BG.STAGES, 64), BG.NUM_WARPS)
    per_thread = 64 * 64 // (32 * BG.NUM_WARPS)
    if not r["exps_between_waits"] or min(r["exps_between_waits"]) < per_thread or r["local"] or r["stack"]:
        raise RuntimeError(f"the Gluon dQ lost its overlap or spills: {r}")
    print(f"ok dq_gluon {BG.BLOCK_M}x{BG.NUM_WARPS}w{BG.STAGES}s: {r}", flush=True)


if __name__ == "__main__":
    main()
