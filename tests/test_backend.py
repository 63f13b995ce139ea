"""The `samhq` backend end to end on CPU: registration, options, HF models, dumps, dynamic batch."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import re
from pathlib import Path
from unittest import mock

import pytest
import torch
from torch._dynamo.utils import counters

from samhq_fx.models import random_init_, tiny_vision_config
from samhq_fx.rewrite import RelPosAttentionPass

from helpers import capture_compile_fx, fresh_compile_state, rel_err

# The rewrite followed by aot_eager instead of Inductor: the same matcher, op and autograd, without
# minutes of C++ compilation on CI's two cores. Tests marked INDUCTOR run the real pipeline.
FAST = {"samhq.inductor": False}

transformers = pytest.importorskip("transformers")


def test_backend_is_registered_without_import():
    eps = importlib.metadata.entry_points(group="torch_dynamo_backends")
    assert any(ep.name == "samhq" and ep.value == "samhq_fx.backend:samhq_backend" for ep in eps)
    assert "samhq" in torch._dynamo.list_backends()


def test_mode_and_options_pass_through_to_inductor(monkeypatch):
    seen = {}

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        seen.update(config_patches)
        return gm.forward

    import torch._inductor.compile_fx

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fake_compile_fx)
    from samhq_fx.backend import samhq_backend

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    samhq_backend(gm, [torch.ones(2)], mode="max-autotune-no-cudagraphs", options=None)
    assert seen["max_autotune"] is True and isinstance(seen["pre_grad_custom_pass"], RelPosAttentionPass)
    seen.clear()
    samhq_backend(gm, [torch.ones(2)], options={"epilogue_fusion": False, "samhq.rewrite": False})
    assert seen == {"epilogue_fusion": False}
    with pytest.raises(ValueError, match="unknown option 'samhq.dump'"):
        samhq_backend(gm, [torch.ones(2)], options={"samhq.dump": "x"})
    with pytest.raises(ValueError, match=r"options\['samhq.triton_op'\] must be True, False or 'auto', got 'yes'"):
        samhq_backend(gm, [torch.ones(2)], options={"samhq.triton_op": "yes"})
    # "auto" (the default) keeps the opaque op under CUDA graphs; an explicit True is honoured there
    samhq_backend(gm, [torch.ones(2)])
    assert seen["pre_grad_custom_pass"].triton_op == "auto"
    samhq_backend(gm, [torch.ones(2)], mode="reduce-overhead")
    assert seen["pre_grad_custom_pass"].triton_op is False
    samhq_backend(gm, [torch.ones(2)], mode="reduce-overhead", options={"samhq.triton_op": True})
    assert seen["pre_grad_custom_pass"].triton_op is True
    # ... and under compiled autograd, whose re-trace of the backward would open the triton_op (GPU test)
    with torch._dynamo.config.patch(compiled_autograd=True):
        samhq_backend(gm, [torch.ones(2)])
    assert seen["pre_grad_custom_pass"].triton_op is False
    for env, want in (("0", False), ("1", True), ("auto", "auto")):
        monkeypatch.setenv("SAMHQ_FX_TRITON_OP", env)
        samhq_backend(gm, [torch.ones(2)])
        assert seen["pre_grad_custom_pass"].triton_op == want, env
    monkeypatch.setenv("SAMHQ_FX_TRITON_OP", "yes")
    with pytest.raises(ValueError, match="SAMHQ_FX_TRITON_OP must be 0, 1 or auto, got 'yes'"):
        samhq_backend(gm, [torch.ones(2)])


def test_mode_errors_name_what_conflicts(monkeypatch):
    seen = capture_compile_fx(monkeypatch)
    from samhq_fx.backend import samhq_backend

    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    x = [torch.ones(2)]
    with pytest.raises(ValueError, match=r"options\['samhq.mode'\]='fast' is not an Inductor mode; valid: "
                                         r"default, .*reduce-overhead.*max-autotune-no-cudagraphs"):
        samhq_backend(gm, x, options={"samhq.mode": "fast"})
    with pytest.raises(ValueError, match="mode='turbo' is not an Inductor mode"):
        samhq_backend(gm, x, mode="turbo")
    with pytest.raises(ValueError, match=r"mode='max-autotune' and options\['samhq.mode'\]='reduce-overhead' differ"):
        samhq_backend(gm, x, mode="max-autotune", options={"samhq.mode": "reduce-overhead"})
    with pytest.raises(ValueError, match="mode 'reduce-overhead' sets 'triton.cudagraphs'=True, options set it to False"):
        samhq_backend(gm, x, options={"samhq.mode": "reduce-overhead", "triton.cudagraphs": False})
    with pytest.raises(ValueError, match=r"options\['samhq.inductor'\] is False"):
        samhq_backend(gm, x, options={"samhq.mode": "max-autotune", "samhq.inductor": False})
    # the same mode both ways is one mode; "default" adds nothing
    samhq_backend(gm, x, mode="max-autotune-no-cudagraphs", options={"samhq.mode": "max-autotune-no-cudagraphs"})
    assert seen["max_autotune"] is True and "triton.cudagraphs" not in seen
    seen.clear()
    samhq_backend(gm, x, options={"samhq.mode": "default", "epilogue_fusion": False})
    from torch._inductor import config as inductor_config

    static = {"static_launch_user_defined_triton_kernels"} if hasattr(
        inductor_config, "static_launch_user_defined_triton_kernels") else set()  # samhq.static_launch, torch >= 2.8
    assert seen.keys() == {"epilogue_fusion", "pre_grad_custom_pass"} | static
    seen.clear()
    samhq_backend(gm, x, options={"samhq.triton_op": False})  # the opaque op launches its own kernels
    assert "static_launch_user_defined_triton_kernels" not in seen


def test_readme_never_passes_mode_with_options():
    # the spelling torch.compile refuses must not be documented (it was, before samhq.mode)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    calls = re.findall(r"(?:torch\.compile|\.compile)\([^)]*\)", readme)
    assert calls and not [c for c in calls if "mode=" in c and "options=" in c]


def test_pass_uuid_is_stable_and_keyed_on_settings():
    assert RelPosAttentionPass().uuid() == RelPosAttentionPass().uuid()
    assert RelPosAttentionPass(min_seq_len=1).uuid() != RelPosAttentionPass(min_seq_len=64).uuid()
    uuids = {RelPosAttentionPass(triton_op=t).uuid() for t in (False, True, "auto")}
    assert len(uuids) == 3


def _attention_region(src: str) -> str:
    """The rewritten graph from the rel-pos einsums to the output, without `x = None` frees."""
    lines = [re.sub(r";  .* = None$", "", l.strip()) for l in src.splitlines()]
    start = next(i for i, l in enumerate(lines) if l.startswith("rel_h = "))
    return "\n".join(l for l in lines[start:] if l)


def test_expected_rewrite_of_hf_samhq_attention(tmp_path):
    # expecttest is a test extra (pyproject); a GPU image without it still collects the rest of this file
    assert_expected_inline = pytest.importorskip("expecttest").assert_expected_inline
    from transformers.models.sam_hq.modeling_sam_hq import SamHQVisionAttention

    fresh_compile_state()
    attn = random_init_(SamHQVisionAttention(tiny_vision_config(), window_size=3))
    f = torch.compile(lambda x: attn(x)[0], backend="samhq", options={"samhq.dump_dir": str(tmp_path)})
    f(torch.randn(1, 3, 3, 32))
    after = (tmp_path / "graph_1_after.py").read_text()
    after = "\n".join(l for l in after.splitlines() if not l.strip().startswith("#"))
    after = re.sub(r': "[^"]*"', "", after)  # drop shape annotations
    assert_expected_inline(
        _attention_region(after),
        """\
