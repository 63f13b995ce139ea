"""SAM-HQ models for fine-tuning: load or build them, choose what trains, save and resume checkpoints.

    python examples/samhq_model_io.py DIR [--size tiny|vit-b|vit-l|vit-h]   # save a random-init SAM-HQ to DIR

A model is named by a spec: a directory or cached hub id that `SamHQModel.from_pretrained` takes, or
"random:tiny" / "random:vit-b" for a random-init model (`samhq_fx.models.random_init_`, seeded, so the
same spec rebuilds the same weights; a LoRA resume rebuilds its base model that way).
`load(spec, image_size=N)` gives the model for N x N images whatever size it was saved at (`resized_model`: the
position embeddings resized to the new patch grid) and a processor that resizes images and prompts to N.
A checkpoint folder (`DIR/checkpoint-<step>/`) holds
    model/               save_pretrained weights (safetensors) and the processor: what segment.py loads;
                         for LoRA the adapter merged into the base model
    adapter/             LoRA only: the peft adapter, with the trained mask decoder (modules_to_save)
    trainer_state.pt     optimizer, scheduler, step, train mode, base-model spec, image size, and the data
                         folder, batch size and seed that the batches follow (a resume takes them unless
                         given again)
It is written to a temporary folder and renamed, so an interrupted save leaves no half checkpoint.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import SamHQConfig, SamHQModel, SamHQProcessor

from samhq_fx.models import VIT_SIZES, random_init_, sam_hq_config

TRAIN_MODES = ("decoder", "lora", "full")
# The vision encoder's attention projections; the fused op sits between them, so LoRA here keeps it fused.
LORA_TARGETS = r"vision_encoder\.layers\.\d+\.attn\.(qkv|proj)"
DECODER = "mask_decoder."  # the parameters --train decoder trains (and its checkpoints take from the run)


class ModelError(ValueError):
    """--model / --resume does not name a usable SAM-HQ checkpoint; the message names it."""


RANDOM_KINDS = ("tiny", *VIT_SIZES)


def random_config(kind: str, attn: str = "sdpa") -> SamHQConfig:
    # vit-b / vit-l / vit-h: SAM-HQ's encoders at 1024x1024 (64x64 tokens, 14x14 windows, 4 global layers;
    # samhq_fx.models.VIT_SIZES); tiny: 64x64 images in 8x8 tokens, for CPU
    if kind not in RANDOM_KINDS:
        raise ModelError(f"unknown random model {kind!r} ({', '.join(RANDOM_KINDS)})")
    return sam_hq_config(attn, full=kind != "tiny", size=kind if kind != "tiny" else "vit-b")


def check_image_size(image_size: int | None, patch_size: int) -> None:
    if image_size is not None and (image_size <= 0 or image_size % patch_size):
        raise ModelError(f"--image-size {image_size}: must be a positive multiple of the model's patch size "
                         f"{patch_size}")


def image_size_of(model: SamHQModel) -> int:
    return model.config.vision_config.image_size


def mask_size(model: SamHQModel) -> int:
    """Side of SAM's low-res mask logits: 4x the image-embedding grid (256 at 1024 / patch 16)."""
    vc = model.config.vision_config
    return 4 * vc.image_size // vc.patch_size


def _processor(cfg: dict) -> SamHQProcessor:
    # through a preprocessor_config.json: the format every transformers 5.x reads, whichever image-processor
    # backend it picks; SamHQProcessor reads its prompt-coordinate scale from it when it is built
    with tempfile.TemporaryDirectory() as d:
        Path(d, "preprocessor_config.json").write_text(json.dumps(cfg))
        return SamHQProcessor.from_pretrained(d)


def _sizes(image_size: int, mask_size_: int) -> dict:
    return {"size": {"longest_edge": image_size}, "pad_size": {"height": image_size, "width": image_size},
            "mask_size": {"longest_edge": mask_size_}, "mask_pad_size": {"height": mask_size_, "width": mask_size_}}


def processor_for(image_size: int, mask_size_: int) -> SamHQProcessor:
    """A SAM-HQ processor for `image_size` inputs (SAM's normalisation)."""
    return _processor({"image_processor_type": "SamImageProcessor", "processor_class": "SamHQProcessor",
                       **_sizes(image_size, mask_size_)})


