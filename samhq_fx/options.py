"""The samhq backend's options, checked: one frozen `Options` per compile, from torch.compile's `mode` and `options`
and the SAMHQ_FX_* environment variables; `options()` checks them where they are written.

    torch.compile(model, backend="samhq", options=samhq_fx.options(dump_dir="dumps", mode="reduce-overhead"))
    samhq_fx.compile_encoder(model, options={"samhq.dump_dir": "dumps"})      # checked before it compiles

torch.compile hands a backend named by a string its mode and options only when it compiles the first graph
(torch/__init__.py, _TorchCompileWrapper, torch 2.11-2.13: nothing of the backend runs at wrap time), so a dict given
to torch.compile directly is checked at the compiled model's first call; `options()` and `compile_encoder` check it
before. Every error is a ValueError (a value out of range, an unknown key, a contradiction) or a TypeError (a value
of the wrong type) that names the option or variable and what it takes.

Options (keys of `options`; an option beats its environment variable, which beats the default):
    samhq.mode         str, default None    an Inductor mode: "default", "reduce-overhead", "max-autotune",
                                            "max-autotune-no-cudagraphs" (the mode= of torch.compile, which
                                            cannot come with options=). Given both ways, they must agree
    samhq.rewrite      bool, default True   False: plain Inductor            (SAMHQ_FX_DISABLE=1; =0 leaves it on)
    samhq.dump_dir     path, default None   write graphs + match report here (SAMHQ_FX_DUMP_DIR)
    samhq.min_seq_len  int >= 1, default 1  leave attention over fewer keys alone (SAMHQ_FX_MIN_SEQ_LEN)
    samhq.triton_op    True, False or       True: emit the op's torch.library.triton_op registration, whose
                       "auto", default      kernels Inductor compiles and launches itself; static key grids
                       "auto"               only (SAMHQ_FX_TRITON_OP=1). False: the opaque op, which
                                            launches them itself (SAMHQ_FX_TRITON_OP=0). "auto": the
                                            triton_op one for static grids on any CUDA GPU (placement.py),
                                            unless the mode captures CUDA graphs or compiled autograd is on;
                                            the opaque op everywhere else (SAMHQ_FX_TRITON_OP=auto)
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
                                            Triton's Python launcher (SAMHQ_FX_STATIC_LAUNCH=0 turns it off, =1
                                            on). It reaches compile workers started after the first samhq
                                            compile only (backend.launch_user_kernels_statically)
    samhq.memory_budget number in (0, 1],   keep at most this fraction of the activations the default partition
                       default None         saves for the backward, and recompute the cheapest rest there:
                                            AOTAutograd's activation_memory_budget (torch._functorch.config)
                                            for this compile only, no change to the model. None leaves
                                            PyTorch's setting (1.0 unless set) (SAMHQ_FX_MEMORY_BUDGET)
    samhq.recompute_copies bool,            recompute in the backward, instead of saving, the copies of q that
                       default False        the rel-pos einsums multiply (the fused op saves q anyway): 7.5-10%
                                            fewer bytes saved for the backward (ViT-B, CPU); a copy kernel each
                                            (recompute.py; Inductor's joint_custom_post_pass, which it takes;
                                            nothing under samhq.inductor=False, whose aot_eager has no such
                                            hook) (SAMHQ_FX_RECOMPUTE_COPIES=1 turns it on, =0 off)
An environment variable set to "" counts as unset. All other keys are Inductor config options
(torch._inductor.list_options()), passed through unchanged; one that contradicts the mode's own setting (e.g.
"triton.cudagraphs": False with "reduce-overhead") is an error, not a silent override. "guard_filter_fn" and
"use_aoti" are torch.compile's own, which it takes out of the dict before the backend sees it.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
from collections.abc import Mapping
from typing import Any

__all__ = ["Options", "inductor_modes", "options"]

PREFIX = "samhq."
TORCH_COMPILE_KEYS = frozenset({"guard_filter_fn", "use_aoti"})  # torch.compile pops these from a dict `options`
_SWITCH = {"0": False, "1": True}
_TRITON_OP = {"0": False, "1": True, "auto": "auto"}


@dataclasses.dataclass(frozen=True)
class Options:
    """One compile's samhq options, checked; fields are the option names without `samhq.` (the module docstring
    says what each does). Made by `Options.resolve`, which checks every value; `mode` is the one mode of
    torch.compile's mode= and samhq.mode, "default" when neither is given."""

    mode: str = "default"
    rewrite: bool = True
    dump_dir: str | None = None
    min_seq_len: int = 1
    triton_op: bool | str = "auto"
    host_indices: bool = True
    inductor: bool = True
    static_launch: bool = True
    memory_budget: float | None = None
    recompute_copies: bool = False
    inductor_options: dict[str, Any] = dataclasses.field(default_factory=dict, hash=False)  # the other keys

    @classmethod
    def resolve(cls, options: Mapping[str, Any] | None = None, mode: str | None = None,
                env: Mapping[str, str] | None = None) -> Options:
        """The options of one compile: defaults, then the environment (`env`, default os.environ), then `options`,
        then torch.compile's `mode`, which must agree with samhq.mode. ValueError / TypeError for anything the
        compile would fail on or silently ignore."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise TypeError(f"samhq backend: options must be a mapping (a dict of option names to values), "
                            f"got {type(options).__name__}")
        values = _from_env(os.environ if env is None else env)
        inductor = {}
        for key, val in options.items():
            if not isinstance(key, str):
                raise TypeError(f"samhq backend: option names must be str, got {key!r} ({type(key).__name__})")
            if key.startswith(PREFIX):
                name = key[len(PREFIX):]
                if name not in _CHECKS:
                    raise ValueError(f"samhq backend: unknown option {key!r}{_did_you_mean(key, KEYS)} (samhq's "
                                     f"options: {', '.join(KEYS)})")
                values[name] = _CHECKS[name](f"options[{key!r}]", val)
            elif key not in TORCH_COMPILE_KEYS:
                inductor[key] = val
        _check_inductor_keys(inductor)
        resolved = cls(mode=_one_mode(mode, values.pop("mode", None)), inductor_options=inductor, **values)
        if resolved.mode != "default" and not resolved.inductor:
            raise ValueError(f"samhq backend: mode {resolved.mode!r} is an Inductor mode, and "
                             f"options['samhq.inductor'] is False (aot_eager, which has no modes); drop one of them")
        if resolved.rewrite and inductor.get("pre_grad_custom_pass") is not None:
            raise ValueError("samhq backend: options['pre_grad_custom_pass'] is taken by the samhq rewrite")
        if resolved.recompute_copies and resolved.inductor and inductor.get("joint_custom_post_pass") is not None:
            raise ValueError("samhq backend: options['joint_custom_post_pass'] is taken by samhq.recompute_copies "
                             "(options['samhq.recompute_copies'] or SAMHQ_FX_RECOMPUTE_COPIES=1); turn that off to "
                             "pass your own")
        resolved.inductor_patches()  # a contradiction between the mode and an Inductor option
        return resolved

    def inductor_patches(self) -> dict[str, Any]:
        """What torch.compile(backend="inductor", mode=..., options=...) would set, if torch.compile took both: a
        new dict. An option that contradicts the mode's own setting is an error: torch.compile cannot express that
        combination for Inductor either, and a silent override would hide which of the two the user meant."""
        patches = dict(inductor_modes()[self.mode])
        for key, val in self.inductor_options.items():
            if key in patches and patches[key] != val:
                raise ValueError(f"samhq backend: mode {self.mode!r} sets {key!r}={patches[key]!r}, options set it "
                                 f"to {val!r}; choose the mode that has it (modes: {', '.join(inductor_modes())})")
        patches.update(self.inductor_options)
        return patches


def options(mapping: Mapping[str, Any] | None = None, /, **samhq_options: Any) -> dict[str, Any]:
    """torch.compile's `options` for the samhq backend, checked now rather than at the compiled model's first call.

        torch.compile(model, backend="samhq", options=samhq_fx.options(dump_dir="dumps", mode="reduce-overhead"))
        samhq_fx.compile_encoder(model, options=samhq_fx.options(memory_budget=0.5, inductor=False))
        samhq_fx.options({"samhq.dump_dir": "dumps", "max_autotune": True})    # a dict in torch.compile's spelling
        samhq_fx.options({"epilogue_fusion": False}, rewrite=False)             # Inductor options, then samhq's

    Keywords are samhq's options by their names without `samhq.`: mode, rewrite, dump_dir, min_seq_len, triton_op,
    host_indices, inductor, static_launch, memory_budget, recompute_copies (samhq_fx/options.py says what each
    does). The mapping is torch.compile's spelling: `samhq.` keys and Inductor config options, which are not all
    valid keywords ("triton.cudagraphs"). Returns a new plain dict: a `samhq.<name>` key for each samhq option given,
    its value normalised (a path as str, a budget as float), and the other keys as given. Options left out are not
    filled in, so the SAMHQ_FX_* variables still apply to them when the model compiles; they are checked here too.

    TypeError: a value of the wrong type, an unknown keyword, a mapping that is not one. ValueError: a value out of
    range, an unknown `samhq.` key or Inductor option, an option given both ways, a contradiction (an Inductor option
    against the mode, a mode with inductor=False)."""
    merged: dict[str, Any] = {}
    if mapping is not None:
        if not isinstance(mapping, Mapping):
            raise TypeError(f"samhq_fx.options: the positional argument must be a mapping (a dict of option names "
                            f"to values), got {type(mapping).__name__}")
        merged.update(mapping)
    for name, val in samhq_options.items():
        if name not in _CHECKS:
            hint = _did_you_mean(name, NAMES, lambda n: n + "=")
            raise TypeError(f"samhq_fx.options: unknown option {name}={hint} (samhq's options: {', '.join(NAMES)}; "
                            f"Inductor options go in the mapping: samhq_fx.options({{{name!r}: ...}}))")
        if PREFIX + name in merged:
            raise ValueError(f"samhq_fx.options: {PREFIX + name!r} is given twice, in the mapping and as {name}=")
        merged[PREFIX + name] = val
    resolved = Options.resolve(merged)
    return {key: getattr(resolved, key[len(PREFIX):]) if key.startswith(PREFIX) else val
            for key, val in merged.items()}


def inductor_modes() -> dict[str, dict[str, Any]]:
    """{mode: its Inductor options}, as this torch knows them ("default", "reduce-overhead", "max-autotune",
    "max-autotune-no-cudagraphs"; newer torch adds more)."""
    from torch._inductor import list_mode_options

    return list_mode_options()


def _one_mode(mode: str | None, samhq_mode: str | None) -> str:
    """The one mode from torch.compile's mode= and options["samhq.mode"]: either, or both when they agree."""
    mode = _mode("mode", mode)
    if mode is not None and samhq_mode is not None and mode != samhq_mode:
        raise ValueError(f"samhq backend: mode={mode!r} and options['samhq.mode']={samhq_mode!r} differ; give one")
    return mode or samhq_mode or "default"


