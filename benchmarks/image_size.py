"""SAM-HQ's configs at another image size than 1024 (--img of train_step.py, inference.py, tools/profile_host.py).

SAM's ViT at image size S has an S/16 x S/16 patch grid: its windowed layers pad the grid to a multiple of the
window (14) and attend within 14x14 windows, its global layers attend over the whole grid, and its positional
embedding and the global layers' rel-pos tables are sized for that grid (samhq_fx.models builds the configs at any
size; this holds the sizes the harnesses take).

    img   grid    global keys   windows per image (grid padded to)
    1024  64x64   4096          25 (70x70)
     512  32x32   1024           9 (42x42)
     256  16x16    256           4 (28x28)
"""

from __future__ import annotations

from samhq_fx import models

IMAGE_SIZES = (256, 512, 1024)  # --img's choices; 1024 is SAM's own
PATCH = 16  # SAM's patch size: the grid is img / 16 on a side
WINDOW = 14  # SAM's window size


def grid_classes(img: int) -> list[tuple[str, int, int]]:
    """(layer, grid side, windows per image) of SAM's encoder at image size `img`: the global layer over the whole
    grid, the windowed layers over 14x14 windows of the grid padded to a multiple of 14."""
    g = img // PATCH
    return [("global", g, 1), ("window", WINDOW, (-(-g // WINDOW)) ** 2)]


def check(img: int) -> int:
    """img itself, if it is one of IMAGE_SIZES; ValueError naming --img otherwise."""
    if img not in IMAGE_SIZES:
        raise ValueError(f"--img must be one of {', '.join(map(str, IMAGE_SIZES))}, got {img!r}")
    return img


def vision_config(size: str, attn_implementation: str, img: int):
    """samhq_fx.models.vision_config at image size `img` (one of IMAGE_SIZES)."""
    return models.vision_config(size, attn_implementation, image_size=check(img))


def sam_hq_config(attn_implementation: str, size: str, img: int):
    """samhq_fx.models.sam_hq_config(attn_implementation, full=True, size=size) at image size `img`: the vision
    encoder's input and the prompt encoder's image (and with it its image embedding, img / 16 on a side)."""
    return models.sam_hq_config(attn_implementation, full=True, size=size, image_size=check(img))
