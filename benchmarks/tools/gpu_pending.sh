#!/usr/bin/env bash
# The GPU runs behind the open targets of benchmarks/NOTES.md (host path, every SAM size): each part reproduces a
# recorded figure (decoder, tf32-train, vit-l and vit-h-train ran at c5401c0; ro-infer, ro-train, vit-l-train,
# ro-train-b1, tf32-train-b4, vit-h-infer and d80 on its code, 2026-12-03; infer-both, train-both-b1,
# train-both-b4 and d80 again at 050645a; tests, ro-train-tf32-b4, vit-h-train2, d80-ncu and static-ab at 22b570f;
# tests, vit-l-train-ro and vit-h-train-ro (one Inductor class), vit-h-infer-tf32-b8 and d80-bf16 at a6236b5,
# 2026-12-03) or measures one still open (vit-l-train-ro and vit-h-train-ro with both Inductor classes; d80's
# 64-query dQ on 8 warps and its K-major copies off; train-both-tf32, whose two Inductor classes ran against samhq
# in two processes; vit-l-train-mem and vit-h-train-mem, samhq.memory_budget, never run).
# Each part fits one 10-minute device command on one H200 (compiles take 30-280 s each there; ViT-H training
# 170-280 s a build); several parts in one command run one after the other:
#   bash benchmarks/tools/gpu_pending.sh tests        # every GPU test (~200 s with -n 12)
#   bash benchmarks/tools/gpu_pending.sh decoder      # the decoder recipe's whole step (frozen encoder, mask decoder
#                                                     # forward + backward, AdamW; batch 4), samhq and Inductor on
#                                                     # HF's "sdpa" class, each with and without its frozen weights
#                                                     # held in bf16 (cast_frozen_weights_; ~5 min)
#   bash benchmarks/tools/gpu_pending.sh tf32-train   # ViT-B forward + backward in TF32 at batch 1, samhq and Inductor
#   bash benchmarks/tools/gpu_pending.sh vit-l        # ViT-L inference cells not timed yet: TF32 B=8, bf16 B=1 against
#                                                     # Inductor's "eager" class (ViT-L compiles ~60 s a build)
#   bash benchmarks/tools/gpu_pending.sh vit-h-train  # ViT-H training step, samhq and Inductor in one process
#   bash benchmarks/tools/gpu_pending.sh ro-infer     # the reduce-overhead inference cells not yet timed against
#                                                     # Inductor's "sdpa" class: bf16 B=8, TF32 B=1 and B=8 (~20 s a
#                                                     # build; bf16 B=1 ran at c5401c0)
#   bash benchmarks/tools/gpu_pending.sh ro-train     # the reduce-overhead training step at bf16 B=4 against both
#                                                     # Inductor classes (ViT-B trains ~120 s a build)
#   bash benchmarks/tools/gpu_pending.sh vit-l-train  # ViT-L training step, bf16 B=1, samhq and Inductor in one process
#   bash benchmarks/tools/gpu_pending.sh vit-h-train2 # ViT-H training step at batch 2 (where activations weigh more
#                                                     # against the fixed weight and AdamW state)
#   bash benchmarks/tools/gpu_pending.sh vit-l-train-ro # ViT-L / ViT-H training step at bf16 B=1 under
#   bash benchmarks/tools/gpu_pending.sh vit-h-train-ro # reduce-overhead, samhq and both Inductor classes (ViT-H's
#                                                     # three builds ~8-9 min; at a6236b5 they ran without the
#                                                     # "eager" class, Inductor's faster one under CUDA graphs at ViT-B)
#   bash benchmarks/tools/gpu_pending.sh vit-l-train-mem # ViT-L / ViT-H training step at bf16 B=1 with
#   bash benchmarks/tools/gpu_pending.sh vit-h-train-mem # samhq.memory_budget 0.2 (samhq-eager-mem) against Inductor,
#                                                     # one process: the peak-memory target's other route
#   bash benchmarks/tools/gpu_pending.sh d80          # TF32 dK/dV and dQ configs at head dim 80, and the K-major copies
#                                                     # off (sweep_kernels.py)
#   bash benchmarks/tools/gpu_pending.sh d80-bf16     # bf16 forward / dQ with one grid row per key tile at ViT-H's
#                                                     # windows, head dims 80 and 64 (sweep_kernels.py; ~1 min)
#   bash benchmarks/tools/gpu_pending.sh d80-ncu      # ncu of ViT-H's global layer (16 heads, 64x64), bf16 and TF32:
#                                                     # head dim 64, 80 as 64 + 16, 80 padded to 128 (~4 min)
#   bash benchmarks/tools/gpu_pending.sh static-ab    # ViT-B inference bf16 B=1, the fused op launched by Inductor's
#                                                     # static launcher (the default) against Triton's, one process
#   bash benchmarks/tools/gpu_pending.sh ro-train-b1  # the reduce-overhead training step at batch 1, bf16 and TF32,
#                                                     # against both Inductor classes (6 ViT-B training builds)
#   bash benchmarks/tools/gpu_pending.sh tf32-train-b4 # ViT-B forward + backward in TF32 at batch 4, samhq and both
#                                                     # Inductor classes
#   bash benchmarks/tools/gpu_pending.sh vit-h-infer  # ViT-H inference cells not timed yet: bf16 B=8, TF32 B=1
#                                                     # against Inductor's "sdpa" and "eager" classes
#   bash benchmarks/tools/gpu_pending.sh vit-h-infer-tf32-b8 # ViT-H inference, TF32 B=8, against both Inductor
#                                                     # classes (~7 min)
#   bash benchmarks/tools/gpu_pending.sh ro-train-tf32-b4 # the reduce-overhead training step in TF32 at batch 4
#                                                     # against both Inductor classes
#   bash benchmarks/tools/gpu_pending.sh infer-both   # default-mode ViT-B inference cells timed so far against one
#                                                     # Inductor class: bf16 B=1 and B=8, TF32 B=8, with both
#   bash benchmarks/tools/gpu_pending.sh train-both-b1   # default-mode ViT-B forward + backward with both Inductor
#   bash benchmarks/tools/gpu_pending.sh train-both-b4   # classes where one was timed: bf16 B=1, bf16 B=4, TF32 B=1
#   bash benchmarks/tools/gpu_pending.sh train-both-tf32 # (3 training builds each, ~80-115 s a build)
# Writes logs and JSON under ${OUT:-gpu_pending_out}.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-gpu_pending_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -1
PH=benchmarks/tools/profile_host.py
for part in "${@:-tests}"; do
echo "=== $part"
case "$part" in
tests)
    # PYTHONSAFEPATH: not the repo root on sys.path, whose kernels/ would shadow the hub `kernels` package
    timeout 400 env PYTHONSAFEPATH=1 python -m pytest -v -rf -m gpu -n 12 --tb=short tests/ > "$OUT/tests.log" 2>&1
    grep -E "^E  |^tests/.*: in |FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -40 ;;  # why, not only which