rel_h = torch.functional.einsum('bhwc,hkc->bhwk', reshaped_query, relative_position_height)
rel_w = torch.functional.einsum('bhwc,wkc->bhwk', reshaped_query, relative_position_width)
getitem_9 = rel_h[(slice(None, None, None), slice(None, None, None), slice(None, None, None), slice(None, None, None), None)]
getitem_10 = rel_w[(slice(None, None, None), slice(None, None, None), slice(None, None, None), None, slice(None, None, None))]
squeeze = getitem_9.squeeze(4)
squeeze_1 = getitem_10.squeeze(3)
rel_pos_attention_default = torch.ops.samhq.rel_pos_attention.default(query, key, value, squeeze, squeeze_1, 0.25, 2)
getitem_11 = rel_pos_attention_default[0]
transpose_3 = getitem_11.transpose(1, 2)
attn_output = transpose_3.reshape(1, 2, 3, 3, -1)
permute_3 = attn_output.permute(0, 2, 3, 1, 4)
attn_output_1 = permute_3.reshape(1, 3, 3, -1)
attn_output_2 = torch._C._nn.linear(attn_output_1, l_attn_modules_proj_parameters_weight_, l_attn_modules_proj_parameters_bias_)
return (attn_output_2,)""",
    )
    assert "softmax" not in after and "@" not in after


MODELS = [("sam_hq", "eager"), ("sam_hq", "sdpa"), ("sam", "eager"), ("sam", "sdpa")]


def _vision_model(family, impl, **overrides):
    from transformers import SamHQVisionModel, SamVisionModel

    cls = {"sam_hq": SamHQVisionModel, "sam": SamVisionModel}[family]
    return random_init_(cls(tiny_vision_config(impl, family=family, **overrides)), rel_pos_std=0.5)


def _loss_and_grads(model, fn, x, **kw):
    model.zero_grad()
    out = fn(x, **kw)
    out.last_hidden_state.pow(2).mean().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family,impl,options", [(f, i, FAST) for f, i in MODELS] + [("sam_hq", "sdpa", None)])
def test_hf_vision_model_matches_eager(family, impl, options):
    fresh_compile_state()
    model = _vision_model(family, impl)
    x = torch.randn(2, 3, 32, 32)
    ref, ref_grads = _loss_and_grads(model, model, x)
    out, grads = _loss_and_grads(model, torch.compile(model, backend="samhq", options=options), x)
    n_layers = model.config.num_hidden_layers
    assert counters["samhq"]["fused"] == n_layers  # windowed and global layers alike
    assert rel_err(out.last_hidden_state, ref.last_hidden_state) < 1e-5
    assert grads.keys() == ref_grads.keys() and len(grads) > 0
    for name, g in grads.items():
        assert rel_err(g, ref_grads[name]) < 1e-4, name
    assert any("rel_pos_h" in n for n in grads)


def test_output_attentions_is_left_alone():
    fresh_compile_state()
    model = _vision_model("sam_hq", "eager")
    x = torch.randn(1, 3, 32, 32)
    ref = model(x, output_attentions=True)
    out = torch.compile(model, backend="samhq", options=FAST)(x, output_attentions=True)
    assert counters["samhq"]["fused"] == 0 and counters["samhq"]["skipped"] == 2
    assert rel_err(out.last_hidden_state, ref.last_hidden_state) < 1e-5
    for a, r in zip(out.attentions, ref.attentions):
        assert rel_err(a, r) < 1e-5


def test_active_dropout_is_left_alone():
    fresh_compile_state()
    model = _vision_model("sam_hq", "eager", attention_dropout=0.2).train()
    x = torch.randn(1, 3, 32, 32)
    torch.manual_seed(0)
    ref = model(x).last_hidden_state
    with torch._inductor.config.patch(fallback_random=True):
        torch.manual_seed(0)
        out = torch.compile(model, backend="samhq", options=FAST)(x).last_hidden_state
    assert counters["samhq"]["fused"] == 0 and counters["samhq"]["skipped"] == 2
    assert rel_err(out, ref) < 1e-5


def test_dynamic_batch_compiles_once():
    fresh_compile_state()
    model = _vision_model("sam_hq", "sdpa")
    f = torch.compile(model, backend="samhq", options=FAST)
    for b in (2, 3, 4):
        x = torch.randn(b, 3, 32, 32)
        torch._dynamo.mark_dynamic(x, 0)
        assert rel_err(f(x).last_hidden_state, model(x).last_hidden_state) < 1e-5
    assert counters["samhq"]["graphs"] == 1
    assert counters["samhq"]["fused"] == 2


def test_new_batch_size_recompiles_at_most_once():
    fresh_compile_state()
    model = _vision_model("sam_hq", "eager")
    f = torch.compile(model, backend="samhq", options=FAST)
    for b in (1, 2, 3, 4, 2):
        x = torch.randn(b, 3, 32, 32)
        assert rel_err(f(x).last_hidden_state, model(x).last_hidden_state) < 1e-5
    assert counters["samhq"]["graphs"] <= 2  # static, then automatic-dynamic batch
    assert counters["samhq"]["fused"] == 2 * counters["samhq"]["graphs"]


def test_dumps_show_both_graphs_and_report(tmp_path, monkeypatch):
    fresh_compile_state()
    monkeypatch.setenv("SAMHQ_FX_DUMP_DIR", str(tmp_path))
    model = _vision_model("sam_hq", "sdpa")
    torch.compile(model, backend="samhq", options=FAST)(torch.randn(1, 3, 32, 32))
    before = (tmp_path / "graph_1_before.py").read_text()
    after = (tmp_path / "graph_1_after.py").read_text()
    report = (tmp_path / "graph_1_report.txt").read_text()
    code = "\n".join(l for l in after.splitlines() if not l.strip().startswith("#"))  # not the source comments
    assert "scaled_dot_product_attention" in before and "samhq.rel_pos_attention" not in before
    assert "samhq.rel_pos_attention" in code and "scaled_dot_product_attention" not in code
    assert report.startswith("2 of 2 attention candidates fused") and report.count("FUSED") == 2


def test_disable_env_var_gives_plain_inductor(monkeypatch):
    fresh_compile_state()
    monkeypatch.setenv("SAMHQ_FX_DISABLE", "1")
    model = _vision_model("sam_hq", "eager")
    x = torch.randn(1, 3, 32, 32)
    out = torch.compile(model, backend="samhq", options=FAST)(x)
    assert counters["samhq"]["graphs"] == 0
    assert rel_err(out.last_hidden_state, model(x).last_hidden_state) < 1e-5


def test_pass_survives_deepcopy_after_running():
    # Inductor deep-copies its config (the pass included) after the backend has run the pass.
    import copy

    p = RelPosAttentionPass()
    gm = torch.fx.symbolic_trace(lambda x: x.softmax(-1))
    p(gm.graph)
    assert copy.deepcopy(p).uuid() == p.uuid()


@pytest.mark.parametrize("options", [FAST, None])
def test_activation_checkpointing_regions_are_fused(options):
    # HF gradient checkpointing puts each layer in a checkpoint region: a subgraph of the Dynamo graph.
    fresh_compile_state()
    model = _vision_model("sam_hq", "sdpa").train()
    model.gradient_checkpointing_enable()
    x = torch.randn(2, 3, 32, 32)
    ref, ref_grads = _loss_and_grads(model, model, x)
    out, grads = _loss_and_grads(model, torch.compile(model, backend="samhq", options=options), x)
    assert counters["samhq"]["fused"] == 2
    assert rel_err(out.last_hidden_state, ref.last_hidden_state) < 1e-5
    for name, g in grads.items():
        assert rel_err(g, ref_grads[name]) < 1e-4, name


def test_compiled_autograd_sends_the_backward_through_samhq(tmp_path):
    # torch._dynamo.config.compiled_autograd (set before torch.compile, which reads it): a backward called
    # inside the compiled function is traced into a second graph that the samhq backend compiles too. The
    # forward's attention is fused, the backward graph calls the fused op's backward, gradients equal eager's.
    fresh_compile_state()
    model = _vision_model("sam_hq", "eager")
    x = torch.randn(2, 3, 32, 32)

    def step(x):
        out = model(x).last_hidden_state
        out.pow(2).mean().backward()
        return out

    ref, ref_grads = _loss_and_grads(model, model, x)
    with torch._dynamo.config.patch(compiled_autograd=True):
        f = torch.compile(step, backend="samhq", options={**FAST, "samhq.dump_dir": str(tmp_path)})
        for _ in range(2):  # the second step reuses both graphs
            model.zero_grad(set_to_none=True)
            out = f(x)
    assert counters["compiled_autograd"]["captures"] == 1
    assert counters["samhq"]["graphs"] == 2 and counters["samhq"]["fused"] == 2
    backward = (tmp_path / "graph_2_before.py").read_text()
    assert backward.count("torch.ops.samhq.rel_pos_attention_backward.default(") == 2
    assert rel_err(out, ref.last_hidden_state) < 1e-5
    for name, g in ref_grads.items():
        assert rel_err(model.get_parameter(name).grad, g) < 1e-4, name


def test_cudagraph_skips_counts_and_keeps_the_reasons(caplog):
    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from samhq_fx.debug import cudagraph_skips

    caplog.set_level(logging.WARNING, logger="samhq_fx")
    with cudagraph_skips() as skips:
        log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to cpu device (x)")  # what Inductor calls
        counters["inductor"]["cudagraph_skips"] += 1  # a non-CUDA graph: counted, no line
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to after the block")
    assert skips.count == 2 and skips.reasons == ["skipping cudagraphs due to cpu device (x)"]
    assert "cpu device (x)" in caplog.text


def test_inference_mode_uses_the_fused_forward():
    fresh_compile_state()
    model = _vision_model("sam_hq", "eager").eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        ref = model(x).last_hidden_state
        out = torch.compile(model, backend="samhq", options=FAST)(x).last_hidden_state
    assert counters["samhq"]["fused"] == 2
    assert rel_err(out, ref) < 1e-5


def test_user_kernels_launch_statically_unless_the_user_says_otherwise():
    # the fused op's kernels (triton_op registration) go through Inductor's static launcher, as its own do
    from samhq_fx.backend import launch_user_kernels_statically

    env = "TORCHINDUCTOR_STATIC_LAUNCH_USER_DEFINED_TRITON_KERNELS"
    with mock.patch.dict(os.environ):
        os.environ.pop(env, None)
        patches = {"static_launch_user_defined_triton_kernels": False}
        launch_user_kernels_statically(patches)
        assert patches == {"static_launch_user_defined_triton_kernels": False} and env not in os.environ
        patches = {}
        launch_user_kernels_statically(patches)
        assert patches == {"static_launch_user_defined_triton_kernels": True}
        assert os.environ[env] == "1"  # Inductor's compile workers read it from their environment


def test_memory_budget_errors_name_the_option(monkeypatch):
    from samhq_fx.backend import split_options

    for bad, error in ((0, ValueError), (1.5, ValueError), (-0.1, ValueError), ("half", TypeError), (True, TypeError)):
        with pytest.raises(error, match=r"options\['samhq.memory_budget'\] must be None or a number in \(0, 1\]"):
            split_options({"samhq.memory_budget": bad})
    monkeypatch.setenv("SAMHQ_FX_MEMORY_BUDGET", "0.5")
    assert split_options(None)[0]["samhq.memory_budget"] == 0.5
    assert split_options({"samhq.memory_budget": None})[0]["samhq.memory_budget"] is None  # an option beats the env
    monkeypatch.setenv("SAMHQ_FX_MEMORY_BUDGET", "low")
    with pytest.raises(ValueError, match="SAMHQ_FX_MEMORY_BUDGET must be a number in"):
        split_options(None)
