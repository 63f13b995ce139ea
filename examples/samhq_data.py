"""A mask folder for SAM-HQ fine-tuning: read and check it, split it, turn it into model batches.

    DIR/images/<name>.jpg|.jpeg|.png    the image (any mode; converted to RGB)
    DIR/masks/<name>.png                its mask: 0 is background, any other value foreground
    DIR/val.txt                         optional: validation stems, one a line ('#' starts a comment)

`scan` reads every file once, up front, and raises `DatasetError` naming the file for anything that
would otherwise fail half-way through a run: a mask with no image, an image with no mask, sizes that
differ, an empty mask, a file that does not decode. Prompts come from each mask's bounding box (jittered
while training) and, optionally, from points drawn inside the mask. Everything random is drawn from a
generator seeded by (seed, step), so a resumed run sees exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

IMAGE_EXTS = (".jpg", ".jpeg", ".png")


class DatasetError(ValueError):
    """Bad input in a mask folder; the message names the file."""


@dataclass(frozen=True)
class Sample:
    stem: str
    image: Path
    mask: Path
    height: int
    width: int
    box: tuple[int, int, int, int]  # x0, y0, x1, y1: the mask's extent in pixels, x1 / y1 exclusive


def read_mask(path: Path) -> np.ndarray:
    """A boolean [H, W] array. Colour masks count a pixel as foreground if any colour channel is non-zero
    (alpha is ignored); palette masks by their index, so index 0 is background whatever its colour."""
    try:
        with Image.open(path) as im:
            arr = np.asarray(im)
    except Exception as e:  # PIL raises UnidentifiedImageError, OSError, SyntaxError... for broken files
        raise DatasetError(f"{path}: cannot read mask ({e})") from e
    return arr[..., :3].any(-1) if arr.ndim == 3 else arr != 0


def read_image(path: Path) -> Image.Image:
    try:
        with Image.open(path) as im:
            return im.convert("RGB")  # convert() decodes the whole file, so a truncated one fails here
    except Exception as e:
        raise DatasetError(f"{path}: cannot read image ({e})") from e


def _by_stem(folder: Path, exts: tuple[str, ...], what: str) -> dict[str, Path]:
    if not folder.is_dir():
        raise DatasetError(f"{folder}: no such folder (expected DIR/images/ and DIR/masks/)")
    found: dict[str, Path] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.suffix.lower() not in exts:
            raise DatasetError(f"{path}: not a {what} file (expected {', '.join(exts)})")
        if path.stem in found:
            raise DatasetError(f"{path}: two {what} files named {path.stem!r} ({found[path.stem].name})")
        found[path.stem] = path
    return found


def scan(root: str | Path) -> list[Sample]:
    """Every (image, mask) pair of a mask folder, checked; raises DatasetError on the first bad file."""
    root = Path(root)
    images = _by_stem(root / "images", IMAGE_EXTS, "image")
    masks = _by_stem(root / "masks", (".png",), "mask")
    for stem, path in masks.items():
        if stem not in images:
            raise DatasetError(f"{path}: mask with no image (expected {root / 'images' / stem}.jpg/.jpeg/.png)")
    for stem, path in images.items():
        if stem not in masks:
            raise DatasetError(f"{path}: image with no mask (expected {root / 'masks' / stem}.png)")
    if not images:
        raise DatasetError(f"{root / 'images'}: no images")
    samples = []
    for stem, image_path in images.items():
        width, height = read_image(image_path).size
        mask = read_mask(masks[stem])
        if mask.shape != (height, width):
            raise DatasetError(f"{masks[stem]}: mask is {mask.shape[1]}x{mask.shape[0]} but its image "
                               f"{image_path.name} is {width}x{height} (width x height)")
        ys, xs = np.nonzero(mask)
        if len(xs) == 0:
            raise DatasetError(f"{masks[stem]}: empty mask (no foreground pixel), nothing to prompt or learn")
        box = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
        samples.append(Sample(stem, image_path, masks[stem], height, width, box))
    return samples


def split(samples: list[Sample], root: str | Path, val_fraction: float, seed: int):
    """(train, val): the stems in DIR/val.txt if it exists, else a seeded `val_fraction` of the samples."""
    val_file = Path(root) / "val.txt"
    if val_file.exists():
        stems = {line.split("#")[0].strip() for line in val_file.read_text().splitlines()} - {""}
        unknown = stems - {s.stem for s in samples}
        if unknown:
            raise DatasetError(f"{val_file}: lists stems with no image and mask: {sorted(unknown)[:5]}")
        val = [s for s in samples if s.stem in stems]
    else:
        n_val = min(len(samples) - 1, round(val_fraction * len(samples))) if val_fraction > 0 else 0
        if val_fraction > 0 and n_val == 0 and len(samples) > 1:
            n_val = 1  # a fraction of a tiny set still gets one validation image
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed)).tolist()
        held = set(order[:n_val])
        val = [s for i, s in enumerate(samples) if i in held]
    val_stems = {s.stem for s in val}
    train = [s for s in samples if s.stem not in val_stems]
    if not train:
        raise DatasetError(f"{root}: every sample is in the validation split; nothing to train on")
    return train, val


def step_generator(seed: int, step: int) -> torch.Generator:
    """The generator for one step's randomness: a function of (seed, step) only, so resuming is exact."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def batch_indices(n_train: int, batch: int, seed: int, step: int) -> list[int]:
    """Which training samples step `step` sees: a fresh seeded permutation per epoch, the last partial batch
    dropped (a ragged batch would make torch.compile build a second graph)."""
    per_epoch = max(1, n_train // batch)
    epoch, pos = divmod(step, per_epoch)
    order = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist()
    if n_train < batch:  # fewer samples than the batch: repeat the permutation
        order = (order * (batch // n_train + 1))
    return order[pos * batch:(pos + 1) * batch]


def prompt_box(sample: Sample, jitter: float, gen: torch.Generator | None) -> list[float]:
    """The mask's box; while training each side moves by up to `jitter` x the box's size, inside the image."""
    x0, y0, x1, y1 = map(float, sample.box)
    if gen is not None and jitter > 0:
        w, h = x1 - x0, y1 - y0
        d = (torch.rand(4, generator=gen) * 2 - 1) * jitter * torch.tensor([w, h, w, h])
        x0, y0, x1, y1 = (x0 + d[0].item(), y0 + d[1].item(), x1 + d[2].item(), y1 + d[3].item())
    x0, x1 = sorted((min(max(x0, 0.0), sample.width), min(max(x1, 0.0), sample.width)))
    y0, y1 = sorted((min(max(y0, 0.0), sample.height), min(max(y1, 0.0), sample.height)))
    return [x0, y0, x1, y1]


def prompt_points(mask: np.ndarray, n: int, gen: torch.Generator) -> list[list[float]]:
    """`n` foreground pixel centres, drawn uniformly (with replacement: tiny masks still give n)."""
    ys, xs = np.nonzero(mask)
    pick = torch.randint(len(xs), (n,), generator=gen).numpy()
    return [[float(xs[i]) + 0.5, float(ys[i]) + 0.5] for i in pick]


def low_res_target(mask: np.ndarray, resized_hw, image_size: int, mask_size: int) -> torch.Tensor:
    """The mask on SAM's low-res logit grid: the processor resizes the image to `resized_hw` inside an
    image_size^2 canvas (padded right and bottom); the logits cover that canvas at mask_size^2."""
    h = round(int(resized_hw[0]) * mask_size / image_size)
    w = round(int(resized_hw[1]) * mask_size / image_size)
    m = torch.from_numpy(mask).float()[None, None]
    m = F.interpolate(m, size=(h, w), mode="bilinear", align_corners=False, antialias=True)[0, 0]
    return F.pad(m, (0, mask_size - w, 0, mask_size - h))  # soft edges: BCE and dice take them as they are


def make_batch(samples: list[Sample], processor, mask_size: int, gen: torch.Generator | None,
               jitter: float = 0.0, points: int = 0) -> dict:
    """Model inputs and targets for `samples`. gen=None: evaluation (exact boxes, points from a fixed seed)."""
    images = [read_image(s.image) for s in samples]
    masks = [read_mask(s.mask) for s in samples]
    point_gen = gen if gen is not None else torch.Generator().manual_seed(0)
    kw = {"input_boxes": [[prompt_box(s, jitter, gen)] for s in samples]}
    if points:
        kw["input_points"] = [[prompt_points(m, points, point_gen)] for m in masks]
        kw["input_labels"] = [[[1] * points] for _ in masks]
    enc = processor(images=images, return_tensors="pt", **kw)
    image_size = processor.image_processor.pad_size["height"]
    batch = {
        "pixel_values": enc["pixel_values"].float(),
        "input_boxes": enc["input_boxes"].float(),  # the processor returns float64 coordinates
        "target": torch.stack([low_res_target(m, hw, image_size, mask_size)
                               for m, hw in zip(masks, enc["reshaped_input_sizes"])]),
        "masks": [torch.from_numpy(m) for m in masks],
        "original_sizes": enc["original_sizes"], "reshaped_input_sizes": enc["reshaped_input_sizes"],
    }
    if points:
        batch["input_points"] = enc["input_points"].float()
        batch["input_labels"] = enc["input_labels"].long()
    return batch


class StepBatches(torch.utils.data.Dataset):
    """Training batches by step, `start` to `total`, for a DataLoader (batch_size=None): each is a function of
    (seed, step) alone, so worker processes decode and preprocess ahead without changing what a step sees."""

    def __init__(self, train: list[Sample], processor, mask_size: int, batch: int, seed: int, jitter: float,
                 points: int, start: int, total: int):
        self.train, self.processor, self.mask_size, self.batch = train, processor, mask_size, batch
        self.seed, self.jitter, self.points, self.start, self.total = seed, jitter, points, start, total

    def __len__(self):
        return max(0, self.total - self.start)

    def __getitem__(self, i: int) -> dict:
        step = self.start + i
        chosen = [self.train[j] for j in batch_indices(len(self.train), self.batch, self.seed, step)]
        return make_batch(chosen, self.processor, self.mask_size, step_generator(self.seed, step), self.jitter,
                          self.points)


def write_synthetic(root: str | Path, n: int = 40, size: int = 64, seed: int = 0) -> Path:
    """A mask folder of `n` images (square and 3:4, both ways round) with one textured ellipse each on a
    smooth background. Written to a temporary folder and renamed, so a stopped run leaves no half set."""
    root = Path(root)
    if root.exists():
        return root
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "images").mkdir(parents=True)
    (tmp / "masks").mkdir()
    rng = np.random.default_rng(seed)
    shapes = [(size, size), (size * 3 // 4, size), (size, size * 3 // 4)]
    for i in range(n):
        h, w = shapes[i % len(shapes)]
        coarse = rng.random((4, 4, 3)) * 0.5 + 0.25
        bg = np.asarray(Image.fromarray((coarse * 255).astype(np.uint8)).resize((w, h), Image.BILINEAR)) / 255.0
        cy, cx = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w
        ry, rx = rng.uniform(0.12, 0.3) * h, rng.uniform(0.12, 0.3) * w
        yy, xx = np.mgrid[:h, :w]
        mask = ((yy + 0.5 - cy) / ry) ** 2 + ((xx + 0.5 - cx) / rx) ** 2 <= 1
        colour = rng.random(3)
        img = np.where(mask[..., None], colour + 0.1 * rng.standard_normal((h, w, 3)), bg)
        Image.fromarray((np.clip(img, 0, 1) * 255).astype(np.uint8)).save(tmp / "images" / f"{i:04d}.png")
        Image.fromarray(mask.astype(np.uint8) * 255).save(tmp / "masks" / f"{i:04d}.png")
    os.replace(tmp, root)
    return root