def _did_you_mean(name: str, known, spell=repr) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    return f"; did you mean {spell(close[0])}?" if close else ""


def _check_inductor_keys(inductor: dict[str, Any]) -> None:
    """ValueError for a key that is no Inductor config option (Inductor would fail on it at the first call)."""
    if not inductor:
        return
    from torch._inductor import config as inductor_config
    from torch._inductor import list_options

    known = set(list_options()) | set(getattr(inductor_config, "_config", ()))  # _config: aliases too
    for key in inductor:
        if key not in known:
            raise ValueError(f"samhq backend: unknown option {key!r}: neither a samhq option ({PREFIX}*) nor an "
                             f"Inductor config option (torch._inductor.list_options())"
                             f"{_did_you_mean(key, [*KEYS, *sorted(known)])}")


# --- checks: each takes where the value came from (for the message) and the value, and returns it normalised


def _got(val: Any) -> str:
    return f"got {val!r} ({type(val).__name__})"


def _bool(where: str, val: Any) -> bool:
    if not isinstance(val, bool):
        raise TypeError(f"samhq backend: {where} must be True or False, {_got(val)}")
    return val


def _mode(where: str, val: Any) -> str | None:
    if val is None:
        return None
    modes = inductor_modes()
    if not isinstance(val, str):
        raise TypeError(f"samhq backend: {where} must be None or one of the Inductor modes {', '.join(modes)}; "
                        f"{_got(val)}")
    if val not in modes:
        raise ValueError(f"samhq backend: {where}={val!r} is not an Inductor mode; valid: {', '.join(modes)}")
    return val


