"""Where the host time of a compiled SAM encoder goes: wall vs GPU per call, and the Python and ops behind it.

For each build (samhq with the triton_op registration; the same with its kernels on Triton's launcher instead of
Inductor's static one, samhq.static_launch off; samhq with the opaque op; samhq on HF's "sdpa" attention class; samhq and Inductor
with Inductor's C++ wrapper, cpp_wrapper; Inductor on HF's "eager" and "sdpa" attention classes; samhq and Inductor in
reduce-overhead mode, the -ro builds, only when named) of an HF SAM-HQ vision
encoder (ViT-B/L/H config at --img: 1024, SAM's, the default, or 512 / 256, benchmarks/image_size.py; random
weights), all compiled first, in one process:
  wall      median of --rounds x --iters calls, each call synchronized (perf_counter around call + sync), the
            builds' calls interleaved one by one; also the median of each round of --iters calls;
  GPU       torch.profiler (CUDA) over 3 calls: the sum of kernel / memcpy / memset durations per call, the
            launches per call, and GPU busy = GPU / wall (the unprofiled wall above);
  peak      what one call allocates at its peak above what was live before it (MiB, max_memory_allocated);
  host ops  the same profile's CPU side: the top ops by self CPU time per call (custom ops, aten, Triton
            launches appear as cudaLaunchKernel / cuLaunchKernelEx);
  python    cProfile over --iters calls: the top functions by cumulative and by own time per call.
Then the fused op's pieces at this model's attention shapes, each timed alone on the host (perf_counter over 200
calls, one sync at the end): op dispatch, config lookup, unsupported_reason, kernels.forward / backward, an empty
Triton launch, index_rows.

  python benchmarks/tools/profile_host.py --model vit-b --dtype bf16 --batch 1 --what infer --out DIR
  python benchmarks/tools/profile_host.py --what train ...      # forward + backward (bf16 autocast)
  python benchmarks/tools/profile_host.py --dtype autocast --batch 4 --builds samhq-sdpa,inductor-sdpa
                                            # the frozen encoder of finetune_samhq.py --train decoder
  python benchmarks/tools/profile_host.py --what decoder --batch 4 ...
                                            # that recipe's whole step (encoder, mask decoder, AdamW)
  python benchmarks/tools/profile_host.py --img 256 --dtype tf32 --builds samhq-ro,inductor-eager-ro,inductor-sdpa-ro
                                            # reduce-overhead builds, interleaved (CUDA graph replays)
Appends one row per build to benchmarks/results/profile_host.jsonl (or --out), each starting with common.row_meta
(commit, date, GPU, versions), then the run's cell (model, what, dtype, batch, img), its builds and the build's figures
(with --pieces, the samhq build's row also holds them); prints a table.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import image_size  # noqa: E402

HARNESS = "profile_host"  # its rows: benchmarks/results/profile_host.jsonl

BUILDS = {
    "samhq": ("eager", "samhq", {"samhq.triton_op": "auto"}),
    # the fused op's kernels through Triton's Python launcher instead of Inductor's static one. Compiled in this
    # process (compile_threads=1) with the option off explicitly: compile workers read it from the environment,
    # where an earlier samhq build in the process has set it (samhq_fx/backend.py, launch_user_kernels_statically;
    # an A/B without this launched both builds' kernels statically, H200 2026-12-02)
    "samhq-triton-launcher": ("eager", "samhq", {"samhq.triton_op": "auto", "samhq.static_launch": False,
                                                 "static_launch_user_defined_triton_kernels": False,
                                                 "compile_threads": 1}),
    "samhq-opaque": ("eager", "samhq", {"samhq.triton_op": False}),
    # HF's "sdpa" attention class under samhq (finetune_samhq.py's default --attn): SDPA with a bias, matched too
    "samhq-sdpa": ("sdpa", "samhq", {"samhq.triton_op": "auto"}),
    # Inductor's C++ wrapper: the graph's launches issued from C++ instead of its Python wrapper
    "samhq-cpp": ("eager", "samhq", {"samhq.triton_op": "auto", "cpp_wrapper": True}),
    "inductor-eager": ("eager", "inductor", None),
    "inductor-sdpa": ("sdpa", "inductor", None),
    "inductor-sdpa-cpp": ("sdpa", "inductor", {"cpp_wrapper": True}),
    # reduce-overhead (CUDA graphs), timed interleaved like the rest: inference.py times such cells one at a time,
    # and a small one's in-cell timing moves by more than the builds differ. {"triton.cudagraphs": True} is what
    # Inductor's mode="reduce-overhead" sets (torch._inductor.list_mode_options)
    "samhq-ro": ("eager", "samhq", {"samhq.mode": "reduce-overhead"}),
    "inductor-eager-ro": ("eager", "inductor", {"triton.cudagraphs": True}),
    "inductor-sdpa-ro": ("sdpa", "inductor", {"triton.cudagraphs": True}),
}


# a build name with this suffix ("samhq-sdpa-held") is that build with the model's frozen Linear / conv weights held
# in bf16 (samhq_fx.cast_frozen_weights_): for --what decoder and --dtype autocast, where autocast casts them per call
HELD = "-held"


def build_encoder(model: str, attn: str, dtype: str, what: str, device, img: int = 1024):
    """Inference in bf16 casts the model (no master weights); training, and inference in "autocast", keep fp32 weights
    under bf16 autocast ("autocast" inference is the frozen encoder of finetune_samhq.py's decoder recipe). "decoder"
    builds the whole SamHQModel, with only its mask decoder trainable (the recipe's step). All at image size img."""
    from transformers import SamHQModel, SamHQVisionModel

    from samhq_fx.models import random_init_

    if what == "decoder":
        core = random_init_(SamHQModel(image_size.sam_hq_config(attn, model, img)))
        for name, p in core.named_parameters():
            p.requires_grad_(name.startswith("mask_decoder."))
        return core.to(device).train()
    enc = random_init_(SamHQVisionModel(image_size.vision_config(model, attn, img))).requires_grad_(what == "train")
    return enc.to(device=device, dtype=torch.bfloat16 if dtype == "bf16" and what == "infer" else torch.float32)


def make_call(enc, what: str, dtype: str, batch: int, device):
    if what == "decoder":
        return decoder_step(enc, batch, device)
    size = enc.config.image_size
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, size, size, generator=gen).to(device, next(enc.parameters()).dtype)
    probe = None

    def infer():
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16, enabled=dtype == "autocast"):
            return enc(pixel_values=x).last_hidden_state

    def train():
        nonlocal probe
        with torch.autocast("cuda", torch.bfloat16, enabled=dtype in ("bf16", "autocast")):
            out = enc(pixel_values=x).last_hidden_state
        if probe is None:
            probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        loss = (out.float() * probe).mean()
        loss.backward()
        for p in enc.parameters():
            p.grad = None
        return loss

    return infer if what == "infer" else train


