"""samhq_fx.cast_frozen_weights_: frozen Linear / conv weights held in bf16 give the same bits under bf16 autocast,
eager and compiled, with fewer casts in the compiled graph; trained and non-GEMM parameters are left alone."""

from __future__ import annotations

import copy

import pytest
import torch

import samhq_fx
from helpers import fresh_compile_state

pytest.importorskip("transformers")
from transformers import SamHQVisionModel  # noqa: E402

from samhq_fx.models import random_init_, tiny_vision_config  # noqa: E402


def _encoder(attn="eager"):
    return random_init_(SamHQVisionModel(tiny_vision_config(attn))).eval().requires_grad_(False)


def _casts(gm: torch.fx.GraphModule) -> int:
    return sum(n.op == "call_function" and n.target in (torch.ops.prims.convert_element_type.default,
                                                         torch.ops.aten._to_copy.default) for n in gm.graph.nodes)


def test_only_frozen_gemm_and_conv_weights_are_cast():
    enc = _encoder()
    enc.vision_encoder.layers[0].mlp.requires_grad_(True)  # a trained block keeps its fp32 master weights
    before = {n: p for n, p in enc.named_parameters()}
    cast = samhq_fx.cast_frozen_weights_(enc)
    linears = [m for m in enc.modules() if type(m) in (torch.nn.Linear, torch.nn.Conv2d)]
    assert cast == len(linears) - 2  # mlp.lin1, mlp.lin2 of layer 0 stay
    for name, p in enc.named_parameters():
        assert p is before[name]  # the same Parameter objects, so hooks and optimizers holding them still work
        owner = enc.get_submodule(name.rsplit(".", 1)[0])
        gemm = type(owner) in (torch.nn.Linear, torch.nn.Conv2d) and not name.startswith("vision_encoder.layers.0.mlp.")
        assert p.dtype == (torch.bfloat16 if gemm else torch.float32), name
    body = enc.vision_encoder
    assert body.layers[0].attn.rel_pos_h.dtype == torch.float32 and body.neck.layer_norm1.weight.dtype == torch.float32
    assert samhq_fx.cast_frozen_weights_(enc) == 0  # nothing left to cast


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_same_bits_under_autocast_eager_and_compiled(attn):
    fresh_compile_state()
    ref = _encoder(attn)
    held = copy.deepcopy(ref)
    assert samhq_fx.cast_frozen_weights_(held) > 0
    x = torch.randn(2, 3, ref.config.image_size, ref.config.image_size, generator=torch.Generator().manual_seed(0))
    graphs = []

    def backend(name):
        from torch._dynamo.backends.common import aot_autograd

        def fw(gm, _inputs):
            graphs.append((name, _casts(gm)))
            return gm
        return aot_autograd(fw_compiler=fw)

    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16):
        want, got = ref(x).last_hidden_state, held(x).last_hidden_state
        assert torch.equal(want, got)  # eager: autocast rounds the fp32 weight to bf16 exactly as the cast did
        assert torch.equal(torch.compile(ref, backend=backend("fp32"))(x).last_hidden_state, want)
        assert torch.equal(torch.compile(held, backend=backend("held"))(x).last_hidden_state, got)
        fused = samhq_fx.compile_encoder(copy.deepcopy(held), options={"samhq.inductor": False})(x).last_hidden_state
    casts = dict(graphs)
    n_weights = sum(1 for m in ref.modules() if type(m) in (torch.nn.Linear, torch.nn.Conv2d) for _ in m.parameters())
    assert casts["fp32"] - casts["held"] == n_weights  # one cast per weight and bias gone, every other cast kept
    assert torch.isfinite(fused).all() and (fused.float() - want.float()).abs().max() < 0.1


def test_cast_frozen_weights_rejects_bad_arguments():
    with pytest.raises(TypeError, match="`module` must be a torch.nn.Module"):
        samhq_fx.cast_frozen_weights_(torch.zeros(2))
    with pytest.raises(ValueError, match="`dtype` must be torch.bfloat16 or torch.float16"):
        samhq_fx.cast_frozen_weights_(torch.nn.Linear(2, 2), torch.float64)