def _dump_dir(where: str, val: Any) -> str | None:
    if val is None:
        return None
    path = os.fspath(val) if isinstance(val, (str, os.PathLike)) else None
    if not isinstance(path, str):
        raise TypeError(f"samhq backend: {where} must be None or a directory path (str or os.PathLike), {_got(val)}")
    if not path:
        raise ValueError(f"samhq backend: {where} must be a directory path, got '' (None: no dumps)")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"samhq backend: {where}={path!r} is a file; it must be a directory (made if missing)")
    return path


def _min_seq_len(where: str, val: Any) -> int:
    if isinstance(val, bool) or not isinstance(val, numbers.Integral):
        raise TypeError(f"samhq backend: {where} must be an int >= 1, {_got(val)}")
    if val < 1:
        raise ValueError(f"samhq backend: {where} must be an int >= 1, got {val!r}")
    return int(val)


def _triton_op(where: str, val: Any) -> bool | str:
    if isinstance(val, bool) or (isinstance(val, str) and val == "auto"):
        return val
    err = ValueError if isinstance(val, str) else TypeError
    raise err(f"samhq backend: {where} must be True, False or 'auto', got {val!r}")


def _memory_budget(where: str, val: Any) -> float | None:
    if val is None:
        return None
    if isinstance(val, bool) or not isinstance(val, numbers.Real):
        raise TypeError(f"samhq backend: {where} must be None or a number in (0, 1], {_got(val)}")
    if not 0 < val <= 1:  # NaN too
        raise ValueError(f"samhq backend: {where} must be None or a number in (0, 1], got {val!r}")
    return float(val)