decoder)
    timeout 330 python $PH --what decoder --batch 4 --builds samhq-sdpa,samhq-sdpa-held,inductor-sdpa,inductor-sdpa-held \
        --iters 10 --rounds 5 --out "$OUT" > "$OUT/decoder.log" 2>&1
    grep -E "wall|cudaStreamSynchronize|cudaMemcpy" "$OUT/decoder.log" ;;
tf32-train)
    timeout 330 python $PH --what train --dtype tf32 --builds samhq,inductor-eager --iters 5 --rounds 4 \
        --out "$OUT" > "$OUT/tf32-train.log" 2>&1
    grep -E "wall" "$OUT/tf32-train.log" ;;
vit-l)
    timeout 220 python $PH --model vit-l --what infer --dtype tf32 --batch 8 --builds samhq,inductor-eager \
        --iters 5 --rounds 4 --out "$OUT/tf32-b8" > "$OUT/vit-l-tf32-b8.log" 2>&1
    grep -E "wall" "$OUT/vit-l-tf32-b8.log"
    timeout 220 python $PH --model vit-l --what infer --builds samhq,inductor-eager \
        --iters 10 --rounds 4 --out "$OUT/bf16-b1" > "$OUT/vit-l-bf16-b1.log" 2>&1
    grep -E "wall" "$OUT/vit-l-bf16-b1.log" ;;
vit-h-train)
    timeout 590 python benchmarks/train_step.py --model vit-h --impls samhq-eager,inductor --modes default \
        --batch 1 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" > "$OUT/vit-h-train.log" 2>&1
    tail -4 "$OUT/vit-h-train.log" ;;
