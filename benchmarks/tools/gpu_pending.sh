#!/usr/bin/env bash
# The GPU run that decides what is built but off until timed (benchmarks/NOTES.md: host path, every SAM size):
# the head-dim chunks (SAMHQ_FX_SPLIT_HEAD_DIM), samhq.static_launch and samhq.rel_einsum. About 10 minutes on
# one H200; writes JSON under ${OUT:-gpu_pending_out}.
#   bash benchmarks/tools/gpu_pending.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_pending_out}
mkdir -p "$OUT/switches"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
# correctness first: every GPU test, with the chunked kernels on (they run the padded path's tests too)
SAMHQ_FX_SPLIT_HEAD_DIM=1 python -m pytest -q -m gpu -n 4 tests/test_kernels.py tests/test_gpu.py tests/test_op.py \
    tests/test_host_indices.py 2>&1 | tail -5
# head dim 80 padded against chunked, in one process each (ratios to head dim 64 in the table printed last)
python benchmarks/bench_attention_core.py --sam-sizes --out "$OUT" | tail -18
SAMHQ_FX_SPLIT_HEAD_DIM=1 python benchmarks/bench_attention_core.py --sam-sizes --out "$OUT/switches" | tail -18
# the default path: samhq as shipped against Inductor's builds, then samhq with both host switches on
for what in infer train; do
    python benchmarks/tools/profile_host.py --what $what --builds samhq,inductor-sdpa,inductor-eager --iters 10 \
        --out "$OUT" | grep -E "wall|area"
    SAMHQ_FX_STATIC_LAUNCH=1 SAMHQ_FX_REL_EINSUM=1 python benchmarks/tools/profile_host.py --what $what \
        --builds samhq --iters 10 --out "$OUT/switches" | grep -E "wall|area"
done
