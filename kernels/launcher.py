"""Launches of already-compiled kernels, for calls made outside any trace (the op called eagerly, the opaque op in a
compiled graph).

Triton's `kernel[grid](...)` (JITFunction.run) works out on every launch which binary the arguments need: it
specializes each argument (a pointer's dtype and 16-byte alignment, an integer's value 1 and divisibility by 16) and
hashes the result. For the backward's 77 arguments that is ~20 us of a CI core, and torch's wrap_triton wrapper in
front of it ~8 us more, per launch. Here the caller hands each launch site a cache that belongs to one signature of
the call (its inputs' shapes, strides and dtypes, the GPU class, the block config: rel_pos_attention._plan), which
fixes every integer and constexpr argument, so a launch reads only the current device and its pointers' alignment.
The first launch of each goes through JITFunction.run, which compiles or finds the binary and launches it; later
ones call that binary's launcher as JITFunction.run does last.

On unless SAMHQ_FX_DIRECT_LAUNCH=0. tests/test_kernels.py (test_gpu_direct_launch_bits) checks on a GPU that these
launches give JITFunction.run's bits, on first and later calls and with an unaligned pointer, and that later calls
make no JIT call; tests/test_host_path.py checks the bookkeeping on CPU.

Where Triton is asked to watch launches (`triton.knobs.runtime.launch_enter_hook` / `launch_exit_hook`, set by its
profiler) or a kernel has pre-run hooks, every launch goes through JITFunction.run, so the hooks see them all; so
do all launches on a Triton whose launcher call was not read (other than 3.6 to 3.9). Triton knobs that pick another
binary (`TRITON_DEBUG`, instrumentation) are read at a launch site's first launch, not again.
"""

from __future__ import annotations

import os

import torch
import triton
from triton import knobs
from triton.runtime import driver

# the Tritons whose CompiledKernel.run call (grid, stream, function, metadata, launch metadata, hooks, arguments with
# the constexprs in place) this module makes as JITFunction.run does: read in 3.6 and 3.9
_CALL_LAYOUT_READ = (3, 6) <= tuple(int(x) for x in triton.__version__.split(".")[:2]) <= (3, 9)
ENABLED = os.environ.get("SAMHQ_FX_DIRECT_LAUNCH", "1") != "0" and _CALL_LAYOUT_READ


def _hooked() -> bool:
    """Whether Triton has launch hooks to call (HookChain objects with entries; a plain callable in older Tritons)."""
    return any(h is not None and getattr(h, "calls", True)
               for h in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook))


def launch(kernel, grid: tuple, cache: dict, args: tuple, kwargs: dict) -> None:
    """kernel[grid](*args, **kwargs) (args: the runtime arguments, positional, in parameter order; kwargs: the
    constexprs and launch options). cache: this launch site's binaries, from a plan whose signature fixes every
    non-pointer argument and option of the launch; keyed here by device and pointer alignments."""
    device = driver.active.get_current_device()  # JITFunction.run's too: it compiles and launches for this one
    aligned = tuple([a.data_ptr() % 16 == 0 for a in args if isinstance(a, torch.Tensor)])
    hit = cache.get((device, aligned))
    if hit is None or _hooked() or kernel.pre_run_hooks:
        compiled = kernel[grid](*args, **kwargs)
        if compiled is None:  # a jit_cache_hook took the launch: nothing to keep
            return
        consts = tuple(kwargs[p.name] if p.name in kwargs else p.default for p in kernel.params[len(args):])
        # the CompiledKernel is kept with its handles: its module is unloaded when it is freed
        cache[(device, aligned)] = (compiled, compiled.run, compiled.function, compiled.packed_metadata, consts)
        return
    _, run, function, metadata, consts = hit
    grid_y = grid[1] if len(grid) > 1 else 1
    grid_z = grid[2] if len(grid) > 2 else 1
    # what JITFunction.run calls last, without launch metadata or hooks (none are set: _hooked)
    run(grid[0], grid_y, grid_z, driver.active.get_current_stream(device), function, metadata, None, None, None,
        *args, *consts)
