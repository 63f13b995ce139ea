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

samhq's own options (keys of `options`, or environment variables):
    samhq.mode         str, default None    an Inductor mode: "default", "reduce-overhead", "max-autotune",
                                            "max-autotune-no-cudagraphs" (the mode= of torch.compile, which
                                            cannot come with options=). Given both ways, they must agree
    samhq.rewrite      bool, default True   False: plain Inductor            (SAMHQ_FX_DISABLE=1)
    samhq.dump_dir     str, default None    write graphs + match report here (SAMHQ_FX_DUMP_DIR)
    samhq.min_seq_len  int, default 1       leave attention over fewer keys alone (SAMHQ_FX_MIN_SEQ_LEN)
    samhq.triton_op    bool or "auto",      True: emit the op's torch.library.triton_op registration, whose
                       default "auto"       kernels Inductor compiles and launches itself; static key grids
                                            only (SAMHQ_FX_TRITON_OP=1). False: the opaque op, which
                                            launches them itself (SAMHQ_FX_TRITON_OP=0). "auto": the
                                            triton_op one where the grid is static and the GPU is a Hopper
                                            (op.kernels_verified_for), unless the mode captures CUDA graphs;
                                            the opaque op everywhere else
    samhq.host_indices bool, default True   build index tensors that the model makes on the host
                                            (torch.arange without a device, as SAM's get_rel_pos does) on
                                            the device of the tensor they index, which removes a host sync
                                            per use and lets CUDA graphs capture the step
                                            (SAMHQ_FX_HOST_INDICES=0 turns it off, =1 on; host_indices.py)
    samhq.inductor     bool, default True   False: run the rewritten graph with aot_eager instead of
                                            Inductor (debugging: is a difference the rewrite's or
                                            Inductor's?; also compiles in a fraction of the time)
    samhq.static_launch bool, default True  Inductor launches the fused op's kernels (triton_op registration)
                                            with its static CUDA launcher, as it launches its own, instead of
                                            Triton's Python launcher (SAMHQ_FX_STATIC_LAUNCH=0 turns it off). It
                                            reaches compile workers started after the first samhq compile only
                                            (launch_user_kernels_statically)
    samhq.memory_budget float, default None  keep at most this fraction (0 < f <= 1) of the activations the
                                            default partition saves for the backward, and recompute the cheapest
                                            rest there: AOTAutograd's activation_memory_budget
                                            (torch._functorch.config) for this compile only, no change to the
                                            model. None leaves PyTorch's setting (1.0 unless set)
                                            (SAMHQ_FX_MEMORY_BUDGET)
All other keys are Inductor config options, passed through unchanged; one that contradicts the mode's own
setting (e.g. "triton.cudagraphs": False with "reduce-overhead") is an error, not a silent override.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from .host_indices import move_host_indices
from .rewrite import RelPosAttentionPass

SAMHQ_OPTIONS = {"samhq.mode": None, "samhq.rewrite": True, "samhq.dump_dir": None, "samhq.min_seq_len": 1,
                 "samhq.triton_op": "auto", "samhq.host_indices": True, "samhq.inductor": True,
                 "samhq.static_launch": True, "samhq.memory_budget": None}
_TRITON_OP_ENV = {"0": False, "1": True, "auto": "auto"}


def _env_switch(name: str) -> bool | None:
    """An on/off environment variable: unset or "" -> None (the default holds), "0" -> False, else True."""
    val = os.environ.get(name, "")
    return None if val == "" else val != "0"


def _env_defaults() -> dict[str, Any]:
    env = dict(SAMHQ_OPTIONS)
    if _env_switch("SAMHQ_FX_DISABLE"):
        env["samhq.rewrite"] = False
    if os.environ.get("SAMHQ_FX_DUMP_DIR"):
        env["samhq.dump_dir"] = os.environ["SAMHQ_FX_DUMP_DIR"]
    triton_op = os.environ.get("SAMHQ_FX_TRITON_OP", "")
    if triton_op:
        if triton_op not in _TRITON_OP_ENV:
            raise ValueError(f"samhq backend: SAMHQ_FX_TRITON_OP must be 0, 1 or auto, got {triton_op!r}")
        env["samhq.triton_op"] = _TRITON_OP_ENV[triton_op]
    for key, name in (("samhq.host_indices", "SAMHQ_FX_HOST_INDICES"),
                      ("samhq.static_launch", "SAMHQ_FX_STATIC_LAUNCH")):
        switch = _env_switch(name)
        if switch is not None:
            env[key] = switch
    if os.environ.get("SAMHQ_FX_MIN_SEQ_LEN"):
        env["samhq.min_seq_len"] = int(os.environ["SAMHQ_FX_MIN_SEQ_LEN"])
    budget = os.environ.get("SAMHQ_FX_MEMORY_BUDGET", "")
    if budget:
        try:
            env["samhq.memory_budget"] = float(budget)
        except ValueError:
            raise ValueError(f"samhq backend: SAMHQ_FX_MEMORY_BUDGET must be a number in (0, 1], got {budget!r}")
    return env


def split_options(options: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(samhq options with defaults and env applied, Inductor options)."""
    ours = _env_defaults()
    inductor = {}
    for key, val in (options or {}).items():
        if key.startswith("samhq."):
            if key not in SAMHQ_OPTIONS:
                raise ValueError(f"samhq backend: unknown option {key!r}; known: {sorted(SAMHQ_OPTIONS)}")
            ours[key] = val
        else:
            inductor[key] = val
    if ours["samhq.triton_op"] not in (True, False, "auto"):
        raise ValueError(f"samhq backend: options['samhq.triton_op'] must be True, False or 'auto', "
                         f"got {ours['samhq.triton_op']!r}")
    budget = ours["samhq.memory_budget"]
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, (int, float))
                               or not 0 < budget <= 1):
        raise ValueError(f"samhq backend: options['samhq.memory_budget'] must be None or a number in (0, 1], "
                         f"got {budget!r}")
    return ours, inductor


def inductor_modes() -> dict[str, dict[str, Any]]:
    """{mode: its Inductor options}, as this torch knows them ("default", "reduce-overhead", "max-autotune",
    "max-autotune-no-cudagraphs"; newer torch adds more)."""
    from torch._inductor import list_mode_options

    return list_mode_options()


def resolve_mode(mode: str | None, samhq_mode: str | None) -> str:
    """The one mode from torch.compile's mode= and options["samhq.mode"]: either, or both when they agree."""
    modes = inductor_modes()
    for name, val in (("mode", mode), ("options['samhq.mode']", samhq_mode)):
        if val is not None and val not in modes:
            raise ValueError(f"samhq backend: {name}={val!r} is not an Inductor mode; valid: {', '.join(modes)}")
    if mode is not None and samhq_mode is not None and mode != samhq_mode:
        raise ValueError(f"samhq backend: mode={mode!r} and options['samhq.mode']={samhq_mode!r} differ; give one")
    return mode or samhq_mode or "default"


def inductor_config_patches(mode: str | None, inductor_options: dict[str, Any]) -> dict[str, Any]:
    """What torch.compile(backend="inductor", mode=..., options=...) would set, if torch.compile took both.
    An option that contradicts the mode's own setting is an error: torch.compile cannot express that
    combination for Inductor either, and a silent override would hide which of the two the user meant."""
    patches = dict(inductor_modes()[mode or "default"])
    for key, val in inductor_options.items():
        if key in patches and patches[key] != val:
            raise ValueError(f"samhq backend: mode {mode!r} sets {key!r}={patches[key]!r}, options set it to "
                             f"{val!r}; choose the mode that has it (modes: {', '.join(inductor_modes())})")
    patches.update(inductor_options)
    return patches


def resolve_triton_op(triton_op: bool | str, patches: dict[str, Any]) -> bool | str:
    """Which registration of the fused op "auto" may use in this compile (True / False stay as given)."""
    if triton_op != "auto":
        return triton_op
    if patches.get("triton.cudagraphs"):
        # CUDA graphs replay the launches without host work, which is what Inductor's launcher saves
        # ("auto" measured: bf16 train step 71.6 -> 60.7 ms without graphs); the opaque op keeps its
        # runtime fallback to the reference
        return False
    if torch._dynamo.config.compiled_autograd:
        # compiled autograd re-traces the backward and opens a triton_op into triton_kernel_wrapper_functional,
        # which Dynamo (torch 2.11) cannot trace: the backward graph broke there and the attention backward
        # ran outside every compiled graph (GPU test, 354cac1). The opaque op stays one node.
        return False
    return "auto"


def launch_user_kernels_statically(patches: dict[str, Any]) -> None:
    """Let Inductor launch the fused op's kernels (the triton_op registration's) with its static CUDA launcher,
    as it launches its own (option samhq.static_launch), unless the user's Inductor options say otherwise.
    Triton's own launcher binds and specialises every argument in Python on each call: 12 forward launches of the
    bf16 ViT-B encoder at batch 1 cost about as much host time as its other 147 launches together (cProfile on the
    H200, benchmarks/NOTES.md, host path). A kernel that cannot be launched statically keeps Triton's launcher
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

    ours, inductor = split_options(options)
    mode = resolve_mode(mode, ours["samhq.mode"])
    if mode != "default" and not ours["samhq.inductor"]:
        raise ValueError(f"samhq backend: mode {mode!r} is an Inductor mode, and options['samhq.inductor'] is "
                         f"False (aot_eager, which has no modes); drop one of them")
    patches = inductor_config_patches(mode, inductor)
    graphs = [m for m in gm.modules() if isinstance(m, torch.fx.GraphModule)]  # gm and its HOP bodies
    if ours["samhq.host_indices"]:
        for module in graphs:
            if move_host_indices(module.graph):
                module.recompile()
    if ours["samhq.rewrite"]:
        if patches.get("pre_grad_custom_pass") is not None:
            raise ValueError("samhq backend: options['pre_grad_custom_pass'] is taken by the samhq rewrite")
        triton_op = resolve_triton_op(ours["samhq.triton_op"], patches)
        rewrite = RelPosAttentionPass(ours["samhq.min_seq_len"], ours["samhq.dump_dir"], triton_op)
        for module in graphs:  # activation-checkpoint regions and other HOP bodies included
            rewrite(module.graph)
            module.recompile()
        patches["pre_grad_custom_pass"] = rewrite  # its uuid() keys Inductor's caches
        if ours["samhq.static_launch"] and triton_op:  # the opaque op launches its kernels itself
            launch_user_kernels_statically(patches)
    with memory_budget(ours["samhq.memory_budget"]):  # AOTAutograd partitions while the backend compiles
        if not ours["samhq.inductor"]:
            from torch._dynamo.backends.debugging import aot_eager

            return aot_eager(gm, example_inputs)
        return compile_fx(gm, example_inputs, config_patches=patches)


def memory_budget(budget: float | None):
    """The partitioner's activation memory budget for one compile (option samhq.memory_budget); None: as set."""
    import torch._functorch.config as functorch_config

    if budget is None:
        return contextlib.nullcontext()
    return functorch_config.patch(activation_memory_budget=float(budget))