ro-infer)
    timeout 280 python benchmarks/inference.py --impls samhq-eager-ro,inductor-ro,inductor-eager-ro --batch 8 \
        --dtype bf16,tf32 --iters 20 --time-budget 260 --out "$OUT/ro-b8" > "$OUT/ro-infer-b8.log" 2>&1
    tail -3 "$OUT/ro-infer-b8.log"
    timeout 150 python benchmarks/inference.py --impls samhq-eager-ro,inductor-ro,inductor-eager-ro --batch 1 \
        --dtype tf32 --iters 20 --time-budget 130 --out "$OUT/ro-b1" > "$OUT/ro-infer-b1.log" 2>&1
    tail -3 "$OUT/ro-infer-b1.log" ;;
ro-train)
    timeout 590 python benchmarks/train_step.py --impls samhq-eager-ro,inductor-ro,inductor-eager-ro --modes \
        reduce-overhead --batch 4 --dtype bf16 --steps 10 --warmup 3 --time-budget 570 --out "$OUT" \
        > "$OUT/ro-train.log" 2>&1
    tail -4 "$OUT/ro-train.log" ;;
vit-l-train)
    timeout 590 python benchmarks/train_step.py --model vit-l --impls samhq-eager,inductor --modes default \
        --batch 1 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" > "$OUT/vit-l-train.log" 2>&1
    tail -4 "$OUT/vit-l-train.log" ;;
vit-h-train2)
    timeout 590 python benchmarks/train_step.py --model vit-h --impls samhq-eager,inductor --modes default \
        --batch 2 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" > "$OUT/vit-h-train2.log" 2>&1
    tail -4 "$OUT/vit-h-train2.log" ;;
vit-l-train-ro|vit-h-train-ro)
    timeout 590 python benchmarks/train_step.py --model "${part%-train-ro}" \
        --impls samhq-eager-ro,inductor-ro,inductor-eager-ro \
        --modes reduce-overhead --batch 1 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" \
        > "$OUT/$part.log" 2>&1
    tail -4 "$OUT/$part.log" ;;
vit-l-train-mem|vit-h-train-mem)
    timeout 590 python benchmarks/train_step.py --model "${part%-train-mem}" --impls samhq-eager-mem,inductor \
        --modes default --batch 1 --dtype bf16 --steps 5 --warmup 2 --time-budget 570 --out "$OUT" \
        > "$OUT/$part.log" 2>&1
    tail -4 "$OUT/$part.log" ;;
d80)
    timeout 560 python benchmarks/tools/sweep_kernels.py --d80-fp32 --out "$OUT" > "$OUT/d80.log" 2>&1
    tail -12 "$OUT/d80.log" ;;
d80-bf16)
    timeout 300 python benchmarks/tools/sweep_kernels.py --d80-bf16 --out "$OUT" > "$OUT/d80-bf16.log" 2>&1
    tail -8 "$OUT/d80-bf16.log" ;;
d80-ncu)
    PK=benchmarks/tools/profile_kernels.py
    for cell in "bf16 64 1" "bf16 80 1" "bf16 80 0" "fp32-tf32 64 1" "fp32-tf32 80 1" "fp32-tf32 80 0"; do
        read -r mode d chunks <<< "$cell"  # chunks 0: SAMHQ_FX_SPLIT_HEAD_DIM=0, head dim 80 padded to 128
        name="ncu-$mode-d$d-split$chunks"
        SAMHQ_FX_SPLIT_HEAD_DIM=$chunks timeout 150 ncu --clock-control none --section SpeedOfLight \
            --section Occupancy --section LaunchStats -k regex:"_fwd_kernel|_bwd_kernel" --csv --page details \
            python $PK --mode "$mode" --heads 16 --head-dim "$d" > "$OUT/$name.csv" 2>> "$OUT/d80-ncu.log"
        echo "--- $name"; python $PK --summarize "$OUT/$name.csv"
    done 2>&1 | tee "$OUT/d80-ncu.txt"
    tar -czf "$OUT/d80-ncu-csv.tgz" -C "$OUT" --remove-files $(cd "$OUT" && ls ncu-*.csv) ;;  # few files come back
