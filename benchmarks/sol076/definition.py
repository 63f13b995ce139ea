"""SOL-ExecBench L2/076 as data: the layer, its 16 workloads, its inputs and its correctness rule.

NVIDIA's problem `L2/076_sam_hq_vision_attention_with_relative_position_backward` (model
sam-hq-vit-base): the backward of one SAM-HQ ViT-B vision attention layer, forward recomputed.
Facts copied from the benchmark's public definition so this repo stands alone; the code is ours.

    inputs : grad_output [B,H,W,768], hidden_states [B,H,W,768], qkv_weight [2304,768], qkv_bias [2304],
             proj_weight [768,768], proj_bias [768], rel_pos_h [2H-1,64], rel_pos_w [2W-1,64], scale
    outputs: the 7 gradients w.r.t. hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias,
             rel_pos_h, rel_pos_w (fp32, shapes of their inputs)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

HIDDEN = 768
HEADS = 12
HEAD_DIM = 64
SCALE = HEAD_DIM**-0.5  # 0.125

# (H, W, B): atol.  rtol is 1e-3 for every workload.
WORKLOADS: dict[tuple[int, int, int], float] = {
    (7, 7, 1): 0.0094, (7, 7, 64): 0.08, (14, 14, 1): 0.024, (14, 14, 2): 0.028,
    (14, 14, 8): 0.075, (16, 16, 1): 0.026, (16, 16, 32): 0.16, (28, 28, 4): 0.082,
    (32, 32, 1): 0.053, (32, 32, 2): 0.068, (32, 32, 4): 0.13, (32, 32, 8): 0.16,
    (48, 48, 1): 0.085, (48, 48, 2): 0.13, (56, 56, 1): 0.081, (64, 64, 4): 0.19,
}
RTOL = 1e-3
INPUT_NAMES = ("hidden_states", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias", "rel_pos_h", "rel_pos_w")


def get_rel_pos(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """Table [2*max-1, C] -> [q_size, k_size, C], as SAM: interpolate (identity here), then gather."""
    max_rel_dist = 2 * max(q_size, k_size) - 1
    resized = F.interpolate(rel_pos.reshape(1, rel_pos.shape[0], -1).transpose(1, 2), size=max_rel_dist, mode="linear")
    resized = resized.reshape(-1, max_rel_dist).permute(1, 0)
    q_coords = torch.arange(q_size, device=rel_pos.device)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size, device=rel_pos.device)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return resized[relative_coords.long()]


def attention_layer(hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w, scale=SCALE):
    """The forward the benchmark differentiates: one SAM-HQ vision attention layer (explicit softmax)."""
    B, H, W, _ = hidden_states.shape
    N = H * W
    qkv = F.linear(hidden_states, qkv_weight, qkv_bias).reshape(B, N, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, B * HEADS, N, -1).unbind(0)  # each [B*heads, N, 64]
    attn = (q * scale) @ k.transpose(-2, -1)
    Rh, Rw = get_rel_pos(H, H, rel_pos_h), get_rel_pos(W, W, rel_pos_w)
    r_q = q.reshape(B * HEADS, H, W, -1)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, Rh)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, Rw)
    attn = (attn.view(B * HEADS, H, W, H, W) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).view(B * HEADS, N, N)
    attn = torch.softmax(attn, dim=-1, dtype=torch.float32).to(q.dtype)
    out = (attn @ v).view(B, HEADS, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)
    return F.linear(out, proj_weight, proj_bias)


def layer_backward(grad_output, *inputs, layer=attention_layer, scale=SCALE):
    """The timed function: forward, then torch.autograd.grad of all 7 inputs. Inputs must require grad."""
    out = layer(*inputs, scale=scale)
    return torch.autograd.grad(out, inputs, grad_output)


def float64_gradients(grad_output, *inputs, scale=SCALE):
    """The reference: layer_backward on float64 copies of grad_output and the 7 inputs (detached results)."""
    ref_in = [t.detach().double().requires_grad_() for t in inputs]
    return [g.detach() for g in layer_backward(grad_output.detach().double(), *ref_in, scale=scale)]


def make_inputs(H: int, W: int, B: int, device="cpu", dtype=torch.float32, generator=None):
    """(grad_output, hidden_states, qkv_weight, qkv_bias, proj_weight, proj_bias, rel_pos_h, rel_pos_w),
    drawn as the benchmark draws them; the 7 layer inputs require grad."""
    g = generator

    def randn(*shape, std=1.0):
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * std).to(device=device, dtype=dtype)

    grad_output = randn(B, H, W, HIDDEN)
    inputs = [
        randn(B, H, W, HIDDEN, std=0.1),
        randn(3 * HIDDEN, HIDDEN, std=(2 / HIDDEN) ** 0.5),
        torch.zeros(3 * HIDDEN, device=device, dtype=dtype),
        randn(HIDDEN, HIDDEN, std=(2 / HIDDEN) ** 0.5),
        torch.zeros(HIDDEN, device=device, dtype=dtype),
        randn(2 * H - 1, HEAD_DIM, std=0.02),
        randn(2 * W - 1, HEAD_DIM, std=0.02),
    ]
    return (grad_output, *[t.requires_grad_() for t in inputs])


def check(got, ref, atol: float, rtol: float = RTOL) -> tuple[bool, str]:
    """The benchmark's rule, per output: finite, and >= 99% of elements within atol + rtol*|ref|."""
    for name, g, r in zip(INPUT_NAMES, got, ref):
        g, r = g.detach().double(), r.detach().double()
        if g.shape != r.shape:
            return False, f"{name}: shape {tuple(g.shape)} != {tuple(r.shape)}"
        if not torch.isfinite(g).all():
            return False, f"{name}: NaN/inf"
        ok = ((g - r).abs() <= atol + rtol * r.abs()).double().mean().item()
        if ok < 0.99:
            return False, f"{name}: only {100 * ok:.2f}% within tolerance"
    return True, "ok"