def processor_at(processor: SamHQProcessor, image_size: int, mask_size_: int) -> SamHQProcessor:
    """`processor` (its normalisation and resampling kept) resizing images to `image_size` on their longest
    side and padding to image_size^2; boxes and points are scaled with them."""
    cfg = {**processor.image_processor.to_dict(), "processor_class": "SamHQProcessor"}
    return _processor({**cfg, **_sizes(image_size, mask_size_)})


def at_image_size(model: SamHQModel, processor: SamHQProcessor, image_size: int | None):
    """(model, processor) for image_size x image_size inputs (None: as they are): `resized_model`, and
    `processor_at` resizing the images and scaling the prompts to match."""
    if image_size is None or image_size == image_size_of(model):
        return model, processor
    model = resized_model(model, image_size)
    return model, processor_at(processor, image_size, mask_size(model))


@torch.no_grad()
def resized_model(model: SamHQModel, image_size: int) -> SamHQModel:
    """`model` for image_size x image_size inputs: a new SamHQModel whose config says image_size (encoder and
    prompt encoder), every weight copied, the ones whose shape follows the patch grid resized: the absolute
    position embedding bilinearly to the new grid, the global layers' rel-pos tables linearly to 2 * grid - 1
    rows (what SAM's get_rel_pos would do to them on every call). Windowed layers' tables keep their
    2 * window - 1 rows."""
    check_image_size(image_size, model.config.vision_config.patch_size)
    cfg = copy.deepcopy(model.config)
    cfg.vision_config.image_size = cfg.prompt_encoder_config.image_size = image_size
    cfg.prompt_encoder_config.image_embedding_size = image_size // cfg.prompt_encoder_config.patch_size
    resized = SamHQModel(cfg)
    shapes = {k: v.shape for k, v in resized.state_dict().items()}
    state = {}
    for name, w in model.state_dict().items():
        shape = shapes[name]
        if w.shape == shape:
            state[name] = w
        elif name.endswith("pos_embed"):  # [1, grid, grid, C]
            x = F.interpolate(w.permute(0, 3, 1, 2).float(), size=tuple(shape[1:3]), mode="bilinear",
                              align_corners=False)
            state[name] = x.permute(0, 2, 3, 1).to(w.dtype)
        elif "rel_pos" in name:  # [2 * grid - 1, head_dim]
            x = F.interpolate(w.T[None].float(), size=shape[0], mode="linear", align_corners=False)
            state[name] = x[0].T.to(w.dtype)
        else:
            raise ModelError(f"--image-size {image_size}: {name} is {tuple(w.shape)} at "
                             f"{image_size_of(model)} and {tuple(shape)} at {image_size}; no rule to resize it")
    resized.load_state_dict(state)
    return resized.train(model.training)


def load(spec: str, attn: str = "sdpa", image_size: int | None = None):
    """(model, processor) for a spec, for image_size^2 inputs (default: the size it was saved or built at, then
    `at_image_size`); fp32 weights (autocast does the bf16)."""
    if spec.startswith("random:"):
        cfg = random_config(spec.split(":", 1)[1], attn)
        check_image_size(image_size, cfg.vision_config.patch_size)
        model = random_init_(SamHQModel(cfg))
        return at_image_size(model, processor_for(image_size_of(model), mask_size(model)), image_size)
    from transformers import PretrainedConfig

    try:  # local_files_only: a hub id must already be in the cache; no run reaches the network on its own
        cfg, _ = PretrainedConfig.get_config_dict(spec, local_files_only=True)
    except OSError as e:
        raise ModelError(f"--model {spec}: not a model directory with config.json, nor a hub id in the local "
                         f"cache ({e})") from e
    if cfg.get("model_type") is None:
        raise ModelError(f"--model {spec}: no config.json with a model_type there, not a SAM-HQ checkpoint")
    if cfg.get("model_type") != "sam_hq":
        raise ModelError(f"--model {spec}: model_type is {cfg.get('model_type')!r}, not a SAM-HQ checkpoint "
                         f"('sam_hq')")
    check_image_size(image_size, cfg.get("vision_config", {}).get("patch_size", 16))
    try:
        model = SamHQModel.from_pretrained(spec, local_files_only=True, dtype=torch.float32,
                                           attn_implementation=attn)
        processor = SamHQProcessor.from_pretrained(spec, local_files_only=True)
    except Exception as e:  # missing or broken files raise OSError, ValueError, SafetensorError...: all bad input
        raise ModelError(f"--model {spec}: cannot load SAM-HQ weights and processor "
                         f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})") from e
    return at_image_size(model, processor, image_size)


