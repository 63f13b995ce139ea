#!/usr/bin/env bash
# The GPU runs that decide what is still open (benchmarks/NOTES.md: host path, every SAM size). Each part fits one
# 10-minute device command on one H200 (compiles take 30-280 s each there; ViT-H training ~280 s a build):
#   bash benchmarks/tools/gpu_pending.sh tests        # every GPU test (~220 s with -n 12)
#   bash benchmarks/tools/gpu_pending.sh static       # ViT-B inference, bf16 B=1: samhq with and without the
#                                                     # static launcher, Inductor
#   bash benchmarks/tools/gpu_pending.sh vit-h-infer  # ViT-H inference, bf16 B=1: samhq, samhq with Inductor's
#                                                     # C++ wrapper, Inductor
#   bash benchmarks/tools/gpu_pending.sh vit-h-train  # ViT-H training step, samhq and Inductor in one process
#   bash benchmarks/tools/gpu_pending.sh train        # ViT-B forward + backward profile, samhq and Inductor
#   bash benchmarks/tools/gpu_pending.sh tf32         # ViT-B inference in TF32, batch 1, default mode
#   bash benchmarks/tools/gpu_pending.sh d80          # TF32 dK/dV and dQ configs at head dim 80 (sweep_kernels.py)
# Writes logs and JSON under ${OUT:-gpu_pending_out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_pending_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
case "${1:-tests}" in
tests)
    timeout 400 python -m pytest -v -rf -m gpu -n 12 tests/ > "$OUT/tests.log" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -8 ;;
static)
    timeout 560 python benchmarks/tools/profile_host.py --what infer \
        --builds samhq,samhq-triton-launcher,inductor-sdpa --iters 20 --rounds 5 --out "$OUT" > "$OUT/static.log" 2>&1
    grep -E "wall" "$OUT/static.log" ;;
vit-h-infer)
    timeout 560 python benchmarks/tools/profile_host.py --model vit-h --what infer \
        --builds samhq,samhq-cpp,inductor-sdpa --iters 10 --rounds 5 --out "$OUT" > "$OUT/vit-h-infer.log" 2>&1
    grep -E "wall" "$OUT/vit-h-infer.log" ;;
vit-h-train)
    timeout 590 python benchmarks/train_step.py --model vit-h --impls samhq-eager,inductor --modes default \
        --batch 1 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" > "$OUT/vit-h-train.log" 2>&1
    tail -4 "$OUT/vit-h-train.log" ;;
train)
    timeout 560 python benchmarks/tools/profile_host.py --what train \
        --builds samhq,inductor-sdpa,inductor-eager --iters 10 --rounds 5 --out "$OUT" > "$OUT/train.log" 2>&1
    grep -E "wall" "$OUT/train.log" ;;
d80)
    timeout 560 python benchmarks/tools/sweep_kernels.py --d80-fp32 --out "$OUT" > "$OUT/d80.log" 2>&1
    tail -12 "$OUT/d80.log" ;;
tf32)
    timeout 560 python benchmarks/inference.py --impls samhq-eager,inductor,inductor-eager --modes default \
        --batch 1 --dtype tf32 --iters 10 --time-budget 540 --out "$OUT" > "$OUT/tf32.log" 2>&1
    tail -4 "$OUT/tf32.log" ;;
*)
    echo "usage: $0 tests|static|vit-h-infer|vit-h-train|train|tf32|d80" >&2; exit 2 ;;
esac
