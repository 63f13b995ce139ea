#!/usr/bin/env bash
# The GPU runs that decide what is still open (benchmarks/NOTES.md: host path, every SAM size): every GPU test,
# samhq.static_launch timed alone, the default-mode training profile with its Inductor peers, and the ViT-L / ViT-H
# cells. Each part fits one 10-minute device command on one H200 (compiles take 30-130 s each there):
#   bash benchmarks/tools/gpu_pending.sh tests      # every GPU test (head dims in chunks are the default)
#   bash benchmarks/tools/gpu_pending.sh host       # static launch on / off, inference and training, ViT-B bf16 B=1
#   bash benchmarks/tools/gpu_pending.sh vit-h      # ViT-H training step and inference against Inductor, bf16 B=1
# Writes logs and JSON under ${OUT:-gpu_pending_out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_pending_out}
mkdir -p "$OUT/static"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
case "${1:-tests}" in
tests)
    python -m pytest -v -rf -m gpu -n 12 tests/ > "$OUT/tests.log" 2>&1
    grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -8 ;;
host)
    for what in infer train; do
        python benchmarks/tools/profile_host.py --what $what --builds samhq,inductor-sdpa,inductor-eager --iters 10 \
            --out "$OUT" | grep -E "wall"
        SAMHQ_FX_STATIC_LAUNCH=1 python benchmarks/tools/profile_host.py --what $what --builds samhq --iters 10 \
            --out "$OUT/static" | grep -E "wall"
    done ;;
vit-h)
    python benchmarks/train_step.py --model vit-h --impls inductor,inductor-eager,samhq-eager --modes default \
        --batch 1 --dtype bf16 --steps 8 --out "$OUT" | tail -4
    python benchmarks/inference.py --model vit-h --impls inductor,inductor-eager,samhq-eager --modes default \
        --batch 1 --dtype bf16 --out "$OUT" | tail -4 ;;
*)
    echo "usage: $0 tests|host|vit-h" >&2; exit 2 ;;
esac