def decoder_step(core, batch: int, device):
    """One step of finetune_samhq.py --train decoder on fixed inputs (no data loader): the compiled encoder under
    no_grad, the eager prompt encoder and mask decoder forward and backward under bf16 autocast, an AdamW step."""
    gen = torch.Generator().manual_seed(0)
    size = core.config.vision_config.image_size
    x = torch.randn(batch, 3, size, size, generator=gen).to(device)
    corner = torch.rand(batch, 1, 2, generator=gen) * size / 2
    boxes = torch.cat([corner, corner + size / 4], -1).to(device)  # [B, 1, 4] xyxy
    side = 4 * size // core.config.vision_config.patch_size
    target = (torch.rand(batch, side, side, generator=gen) > 0.5).float().to(device)
    opt = torch.optim.AdamW([p for p in core.parameters() if p.requires_grad], lr=1e-3)

    def step():
        with torch.autocast(device.type, torch.bfloat16):
            with torch.no_grad():
                vis = core.vision_encoder(x)
            out = core(image_embeddings=vis.last_hidden_state, intermediate_embeddings=vis.intermediate_embeddings,
                       input_boxes=boxes, multimask_output=False, hq_token_only=True)
            logits = out.pred_masks[:, 0, 0].float()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


def interleaved_walls(calls: dict, n: int, sync_after: bool = True) -> dict[str, list[float]]:
    """n calls of every build from an idle GPU, one call of each in turn (the order rotated every turn): a host
    whose speed drifts over seconds (lent machines do, by up to 1.7x between rounds of 20 calls) slows every build
    alike, where timing build after build would charge the drift to whichever build ran then. sync_after=False
    times only the issue: the host's time to the call's return, the GPU running behind."""
    names = list(calls)
    out: dict[str, list[float]] = {name: [] for name in names}
    for i in range(n):
        for name in common.in_turn(names, i):
            torch.cuda.synchronize()
            t = time.perf_counter()
            calls[name]()
            if sync_after:
                torch.cuda.synchronize()
            out[name].append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return out