def save_model(model: SamHQModel, processor, path: str | Path) -> None:
    model.save_pretrained(path)  # safetensors
    processor.save_pretrained(path)


def prepare(model: SamHQModel, mode: str, lora_rank: int = 8):
    """Set what trains; returns the module the optimizer and checkpoints see (a PeftModel for lora).
    decoder: SAM-HQ's recipe, encoder and prompt encoder frozen, the mask decoder (with the HQ token and
    the fusion convolutions) trained. lora: adapters on the encoder's attention projections, plus the
    decoder. full: everything."""
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        # dropout 0: peft's LoRA dropout would draw from the global RNG and break exact resumption
        cfg = LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=LORA_TARGETS,
                         modules_to_save=["mask_decoder"])
        return get_peft_model(model, cfg)
    for name, p in model.named_parameters():
        p.requires_grad_(mode == "full" or name.startswith(DECODER))
    return model


def core_model(trained) -> SamHQModel:
    """The SamHQModel inside (peft injects its layers in place, so calling this runs the adapters)."""
    return trained.get_base_model() if hasattr(trained, "get_base_model") else trained


def save_checkpoint(out: Path, step: int, trained, mode: str, spec: str, processor, state: dict) -> Path:
    final = out / f"checkpoint-{step}"
    tmp = out / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if mode == "lora":
        trained.save_pretrained(tmp / "adapter")
        # merge into a freshly loaded base: merging in place (merge_adapter / unmerge_adapter) would round
        # the training weights and a resumed run would no longer match an uninterrupted one
        from peft import PeftModel

        base, _ = load(spec, image_size=image_size_of(core_model(trained)))
        merged = PeftModel.from_pretrained(base, tmp / "adapter").merge_and_unload()
        save_model(merged, processor, tmp / "model")
    elif mode == "decoder" and any(p.dtype != torch.float32 for p in trained.parameters()):
        # the frozen rest is held in bf16 for training (samhq_fx.cast_frozen_weights_): the trained mask decoder
        # goes into a freshly loaded base, so the checkpoint keeps the base's own fp32 weights
        base, _ = load(spec, image_size=image_size_of(trained))
        base.load_state_dict({k: v for k, v in trained.state_dict().items() if k.startswith(DECODER)}, strict=False)
        save_model(base, processor, tmp / "model")
    else:
        save_model(trained, processor, tmp / "model")
    torch.save(dict(state, step=step, train=mode, model=spec, image_size=image_size_of(core_model(trained))),
               tmp / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def load_checkpoint(path: str | Path, mode: str, attn: str = "sdpa"):
    """(trained, processor, state) from a checkpoint folder, ready for `mode` (which must be the saved one)."""
    path = Path(path)
    if not (path / "trainer_state.pt").is_file():
        raise ModelError(f"--resume {path}: no trainer_state.pt (expected a DIR/checkpoint-<step> folder)")
    state = torch.load(path / "trainer_state.pt", weights_only=True)
    if state["train"] != mode:
        raise ModelError(f"--resume {path}: saved with --train {state['train']}, not --train {mode}")
    if mode == "lora":
        from peft import PeftModel

        base, processor = load(state["model"], attn, state.get("image_size"))
        trained = PeftModel.from_pretrained(base, path / "adapter", is_trainable=True)
    else:
        model, processor = load(str(path / "model"), attn)
        trained = prepare(model, mode)
    return trained, processor, state


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="where to save the model (save_pretrained) and its processor")
    p.add_argument("--vit-b", action="store_true", help="SAM-HQ ViT-B at 1024x1024 instead of the tiny model")
    p.add_argument("--size", choices=RANDOM_KINDS, default=None, help="tiny, vit-b, vit-l or vit-h (--vit-b: vit-b)")
    args = p.parse_args(argv)
    kind = args.size or ("vit-b" if args.vit_b else "tiny")
    model, processor = load(f"random:{kind}")
    save_model(model, processor, args.dir)
    print(f"saved a random-init SAM-HQ ({kind}) to {args.dir}")


if __name__ == "__main__":
    main()
