"""samhq-fx: SAM / SAM-HQ rel-pos attention, fused, under torch.compile.

    model = torch.compile(model, backend="samhq")

The backend (registered as an entry point, so no import is needed) finds every decomposed
rel-pos attention in the Dynamo graph, replaces it with `torch.ops.samhq.rel_pos_attention`
(Triton forward and backward on CUDA, a memory-bounded reference elsewhere) and hands the graph
to Inductor. `samhq_fx.rel_pos_attention` is the same op as a plain function.

    model = samhq_fx.compile_encoder(model)   # a SamModel / SamHQModel: only its vision encoder, in place
    torch.compile(model, backend="samhq", options=samhq_fx.options(dump_dir="dumps"))   # options checked here
    Trainer(model=model, args=..., callbacks=[samhq_fx.SamHQCompileCallback()])   # the same, in HF Trainer
    samhq_fx.cast_frozen_weights_(model)      # before the first call, under bf16 autocast: frozen Linear / conv
                                              # weights held in bf16 (the same bits, no per-call weight casts)
"""

from .compile import compile_encoder
from .frozen import cast_frozen_weights_
from .op import rel_pos_attention
from .options import options  # the function; the module stays importable as `from samhq_fx.options import ...`

__version__ = "0.1.0"
__all__ = ["SamHQCompileCallback", "cast_frozen_weights_", "compile_encoder", "options", "rel_pos_attention",
           "__version__"]


def __getattr__(name):
    if name == "SamHQCompileCallback":  # imports transformers: only when asked for
        from .hf_trainer import SamHQCompileCallback

        return SamHQCompileCallback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
