"""`SamHQCompileCallback`: HF `Trainer` compiles its model's vision encoder with the samhq backend.

    trainer = Trainer(model=model, args=TrainingArguments(...), callbacks=[samhq_fx.SamHQCompileCallback()])

`TrainingArguments(torch_compile_backend="samhq")` cannot do it: accelerate's TorchDynamoPlugin takes only the
backends of its own `DynamoBackend` list ("ValueError: 'SAMHQ' is not a valid DynamoBackend", accelerate 1.15,
transformers 5.24), and it would compile the whole model. The callback compiles the encoder in place
(`samhq_fx.compile_encoder`) when the Trainer is built (so `evaluate()` alone runs compiled too) and again at
`train()` for a model made there by `model_init`. It is the same as
`Trainer(model=samhq_fx.compile_encoder(model), ...)`, which also works. Leave `torch_compile` False.
"""

from __future__ import annotations

import weakref
from typing import Any

from transformers import TrainerCallback

from .compile import check_compile_kwargs, compile_encoder

__all__ = ["SamHQCompileCallback"]


class SamHQCompileCallback(TrainerCallback):
    """Compiles the Trainer's model's vision encoder with `samhq_fx.compile_encoder(model, **compile_kwargs)`."""

    def __init__(self, **compile_kwargs: Any):
        check_compile_kwargs(compile_kwargs)
        self.compile_kwargs = compile_kwargs
        self._compiled: weakref.WeakSet = weakref.WeakSet()

    def _compile(self, args, model) -> None:
        if getattr(args, "torch_compile", False):
            raise ValueError("SamHQCompileCallback: `args.torch_compile` must be False (the callback compiles the "
                             "vision encoder; torch_compile=True would compile the whole model as well)")
        if model is not None and model not in self._compiled:
            compile_encoder(model, **self.compile_kwargs)
            self._compiled.add(model)

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._compile(args, model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._compile(args, model)
