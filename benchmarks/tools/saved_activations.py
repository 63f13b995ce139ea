"""What a samhq-compiled SAM-HQ encoder saves for its backward, by `samhq.memory_budget` (CPU or GPU).

    python benchmarks/tools/saved_activations.py --model vit-h --dtype bf16 --budgets none,0.2,0.1

One forward per budget, in a fresh compile, under `torch.autograd.graph.saved_tensors_hooks`: the bytes of the
distinct storages autograd keeps for the backward, split into the model's parameters (resident anyway: saving one
costs no memory) and the rest (activations and casts, which the backward's peak holds). It counts what the
partitioner chose, not a peak: on the GPU the step's peak adds the fixed state and the backward's temporaries.
`--inductor` compiles the rest with Inductor (minutes on a CPU); by default aot_eager, which runs the same
partitioner (min-cut, with the budget), though Inductor's recomputes more pointwise ops on its own.
`--option KEY=VALUE` (repeatable) adds a samhq option to samhq's rows (`--option samhq.recompute_copies=True`).
`--peers` adds the builds samhq is held to: Inductor (or, without `--inductor`, aot_eager) with no rewrite, on HF's
"sdpa" and "eager" attention classes (samhq's own rows use `--attn`'s). `--img` builds the model for another image
size (benchmarks/image_size.py).
Appends one row per budget (and per peer) to benchmarks/results/saved_activations.jsonl (or --out), each starting
with common.row_meta (commit, date, GPU, versions).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import impls  # noqa: E402


def saved_bytes(fn, x, params: set[int], autocast_dtype=None) -> tuple[object, int, int]:
    """(fn(x), parameter bytes, other bytes) of the storages autograd saves during fn(x); params holds the
    parameters' storage data_ptr()s."""
    storages: dict[int, int] = {}

    def pack(t):
        if not isinstance(t, torch._subclasses.FakeTensor):  # fake ones: the compile's own tracing
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    autocast = torch.autocast(x.device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None)
    with autocast, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    weights = sum(n for ptr, n in storages.items() if ptr in params)
    return out, weights, sum(storages.values()) - weights


def main(argv=None) -> list[dict]:
    from transformers import SamHQVisionModel

    from samhq_fx import models

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit-b", choices=(*models.VIT_SIZES, "tiny"))
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"), help="bf16: under autocast")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--budgets", default="none,0.5,0.2", help="comma list of samhq.memory_budget values, or none")
    ap.add_argument("--inductor", action="store_true", help="compile with Inductor instead of aot_eager")
    ap.add_argument("--img", type=int, default=None, help="image size (256, 512, 1024; default: the model's)")
    ap.add_argument("--attn", default="eager", choices=("eager", "sdpa"), help="HF attention class of samhq's rows")
    ap.add_argument("--peers", action="store_true", help="also count the builds without samhq, both classes")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a samhq compile option for samhq's rows, VALUE a Python literal (repeatable)")
    ap.add_argument("--out", default=None, help="append the rows to this .jsonl file (a directory: "
                                                "<dir>/saved_activations.jsonl) instead of benchmarks/results/")
    args = ap.parse_args(argv)
    budgets = [None if b.strip() == "none" else float(b) for b in args.budgets.split(",") if b.strip()]
    extra = {}
    for item in args.option:
        try:
            key, value = impls.parse_option(item)
        except ValueError:
            ap.error(f"--option {item!r}: not KEY=VALUE with a Python literal (e.g. samhq.recompute_copies=True)")
        if not key.startswith("samhq."):
            ap.error(f"--option {item!r}: not a samhq option (samhq.NAME=VALUE)")
        extra[key] = value
    if args.img and args.model == "tiny":
        ap.error("--img: the tiny model has its own image size; give it with --model vit-b, vit-l or vit-h")

    device = "cuda" if torch.cuda.is_available() else "cpu"
    meta = common.row_meta(common.env_info(), torch.device(device))
    path = common.results_path("saved_activations", args.out)
    runs = [("samhq", args.attn, b) for b in budgets]
    if args.peers:
        runs += [("inductor" if args.inductor else "aot_eager", attn, None) for attn in ("sdpa", "eager")]
    rows = []
    for backend, attn, budget in runs:
        if args.model == "tiny":
            cfg = models.tiny_vision_config(attn)
        else:
            cfg = models.vision_config(args.model, attn, **({"image_size": args.img} if args.img else {}))
        torch.manual_seed(0)
        model = models.random_init_(SamHQVisionModel(cfg)).to(device)
        size = cfg.image_size
        x = torch.randn(args.batch, 3, size, size, device=device)
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        if backend == "samhq":
            options = {"samhq.memory_budget": budget, "samhq.inductor": args.inductor, **extra}
            kw = dict(backend="samhq", options=options)
        else:
            kw = dict(backend=backend)
        start = time.perf_counter()
        out, weights, rest = saved_bytes(torch.compile(model, **kw), x, params,
                                         torch.bfloat16 if args.dtype == "bf16" else None)
        del out  # and with it what it saved, before the next compile
        rows.append(dict(meta, model=args.model, img=size, dtype=args.dtype, batch=args.batch, device=device,
                         backend=backend, attn_implementation=attn, budget=budget, inductor=args.inductor,
                         options=extra if backend == "samhq" else {},
                         saved_params_mib=round(weights / 2**20, 3), saved_rest_mib=round(rest / 2**20, 3),
                         fused=torch._dynamo.utils.counters["samhq"]["fused"],
                         seconds=round(time.perf_counter() - start, 1)))
        common.append_rows(path, rows[-1:])
        shown = "".join(f" {k}={v}" for k, v in extra.items()) if backend == "samhq" else ""
        print(f"{args.model} {size}px {args.dtype} b{args.batch} {backend} ({attn} class) budget {budget}{shown}: "
              f"saved {rest / 2**20:.2f} MiB + parameters {weights / 2**20:.2f} MiB; {rows[-1]['fused']} fused",
              flush=True)
    return rows


if __name__ == "__main__":
    main()