def call_peak_mib(call) -> float:
    """What one call allocates at its peak above what was live before it (activations and workspace; the weights,
    and every other build's, are live before it): torch.cuda.max_memory_allocated over the call."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def gpu_profile(call, calls: int = 3, kernels: int = 25) -> dict:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t = time.perf_counter()
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) * 1e3 / calls
    recs = common.gpu_records(prof)
    gpu_us = sum(end - start for _, start, end in recs)
    names: dict[str, float] = {}
    for name, start, end in recs:
        names[name] = names.get(name, 0.0) + end - start
    counts: dict[str, int] = {}
    for name, _start, _end in recs:
        counts[name] = counts.get(name, 0) + 1
    top_gpu = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    top_count = [(n, c / calls) for n, c in sorted(counts.items(), key=lambda kv: -kv[1])[:kernels or None]]
    cpu = [(a.key, a.count / calls, a.self_cpu_time_total / calls) for a in prof.key_averages()
           if a.self_cpu_time_total > 0]
    cpu.sort(key=lambda r: -r[2])
    return {"wall_ms_profiled": wall, "gpu_ms": gpu_us / 1e3 / calls, "launches": len(recs) / calls,
            "gpu_busy": gpu_us / 1e3 / calls / wall, "top_gpu": [(n, t / calls) for n, t in top_gpu], "top_count": top_count,
            "top_cpu_self": [{"op": key, "count": count, "self_us": round(us, 1)} for key, count, us in cpu[:30]]}


def py_profile(call, iters: int) -> dict:
    pr = cProfile.Profile()
    torch.cuda.synchronize()
    pr.enable()
    for _ in range(iters):
        call()
    torch.cuda.synchronize()
    pr.disable()
    st = pstats.Stats(pr)
    rows = []
    for (file, line, fn), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append({"fn": f"{os.path.basename(file)}:{line}:{fn}", "calls": nc / iters, "own_us": tt * 1e6 / iters,
                     "cum_us": ct * 1e6 / iters})
    by_cum = sorted(rows, key=lambda r: -r["cum_us"])[:40]
    by_own = sorted(rows, key=lambda r: -r["own_us"])[:40]
    areas: dict[str, float] = {}
    for (file, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        areas[_area(file)] = areas.get(_area(file), 0.0) + tt * 1e6 / iters
    return {"by_cum": by_cum, "by_own": by_own, "own_us_by_area": dict(sorted(areas.items(), key=lambda kv: -kv[1]))}


def _area(file: str) -> str:
    """Which layer a Python function belongs to, for the own-time breakdown."""
    for key in ("samhq_fx", "kernels/", "patterns/", "torch/_inductor/runtime", "torch/_inductor", "torch/_dynamo",
                "torch/_library", "torch/_ops", "torch/autograd", "torch/cuda", "torch/utils", "triton/", "transformers"):
        if key in file:
            return key.rstrip("/")
    return "builtins/C" if file.startswith("~") or file == "" else "other: " + os.path.basename(file)


@triton.jit
def _empty(X, n, BLOCK: tl.constexpr):
    pass


def attention_shapes(enc, batch: int):
    """(B*heads, N, D, grid) of the encoder's window and global layers."""
    cfg = enc.config
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    g = cfg.image_size // cfg.patch_size
    w = cfg.window_size
    n_win = (-(-g // w)) ** 2  # windows per image (the grid padded to whole windows)
    return {"window": (batch * n_win * heads, w, d), "global": (batch * heads, g, d)}


def op_pieces(enc, batch: int, dtype) -> list[dict]:
    """Host time of the fused op's pieces at the model's attention shapes (the GPU work is small or queued)."""
    from samhq_fx.kernels import rel_pos_attention as K

    _empty_kernel = _empty

    def host_us(fn, n=200):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t) * 1e6 / n
        torch.cuda.synchronize()
        return host

    rows = []
    x0 = torch.empty(16, device="cuda")
    rows.append({"piece": "empty Triton launch (3 args)",
                 "us": host_us(lambda: _empty_kernel[(1,)](x0, 16, BLOCK=16))})
    for kind, (bh, g, d) in attention_shapes(enc, batch).items():
        n = g * g
        q, k, v = (torch.randn(bh, n, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
        rh, rw = (torch.randn(bh, n, g, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
        s = d ** -0.5
        out, lse = torch.ops.samhq.rel_pos_attention(q, k, v, rh, rw, s)
        dout = torch.randn_like(out)
        pre = f"{kind} {bh}x{g}x{g}x{d}"
        rows.append({"piece": f"{pre}: unsupported_reason", "us": host_us(lambda: K.unsupported_reason(q, k, v, rh, rw))})
        rows.append({"piece": f"{pre}: config lookup (3 kernels)", "us": host_us(lambda: [
            K._config(kn, dtype, "none", K._pad(d), K._pad(d), g, bh * n) for kn in ("fwd", "dq", "dkdv")])})
        rows.append({"piece": f"{pre}: kernels.forward", "us": host_us(lambda: K.forward(q, k, v, rh, rw, s))})
        rows.append({"piece": f"{pre}: kernels.backward", "us": host_us(
            lambda: K.backward(dout, q, k, v, rh, rw, out, lse, s))})
        rows.append({"piece": f"{pre}: samhq::rel_pos_attention (opaque op)",
                     "us": host_us(lambda: torch.ops.samhq.rel_pos_attention(q, k, v, rh, rw, s))})
        rows.append({"piece": f"{pre}: samhq::rel_pos_attention_backward (opaque op)", "us": host_us(
            lambda: torch.ops.samhq.rel_pos_attention_backward(dout, q, k, v, rh, rw, out, lse, s))})
        rows.append({"piece": f"{pre}: opaque op forward + backward, cProfile top own time (us per pair)",
                     "us": None, "python": py_profile(lambda: (
                         torch.ops.samhq.rel_pos_attention(q, k, v, rh, rw, s),
                         torch.ops.samhq.rel_pos_attention_backward(dout, q, k, v, rh, rw, out, lse, s)), 50)})
        table = torch.randn(2 * g - 1, d, device="cuda", dtype=dtype)
        idx = (torch.arange(g)[:, None] - torch.arange(g)[None, :] + g - 1).cuda()
        rows.append({"piece": f"{pre}: samhq::index_rows", "us": host_us(lambda: torch.ops.samhq.index_rows(table, idx))})
        rows.append({"piece": f"{pre}: table[idx] (aten)", "us": host_us(lambda: table[idx])})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit-b")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "tf32", "autocast"),
                    help="inference: bf16 weights and input, fp32 at TF32, or fp32 weights under bf16 autocast; "
                         "training: bf16 autocast (bf16, autocast) or TF32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--img", type=int, default=1024, choices=image_size.IMAGE_SIZES,
                    help="image size the model is built for and fed at (default 1024)")
    ap.add_argument("--what", default="infer", choices=("infer", "train", "decoder"),
                    help="encoder inference; encoder forward + backward; the decoder recipe's whole step")
    ap.add_argument("--builds", default=",".join(b for b in BUILDS if not b.endswith("-ro")),
                    help=f"comma list of {', '.join(BUILDS)} (default: all but the -ro builds); a name ending in "
                         f"{HELD!r}: that build with its frozen Linear / conv weights held in bf16 (--what decoder, "
                         "--dtype autocast)")
    ap.add_argument("--iters", type=int, default=20, help="synchronized calls per timing round")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timing rounds of --iters calls per build, the builds' calls interleaved one by one")
    ap.add_argument("--out", default=None, help=f"append the rows to this .jsonl file (a directory: "
                                                 f"<dir>/{HARNESS}.jsonl) instead of benchmarks/results/{HARNESS}.jsonl")
    ap.add_argument("--pieces", action="store_true", help="also time the fused op's pieces")
    ap.add_argument("--kernels", type=int, default=25,
                    help="GPU kernels kept in a row's top_count, by launches a call (0: all; to tell two builds' "
                         "launches apart)")
    args = ap.parse_args()
    torch.set_float32_matmul_precision("high")
    device = torch.device("cuda")
    from torch._dynamo.utils import counters

    import samhq_fx

    path = common.results_path(HARNESS, args.out)
    names = args.builds.split(",")
    run = {**common.row_meta(common.env_info(), device), "model": args.model, "what": args.what, "dtype": args.dtype,
           "batch": args.batch, "img": args.img, "iters": args.iters, "rounds": args.rounds, "builds": names}
    result = {"builds": {}}
    # Compile every build first, then time them in rotation: in one process the first build timed ran slower on
    # the host in every piece (addmm, launches, guards ~1.5x; H200, 2026-12-02), so timing builds one after the
    # other favours the later ones.
    built = {}
    for name in names:
        held = name.endswith(HELD)
        attn, backend, options = BUILDS[name.removesuffix(HELD)]
        counters.clear()
        enc = build_encoder(args.model, attn, args.dtype, args.what, device, args.img)
        cast = samhq_fx.cast_frozen_weights_(enc) if held else None  # before the compile: it guards on dtypes
        kw = {"backend": backend}
        if options:
            kw["options"] = options
        if args.what == "decoder":  # the recipe compiles the encoder module in place
            enc.vision_encoder.compile(**kw)
            call = make_call(enc, args.what, args.dtype, args.batch, device)
        else:
            call = make_call(torch.compile(enc, **kw), args.what, args.dtype, args.batch, device)
        t = time.perf_counter()
        call()
        torch.cuda.synchronize()
        row = {"compile_s": time.perf_counter() - t, "fused": counters["samhq"]["fused"],
               "graph_breaks": sum(counters["graph_break"].values())}
        if held:
            row["frozen_layers_in_bf16"] = cast
        for _ in range(3):
            call()
        built[name] = (enc, call, row)
        result["builds"][name] = row
        print(f"{name:22s} compiled in {row['compile_s']:.0f} s, fused {row['fused']}", flush=True)
    calls = {name: built[name][1] for name in names}
    timed = interleaved_walls(calls, args.rounds * args.iters)
    issued = interleaved_walls(calls, args.iters, sync_after=False)
    for name in names:
        enc, call, row = built[name]
        all_w = timed[name]
        w = [statistics.median(all_w[i:i + args.iters]) for i in range(0, len(all_w), args.iters)]
        row.update(wall_ms=statistics.median(all_w), wall_ms_by_round=w,
                   # one call (a cache warm-up run) has no quartiles
                   wall_ms_quartiles=statistics.quantiles(all_w, n=4) if len(all_w) > 1 else None,
                   issue_ms=statistics.median(issued[name]))
        row.update(gpu_profile(call, kernels=args.kernels))
        row["call_peak_mib"] = call_peak_mib(call)
        # busy against the unprofiled wall: the profiler's own host work slows a host-bound call
        row["gpu_busy_profiled"], row["gpu_busy"] = row["gpu_busy"], row["gpu_ms"] / row["wall_ms"]
        row["host_ms"] = row["wall_ms"] - row["gpu_ms"]
        row["python"] = py_profile(call, args.iters)
        result["builds"][name] = row
        print(f"{name:22s} wall {row['wall_ms']:7.2f} ms (rounds " + " ".join(f"{x:.2f}" for x in w) + ")  issue "
              f"{row['issue_ms']:7.2f} ms  gpu {row['gpu_ms']:6.2f} ms  busy {100 * row['gpu_busy']:4.0f}%  launches "
              f"{row['launches']:6.0f}  peak +{row['call_peak_mib']:.0f} MiB  fused {row['fused']}", flush=True)
        if args.pieces and name == "samhq":
            result["pieces"] = row["pieces"] = op_pieces(enc, args.batch,
                                                         torch.float32 if args.dtype == "tf32" else torch.bfloat16)
        # after every build: a later one that fails or runs out of time loses nothing
        common.append_rows(path, [{**run, "build": name, **row}])
    for p in result.get("pieces", []):
        if p["us"] is not None:
            print(f"  {p['us']:8.1f} us  {p['piece']}")
            continue
        print(f"  {p['piece']}: " + ", ".join(f"{k} {v:.0f}" for k, v in p["python"]["own_us_by_area"].items()))
        for r in p["python"]["by_own"][:12]:
            print(f"      own {r['own_us']:7.1f} cum {r['cum_us']:7.1f} x{r['calls']:<4.0f} {r['fn'][:80]}")
    for name, row in result["builds"].items():
        print(f"--- {name}: Python own time by area (us/call): " + ", ".join(
            f"{k} {v:.0f}" for k, v in list(row["python"]["own_us_by_area"].items())[:10]))
        print(f"--- {name}: GPU records by count (per call): " + "; ".join(
            f"{n[:50]} x{c:.0f}" for n, c in row["top_count"][:15]))
        print(f"--- {name}: top CPU self (us/call)")
        for r in row["top_cpu_self"][:12]:
            print(f"  {r['self_us']:8.1f}  x{r['count']:<6.0f} {r['op'][:90]}")
        print(f"--- {name}: top Python cumulative (us/call)")
        for r in row["python"]["by_cum"][:25]:
            print(f"  {r['cum_us']:8.1f} own {r['own_us']:7.1f} x{r['calls']:<5.0f} {r['fn'][:90]}")


if __name__ == "__main__":
    main()
