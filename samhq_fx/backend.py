"""The `samhq` torch.compile backend: Inductor, plus the rel-pos attention rewrite.

    torch.compile(model, backend="samhq")                           # registered as an entry point
    torch.compile(model, backend="samhq", mode="reduce-overhead")   # any Inductor mode, without options
    torch.compile(model, backend="samhq", options={"samhq.mode": "reduce-overhead", "samhq.dump_dir": "dumps"})
    torch.compile(model, backend="samhq", options={"samhq.dump_dir": "dumps", "max_autotune": True})

torch.compile refuses `mode=` and `options=` together (RuntimeError, every torch from 2.0 to 2.13, whatever the
backend), so a mode that comes with other options is the option `samhq.mode`. For a backend given by name
torch.compile passes `mode` only when it is not "default" and `options` only when not empty.

Everything but the rewrite is Inductor's. The rewrite runs on the Dynamo graph (before autograd is
traced), here in the backend so its counters and dumps exist even when Inductor's caches hit; the
same pass object is then given to Inductor as `pre_grad_custom_pass`, where its `uuid()` enters the
cache key. `compile_fx` does the rest with the mode's and the user's Inductor options. Under compiled
autograd (torch._dynamo.config.compiled_autograd = True) the backward graph comes through here too.

Its options (keys of `options` prefixed `samhq.`, or SAMHQ_FX_* environment variables) are samhq_fx/options.py's,
resolved once per compile into an `Options`; all other keys are Inductor config options, passed through. An option
error reaches the caller of the compiled model as the ValueError / TypeError it is (`OptionValueError`,
`OptionTypeError`), not inside Dynamo's BackendCompilerFailed.
"""

from __future__ import annotations

import contextlib
import inspect
import os
from typing import Any

import torch
from torch._dynamo.exc import ShortenTraceback

from .host_indices import move_host_indices
from .options import KEYS, PREFIX, Options
from . import placement
from .recompute import RecomputeRelCopies
from .rewrite import RelPosAttentionPass


class _OptionError(ShortenTraceback):
    """An option error raised where Dynamo calls the backend. Dynamo wraps anything else a backend raises in
    BackendCompilerFailed ("backend='samhq' raised: ...", with its advice around the message), and re-raises a
    ShortenTraceback as it is (torch/_dynamo/output_graph.py, _call_user_compiler, torch 2.11-2.13); its traceback
    starts at the backend. str() is the message as raised: Dynamo appends its advice to args[0]."""

    def __init__(self, message: str, first_useful_frame):
        super().__init__(message, first_useful_frame=first_useful_frame)
        self.message = message

    def __str__(self) -> str:
        return self.message


class OptionValueError(_OptionError, ValueError):
    """A ValueError in the samhq backend's options, found when the first graph compiled."""


class OptionTypeError(_OptionError, TypeError):
    """A TypeError in the samhq backend's options, found when the first graph compiled."""


def resolve_options(mode: str | None, options) -> Options:
    """`Options.resolve`, its errors as OptionValueError / OptionTypeError, which Dynamo passes through."""
    try:
        return Options.resolve(options, mode=mode)
    except (ValueError, TypeError) as err:
        error = OptionTypeError if isinstance(err, TypeError) else OptionValueError
        raise error(str(err), first_useful_frame=inspect.currentframe().f_back) from None  # from the caller on


def split_options(options) -> tuple[dict[str, Any], dict[str, Any]]:
    """The resolved options as two dicts in torch.compile's spelling: ({"samhq.<name>": value}, Inductor's)."""
    resolved = Options.resolve(options)
    ours = {key: getattr(resolved, key[len(PREFIX):]) for key in KEYS}
    return ours, dict(resolved.inductor_options)


def launch_user_kernels_statically(patches: dict[str, Any]) -> None:
    """Let Inductor launch the fused op's kernels (the triton_op registration's) with its static CUDA launcher,
    as it launches its own (option samhq.static_launch), unless the user's Inductor options say otherwise.
    Triton's own launcher binds and specialises every argument in Python on each call: 12 forward launches of the
    bf16 ViT-B encoder at batch 1 cost about as much host time as its other 147 launches together (cProfile on the
    H200, benchmarks/DECISIONS.md, host path). A kernel that cannot be launched statically keeps Triton's launcher
    (Inductor decides per kernel).

    Inductor decides that where it compiles the kernel, which is in its compile workers (separate processes), and
    it hands them only `use_static_triton_launcher` of the parent's config (torch 2.11-2.13,
    async_compile.py): a config patch alone never reached them (H200, 2026-12-02: all 12 launches still went
    through Triton's launcher). The workers read the option from their environment when they start, so it is set
    there too; workers already running (an earlier compile in the process) keep what they had."""
    from torch._inductor import config as inductor_config

    key = "static_launch_user_defined_triton_kernels"
    if hasattr(inductor_config, key):  # torch >= 2.8
        patches.setdefault(key, True)
        if patches[key]:
            os.environ.setdefault("TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS", "1")


def samhq_backend(gm: torch.fx.GraphModule, example_inputs, mode: str | None = None, options=None):
    """Dynamo backend: rewrite rel-pos attention, compile the rest with Inductor.

    torch.compile(backend="samhq") calls it with mode= (only when not "default") or options= (only when not
    empty), never both (torch/__init__.py, _TorchCompileWrapper); a direct caller may give both."""
    from torch._inductor.compile_fx import compile_fx

    opts = resolve_options(mode, options)
    patches = opts.inductor_patches()
    graphs = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]  # gm and its HOP bodies
    if opts.host_indices:
        for module in graphs:
            if move_host_indices(module.graph):
                module.recompile()
    if opts.rewrite:
        triton_op = placement.for_compile(opts.triton_op, patches)
        rewrite = RelPosAttentionPass(opts.min_seq_len, opts.dump_dir, triton_op)
        for module in graphs:  # activation-checkpoint regions and other HOP bodies included
            rewrite(module.graph)
            module.recompile()
        patches["pre_grad_custom_pass"] = rewrite  # its uuid() keys Inductor's caches
        if opts.static_launch and triton_op:  # the opaque op launches its kernels itself
            launch_user_kernels_statically(patches)
    if opts.recompute_copies:  # tags the joint graph before Inductor partitions it (aot_eager has no such hook)
        patches["joint_custom_post_pass"] = RecomputeRelCopies()
    with memory_budget(opts.memory_budget):  # AOTAutograd partitions while the backend compiles
        if not opts.inductor:
            from torch._dynamo.backends.debugging import aot_eager

            return aot_eager(gm, example_inputs)
        return compile_fx(gm, example_inputs, config_patches=patches)


def memory_budget(budget: float | None):
    """The partitioner's activation memory budget for one compile (option samhq.memory_budget); None: as set."""
    import torch._functorch.config as functorch_config

    if budget is None:
        return contextlib.nullcontext()
    return functorch_config.patch(activation_memory_budget=float(budget))
