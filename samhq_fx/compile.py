"""`compile_encoder`: compile only a SAM / SAM-HQ model's vision encoder, in place, with the samhq backend.

    model = samhq_fx.compile_encoder(model)                        # SamModel / SamHQModel, or a module holding one
    model = samhq_fx.compile_encoder(model, options={"samhq.inductor": False})     # kwargs go to nn.Module.compile

All of SAM's rel-pos attention is in the vision encoder, and compiling the whole SamHQModel for bf16 training on
CUDA trips an Inductor bug in the mask decoder's convolutions (torch 2.11, `assert_size_stride` in
`convolution_backward`), so the encoder alone is what gets compiled. It is compiled in place
(`nn.Module.compile`): the model object, its parameters, its state_dict keys and anything holding it (an
optimizer, HF `Trainer`, a LightningModule, PEFT) stay as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .options import Options

__all__ = ["compile_encoder", "find_encoders"]


def _has_rel_pos_attention(module: torch.nn.Module) -> bool:
    """Any submodule (itself included) with `rel_pos_h` and `rel_pos_w` parameters: HF's SamVisionAttention and
    SamHQVisionAttention, and segment-anything's own Attention."""
    return any(
        isinstance(getattr(m, "rel_pos_h", None), torch.Tensor) and isinstance(getattr(m, "rel_pos_w", None), torch.Tensor)
        for m in module.modules()
    )


def find_encoders(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules `compile_encoder(model)` compiles: `model.vision_encoder` (SamModel, SamHQModel, and PEFT models
    around them, which forward attribute access); else every outermost submodule named `vision_encoder` (a
    wrapper holding the model); else `model` itself if it has rel-pos attention (SamVisionModel,
    SamHQVisionModel, any module with it). ValueError for anything else."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"compile_encoder: `model` must be a torch.nn.Module (a SamModel / SamHQModel, a "
                         f"SamVisionModel / SamHQVisionModel, or a module with rel-pos attention), got "
                         f"{type(model).__name__}")
    encoder = getattr(model, "vision_encoder", None)
    if encoder is not None:
        if not isinstance(encoder, torch.nn.Module):
            raise ValueError(f"compile_encoder: `model.vision_encoder` must be a torch.nn.Module, got "
                             f"{type(encoder).__name__}")
        return [encoder]
    found: list[tuple[str, torch.nn.Module]] = []
    for name, sub in model.named_modules():
        if name.rsplit(".", 1)[-1] == "vision_encoder" and not any(name.startswith(n + ".") for n, _ in found):
            found.append((name, sub))
    if found:
        return [sub for _, sub in found]
    if _has_rel_pos_attention(model):
        return [model]
    raise ValueError(f"compile_encoder: `model` ({type(model).__name__}) has no `vision_encoder` and no rel-pos "
                     f"attention (no submodule with `rel_pos_h` / `rel_pos_w`); expected a SamModel / SamHQModel, "
                     f"a SamVisionModel / SamHQVisionModel, or a module with rel-pos attention")


def compile_encoder(model: torch.nn.Module, **compile_kwargs: Any) -> torch.nn.Module:
    """Compile `model`'s vision encoder in place (`find_encoders` says which module) and return `model`.

    `compile_kwargs` go to `nn.Module.compile` (that is, torch.compile): backend defaults to "samhq"; mode= or
    options=, not both (torch.compile refuses the pair; with the samhq backend a mode that comes with options is
    `options={"samhq.mode": mode, ...}`); fullgraph=, dynamic= as usual. The samhq backend's options are checked
    here, before anything compiles (samhq_fx/options.py; ValueError / TypeError naming the option). Calling it again
    recompiles with the new arguments.
    """
    check_compile_kwargs(compile_kwargs)
    compile_kwargs.setdefault("backend", "samhq")
    for encoder in find_encoders(model):
        kwargs = dict(compile_kwargs)
        if kwargs.get("options") is not None:  # torch.compile pops its own keys from the dict it is given
            kwargs["options"] = dict(kwargs["options"])
        encoder.compile(**kwargs)
    return model


def check_compile_kwargs(compile_kwargs: dict[str, Any]) -> None:
    """ValueError / TypeError, before anything is compiled: mode= with options= (torch.compile's RuntimeError
    otherwise), and, for the samhq backend, its options (`Options.resolve`, the environment included)."""
    mode, options = compile_kwargs.get("mode"), compile_kwargs.get("options")
    if mode is not None and options is not None:
        raise ValueError(f"compile_encoder: give `mode` or `options`, not both (torch.compile refuses the pair); "
                         f"with the samhq backend pass the mode as options={{'samhq.mode': {mode!r}, ...}}")
    if options is not None and not isinstance(options, Mapping):
        raise ValueError(f"compile_encoder: `options` must be a dict (or another Mapping) of option names to "
                         f"values, got {type(options).__name__}")
    if _is_samhq(compile_kwargs.get("backend", "samhq")):
        Options.resolve(options, mode=mode)


def _is_samhq(backend: Any) -> bool:
    from .backend import samhq_backend

    return backend == "samhq" or backend is samhq_backend