static-ab)
    timeout 300 python $PH --what infer --builds samhq,samhq-triton-launcher --iters 20 --rounds 4 \
        --out "$OUT/static-ab" > "$OUT/static-ab.log" 2>&1
    grep -E "wall|launch" "$OUT/static-ab.log" ;;
ro-train-b1)
    timeout 590 python benchmarks/train_step.py --impls samhq-eager-ro,inductor-ro,inductor-eager-ro --modes \
        reduce-overhead --batch 1 --dtype bf16,tf32 --steps 10 --warmup 3 --time-budget 570 --out "$OUT" \
        > "$OUT/ro-train-b1.log" 2>&1
    tail -5 "$OUT/ro-train-b1.log" ;;
tf32-train-b4)
    timeout 500 python $PH --what train --dtype tf32 --batch 4 --builds samhq,inductor-eager,inductor-sdpa \
        --iters 5 --rounds 4 --out "$OUT" > "$OUT/tf32-train-b4.log" 2>&1
    grep -E "wall" "$OUT/tf32-train-b4.log" ;;
vit-h-infer)
    timeout 290 python $PH --model vit-h --what infer --batch 8 --builds samhq,inductor-sdpa,inductor-eager \
        --iters 5 --rounds 3 --out "$OUT/vit-h-bf16-b8" > "$OUT/vit-h-bf16-b8.log" 2>&1
    grep -E "wall" "$OUT/vit-h-bf16-b8.log"
    timeout 290 python $PH --model vit-h --what infer --dtype tf32 --builds samhq,inductor-sdpa,inductor-eager \
        --iters 10 --rounds 3 --out "$OUT/vit-h-tf32-b1" > "$OUT/vit-h-tf32-b1.log" 2>&1
    grep -E "wall" "$OUT/vit-h-tf32-b1.log" ;;
vit-h-infer-tf32-b8)
    timeout 400 python $PH --model vit-h --what infer --dtype tf32 --batch 8 --builds samhq,inductor-sdpa,inductor-eager \
        --iters 5 --rounds 3 --out "$OUT" > "$OUT/$part.log" 2>&1
    grep -E "wall" "$OUT/$part.log" ;;
ro-train-tf32-b4)
    timeout 590 python benchmarks/train_step.py --impls samhq-eager-ro,inductor-ro,inductor-eager-ro --modes \
        reduce-overhead --batch 4 --dtype tf32 --steps 10 --warmup 3 --time-budget 570 --out "$OUT" \
        > "$OUT/ro-train-tf32-b4.log" 2>&1
    tail -4 "$OUT/ro-train-tf32-b4.log" ;;
infer-both)
    for cell in "bf16 1 20" "bf16 8 5" "tf32 8 5"; do  # dtype, batch, calls per round
        read -r dt b it <<< "$cell"
        timeout 190 python $PH --what infer --dtype "$dt" --batch "$b" --builds samhq,inductor-sdpa,inductor-eager \
            --iters "$it" --rounds 4 --out "$OUT" > "$OUT/infer-both-$dt-b$b.log" 2>&1
        grep -E "wall" "$OUT/infer-both-$dt-b$b.log"
    done ;;
train-both-b1|train-both-b4|train-both-tf32)
    case "$part" in train-both-b1) dt=bf16 b=1 ;; train-both-b4) dt=bf16 b=4 ;; *) dt=tf32 b=1 ;; esac
    timeout 500 python $PH --what train --dtype "$dt" --batch "$b" --builds samhq,inductor-sdpa,inductor-eager \
        --iters 5 --rounds 4 --out "$OUT" > "$OUT/$part.log" 2>&1
    grep -E "wall" "$OUT/$part.log" ;;
*)
    parts="tests|decoder|tf32-train|vit-l|vit-h-train|ro-infer|ro-train|vit-l-train|vit-h-train2|vit-l-train-ro"
    parts="$parts|vit-h-train-ro|vit-l-train-mem|vit-h-train-mem|d80|d80-bf16|d80-ncu|static-ab"
    more="ro-train-b1|tf32-train-b4|vit-h-infer|vit-h-infer-tf32-b8|ro-train-tf32-b4|infer-both|train-both-b1|train-both-b4|train-both-tf32"
    echo "usage: $0 [$parts|$more]..." >&2
    exit 2 ;;
esac
done
