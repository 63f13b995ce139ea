"""Where a training step's peak memory goes, per implementation (CUDA): the phase it falls in and what is live then.

    python benchmarks/tools/peak_memory.py --model vit-b --img 256 --dtype tf32 --impls samhq-sdpa,inductor-eager

Results: benchmarks/results/peak_memory.jsonl (or --out), rows starting with common.row_meta.

Method: train_step.py's model, step and optimizer (SamHQVisionModel of --model at --img, a fixed random probe as the
loss, AdamW fused), one implementation at a time in one process, each a fresh compile freed before the next; default
mode only (CUDA-graph and compiled-autograd builds are refused: a graph replay allocates nothing the trace could
show, and compiled autograd needs train_step.py's compiled forward-backward). cuBLAS's workspaces, which it keeps
for good, are allocated once before the first implementation (`common.warm_libraries`), so that every implementation's
`base` holds them rather than the first one's figures. After --warmup steps (at least 1: the first compiles; the
optimizer state exists from the first), one step is run phase by phase: forward, backward, optimizer, each under
its own torch.cuda peak (reset_peak_memory_stats), with the allocated bytes at the boundaries; `peak_mib`, the
highest of the three, is train_step.py's peak (the same maximum over whole steps, less what was allocated when
its cell started). Then one more step under torch.cuda.memory._record_memory_history (Python frames): its
allocation trace is replayed (`peak_of`) to the moment the allocated bytes peak, and the blocks live then are
summed by what they are: parameters, optimizer state (both resident before the step), gradients (the blocks in
`.grad` after it that were already live at the peak), and every other block by where it was allocated (`site`:
the innermost frame outside torch, with its source line: for Inductor's code a line such as
`buf3 = empty_strided_cuda(...)`); `at_peak_since_forward_mib` is the part allocated after the forward (a block
of MARKER_BYTES allocated and freed between the two marks the forward's end in the trace), `peak_site` the
allocation that reached the peak. The trace gives each block's requested bytes, while the allocator counts it
rounded up (to 512 B, a large one by up to 1 MiB when the rest of its cached block is not split off), so
`traced_peak_mib` reads somewhat below `step_peak_mib`, torch.cuda's own peak of that same step.
"""

from __future__ import annotations

import argparse
import linecache
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import common  # noqa: E402
import impls  # noqa: E402

MIB = 2**20
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep  # the separator: not torchvision's files too
MAX_ENTRIES = 1_000_000  # the history is a ring buffer: a trace this long may have lost its start
MARKER_BYTES = 4099  # an odd size no tensor has, allocated and freed between the forward and the backward


def peak_of(trace: list[dict], live_before: int) -> tuple[int, dict[int, dict], int]:
    """(peak allocated bytes, the trace's blocks live at that moment: addr -> its alloc event, the index of the
    alloc that reached it) of an allocation trace (torch.cuda.memory._snapshot()["device_traces"][i]);
    live_before: the bytes allocated when recording started, blocks the trace does not name (it can free them:
    they come off the count all the same)."""
    # memory_allocated drops at free_requested, a block is reusable at free_completed; on one stream with no
    # record_stream (this step) the two come together, so the count is the same either way
    now = peak = live_before
    at = -1
    for i, e in enumerate(trace):
        if e["action"] == "alloc":
            now += e["size"]
            if now > peak:
                peak, at = now, i
        elif e["action"] == "free_completed":
            now -= e["size"]
    return peak, live_at(trace, at + 1), at


def marker_index(trace: list[dict]) -> int:
    """Index of the MARKER_BYTES alloc (the forward's end); -1 when the trace has none."""
    return next((i for i, e in enumerate(trace) if e["action"] == "alloc" and e["size"] == MARKER_BYTES), -1)


def live_at(trace: list[dict], end: int) -> dict[int, dict]:
    """addr -> its alloc event, of the trace's blocks live after its first `end` events."""
    live: dict[int, dict] = {}
    for e in trace[:end]:
        if e["action"] == "alloc":
            live[e["addr"]] = e
        elif e["action"] == "free_completed":
            live.pop(e["addr"], None)
    return live


