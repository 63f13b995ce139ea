"""Fine-tune SAM-HQ on a mask folder with the `samhq` torch.compile backend: the main job of this repo.

    python examples/finetune_samhq.py             # tiny random-init SAM-HQ on a generated mask folder (CPU ok)
    python examples/finetune_samhq.py --model DIR_OR_HUB_ID --data DIR [--train decoder|lora|full]
        [--steps N | --epochs N] [--batch B] [--lr LR] [--bf16] [--out DIR] [--resume DIR/checkpoint-K]
        [--image-size N]
    python examples/finetune_samhq.py --full      # random-init ViT-B at 1024x1024 (GPU), bf16 autocast
    python examples/finetune_samhq.py --full --size vit-h     # the same with SAM-HQ's ViT-H encoder
    python examples/finetune_samhq.py --model DIR --data DIR --image-size 256   # train at 256x256 (SAM-Med2D's size)

The data layout is in samhq_data.py, the checkpoint layout in samhq_model_io.py. With no --model a
random-init model is built; with no --data a small mask folder is generated under --out first, so the
default run needs no download. --image-size N trains on N x N inputs (256 and 512 are common for medical
and remote-sensing data): the processor resizes images, masks and prompts to N, and the encoder's absolute
position embedding and its global layers' rel-pos tables are interpolated to the N / 16 patch grid (a 1024
checkpoint trains at 256 on 16x16 patches); its checkpoints keep that size. The vision encoder is compiled
with --backend (samhq by default; the README's Limitations section says why not the whole model). Before
training the compiled loss is checked against eager on the first batch, and a few forward + backward passes
of that batch are timed both ways: the eager baseline's ms/step is printed beside the compiled one at the end
(on CPU that checks correctness only: the fused kernels are CUDA's). Loss: BCE + dice on the low-res mask
logits; AdamW, linear warm-up then cosine decay. Written under --out: checkpoint-<step>/, metrics.jsonl (loss
per step, validation mask IoU and boundary IoU at each evaluation, before training included), curves.png and
summary.json (ms/step, peak memory, validation IoU before and after: one run's numbers).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

import samhq_fx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helper modules beside this file
import samhq_data  # noqa: E402
import samhq_metrics  # noqa: E402
import samhq_model_io as io  # noqa: E402

try:
    from tqdm import tqdm
except ImportError:  # the progress bar is optional
    tqdm = None
say = tqdm.write if tqdm else print  # prints between progress-bar redraws instead of through them

DEFAULT_LR = {"decoder": 1e-3, "lora": 5e-4, "full": 1e-4}  # SAM-HQ trains its decoder at 1e-3


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="SamHQModel.from_pretrained dir or cached hub id (default: random)")
    p.add_argument("--full", action="store_true", help="with no --model: random ViT-B at 1024x1024 (GPU)")
    p.add_argument("--size", choices=("vit-b", "vit-l", "vit-h"), default="vit-b",
                   help="with --full: which SAM-HQ encoder to build (default vit-b)")
    p.add_argument("--data", default=None, help="mask folder: images/, masks/, optional val.txt (default: generated)")
    p.add_argument("--image-size", type=int, default=None,
                   help="train on N x N inputs, e.g. 256 or 512: images, masks and prompts resized to N, the "
                        "encoder's position embeddings interpolated to the new patch grid (default: the model's own, "
                        "1024 for SAM)")
    p.add_argument("--val-fraction", type=float, default=0.1, help="held out when there is no val.txt (seeded)")
    p.add_argument("--points", type=int, default=0, help="also prompt with N points drawn inside the mask")
    p.add_argument("--box-jitter", type=float, default=0.1, help="training box noise, fraction of the box size")
    p.add_argument("--train", choices=io.TRAIN_MODES, default="decoder")
    p.add_argument("--lora-rank", type=int, default=8)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, default=None, help="optimizer steps in all (default 100)")
    length.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="default: 2 small, 1 full")
    p.add_argument("--lr", type=float, default=None, help=f"peak learning rate (default {DEFAULT_LR})")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default: 10%% of the steps)")
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None, help="autocast (default: on GPU)")
    p.add_argument("--cast-frozen", action=argparse.BooleanOptionalAction, default=True,
                   help="with --bf16: keep the frozen Linear / conv weights in bf16 (samhq_fx.cast_frozen_weights_; "
                        "the same bits, no per-step weight casts)")
    p.add_argument("--out", default="finetune_out", help="checkpoints, metrics.jsonl, curves.png")
    p.add_argument("--resume", default=None, help="a checkpoint-<step> folder to continue from")
    p.add_argument("--save-every", type=int, default=0, help="also checkpoint every N steps (always at the end)")
    p.add_argument("--eval-every", type=int, default=None, help="validate every N steps (default: 4 times a run)")
    p.add_argument("--workers", type=int, default=None, help="data-loading processes (default: 4 on GPU, 0 on CPU)")
    p.add_argument("--seed", type=int, default=None, help="data split, order, jitter, points and LoRA init (default 0)")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa", help="HF attn_implementation")
    p.add_argument("--backend", default="samhq", help="torch.compile backend for the encoder (samhq, inductor, none)")
    p.add_argument("--mode", default=None, help="torch.compile mode, e.g. reduce-overhead")
    p.add_argument("--samhq-aot-eager", action="store_true", help="samhq rewrite, then aot_eager (fast CPU compile)")
    p.add_argument("--memory-budget", type=float, default=None,
                   help="samhq.memory_budget in (0, 1]: save that fraction of the activations, recompute the rest")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dump-dir", default=None, help="write samhq graph dumps and match reports here")
    p.add_argument("--no-check", action="store_true", help="skip the eager-vs-compiled loss check and timing")
    p.add_argument("--baseline-steps", type=int, default=3,
                   help="with the check: time N forward + backward passes of the first batch eagerly and compiled, "
                        "printed at the end as ms/step (no optimizer step; 0: no timing)")
    return p, p.parse_args(argv)


def predict(core, batch, grad_encoder: bool) -> torch.Tensor:
    """Low-res mask logits [B, h, w] of the HQ output (what SAM-HQ trains). The encoder is called on its
    own so that it can run without autograd when it is frozen (and so it is the compiled part)."""
    with torch.set_grad_enabled(grad_encoder and torch.is_grad_enabled()):
        vis = core.vision_encoder(batch["pixel_values"])
    out = core(image_embeddings=vis.last_hidden_state, intermediate_embeddings=vis.intermediate_embeddings,
               input_boxes=batch["input_boxes"], input_points=batch.get("input_points"),
               input_labels=batch.get("input_labels"), multimask_output=False, hq_token_only=True)
    return out.pred_masks[:, 0, 0].float()


def first_batch_ms(core, batch, grad_encoder: bool, autocast, device, steps: int) -> float:
    """Median ms of `steps` forward + backward passes on one batch, after one untimed pass (the compile, or a
    warm-up). Gradients are dropped and no optimizer step is taken: the weights stay as they are."""
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        with autocast:
            loss = loss_fn(predict(core, batch, grad_encoder), batch["target"])
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        core.zero_grad(set_to_none=True)
    return statistics.median(times[1:]) * 1e3


def loss_fn(logits, target):
    bce = F.binary_cross_entropy_with_logits(logits, target)
    prob, target = logits.sigmoid().flatten(1), target.flatten(1)
    dice = 1 - (2 * (prob * target).sum(1) + 1) / (prob.sum(1) + target.sum(1) + 1)
    return bce + dice.mean()


def warmup_cosine(warmup: int, total: int):
    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    return factor


def to_device(batch, device):
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


@torch.no_grad()
def evaluate(core, samples, processor, args, device, autocast, mask_size, image_size):
    """Mean mask IoU and boundary IoU over `samples`, exact box prompts. Runs the encoder eagerly: compiling
    it again for no-grad inference would cost a second compile for a few batches."""
    if not samples:
        return None
    core.eval()
    scores = []
    with autocast, torch.compiler.set_stance("force_eager"):
        for i in range(0, len(samples), args.batch):
            batch = samhq_data.make_batch(samples[i:i + args.batch], processor, mask_size, None, points=args.points)
            logits = predict(core, to_device(batch, device), grad_encoder=False)
            scores += samhq_metrics.batch_scores(logits, batch, image_size)
    core.train()
    return {"val_iou": statistics.fmean(s[0] for s in scores), "val_boundary_iou": statistics.fmean(s[1] for s in scores)}


def peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # process peak RSS


def main(argv=None):
    p, args = parse_args(argv)
    device = torch.device(args.device)
    if args.full and device.type != "cuda" and not args.model:
        p.error("--full needs a CUDA GPU")
    if args.memory_budget is not None and (args.backend != "samhq" or not 0 < args.memory_budget <= 1):
        p.error(f"--memory-budget needs --backend samhq and a number in (0, 1], got {args.memory_budget} with "
                f"--backend {args.backend}")
    if args.baseline_steps < 0:
        p.error(f"--baseline-steps must be 0 or more, got {args.baseline_steps}")
    spec = args.model or (f"random:{args.size}" if args.full else "random:tiny")
    bf16 = device.type == "cuda" if args.bf16 is None else args.bf16
    torch.set_float32_matmul_precision("high")  # TF32 where the GPU has it, as most fine-tuning runs do
    out = Path(args.out)

    # Everything that can fail on bad input happens before the first byte is written under --out
    if args.resume:
        trained, processor, state = io.load_checkpoint(args.resume, args.train, args.attn)
        if args.model and args.model != state["model"]:
            p.error(f"--resume {args.resume} was trained from --model {state['model']}, not {args.model}")
        spec = state["model"]
        # what the batches depend on comes from the checkpoint unless given again: an exact continuation
        for key in ("data", "batch", "seed"):
            if getattr(args, key) is None:
                setattr(args, key, state.get(key))
        saved_size = io.image_size_of(io.core_model(trained))
        if args.image_size not in (None, saved_size):
            p.error(f"--resume {args.resume} was trained at --image-size {saved_size}, not {args.image_size}")
    else:
        model, processor = io.load(spec, args.attn)
        own_size = io.image_size_of(model)
        model, processor = io.at_image_size(model, processor, args.image_size)
        if io.image_size_of(model) != own_size:
            patch = model.config.vision_config.patch_size
            g0, g = own_size // patch, args.image_size // patch
            print(f"--image-size {args.image_size} (the model's own is {own_size}): images, masks and prompts resized "
                  f"to {args.image_size}; position embedding interpolated from {g0}x{g0} to {g}x{g} patches, global "
                  f"rel-pos tables from {2 * g0 - 1} to {2 * g - 1} rows")
        state = {}
    args.batch = args.batch or (1 if args.full else 2)
    args.seed = 0 if args.seed is None else args.seed
    core = io.core_model(trained) if args.resume else model
    image_size, mask_size = core.config.vision_config.image_size, io.mask_size(core)
    if args.data:
        samples = samhq_data.scan(args.data)
    else:
        data_dir = samhq_data.write_synthetic(out / "data", size=image_size, seed=args.seed)
        samples = samhq_data.scan(data_dir)
    train_set, val_set = samhq_data.split(samples, args.data or out / "data", args.val_fraction, args.seed)
    if not args.resume:
        torch.manual_seed(args.seed)  # LoRA's adapters draw their init from the global RNG: one --seed, one run
        trained = io.prepare(model, args.train, args.lora_rank)
        core = io.core_model(trained)
    per_epoch = max(1, len(train_set) // args.batch)
    total = args.epochs * per_epoch if args.epochs else (args.steps if args.steps is not None else 100)
    lr = args.lr or DEFAULT_LR[args.train]
    warmup = args.warmup if args.warmup is not None else max(1, total // 10)
    eval_every = args.eval_every or max(1, total // 4)
    if bf16 and args.cast_frozen:  # frozen weights need no fp32 master: cast once, not every step (same bits)
        cast = samhq_fx.cast_frozen_weights_(core)
        if cast:
            print(f"frozen Linear / conv layers kept in bf16: {cast}")
    core.to(device).train()

    options = {}
    if args.dump_dir and args.backend == "samhq":
        options["samhq.dump_dir"] = args.dump_dir
    if args.samhq_aot_eager and args.backend == "samhq":
        options["samhq.inductor"] = False
    if args.memory_budget is not None:
        options["samhq.memory_budget"] = args.memory_budget
    mode = args.mode
    if options and mode:  # torch.compile takes mode= or options=, not both: samhq takes the mode as an option
        options, mode = {**options, "samhq.mode": mode}, None
    if args.backend != "none":
        core.vision_encoder.compile(backend=args.backend, mode=mode, options=options or None)
    params = [q for q in trained.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(warmup, total))
    start = state.get("step", 0)
    batch_args = {"data": args.data, "batch": args.batch, "seed": args.seed}  # saved with each checkpoint
    if args.resume:
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    grad_encoder = args.train != "decoder"
    n_train = sum(q.numel() for q in params)
    compiled = args.backend != "none"
    encoder_runs = (f"vision encoder compiled with backend={args.backend}" if compiled
                    else "vision encoder eager (--backend none: nothing compiled)")
    if args.resume:
        print(f"resuming from {args.resume} at step {start} of {total} (--model {spec}, --data "
              f"{args.data or out / 'data'}, --batch {args.batch}, --seed {args.seed}, --image-size {image_size})")
    print(f"SAM-HQ {spec}: {sum(q.numel() for q in trained.parameters()) / 1e6:.2f}M params, "
          f"{n_train / 1e6:.3f}M trained ({args.train}); data: {len(train_set)} train / {len(val_set)} val; "
          f"batch {args.batch}, {total} steps, lr {lr:g}; {encoder_runs}, "
          f"{'bf16 autocast' if bf16 else 'fp32'}, {device}, images {image_size}x{image_size}")

    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "metrics.jsonl"
    # a resumed run's log starts with the interrupted run's records up to the checkpoint (from --out, or from
    # beside the checkpoint when --out is a new folder), so curves.png and summary.json cover the whole run
    old_log = log_path if log_path.exists() else Path(args.resume or out) / ".." / "metrics.jsonl"
    records = [json.loads(line) for line in old_log.read_text().splitlines()] if start and old_log.exists() else []
    records = [r for r in records if r["step"] < start or ("val_iou" in r and r["step"] == start)]
    log_path.write_text("".join(json.dumps(r) + "\n" for r in records))

    def log(record):
        records.append(record)
        with log_path.open("a") as f:
            f.write(json.dumps(record) + "\n")

    def run_eval(step):
        metrics = evaluate(core, val_set, processor, args, device, autocast, mask_size, image_size)
        if metrics:
            log({"step": step, **metrics})
            say(f"validation at step {step}: mask IoU {metrics['val_iou']:.4f}, "
                  f"boundary IoU {metrics['val_boundary_iou']:.4f}")
        return metrics

    batches = samhq_data.StepBatches(train_set, processor, mask_size, args.batch, args.seed, args.box_jitter,
                                     args.points, start, total)
    workers = args.workers if args.workers is not None else (4 if device.type == "cuda" else 0)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers,
                                         pin_memory=device.type == "cuda")

    if start == 0:
        run_eval(0)
    check_diff = eager_ms = compiled_ms = None
    if not compiled and not args.no_check:
        print("check: none, --backend none compiles nothing (the run is the eager baseline)")
    if compiled and not args.no_check and start < total:
        print(f"check: compiling with {args.backend} (cold caches: minutes for ViT-B) and comparing the first batch's "
              f"loss with eager...", flush=True)
        t0 = time.perf_counter()
        first = to_device(batches[0], device)
        with autocast, torch.compiler.set_stance("force_eager"):
            eager_loss = loss_fn(predict(core, first, grad_encoder), first["target"]).item()
        with autocast:
            compiled_loss = loss_fn(predict(core, first, grad_encoder), first["target"]).item()
        check_diff = abs(eager_loss - compiled_loss)
        print(f"check: eager loss {eager_loss:.6f}, compiled loss {compiled_loss:.6f}, "
              f"|diff| {check_diff:.2e} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if args.baseline_steps > 0:
            try:
                with torch.compiler.set_stance("force_eager"):
                    eager_ms = first_batch_ms(core, first, grad_encoder, autocast, device, args.baseline_steps)
            except torch.cuda.OutOfMemoryError:  # eager holds every N x N attention matrix; the run need not
                core.zero_grad(set_to_none=True)
                torch.cuda.empty_cache()
                print(f"check: eager forward + backward ran out of GPU memory at batch {args.batch}: no baseline")
            compiled_ms = first_batch_ms(core, first, grad_encoder, autocast, device, args.baseline_steps)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, losses = [], []
    bar = tqdm(desc=f"train {args.train}", unit="step", initial=start, total=total) if tqdm else None
    for step, batch in enumerate(loader, start):
        batch = to_device(batch, device)
        t0 = time.perf_counter()
        with autocast:
            loss = loss_fn(predict(core, batch, grad_encoder), batch["target"])
        loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
        log({"step": step, "loss": losses[-1], "lr": sched.get_last_lr()[0], "ms": times[-1] * 1e3})
        if bar is not None:
            bar.update()
            bar.set_postfix(loss=f"{losses[-1]:.4f}", img_s=f"{args.batch / times[-1]:.1f}")
        else:
            print(f"step {step}: loss {losses[-1]:.4f} ({times[-1] * 1e3:.0f} ms)")
        done = step + 1
        if done % eval_every == 0 and done < total:
            run_eval(done)
        if args.save_every and done % args.save_every == 0 and done < total:
            io.save_checkpoint(out, done, trained, args.train, spec, processor,
                               {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), **batch_args})
    if bar is not None:
        bar.close()
    final_metrics = run_eval(total)
    ckpt = io.save_checkpoint(out, total, trained, args.train, spec, processor,
                              {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), **batch_args})
    png = samhq_metrics.plot_curves(records, out / "curves.png")

    evals = [r for r in records if "val_iou" in r]
    fused = counters["samhq"]["fused"]
    steady = times[1:] or times or [float("nan")]
    summary = {  # one line per run for comparing backends and recipes (examples/gpu_proof.sh reads it)
        "train": args.train, "backend": args.backend, "model": spec, "image_size": image_size, "batch": args.batch,
        "steps": total,
        "bf16": bf16, "device": str(device), "fused": fused, "check_abs_diff": check_diff,
        "first_batch_eager_ms": eager_ms, "first_batch_compiled_ms": compiled_ms,
        "ms_per_step": statistics.median(steady) * 1e3, "first_step_s": times[0] if times else None,
        "peak_mib": peak_memory_mib(device), "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None,
        **{f"{k}_{when}": e[k] for when, e in ((("before", evals[0]), ("after", evals[-1])) if evals else ())
           for k in ("val_iou", "val_boundary_iou")},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if losses:
        print(f"loss: {losses[0]:.4f} -> {losses[-1]:.4f}")
        print(f"step time: first {times[0]:.1f} s, then median {summary['ms_per_step']:.1f} ms "
              f"({args.batch * 1e3 / summary['ms_per_step']:.1f} img/s)")
    if compiled_ms is not None:
        eager = "out of memory" if eager_ms is None else f"{eager_ms:.1f} ms/step"
        # on CPU the ratio would read as a speed-up it is not (the note below)
        ratio = "" if eager_ms is None or device.type != "cuda" else f" ({eager_ms / compiled_ms:.2f}x eager's speed)"
        print(f"first batch, forward + backward, median of {args.baseline_steps} (no optimizer step): eager {eager}, "
              f"{args.backend} {compiled_ms:.1f} ms/step{ratio}")
    if device.type == "cpu" and args.backend == "samhq":
        print("note: on CPU samhq is checked for correctness, not speed: its fused kernels need a CUDA GPU (on CPU "
              "the fused op runs a blocked PyTorch reference)")
    print(f"peak memory: {summary['peak_mib']:.0f} MiB ({'GPU allocated' if device.type == 'cuda' else 'process RSS'})")
    if evals:
        print(f"validation mask IoU: {evals[0]['val_iou']:.4f} (step {evals[0]['step']}) -> {evals[-1]['val_iou']:.4f} "
              f"(step {evals[-1]['step']}); boundary IoU {evals[0]['val_boundary_iou']:.4f} -> "
              f"{evals[-1]['val_boundary_iou']:.4f}")
    n_layers = core.config.vision_config.num_hidden_layers
    why = {"samhq": "counted per compiled graph", "none": "--backend none: nothing compiled"}.get(
        args.backend, f"--backend {args.backend}: samhq not used")
    print(f"attention blocks fused by samhq: {fused} (vision encoder has {n_layers} attention layers; {why})")
    print(f"wrote {ckpt}/, {log_path}, {out / 'summary.json'}{', ' + str(png) if png else ''}")
    return {"losses": losses, "times": times, "fused": fused, "evals": evals, "checkpoint": ckpt,
            "final": final_metrics, "steps": total}


if __name__ == "__main__":
    try:
        main()
    except (samhq_data.DatasetError, io.ModelError) as e:  # bad input: the message, not a traceback
        sys.exit(f"error: {e}")
