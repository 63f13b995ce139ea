"""The implementations that the HF-model benchmarks compare (train_step.py, inference.py), defined once.

An implementation = the HF attention class the model is built with ("sdpa": SDPA with the dense rel-pos bias
as attn_mask, HF's default; "eager": explicit softmax) x the compiler (none, Inductor, samhq) x the mode
(default or "reduce-overhead", i.e. CUDA graphs) x compiled autograd (the backward traced into its own graph
and compiled by the same backend; needs the backward inside the compiled function) x the compile's options.

COMPARED is what both benchmarks' default sets hold besides the eager baselines: samhq and Inductor, each on both
attention classes, each in default mode and reduce-overhead, so a run's per-mode summary holds samhq to Inductor's
best build of the same mode.  --modes (`filter_modes`) keeps the compiled impls of some modes only.

`compile_kwargs` is how each one is reached, and `recipe` says it in one line for the results rows: samhq's
mode goes in as options["samhq.mode"] when other options come with it (torch.compile refuses mode= with
options=; README "Options").
"""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Impl:
    attn: str                       # HF attn_implementation: "sdpa" or "eager"
    backend: str | None             # torch.compile backend; None = not compiled
    mode: str | None = None         # torch.compile mode; None = default
    compiled_autograd: bool = False  # torch._dynamo.config.compiled_autograd
    options: tuple = ()             # (key, value) pairs for torch.compile's options= (samhq's own, e.g.)

    @property
    def mode_name(self) -> str:
        """'default' or 'reduce-overhead': the mode a results row records."""
        return self.mode or "default"

    @property
    def family(self) -> str:
        """'eager', 'inductor' or 'samhq': what "faster than Inductor" compares."""
        return self.backend or "eager"


RO = "reduce-overhead"
IMPLS = {
    "eager-sdpa": Impl("sdpa", None),
    "eager-eager": Impl("eager", None),
    "inductor": Impl("sdpa", "inductor"),
    "inductor-eager": Impl("eager", "inductor"),
    "inductor-ro": Impl("sdpa", "inductor", RO),
    "inductor-eager-ro": Impl("eager", "inductor", RO),
    "samhq-eager": Impl("eager", "samhq"),
    "samhq-sdpa": Impl("sdpa", "samhq"),
    "samhq-eager-ro": Impl("eager", "samhq", RO),
    "samhq-sdpa-ro": Impl("sdpa", "samhq", RO),
    # the partitioner keeps a fifth of the activations it saves by default and recomputes the rest (README, Options)
    "samhq-eager-mem": Impl("eager", "samhq", options=(("samhq.memory_budget", 0.2),)),
    "samhq-eager-ca": Impl("eager", "samhq", None, True),
    "samhq-eager-ca-ro": Impl("eager", "samhq", RO, True),
    "inductor-eager-ca-ro": Impl("eager", "inductor", RO, True),
}


MODES = ("default", RO)
# samhq and Inductor x both attention classes x both modes: the peers a "faster than Inductor" claim is held to
COMPARED = ("inductor", "inductor-eager", "inductor-ro", "inductor-eager-ro",
            "samhq-eager", "samhq-sdpa", "samhq-eager-ro", "samhq-sdpa-ro")


def filter_modes(names: tuple[str, ...], spec: str | None, known: dict = IMPLS) -> tuple[str, ...]:
    """--modes: keep the compiled impls whose mode is in the comma list `spec` ('default', 'reduce-overhead';
    'ro' is short for the latter); the uncompiled ones (no mode; the reference of the correctness check) stay.
    None: all of `names`.  SystemExit naming an unknown mode."""
    if not spec:
        return names
    modes = {RO if m.strip() == "ro" else m.strip() for m in spec.split(",") if m.strip()}
    bad = sorted(modes - set(MODES))
    if bad:
        raise SystemExit(f"unknown modes {bad}; modes: {', '.join(MODES)} (or ro)")
    return tuple(n for n in names if known[n].backend is None or known[n].mode_name in modes)


def compile_kwargs(impl: Impl, options: dict | None = None) -> dict:
    """torch.compile keyword arguments for `impl` (dynamic=False: every cell has one static shape)."""
    kw: dict = {"backend": impl.backend, "dynamic": False}
    options = {**dict(impl.options), **(options or {})}
    if impl.mode and options and impl.backend == "samhq":
        options["samhq.mode"] = impl.mode  # the one spelling that combines a mode with options
    elif impl.mode:
        kw["mode"] = impl.mode
    if options:
        kw["options"] = options
    return kw


@contextlib.contextmanager
def compiled_autograd(impl: Impl):
    """torch._dynamo.config.compiled_autograd for the cell: torch.compile reads it when it builds the wrapper
    (torch/_dynamo/eval_frame.py), and the backward must run while it is set."""
    import torch

    with torch._dynamo.config.patch(compiled_autograd=impl.compiled_autograd):
        yield


def recipe(impl: Impl, what: str, options: dict | None = None) -> str:
    """One line: how the cell was built, e.g. torch.compile(model, backend='samhq', mode='reduce-overhead')."""
    if impl.backend is None:
        return f"{what}, attn_implementation={impl.attn!r}, not compiled"
    kw = compile_kwargs(impl, options)
    args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
    out = f"attn_implementation={impl.attn!r}; torch.compile({what}, {args})"
    if impl.compiled_autograd:
        out += " under torch._dynamo.config.compiled_autograd=True (backward inside the compiled function)"
    return out


def parse(spec: str | None, default: tuple[str, ...], known: dict = IMPLS) -> tuple[str, ...]:
    """--impls: a comma list, 'all', or None for `default`; SystemExit naming the unknown ones. A compiled impl may
    take compile options as `+KEY=VALUE` suffixes (`samhq-sdpa+reorder_for_peak_memory=False`: an Inductor option;
    `samhq.` keys are samhq's): the derived impl is added to `known` under that name, which its rows then carry."""
    names = tuple(known) if spec == "all" else tuple(s.strip() for s in (spec or ",".join(default)).split(",") if s.strip())
    for name in names:
        if name not in known and "+" in name:
            derived = _with_options(name, known)
            if derived is not None:
                known[name] = derived
    bad = [n for n in names if n not in known]
    if bad:
        raise SystemExit(f"unknown impls {bad}; known: {', '.join(known)} (a compiled one with +KEY=VALUE options)")
    return names


def _with_options(name: str, known: dict) -> Impl | None:
    """The impl `base+KEY=VALUE+...` names (VALUE a Python literal), or None where base is unknown or not compiled;
    SystemExit for a suffix that is not KEY=VALUE."""
    base, *suffixes = name.split("+")
    impl = known.get(base)
    if impl is None or impl.backend is None:
        return None
    options = list(impl.options)
    for suffix in suffixes:
        try:
            options.append(parse_option(suffix))
        except ValueError:
            raise SystemExit(f"impl {name!r}: {suffix!r} is not KEY=VALUE with a Python literal (e.g. "
                             f"reorder_for_peak_memory=False)") from None
    return replace(impl, options=tuple(options))


def parse_option(text: str) -> tuple[str, object]:
    """(KEY, VALUE) of a compile option written KEY=VALUE, VALUE a Python literal; ValueError for anything else."""
    key, eq, value = text.partition("=")
    if not (key and eq):
        raise ValueError(text)
    try:
        return key, ast.literal_eval(value)
    except SyntaxError:
        raise ValueError(text) from None
