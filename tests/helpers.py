"""Shared test helpers: random rel-pos attention inputs and error measures."""

from __future__ import annotations

import contextlib

import torch


def rand_inputs(b, grid_q, grid_k, d, dtype=torch.float32, dv=None, device="cpu", requires_grad=False, seed=0):
    """q [b, Nq, d], k [b, Nk, d], v [b, Nk, dv], rel_h [b, Nq, Hk], rel_w [b, Nq, Wk]; O(1) values."""
    g = torch.Generator().manual_seed(seed)
    n_q = grid_q[0] * grid_q[1]
    n_k = grid_k[0] * grid_k[1]
    shapes = [(b, n_q, d), (b, n_k, d), (b, n_k, dv or d), (b, n_q, grid_k[0]), (b, n_q, grid_k[1])]
    out = []
    for s in shapes:
        t = torch.randn(s, generator=g, dtype=torch.float64).to(device=device, dtype=dtype)
        out.append(t.requires_grad_(requires_grad))
    return out


def grid_terms(rel_h, rel_w, hq, wq):
    """rel_h / rel_w [B, Hq*Wq, K] as [B, Hq, Wq, K] views laid out as SAM's einsums write them: rel_h grid row by
    grid row ([Hq, B, Wq, K] in memory, a GEMM batched over h), rel_w grid column by grid column ([Wq, B, Hq, K]).
    For B > 1 neither can be viewed as [B, Hq*Wq, K] (the copy the op's 4-D path saves). Same values, same
    requires_grad, new leaves."""
    b = rel_h.shape[0]
    rh = rel_h.detach().view(b, hq, wq, -1).permute(1, 0, 2, 3).contiguous().permute(1, 0, 2, 3)
    rw = rel_w.detach().view(b, hq, wq, -1).permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3)
    return rh.requires_grad_(rel_h.requires_grad), rw.requires_grad_(rel_w.requires_grad)


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| in float64; NaN anywhere gives inf so it never passes."""
    got, ref = got.detach().double(), ref.detach().double().to(got.device)
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def fresh_compile_state():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


@contextlib.contextmanager
def no_compile_caches():
    """Inductor's FX graph cache and AOTAutograd's cache off: passes that run inside Inductor (samhq.recompute_copies)
    run, and count, on every compile instead of only the first with a given key."""
    import torch._functorch.config as functorch_config
    from torch._inductor import config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


def whole_samhq_model_and_loss(tmp_path, device):
    """The main job's tiny random-init SamHQModel (HF "eager" attention) and one batch of 2 generated masks,
    through the example's own loaders (examples/samhq_model_io.py, samhq_data.py); the whole-model loss."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import finetune_samhq
    import samhq_data
    import samhq_model_io

    model, processor = samhq_model_io.load("random:tiny", "eager")
    image_size, mask_size = model.config.vision_config.image_size, samhq_model_io.mask_size(model)
    samples = samhq_data.scan(samhq_data.write_synthetic(tmp_path / "data", n=2, size=image_size, seed=0))
    batch = finetune_samhq.to_device(samhq_data.make_batch(samples, processor, mask_size, None), device)

    def loss_fn(fn):  # the whole model in one call: encoder, prompt encoder and mask decoder
        out = fn(pixel_values=batch["pixel_values"], input_boxes=batch["input_boxes"], multimask_output=False,
                 hq_token_only=True)
        return finetune_samhq.loss_fn(out.pred_masks[:, 0, 0].float(), batch["target"])

    return model.to(device).train(), loss_fn


def capture_compile_fx(monkeypatch) -> dict:
    """Stand in for Inductor's compile_fx: record the config patches the backend hands it, run the graph as is."""
    import torch._inductor.compile_fx

    seen = {}

    def fake_compile_fx(gm, example_inputs, config_patches=None):
        seen.update(config_patches)
        return gm.forward

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", fake_compile_fx)
    return seen