_CHECKS = {"mode": _mode, "rewrite": _bool, "dump_dir": _dump_dir, "min_seq_len": _min_seq_len,
           "triton_op": _triton_op, "host_indices": _bool, "inductor": _bool, "static_launch": _bool,
           "memory_budget": _memory_budget, "recompute_copies": _bool}
NAMES = tuple(f.name for f in dataclasses.fields(Options) if f.name != "inductor_options")
KEYS = tuple(PREFIX + name for name in NAMES)
assert set(_CHECKS) == set(NAMES)


# --- environment variables: unset or "" sets nothing


def _env_choice(env: Mapping[str, str], var: str, choices: dict[str, Any]) -> Any:
    val = env.get(var, "")
    if val == "":
        return None
    if val not in choices:
        raise ValueError(f"samhq backend: {var} must be {', '.join(list(choices)[:-1])} or {list(choices)[-1]}, "
                         f"got {val!r} (unset or empty: the default)")
    return choices[val]


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    """The options the SAMHQ_FX_* variables set, checked."""
    values: dict[str, Any] = {}
    for name, var, choices in (("rewrite", "SAMHQ_FX_DISABLE", {"0": True, "1": False}),
                               ("triton_op", "SAMHQ_FX_TRITON_OP", _TRITON_OP),
                               ("host_indices", "SAMHQ_FX_HOST_INDICES", _SWITCH),
                               ("static_launch", "SAMHQ_FX_STATIC_LAUNCH", _SWITCH),
                               ("recompute_copies", "SAMHQ_FX_RECOMPUTE_COPIES", _SWITCH)):
        val = _env_choice(env, var, choices)
        if val is not None:
            values[name] = val
    if env.get("SAMHQ_FX_DUMP_DIR", ""):
        values["dump_dir"] = _dump_dir("SAMHQ_FX_DUMP_DIR", env["SAMHQ_FX_DUMP_DIR"])
    if val := env.get("SAMHQ_FX_MIN_SEQ_LEN", ""):
        try:
            number = int(val)
        except ValueError:
            number = 0
        if number < 1:
            raise ValueError(f"samhq backend: SAMHQ_FX_MIN_SEQ_LEN must be an integer >= 1, got {val!r}")
        values["min_seq_len"] = number
    if val := env.get("SAMHQ_FX_MEMORY_BUDGET", ""):
        try:
            number = float(val)
        except ValueError:
            number = float("nan")
        if not 0 < number <= 1:
            raise ValueError(f"samhq backend: SAMHQ_FX_MEMORY_BUDGET must be a number in (0, 1], got {val!r}")
        values["memory_budget"] = number
    return values
