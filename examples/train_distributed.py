"""Data-parallel SAM-HQ training with the `samhq` backend: DistributedDataParallel around a compiled model.

    torchrun --nproc_per_node 2 examples/train_ddp.py                  # GPUs (NCCL) if present, else CPU (gloo)
    torchrun --nproc_per_node 2 examples/train_ddp.py --backend inductor   # the same run without the rewrite

Every rank trains the small random-init SAM-HQ vision encoder on its own synthetic batch for a few steps
and rank 0 prints the loss curve, how many attention blocks were fused on each rank (Dynamo's DDP
optimizer splits the graph at gradient-bucket boundaries and compiles each piece separately), and a
checksum and a SHA-256 of the final parameters, so two runs can be compared (samhq vs inductor: close;
samhq vs samhq: the same bits).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch._dynamo.utils import counters
from transformers import SamHQVisionModel

from samhq_fx.models import random_init_, tiny_vision_config, vit_b_vision_config


def _full(p: torch.Tensor) -> torch.Tensor:
    p = p.detach()
    return p.full_tensor() if hasattr(p, "full_tensor") else p  # DTensor (FSDP2 shard) -> whole parameter


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="samhq", help="torch.compile backend: samhq, inductor")
    p.add_argument("--engine", choices=["ddp", "fsdp2"], default="ddp",
                   help="ddp: DistributedDataParallel(model) compiled; fsdp2: fully_shard on each encoder layer and "
                        "the root, then compiled")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch", type=int, default=2, help="per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP gradient bucket size")
    p.add_argument("--model", choices=["tiny", "vit-b-256"], default="tiny",
                   help="tiny: 2 layers; vit-b-256: SAM-HQ ViT-B weights (12 layers, ~15 DDP buckets) on 256x256 images")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    p.add_argument("--samhq-aot-eager", action="store_true", help="samhq rewrite, then aot_eager (fast CPU check)")
    p.add_argument("--json", default=None, help="rank 0 writes its summary here")
    args = p.parse_args(argv)

    use_cuda = (args.device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cuda"
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)

    if args.model == "tiny":
        cfg = tiny_vision_config("sdpa")
    else:  # ViT-B parameter sizes (so DDP buckets split the graph as in real training), 16x16 tokens
        cfg = vit_b_vision_config("sdpa")
        cfg.image_size = 256
    model = random_init_(SamHQVisionModel(cfg), rel_pos_std=0.5).to(device)  # same seed: same weights on all ranks
    size = cfg.image_size
    if args.engine == "ddp":
        wrapped = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    else:
        from torch.distributed.fsdp import fully_shard

        for layer in model.vision_encoder.layers:
            fully_shard(layer)
        wrapped = fully_shard(model)
    options = {"samhq.inductor": False} if args.samhq_aot_eager and args.backend == "samhq" else None
    compiled = torch.compile(wrapped, backend=args.backend, options=options)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    out_hw = size // cfg.patch_size
    w = torch.randn(cfg.output_channels, out_hw, out_hw, generator=torch.Generator().manual_seed(7)).to(device)

    losses = []
    for _ in range(args.steps):
        x = torch.randn(args.batch, 3, size, size, generator=gen).to(device)
        loss = (compiled(x).last_hidden_state * w).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        losses.append(avg.item() / world)

    # per rank: attention blocks fused, and graphs the samhq backend compiled (DDP's optimizer splits the
    # Dynamo graph at bucket boundaries; 0 for other backends)
    mine = torch.tensor([counters["samhq"]["fused"], counters["samhq"]["graphs"]], device=device)
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    full = [_full(p) for p in model.parameters()]  # FSDP2: all-gathers each sharded parameter
    checksum = sum(p.double().sum().item() for p in full)
    sha = hashlib.sha256(b"".join(p.cpu().contiguous().view(torch.uint8).numpy().tobytes() for p in full))
    summary = {"backend": args.backend, "engine": args.engine, "losses": losses,
               "fused_per_rank": [int(g[0]) for g in gathered], "graphs_per_rank": [int(g[1]) for g in gathered],
               "param_checksum": checksum, "param_sha256": sha.hexdigest(), "world": world}
    if rank == 0:
        print(f"{args.backend} ({args.engine}): loss {' -> '.join(f'{l:.5f}' for l in losses)}")
        print(f"attention blocks fused per rank: {summary['fused_per_rank']} in "
              f"{summary['graphs_per_rank']} compiled graphs; parameter checksum {checksum:.6f}, "
              f"sha256 {summary['param_sha256'][:16]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(summary, f)
    # Gloo teardown: a worker thread drops each finished collective after waking the caller, and that
    # drop takes the GIL (the collective's tensors have Python objects); destroying the process group
    # holds the GIL while joining those threads. Seen here as a hang at exit (pytorch/pytorch#75097,
    # #56297). So: wait for all work (barrier), then sleep, which releases the GIL, so the workers
    # finish before the process group goes.
    dist.barrier()
    if not use_cuda:
        time.sleep(0.5)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
