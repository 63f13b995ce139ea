"""Hugging Face SAM / SAM-HQ models with random weights, for examples, tests and benchmarks.

transformers 5.x builds `SamHQVisionModel(config)` with most weights at zero (it expects a
checkpoint to be loaded), which makes every attention uniform and every gradient vanish: useless
for checking numerics or timing real data. `random_init_` gives every parameter a real draw.
"""

from __future__ import annotations

import math

import torch


def tiny_vision_config(attn_implementation: str = "eager", family: str = "sam_hq", **overrides):
    """A SAM-HQ (or SAM, family="sam") ViT small enough for a 2-core CPU: 8x8 patches, 3x3 windows
    (the 8x8 grid is padded to 9x9 for them) and one global layer."""
    from transformers import SamHQVisionConfig, SamVisionConfig

    kw = dict(
        hidden_size=32, num_attention_heads=2, image_size=32, patch_size=4, num_hidden_layers=2,
        global_attn_indexes=[1], window_size=3, mlp_dim=64, output_channels=16,
    )
    kw.update(overrides)
    cfg = {"sam_hq": SamHQVisionConfig, "sam": SamVisionConfig}[family](**kw)
    cfg._attn_implementation = attn_implementation
    return cfg


# SAM's three image encoders (segment-anything's build_sam.py; SAM-HQ uses the same): 1024x1024 images, 16x16
# patches (64x64 tokens), 14x14 windows, head dim 64, 64 for ViT-L and 80 for ViT-H.
VIT_SIZES = {
    "vit-b": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, global_attn_indexes=(2, 5, 8, 11)),
    "vit-l": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, global_attn_indexes=(5, 11, 17, 23)),
    "vit-h": dict(hidden_size=1280, num_hidden_layers=32, num_attention_heads=16, global_attn_indexes=(7, 15, 23, 31)),
}


def check_image_size(image_size, patch_size: int, where: str) -> None:
    """ValueError unless `image_size` is a positive whole number of `patch_size` patches."""
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size <= 0 or image_size % patch_size:
        raise ValueError(f"{where}: `image_size` must be a positive multiple of the patch size {patch_size}, "
                         f"got {image_size!r}")


def vision_config(size: str = "vit-b", attn_implementation: str = "eager", image_size: int = 1024):
    """SAM-HQ's image encoder for `size` "vit-b", "vit-l" or "vit-h" (VIT_SIZES) at image_size x image_size
    (SAM's 1024 by default; 256 gives a 16x16 patch grid, with its global layers' rel-pos tables 31 rows)."""
    from transformers import SamHQVisionConfig

    if size not in VIT_SIZES:
        raise ValueError(f"vision_config: `size` must be one of {', '.join(VIT_SIZES)}, got {size!r}")
    check_image_size(image_size, 16, "vision_config")
    kw = VIT_SIZES[size]
    cfg = SamHQVisionConfig(**kw, mlp_dim=4 * kw["hidden_size"], image_size=image_size)
    cfg._attn_implementation = attn_implementation
    return cfg


def vit_b_vision_config(attn_implementation: str = "eager", image_size: int = 1024):
    """SAM-HQ ViT-B, by default at 1024x1024: 64x64 tokens, 14x14 windows, global layers 2, 5, 8, 11."""
    return vision_config("vit-b", attn_implementation, image_size)


def sam_hq_config(attn_implementation: str = "eager", full: bool = False, size: str = "vit-b",
                  image_size: int | None = None):
    """A whole SamHQModel's config: `size` (VIT_SIZES) at 1024x1024 (full), or a small one for CPU (64x64 images
    in 8x8 patches: 8x8 tokens, a 3x3-window layer padded to 9x9 and a global layer, a one-layer mask decoder).
    `image_size` (default 1024 full, 64 small) sets the images' side for the encoder and the prompt encoder alike;
    a multiple of the patch size (16 full, 8 small)."""
    from transformers import SamHQConfig

    if full:
        vision = vision_config(size, attn_implementation, 1024 if image_size is None else image_size)
        cfg = SamHQConfig(vision_config=vision.to_dict(), mask_decoder_config=dict(vit_dim=vision.hidden_size),
                          prompt_encoder_config=dict(image_size=vision.image_size, patch_size=vision.patch_size))
    else:
        image_size = 64 if image_size is None else image_size
        check_image_size(image_size, 8, "sam_hq_config")
        vision = tiny_vision_config(
            attn_implementation, image_size=image_size, patch_size=8, hidden_size=64, num_attention_heads=4,
            num_hidden_layers=2, global_attn_indexes=[1], window_size=3, mlp_dim=128, output_channels=32,
            num_pos_feats=16,
        )
        cfg = SamHQConfig(
            vision_config=vision.to_dict(),
            prompt_encoder_config=dict(hidden_size=32, image_size=image_size, patch_size=8),
            mask_decoder_config=dict(
                hidden_size=32, mlp_dim=64, num_hidden_layers=1, num_attention_heads=2, iou_head_hidden_dim=32,
                vit_dim=64,
            ),
        )
    cfg.vision_config._attn_implementation = attn_implementation
    return cfg


@torch.no_grad()
def random_init_(model: torch.nn.Module, seed: int = 0, rel_pos_std: float = 0.02) -> torch.nn.Module:
    """Fan-in scaled normal weights, small random biases, random rel-pos tables and norms."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if "rel_pos" in name:
            std = rel_pos_std
        elif p.dim() >= 2:
            std = 1.0 / math.sqrt(p[0].numel())
        else:
            std = 0.02
        base = 1.0 if name.endswith("weight") and p.dim() == 1 else 0.0  # norms start near 1
        p.copy_(base + std * torch.randn(p.shape, generator=g, dtype=torch.float32).to(p.dtype))
    return model
