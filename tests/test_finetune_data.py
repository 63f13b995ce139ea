"""The fine-tuning example's mask folder and metrics (examples/samhq_data.py, samhq_metrics.py): no model.

Each bad input must be refused up front with the offending file named; IoU and boundary IoU are checked
against values worked out by hand in the comments.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
Image = pytest.importorskip("PIL.Image")

import samhq_data  # noqa: E402
import samhq_metrics  # noqa: E402
from samhq_data import DatasetError  # noqa: E402


def _rect_mask(h, w, y0, y1, x0, x1, value=255):
    m = np.zeros((h, w), np.uint8)
    m[y0:y1, x0:x1] = value
    return m


def make_folder(root: Path) -> Path:
    """a.png (grey mask, value 7), b.jpg (RGB mask), c.jpeg (1-bit mask), all 8 wide and 6 high."""
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rgb = (np.arange(6 * 8 * 3).reshape(6, 8, 3) % 255).astype(np.uint8)
    Image.fromarray(rgb).save(root / "images" / "a.png")
    Image.fromarray(rgb).save(root / "images" / "b.jpg")
    Image.fromarray(rgb).save(root / "images" / "c.jpeg")
    Image.fromarray(_rect_mask(6, 8, 1, 3, 2, 5, value=7)).save(root / "masks" / "a.png")
    colour = np.zeros((6, 8, 3), np.uint8)
    colour[4, 6] = (0, 0, 9)  # one pixel, blue only: still foreground
    Image.fromarray(colour).save(root / "masks" / "b.png")
    Image.fromarray(_rect_mask(6, 8, 0, 6, 0, 1) > 0).save(root / "masks" / "c.png")
    return root


def test_scan_reads_every_pair_and_its_box(tmp_path):
    samples = samhq_data.scan(make_folder(tmp_path))
    assert [s.stem for s in samples] == ["a", "b", "c"]
    assert [(s.height, s.width) for s in samples] == [(6, 8)] * 3
    # boxes are x0, y0, x1, y1 with x1 / y1 exclusive
    assert [s.box for s in samples] == [(2, 1, 5, 3), (6, 4, 7, 5), (0, 0, 1, 6)]


def test_split_val_txt_and_seeded_fraction(tmp_path):
    root = make_folder(tmp_path)
    samples = samhq_data.scan(root)
    train, val = samhq_data.split(samples, root, 0.5, seed=0)
    assert len(val) == 2 and len(train) == 1 and {s.stem for s in train + val} == {"a", "b", "c"}
    assert samhq_data.split(samples, root, 0.5, seed=0) == (train, val)  # seeded: the same split again
    (root / "val.txt").write_text("# held out\nb\n\n")
    train, val = samhq_data.split(samples, root, 0.5, seed=0)
    assert [s.stem for s in val] == ["b"] and [s.stem for s in train] == ["a", "c"]
    (root / "val.txt").write_text("zzz\n")
    with pytest.raises(DatasetError, match="val.txt.*zzz"):
        samhq_data.split(samples, root, 0.1, seed=0)


def _break_mask_no_image(root):
    (root / "images" / "a.png").unlink()
    return "masks/a.png", "mask with no image"


def _break_image_no_mask(root):
    (root / "masks" / "b.png").unlink()
    return "images/b.jpg", "image with no mask"


def _break_size(root):
    Image.fromarray(np.full((6, 7), 255, np.uint8)).save(root / "masks" / "c.png")
    return "masks/c.png", "7x6.*8x6"


def _break_empty(root):
    Image.fromarray(np.zeros((6, 8), np.uint8)).save(root / "masks" / "a.png")
    return "masks/a.png", "empty mask"


def _break_image_bytes(root):
    (root / "images" / "b.jpg").write_bytes(b"not a jpeg")
    return "images/b.jpg", "cannot read image"


def _break_mask_bytes(root):
    data = (root / "masks" / "a.png").read_bytes()
    (root / "masks" / "a.png").write_bytes(data[: len(data) // 2])  # truncated PNG
    return "masks/a.png", "cannot read mask"


@pytest.mark.parametrize("breaker", [_break_mask_no_image, _break_image_no_mask, _break_size, _break_empty,
                                     _break_image_bytes, _break_mask_bytes])
def test_scan_names_the_bad_file(tmp_path, breaker):
    root = make_folder(tmp_path)
    name, why = breaker(root)
    with pytest.raises(DatasetError, match=why) as e:
        samhq_data.scan(root)
    assert str(root / name) in str(e.value)


def test_batches_are_a_function_of_seed_and_step():
    n, batch = 9, 2
    epoch0 = [i for step in range(4) for i in samhq_data.batch_indices(n, batch, 0, step)]
    assert len(set(epoch0)) == 8  # one permutation per epoch, the odd one out dropped
    assert samhq_data.batch_indices(n, batch, 0, 5) == samhq_data.batch_indices(n, batch, 0, 5)
    assert [samhq_data.batch_indices(n, batch, 1, s) for s in range(4)] != [samhq_data.batch_indices(n, batch, 0, s)
                                                                           for s in range(4)]  # seed matters
    sample = samhq_data.Sample("x", Path("x"), Path("x"), 40, 60, (10, 5, 30, 25))
    boxes = [samhq_data.prompt_box(sample, 0.2, samhq_data.step_generator(0, 3)) for _ in range(2)]
    assert boxes[0] == boxes[1] and boxes[0] != [10.0, 5.0, 30.0, 25.0]
    x0, y0, x1, y1 = boxes[0]
    assert 0 <= x0 < x1 <= 60 and 0 <= y0 < y1 <= 40 and abs(x0 - 10) <= 4 and abs(y1 - 25) <= 4
    assert samhq_data.prompt_box(sample, 0.2, None) == [10.0, 5.0, 30.0, 25.0]  # evaluation: the exact box


def test_low_res_target_covers_the_resized_image_only():
    mask = np.ones((30, 60), bool)  # 2:1 image; resized to 32x64 in a 64x64 canvas; logits are 16x16
    target = samhq_data.low_res_target(mask, (32, 64), 64, 16)
    assert target.shape == (16, 16)
    torch.testing.assert_close(target[:8], torch.ones(8, 16))  # antialiased resize: ones up to rounding
    assert torch.equal(target[8:], torch.zeros(8, 16))


def _square(h, w, y0, y1, x0, x1):
    m = torch.zeros(h, w, dtype=torch.bool)
    m[y0:y1, x0:x1] = True
    return m


def test_mask_and_boundary_iou_hand_computed():
    gt = _square(10, 10, 2, 6, 2, 6)    # 4x4 square
    pred = _square(10, 10, 2, 6, 3, 7)  # the same, one column to the right
    assert samhq_metrics.mask_iou(pred, gt) == pytest.approx(12 / 20)  # 4x3 overlap, 20 pixels in the union
    # d = max(1, round(0.02 * hypot(10, 10))) = 1: each boundary is its square's 12-pixel ring. The rings share
    # rows 2 and 5 at columns 3-5 (6 pixels); union 12 + 12 - 6 = 18
    assert samhq_metrics.boundary_dilation(10, 10) == 1
    assert int(samhq_metrics.boundary(gt, 1).sum()) == 12
    assert samhq_metrics.boundary_iou(pred, gt) == pytest.approx(6 / 18)
    assert samhq_metrics.boundary_iou(gt, gt) == 1.0 and samhq_metrics.mask_iou(gt, ~gt) == 0.0
    # the image edge counts as background: a full 5x5 mask's boundary is its outer ring of 16
    assert int(samhq_metrics.boundary(torch.ones(5, 5, dtype=torch.bool), 1).sum()) == 16
    # d = round(0.02 * hypot(100, 100)) = 3: a 20x20 square keeps its 14x14 core, boundary 400 - 196
    assert samhq_metrics.boundary_dilation(100, 100) == 3
    assert int(samhq_metrics.boundary(_square(100, 100, 10, 30, 10, 30), 3).sum()) == 400 - 196


def test_upscale_logits_crops_the_padding():
    low = -torch.ones(4, 4)  # an 8x8 canvas at 4x4; the image filled its left half (8 high, 4 wide)
    low[:, :2] = 1
    full = samhq_metrics.upscale_logits(low, (8, 4), (16, 8), image_size=8)
    assert full.shape == (16, 8) and bool((full > 0).all())  # the padded right half is cropped away
    uncropped = samhq_metrics.upscale_logits(low, (8, 8), (16, 16), image_size=8)
    assert bool((uncropped[:, :7] > 0).all()) and bool((uncropped[:, 9:] < 0).all())
