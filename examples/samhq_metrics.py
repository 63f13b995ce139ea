"""Mask quality for SAM-HQ fine-tuning: mask IoU and boundary IoU at the image's own resolution.

Boundary IoU (Cheng et al., CVPR 2021, the metric SAM-HQ reports as mBIoU) compares only the pixels
within d of each mask's contour, d = 2% of the image diagonal: mask IoU barely moves when a large
object's edge gets sharper, boundary IoU does. Both are means over validation objects, as in SAM-HQ.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def mask_iou(pred: torch.Tensor, gt: torch.Tensor) -> float:
    """|pred & gt| / |pred | gt| for boolean [H, W] masks; two empty masks agree perfectly (1.0)."""
    union = (pred | gt).sum().item()
    return 1.0 if union == 0 else (pred & gt).sum().item() / union


def erode(mask: torch.Tensor, d: int) -> torch.Tensor:
    """Binary erosion by a (2d+1)^2 square, with everything outside the image counted as background
    (the reference implementation pads with zeros before cv2.erode with a 3x3 kernel d times, which is the
    same square). A square is separable: a row pass then a column pass, O(d) per pixel instead of O(d^2),
    which matters at 1024x1024 where d is 29."""
    outside = (~mask).float()[None, None]
    k = 2 * d + 1
    outside = F.max_pool2d(F.pad(outside, (d, d, 0, 0), value=1.0), (1, k), stride=1)
    outside = F.max_pool2d(F.pad(outside, (0, 0, d, d), value=1.0), (k, 1), stride=1)
    return outside[0, 0] == 0


def boundary_dilation(height: int, width: int, ratio: float = 0.02) -> int:
    return max(1, round(ratio * math.hypot(height, width)))


def boundary(mask: torch.Tensor, d: int) -> torch.Tensor:
    """The mask's pixels within d of its contour (or of the image edge)."""
    return mask & ~erode(mask, d)


def boundary_iou(pred: torch.Tensor, gt: torch.Tensor, ratio: float = 0.02) -> float:
    d = boundary_dilation(*gt.shape, ratio)
    return mask_iou(boundary(pred, d), boundary(gt, d))


def upscale_logits(low_res: torch.Tensor, reshaped_hw, original_hw, image_size: int) -> torch.Tensor:
    """One image's [h, w] low-res logits back to its original size, as the processor's post_process_masks
    does: up to the padded input canvas, crop the padding away, then to the original size (bilinear)."""
    x = F.interpolate(low_res[None, None].float(), size=(image_size, image_size), mode="bilinear",
                      align_corners=False)
    x = x[..., : int(reshaped_hw[0]), : int(reshaped_hw[1])]
    x = F.interpolate(x, size=(int(original_hw[0]), int(original_hw[1])), mode="bilinear", align_corners=False)
    return x[0, 0]


def batch_scores(logits: torch.Tensor, batch: dict, image_size: int) -> list[tuple[float, float]]:
    """(mask IoU, boundary IoU) per image of a batch made by samhq_data.make_batch; logits > 0 is the mask."""
    scores = []
    for i, gt in enumerate(batch["masks"]):
        full = upscale_logits(logits[i].detach().cpu(), batch["reshaped_input_sizes"][i],
                              batch["original_sizes"][i], image_size)
        pred = full > 0
        scores.append((mask_iou(pred, gt), boundary_iou(pred, gt)))
    return scores


def plot_curves(records: list[dict], path) -> str | None:
    """Training loss and validation IoU / boundary IoU over steps, from metrics.jsonl's records, as a PNG.
    Returns the path, or None (with a note) where matplotlib is not installed: the run itself needs none."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display on training machines
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no curves.png (pip install matplotlib)")
        return None
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "val_iou" in r]
    fig, (ax_loss, ax_iou) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], lw=1)
    ax_loss.set(xlabel="step", ylabel="BCE + dice", title="training loss")
    for key, label in (("val_iou", "mask IoU"), ("val_boundary_iou", "boundary IoU")):
        ax_iou.plot([r["step"] for r in evals], [r[key] for r in evals], marker="o", label=label)
    ax_iou.set(xlabel="step", ylabel="IoU", title="validation", ylim=(0, 1))
    ax_iou.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return str(path)