def site(frames: list[dict]) -> str:
    """Where a block was allocated: the innermost frame (frames: innermost first) outside torch's own files, as
    file:line and its source line (Inductor's generated code names its buffers there), and its caller's place."""
    if not frames:
        return "(no Python frames: C++, e.g. the autograd engine's thread)"
    ours = [f for f in frames if not f.get("filename", "").startswith((_TORCH_DIR, "<"))]
    if not ours:
        return "(torch internals)"
    f = ours[0]
    text = linecache.getline(f["filename"], f.get("line", 0)).strip()
    caller = f" < {os.path.basename(ours[1]['filename'])}:{ours[1].get('line')}" if len(ours) > 1 else ""
    return f"{os.path.basename(f['filename'])}:{f.get('line')} {text[:80]}{caller}"


def storages(tensors) -> dict[int, int]:
    """data_ptr -> bytes of the distinct storages of `tensors` (Nones skipped)."""
    out = {}
    for t in tensors:
        if t is not None:
            s = t.untyped_storage()
            out[s.data_ptr()] = s.nbytes()
    return out


def breakdown(at_peak: dict[int, dict], grads: dict[int, int], only=None) -> dict[str, int]:
    """Bytes of the blocks live at the peak, by site; gradients as one entry; only: the alloc events to count
    (by id), None for all."""
    sums: dict[str, int] = defaultdict(int)
    for addr, e in at_peak.items():
        if only is None or id(e) in only:
            sums["gradients" if addr in grads else site(e.get("frames", []))] += e["size"]
    return dict(sums)


def _in_mib(parts: dict[str, int]) -> dict[str, float]:
    """breakdown()'s bytes in MiB, largest first."""
    return {k: round(v / MIB, 2) for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}


def measure(name: str, args, device) -> dict:
    import train_step

    impl = impls.IMPLS[name]
    common.reset_compile_state()
    common.set_precision("high")
    base = torch.cuda.memory_allocated(device)
    model, cfg = train_step.build_model(impl.attn, False, device, args.model, args.img)
    net = torch.compile(model, **impls.compile_kwargs(impl)) if impl.backend else model
    opt, opt_step = train_step.make_optimizer("adamw-fused", model)
    g = cfg.image_size // cfg.patch_size
    x = torch.randn(args.batch, 3, cfg.image_size, cfg.image_size, generator=torch.Generator().manual_seed(1))
    probe = torch.randn(args.batch, cfg.output_channels, g, g, generator=torch.Generator().manual_seed(7))
    x, probe = x.to(device), probe.to(device)

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
            out = net(pixel_values=x)
        return (out.last_hidden_state.float() * probe).mean()

    def zero():
        model.zero_grad(set_to_none=True)
        torch.compiler.cudagraph_mark_step_begin()

    for _ in range(max(1, args.warmup)):
        zero()
        forward().backward()
        opt_step()
    torch.cuda.synchronize(device)
    row = dict(model=args.model, img=args.img, dtype=args.dtype, batch=args.batch, impl=name,
               recipe=impls.recipe(impl, "model"))
    zero()
    phases = {}
    start = torch.cuda.memory_allocated(device)
    for phase in ("forward", "backward", "optimizer"):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        if phase == "forward":
            loss = forward()
        elif phase == "backward":
            loss.backward()
            del loss
        else:
            opt_step()
        torch.cuda.synchronize(device)
        phases[phase] = (torch.cuda.max_memory_allocated(device), torch.cuda.memory_allocated(device))
    row["fixed_mib"] = round((start - base) / MIB, 1)  # parameters, optimizer state, the inputs
    for phase, (peak, after) in phases.items():
        row[f"{phase}_peak_mib"] = round((peak - base) / MIB, 1)
        row[f"after_{phase}_mib"] = round((after - base) / MIB, 1)
    row["peak_phase"] = max(phases, key=lambda p: phases[p][0])
    row["peak_mib"] = round((phases[row["peak_phase"]][0] - base) / MIB, 1)

    zero()
    torch.cuda.synchronize(device)
    live_before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(stacks="python", max_entries=MAX_ENTRIES, clear_history=True)
    try:
        loss = forward()
        loss.new_empty(MARKER_BYTES, dtype=torch.uint8)  # allocated and freed: marks the forward's end in the trace
        loss.backward()
        del loss
        opt_step()
        torch.cuda.synchronize(device)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    row["step_peak_mib"] = round((torch.cuda.max_memory_allocated(device) - base) / MIB, 1)
    trace = snap["device_traces"][device.index or 0]
    if len(trace) >= MAX_ENTRIES:
        raise RuntimeError(f"{name}: the step's allocation trace filled all {MAX_ENTRIES} entries; its start is lost")
    peak, at_peak, at = peak_of(trace, live_before)
    mark = marker_index(trace)
    if mark < 0:
        raise RuntimeError(f"{name}: the marker block of {MARKER_BYTES} B is not in the step's allocation trace")
    # a gradient's block is the one live at the end of the trace at its address: an activation freed before the
    # backward can have had the same address at the peak
    end = live_at(trace, len(trace))
    grads = {a: n for a, n in storages(p.grad for p in model.parameters()).items()
             if a in at_peak and at_peak[a] is end.get(a)}
    parts = breakdown(at_peak, grads)
    params = sum(storages(model.parameters()).values())
    state = sum(storages(t for s in opt.state.values() for t in s.values()
                         if isinstance(t, torch.Tensor) and t.device.type == "cuda").values())
    row["traced_peak_mib"] = round((peak - base) / MIB, 1)
    row["live_before_mib"] = round((live_before - base) / MIB, 1)
    row["parameters_mib"] = round(params / MIB, 1)
    row["optimizer_state_mib"] = round(state / MIB, 1)
    row["at_peak_mib"] = _in_mib(parts)
    # what was allocated after the forward and is still live at the peak (the rest was live when the forward
    # ended), and the allocation that reached the peak
    later = {id(e) for i, e in enumerate(trace) if i > mark and e["action"] == "alloc"}
    mine = breakdown(at_peak, grads, only=later)
    row["peak_in"] = "backward" if at > mark else "forward"
    row["peak_site"] = site(trace[at].get("frames", [])) if at >= 0 else None
    row["at_peak_since_forward_mib"] = _in_mib(mine)
    return row


