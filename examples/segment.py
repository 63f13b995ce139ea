"""Segment one object in one image with a (fine-tuned) SAM-HQ model: the inference side of finetune_samhq.py.

    python examples/segment.py --model finetune_out/checkpoint-30/model --image cat.jpg --box 10 20 200 180 --out mask.png
    python examples/segment.py --model DIR --image cat.jpg --point 120 90 --out mask.png --compile

Writes the mask (0 / 255, the image's size) to --out and the image with the mask tinted red over it to
--overlay (default: <out>_overlay.png), and prints the model's own estimate of the mask's IoU: SAM's
iou_predictions output, a regression that is not bounded (an untrained or off-domain model gives values
below 0 or above 1), printed clamped to [0, 1]. --compile runs the vision encoder under
torch.compile(backend="samhq"); on one image that pays for a compile, so it is for checking and for
processes that go on to segment many.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
import samhq_data  # noqa: E402
import samhq_metrics  # noqa: E402
import samhq_model_io as io  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="SamHQModel.from_pretrained dir or cached hub id")
    p.add_argument("--image", required=True)
    prompt = p.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--box", type=float, nargs=4, metavar=("X0", "Y0", "X1", "Y1"), help="pixels")
    prompt.add_argument("--point", type=float, nargs=2, metavar=("X", "Y"), help="a foreground point, pixels")
    p.add_argument("--out", required=True, help="mask PNG")
    p.add_argument("--overlay", default=None, help="overlay PNG (default: <out>_overlay.png)")
    p.add_argument("--compile", action="store_true", help="vision encoder under torch.compile(backend='samhq')")
    p.add_argument("--samhq-aot-eager", action="store_true", help="with --compile: rewrite, then aot_eager (fast CPU)")
    p.add_argument("--multimask", action="store_true", help="SAM's 3 candidate masks, keep the best-scored one")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)

    model, processor = io.load(args.model)  # raises io.ModelError naming --model when it is not SAM-HQ
    image = samhq_data.read_image(Path(args.image))  # raises naming the file when it does not decode
    w, h = image.size
    prompts = {"input_boxes": [[args.box]]} if args.box else {"input_points": [[[args.point]]]}
    enc = processor(images=[image], return_tensors="pt", **prompts)
    device = torch.device(args.device)
    model.to(device).eval()
    if args.compile:
        options = {"samhq.inductor": False} if args.samhq_aot_eager else None
        model.vision_encoder.compile(backend="samhq", options=options)
    inputs = {k: enc[k].to(device).float() for k in ("pixel_values", "input_boxes", "input_points") if k in enc}
    with torch.no_grad():
        # hq_token_only: the HQ output, the mask finetune_samhq.py trains and evaluates
        out = model(**inputs, multimask_output=args.multimask, hq_token_only=True)
    best = out.iou_scores[0, 0].argmax().item() if args.multimask else 0
    iou_prediction = out.iou_scores[0, 0, best].item()
    iou_estimate = min(max(iou_prediction, 0.0), 1.0)
    logits = samhq_metrics.upscale_logits(out.pred_masks[0, 0, best].cpu(), enc["reshaped_input_sizes"][0],
                                          enc["original_sizes"][0], processor.image_processor.pad_size["height"])
    mask = (logits > 0).numpy()

    out_path = Path(args.out)
    overlay_path = Path(args.overlay) if args.overlay else out_path.with_name(out_path.stem + "_overlay.png")
    Image.fromarray(mask.astype(np.uint8) * 255).save(out_path)
    rgb = np.asarray(image, dtype=np.float32)
    rgb[mask] = 0.5 * rgb[mask] + 0.5 * np.array([255.0, 0.0, 0.0])
    Image.fromarray(rgb.astype(np.uint8)).save(overlay_path)
    print(f"mask: {mask.sum()} of {w}x{h} pixels; the model's IoU estimate {iou_estimate:.3f} (its iou_predictions "
          f"output, clamped to [0, 1]); wrote {out_path}, {overlay_path}")
    if args.compile:
        print(f"attention blocks fused by samhq: {torch._dynamo.utils.counters['samhq']['fused']}")
    return {"mask": mask, "iou_prediction": iou_prediction, "iou_estimate": iou_estimate,
            "fused": torch._dynamo.utils.counters["samhq"]["fused"]}


if __name__ == "__main__":
    try:
        main()
    except (samhq_data.DatasetError, io.ModelError) as e:  # bad input: the message, not a traceback
        sys.exit(f"error: {e}")
