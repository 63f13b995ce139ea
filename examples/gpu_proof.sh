#!/usr/bin/env bash
# GPU proof of examples/finetune_samhq.py: each --train recipe (decoder, lora, full) with --backend samhq and
# --backend inductor, a few dozen bf16 steps on a random-init SAM-HQ ViT-B saved with save_pretrained (no real
# checkpoint is reachable offline) and a generated 1024x1024 mask folder; then one table of ms/step, the first
# batch's forward + backward eager and compiled (the run's check), peak memory and validation IoU before / after,
# from each run's summary.json.
#
#   bash examples/gpu_proof.sh                      # all three recipes, 30 steps, batch 4
#   STEPS=40 BATCH=2 bash examples/gpu_proof.sh decoder full
#   MODEL=vit-h BATCH=2 bash examples/gpu_proof.sh full lora   # SAM-HQ's ViT-H encoder
#   IMAGE_SIZE=256 BATCH=16 bash examples/gpu_proof.sh full   # trained at 256x256 (SAM-Med2D's size): --image-size
#                                                   # 256, the 1024 model's position embeddings on 16x16 patches
#   BACKENDS=samhq MODEL=vit-h BATCH=2 bash examples/gpu_proof.sh full   # one backend (a ViT-H run compiles for
#                                                   # minutes: one backend per 10-minute device command)
#   WHEELS=wheels bash examples/gpu_proof.sh        # first pip-install peft (lora) etc. from a wheel folder, offline
#   MODEL=tiny EXTRA=--samhq-aot-eager STEPS=3 bash examples/gpu_proof.sh decoder   # dry run on a CPU
#
# Needs Pillow (image IO); lora needs peft (and its accelerate, psutil). matplotlib is optional (curves.png).
# Each run's log, checkpoint and summary.json stay under $WORK (default /tmp/samhq_gpu_proof).
set -uo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-30}
BATCH=${BATCH:-4}
WORK=${WORK:-/tmp/samhq_gpu_proof}
MODEL=${MODEL:-vit-b}  # vit-l, vit-h, or tiny (64x64), to try the script without a GPU
EXTRA=${EXTRA:-}       # more finetune_samhq.py flags
IMAGE_SIZE=${IMAGE_SIZE:-}  # train at IMAGE_SIZE x IMAGE_SIZE (--image-size), e.g. 256; default: the model's own
MODES=${*:-decoder lora full}
BACKENDS=${BACKENDS:-samhq inductor}
mkdir -p "$WORK"

if [ -n "${WHEELS:-}" ]; then
    python -m pip install -q --no-index --find-links "$WHEELS" peft pillow 2>&1 | tail -2
fi
# patterns/ and kernels/ install as samhq_fx.* (pyproject), and the backend is an entry point: install the tree
python -c "import samhq_fx.patterns, samhq_fx.kernels" 2>/dev/null \
    || python -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
python -c "import PIL" || { echo "Pillow is not installed: pip install pillow (or WHEELS=dir)"; exit 1; }
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"

if [ "$MODEL" = tiny ]; then SIZE=64; else SIZE=1024; fi
[ -f "$WORK/$MODEL/config.json" ] || python examples/samhq_model_io.py "$WORK/$MODEL" --size "$MODEL"
python -c "import sys; sys.path.insert(0, 'examples'); import samhq_data; samhq_data.write_synthetic('$WORK/data-$SIZE', n=40, size=$SIZE)"

for mode in $MODES; do
    if [ "$mode" = lora ] && ! python -c "import peft" 2>/dev/null; then
        echo "lora: skipped, peft is not installed (wheels: peft, accelerate, psutil)"
        continue
    fi
    for backend in $BACKENDS; do
        run="$WORK/$mode-$backend${IMAGE_SIZE:+-$IMAGE_SIZE}"
        echo "== $mode, backend $backend: $run.log"
        rm -rf "$run"
        python examples/finetune_samhq.py --model "$WORK/$MODEL" --data "$WORK/data-$SIZE" --train "$mode" \
            --backend "$backend" --steps "$STEPS" --batch "$BATCH" --bf16 --eval-every "$STEPS" --out "$run" \
            ${IMAGE_SIZE:+--image-size "$IMAGE_SIZE"} $EXTRA \
            > "$run.log" 2>&1 || { echo "FAILED (exit $?):"; tail -20 "$run.log"; }
        grep -E "^check:|^first batch|^attention blocks" "$run.log" | grep -v compiling
    done
done

python - "$WORK" <<'EOF'
import json, pathlib, sys
rows = sorted(pathlib.Path(sys.argv[1]).glob("*/summary.json"))
print(f"\n{'recipe':8} {'backend':9} {'size':>4} {'fused':>5} {'ms/step':>8} {'fwd+bwd eager / compiled':>24} "
      f"{'peak MiB':>9} {'check diff':>10} "
      f"{'val IoU before -> after':>24} {'boundary IoU before -> after':>29}")
for path in rows:
    s = json.loads(path.read_text())
    diff = "-" if s["check_abs_diff"] is None else f"{s['check_abs_diff']:.1e}"
    fb = " / ".join("-" if s.get(f"first_batch_{k}_ms") is None else f"{s[f'first_batch_{k}_ms']:.1f}"
                    for k in ("eager", "compiled"))
    print(f"{s['train']:8} {s['backend']:9} {s.get('image_size', '-'):>4} {s['fused']:5} {s['ms_per_step']:8.1f} "
          f"{fb:>24} {s['peak_mib']:9.0f} {diff:>10} "
          f"{s.get('val_iou_before', float('nan')):12.4f} -> {s.get('val_iou_after', float('nan')):.4f} "
          f"{s.get('val_boundary_iou_before', float('nan')):17.4f} -> {s.get('val_boundary_iou_after', float('nan')):.4f}")
EOF

# Under the device runner, $OUT comes back to the caller: the logs and small files only (checkpoints are GBs)
if [ -n "${OUT:-}" ]; then
    for run in "$WORK"/*/summary.json; do
        dir=$(dirname "$run"); name=$(basename "$dir"); mkdir -p "$OUT/$name"
        cp "$dir"/summary.json "$dir"/metrics.jsonl "$OUT/$name/"; cp "$dir"/curves.png "$OUT/$name/" 2>/dev/null
        cp "$WORK/$name.log" "$OUT/$name/run.log"
    done
fi