def main(argv=None) -> list[dict]:
    from samhq_fx import models

    import image_size

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit-b", choices=models.VIT_SIZES)
    ap.add_argument("--img", type=int, default=1024, choices=image_size.IMAGE_SIZES)
    ap.add_argument("--dtype", default="tf32", choices=("tf32", "bf16"), help="bf16: under autocast")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--impls", default="samhq-sdpa,inductor,inductor-eager",
                    help="comma list of benchmarks/impls.py names (default mode: no CUDA graph pools)")
    ap.add_argument("--warmup", type=int, default=3, help="steps before the measured ones (at least 1)")
    ap.add_argument("--top", type=int, default=8, help="sites printed per implementation")
    ap.add_argument("--out", default=None, help="append the rows to this .jsonl file instead of benchmarks/results/")
    args = ap.parse_args(argv)
    names = impls.parse(args.impls, ())
    bad = [n for n in names if impls.IMPLS[n].mode or impls.IMPLS[n].compiled_autograd]
    if bad:
        raise SystemExit(f"peak_memory.py measures default-mode builds only (no CUDA graphs, compiled autograd): {bad}")
    if not torch.cuda.is_available():
        raise SystemExit("peak_memory.py needs a CUDA GPU (torch.cuda.memory history)")
    device = torch.device("cuda", torch.cuda.current_device())
    common.warm_libraries(device)  # before any implementation's base
    meta = common.row_meta(common.env_info(), device)
    path = common.results_path("peak_memory", args.out)
    rows = []
    for name in names:
        row = dict(meta, **measure(name, args, device))
        common.reset_compile_state()  # the cell's compiled code, model and optimizer go with it
        rows.append(row)
        common.append_rows(path, [row])
        print(f"== {name}: peak {row['peak_mib']} MiB in the {row['peak_phase']} (fixed {row['fixed_mib']}, "
              f"after forward {row['after_forward_mib']}, after backward {row['after_backward_mib']}; phase peaks "
              f"{row['forward_peak_mib']} / {row['backward_peak_mib']} / {row['optimizer_peak_mib']})", flush=True)
        print(f"   traced step: peak {row['step_peak_mib']} MiB, replayed {row['traced_peak_mib']} (requested bytes); "
              f"live before it {row['live_before_mib']} MiB: parameters {row['parameters_mib']}, optimizer state "
              f"{row['optimizer_state_mib']}, the rest the inputs and what the build keeps")
        for what, mib in list(row["at_peak_mib"].items())[:args.top]:
            print(f"   {mib:9.2f} MiB  {what}")
        since = row["at_peak_since_forward_mib"]
        print(f"   of which allocated after the forward ({sum(since.values()):.1f} MiB; the peak reached in the "
              f"{row['peak_in']} at {row['peak_site']}):")
        for what, mib in list(since.items())[:args.top]:
            print(f"   {mib:9.2f} MiB  {what}")
    return rows


if __name__ == "__main__":
    main()
