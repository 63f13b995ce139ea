"""Fine-tune a SAM-HQ model with the `samhq` torch.compile backend: the main job of this repo.

    python examples/finetune_samhq.py            # small random-init SAM-HQ, CPU or GPU, about a minute
    python examples/finetune_samhq.py --full     # ViT-B at 1024x1024 (needs a GPU), bf16 autocast

Builds a Hugging Face `SamHQModel` with random weights (no download), makes synthetic images with
box prompts whose target mask is the box, compiles the model with backend="samhq", trains a few
steps and prints loss, step time, peak memory and how many attention blocks were fused. Before
training it checks that the compiled model's loss equals eager's on the first batch.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import statistics
import time

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from transformers import SamHQModel

from samhq_fx.models import random_init_, sam_hq_config

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is optional
    tqdm = None


def build_model(full: bool, attn: str) -> SamHQModel:
    # full: SAM-HQ ViT-B, 64x64 tokens, 14x14 windows, 4 global layers; else a small one for CPU
    return random_init_(SamHQModel(sam_hq_config(attn, full)))


def synthetic_batch(batch: int, image_size: int, mask_size: int, generator: torch.Generator):
    """Smooth random images, one box prompt each, and the box as the target mask (low-res logits size)."""
    coarse = torch.rand(batch, 3, 8, 8, generator=generator)
    images = F.interpolate(coarse, size=image_size, mode="bilinear", align_corners=False) * 2 - 1
    lo = torch.rand(batch, 2, generator=generator) * 0.5
    hi = lo + 0.2 + torch.rand(batch, 2, generator=generator) * 0.3
    boxes = torch.cat([lo, hi], dim=1)[:, None, :] * image_size  # [B, 1, (x0, y0, x1, y1)]
    grid = (torch.arange(mask_size) + 0.5) / mask_size * image_size
    inside_x = (grid[None, :] >= boxes[:, 0, 0:1]) & (grid[None, :] <= boxes[:, 0, 2:3])
    inside_y = (grid[None, :] >= boxes[:, 0, 1:2]) & (grid[None, :] <= boxes[:, 0, 3:4])
    masks = (inside_y[:, :, None] & inside_x[:, None, :]).float()  # [B, mask, mask]
    return images, boxes, masks


def loss_fn(model, images, boxes, masks):
    out = model(pixel_values=images, input_boxes=boxes, multimask_output=False)
    logits = out.pred_masks[:, 0, 0].float()  # [B, h, w]
    return F.binary_cross_entropy_with_logits(logits, masks)


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--full", action="store_true", help="SAM-HQ ViT-B at 1024x1024 (GPU)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=None, help="default: 2 small, 1 full")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="HF attn_implementation")
    p.add_argument("--backend", default="samhq", help="torch.compile backend (samhq, inductor) or 'none'")
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
    p.add_argument("--compile", choices=["model", "vision-encoder"], default=None,
                   help="what to compile (default: model; vision-encoder with --full, see README 'Known issues')")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (default with --full)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dump-dir", default=None, help="write samhq graph dumps and match reports here")
    p.add_argument("--no-check", action="store_true", help="skip the eager-vs-compiled loss check")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if args.full and device.type != "cuda":
        p.error("--full needs a CUDA GPU")
    batch = args.batch or (1 if args.full else 2)
    bf16 = args.bf16 or args.full
    torch.set_float32_matmul_precision("high")  # TF32 where the GPU has it, as most fine-tuning runs do

    model = build_model(args.full, args.attn).to(device).train()
    image_size = model.config.vision_config.image_size
    mask_size = 4 * image_size // model.config.vision_config.patch_size  # SAM's low-res mask logits
    gen = torch.Generator().manual_seed(0)
    data = [tuple(t.to(device) for t in synthetic_batch(batch, image_size, mask_size, gen)) for _ in range(args.steps)]
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    options = {"samhq.dump_dir": args.dump_dir} if args.dump_dir and args.backend == "samhq" else None
    mode = args.mode
    if options and mode:  # torch.compile takes mode= or options=, not both: the mode goes in as samhq.mode
        options, mode = {**options, "samhq.mode": mode}, None
    scope = args.compile or ("vision-encoder" if args.full else "model")
    compiled = model
    if args.backend != "none" and scope == "model":
        compiled = torch.compile(model, backend=args.backend, mode=mode, options=options)
    elif args.backend != "none":
        # All rel-pos attention (and most FLOPs) is in the vision encoder. On the H200 (torch 2.11) plain
        # Inductor, like samhq, fails in the mask decoder's conv backward in bf16 (README: Known issues).
        model.vision_encoder.compile(backend=args.backend, mode=mode, options=options)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"SAM-HQ {'ViT-B 1024' if args.full else 'small'}: {n_params / 1e6:.1f}M params, batch {batch}, "
          f"attn={args.attn}, backend={args.backend} ({scope}), {'bf16 autocast' if bf16 else 'fp32'}, {device}")

    if not args.no_check:
        print("check: compiling (cold caches: minutes for ViT-B) and comparing with eager...", flush=True)
        t0 = time.perf_counter()
        with autocast, torch.compiler.set_stance("force_eager"):
            eager_loss = loss_fn(model, *data[0]).item()
        with autocast:
            compiled_loss = loss_fn(compiled, *data[0]).item()
        print(f"check: eager loss {eager_loss:.6f}, compiled loss {compiled_loss:.6f}, "
              f"|diff| {abs(eager_loss - compiled_loss):.2e} ({time.perf_counter() - t0:.0f} s)", flush=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    steps = tqdm(data, desc="train", unit="step") if tqdm else data
    for images, boxes, masks in steps:
        t0 = time.perf_counter()
        with autocast:
            loss = loss_fn(compiled, images, boxes, masks)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        if tqdm:
            steps.set_postfix(loss=f"{losses[-1]:.4f}")
        else:
            print(f"step {len(losses)}: loss {losses[-1]:.4f} ({times[-1] * 1e3:.0f} ms)")

    steady = times[1:] or times
    print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"step time: first (compile) {times[0]:.1f} s, then median {statistics.median(steady) * 1e3:.1f} ms")
    print(f"peak memory: {peak_memory_mib(device):.0f} MiB ({'GPU allocated' if device.type == 'cuda' else 'process RSS'})")
    fused = counters["samhq"]["fused"]
    n_layers = model.config.vision_config.num_hidden_layers
    print(f"attention blocks fused by samhq: {fused} (vision encoder has {n_layers} attention layers; "
          f"counted per compiled graph)")
    return {"losses": losses, "times": times, "fused": fused}


if __name__ == "__main__":
    main()
