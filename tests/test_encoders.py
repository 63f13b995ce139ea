"""Whole encoders written the way other code bases write them, compiled with backend="samhq" on CPU.

Not HF's SAM classes: segment-anything's ViT image encoder block (window partition with padding, `get_rel_pos`,
`add_decomposed_rel_pos` on a 5-D view), timm's SAM ViT attention (the bias built apart, then SDPA on 3-D q, k, v
or the explicit softmax) and timm's MViTv2 attention without a class token (rel-pos terms from einsums, the
biased scores written back into `attn[:, :, 0:, 0:]`), also with pooled queries and keys (q and k grids of
different sizes, rel-pos distances scaled, residual pooling), and transformers' VitDetModel (ViTMatte's backbone,
rel-pos tables interpolated to a non-square image). Each must fuse every attention layer and
give float64's output and gradients, the rel-pos tables' included: through the op's reference on CPU, and through
the Triton kernels under the interpreter (as on CUDA, where tests/test_gpu.py runs the same checks).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

from helpers import fresh_compile_state, no_compile_caches, rel_err


def get_rel_pos(q_size: int, k_size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    # segment-anything's: the table already has 2 * max(q, k) - 1 rows here, so no interpolation
    q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
    k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
    relative_coords = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
    return rel_pos[relative_coords.long()]


def add_decomposed_rel_pos(attn, q, rel_pos_h, rel_pos_w, q_size, k_size):
    q_h, q_w = q_size
    k_h, k_w = k_size
    Rh, Rw = get_rel_pos(q_h, k_h, rel_pos_h), get_rel_pos(q_w, k_w, rel_pos_w)
    B, _, dim = q.shape
    r_q = q.reshape(B, q_h, q_w, dim)
    rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, Rh)
    rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, Rw)
    attn = (attn.view(B, q_h, q_w, k_h, k_w) + rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).view(
        B, q_h * q_w, k_h * k_w)
    return attn


class SamAttention(nn.Module):  # segment_anything/modeling/image_encoder.py: Attention
    def __init__(self, dim, num_heads, input_size):
        super().__init__()
        self.num_heads, self.scale = num_heads, (dim // num_heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)
        self.rel_pos_h = nn.Parameter(torch.randn(2 * input_size[0] - 1, dim // num_heads) * 0.5)
        self.rel_pos_w = nn.Parameter(torch.randn(2 * input_size[1] - 1, dim // num_heads) * 0.5)

    def forward(self, x):
        B, H, W, _ = x.shape
        qkv = self.qkv(x).reshape(B, H * W, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, B * self.num_heads, H * W, -1).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = add_decomposed_rel_pos(attn, q, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W))
        attn = attn.softmax(dim=-1)
        x = (attn @ v).view(B, self.num_heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)
        return self.proj(x)


class TimmSamAttention(SamAttention):  # timm vision_transformer_sam.py: get_decomposed_rel_pos_bias, fused_attn
    fused_attn = True

    def forward(self, x):
        B, H, W, _ = x.shape
        N = H * W
        qkv = self.qkv(x.reshape(B, N, -1)).view(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.reshape(3, B * self.num_heads, N, -1).unbind(0)
        Rh, Rw = get_rel_pos(H, H, self.rel_pos_h), get_rel_pos(W, W, self.rel_pos_w)
        r_q = q.reshape(B * self.num_heads, H, W, -1)
        rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, Rh)
        rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, Rw)
        attn_bias = (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(-1, N, N)
        if self.fused_attn:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=0.0)
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            x = (attn + attn_bias).softmax(dim=-1) @ v
        x = x.view(B, self.num_heads, N, -1).transpose(1, 2).reshape(B, N, -1)
        return self.proj(x).view(B, H, W, -1)


class TimmSamAttentionExplicit(TimmSamAttention):
    fused_attn = False


def window_partition(x, window_size):
    B, H, W, C = x.shape
    pad_h, pad_w = (window_size - H % window_size) % window_size, (window_size - W % window_size) % window_size
    if pad_h > 0 or pad_w > 0:
        x = F.pad(x, (0, 0, 0, pad_w, 0, pad_h))
    Hp, Wp = H + pad_h, W + pad_w
    x = x.view(B, Hp // window_size, window_size, Wp // window_size, window_size, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, window_size, window_size, C), (Hp, Wp)


def window_unpartition(windows, window_size, pad_hw, hw):
    (Hp, Wp), (H, W) = pad_hw, hw
    B = windows.shape[0] // (Hp * Wp // window_size // window_size)
    x = windows.view(B, Hp // window_size, Wp // window_size, window_size, window_size, -1)
    x = x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, Hp, Wp, -1)
    return x[:, :H, :W, :].contiguous() if Hp > H or Wp > W else x


class SamBlock(nn.Module):  # segment_anything's Block: norm, (windowed) attention, MLP
    def __init__(self, dim, num_heads, window_size, grid, attention=SamAttention):
        super().__init__()
        self.window_size = window_size
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = attention(dim, num_heads, (window_size, window_size) if window_size else grid)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        shortcut, x = x, self.norm1(x)
        if self.window_size > 0:
            H, W = x.shape[1], x.shape[2]
            x, pad_hw = window_partition(x, self.window_size)
        x = self.attn(x)
        if self.window_size > 0:
            x = window_unpartition(x, self.window_size, pad_hw, (H, W))
        x = shortcut + x
        return x + self.mlp(self.norm2(x))


def mvit_add_rel_pos(attn, q, Rh, Rw, q_size, k_size):
    # timm mvitv2 cal_rel_pos_type after its table gather: rel-pos terms from einsums, the biased scores written back
    # whole into attn[:, :, 0:, 0:]; q: [B, heads, Nq, D], Rh: [q_h, k_h, D], Rw: [q_w, k_w, D]
    (q_h, q_w), (k_h, k_w) = q_size, k_size
    B, heads = q.shape[:2]
    r_q = q[:, :, 0:].reshape(B, heads, q_h, q_w, -1)
    rel_h = torch.einsum("byhwc,hkc->byhwk", r_q, Rh)
    rel_w = torch.einsum("byhwc,wkc->byhwk", r_q, Rw)
    attn[:, :, 0:, 0:] = (attn[:, :, 0:, 0:].view(B, -1, q_h, q_w, k_h, k_w)
                          + rel_h.unsqueeze(-1) + rel_w.unsqueeze(-2)).view(B, -1, q_h * q_w, k_h * k_w)
    return attn


class MViTv2Attention(nn.Module):  # timm mvitv2: cal_rel_pos_type without a class token, q [B, heads, N, D]
    def __init__(self, dim, num_heads, grid):
        super().__init__()
        self.num_heads, self.grid, self.scale = num_heads, grid, (dim // num_heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)
        self.rel_pos_h = nn.Parameter(torch.randn(2 * grid[0] - 1, dim // num_heads) * 0.5)
        self.rel_pos_w = nn.Parameter(torch.randn(2 * grid[1] - 1, dim // num_heads) * 0.5)

    def forward(self, x):  # x: [B, N, dim]
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        q_h, q_w = self.grid
        dist_h = torch.arange(q_h)[:, None] - torch.arange(q_h)[None, :] + (q_h - 1)
        dist_w = torch.arange(q_w)[:, None] - torch.arange(q_w)[None, :] + (q_w - 1)
        Rh, Rw = self.rel_pos_h[dist_h.long()], self.rel_pos_w[dist_w.long()]
        attn = mvit_add_rel_pos(attn, q, Rh, Rw, (q_h, q_w), (q_h, q_w)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, -1))


class MViTv2PooledAttention(nn.Module):  # timm mvitv2 MultiScaleAttention: pooled q and k/v grids of their own sizes
    def __init__(self, dim, num_heads, grid, stride_q, stride_kv):
        super().__init__()
        self.num_heads, self.grid, self.scale = num_heads, grid, (dim // num_heads) ** -0.5
        hd = dim // num_heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)
        # timm's "conv" pooling: a depthwise 3x3 convolution per head, strided
        self.pool_q = nn.Conv2d(hd, hd, 3, stride_q, 1, groups=hd, bias=False)
        self.pool_k = nn.Conv2d(hd, hd, 3, stride_kv, 1, groups=hd, bias=False)
        self.pool_v = nn.Conv2d(hd, hd, 3, stride_kv, 1, groups=hd, bias=False)
        q_size = [(s - 1) // stride_q + 1 for s in grid]
        kv_size = [(s - 1) // stride_kv + 1 for s in grid]
        self.rel_pos_h = nn.Parameter(torch.randn(2 * max(q_size[0], kv_size[0]) - 1, hd) * 0.5)
        self.rel_pos_w = nn.Parameter(torch.randn(2 * max(q_size[1], kv_size[1]) - 1, hd) * 0.5)

    @staticmethod
    def _dist(q_n, k_n):  # cal_rel_pos_type's table rows: distances scaled up where the q and k grids differ
        q_ratio, k_ratio = max(k_n / q_n, 1.0), max(q_n / k_n, 1.0)
        dist = torch.arange(q_n)[:, None] * q_ratio - torch.arange(k_n)[None, :] * k_ratio + (k_n - 1) * k_ratio
        return dist.long()

    def _pool(self, x, pool):  # x: [B, heads, N, hd] on grid -> pooled, with its grid
        B, heads, _, hd = x.shape
        x = pool(x.reshape(B * heads, *self.grid, hd).permute(0, 3, 1, 2))
        size = x.shape[2:]
        return x.reshape(B, heads, hd, -1).transpose(2, 3), size

    def forward(self, x):  # x: [B, N, dim] on self.grid
        B, N, _ = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
        (q, (q_h, q_w)), (k, (k_h, k_w)) = self._pool(q, self.pool_q), self._pool(k, self.pool_k)
        v, _ = self._pool(v, self.pool_v)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        Rh, Rw = self.rel_pos_h[self._dist(q_h, k_h)], self.rel_pos_w[self._dist(q_w, k_w)]
        attn = mvit_add_rel_pos(attn, q, Rh, Rw, (q_h, q_w), (k_h, k_w))
        x = attn.softmax(dim=-1) @ v + q  # residual pooling
        return self.proj(x.transpose(1, 2).reshape(B, q_h * q_w, -1))


class HFVitDet(nn.Module):  # transformers' VitDetModel (ViTMatte's backbone): the encoder's last hidden state
    def __init__(self):
        super().__init__()
        from transformers import VitDetConfig, VitDetModel

        from samhq_fx.models import random_init_

        # pretrained at 48 px: the global layers' rel-pos tables (and the absolute ones) are interpolated at 64 px
        cfg = VitDetConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, mlp_ratio=2, image_size=64,
                           pretrain_image_size=48, patch_size=8, window_size=3, window_block_indices=[0, 2],
                           residual_block_indices=[1], use_relative_position_embeddings=True)
        self.model = random_init_(VitDetModel(cfg))

    def forward(self, pixel_values):
        return self.model(pixel_values).last_hidden_state


def _segment_anything_encoder():
    grid = (10, 9)  # 7x7 windows over a padded 14x14 grid, then global 10x9
    return nn.Sequential(SamBlock(32, 2, 7, grid), SamBlock(32, 2, 0, grid)), torch.randn(2, *grid, 32), 2


def _timm_sam_encoder():  # SDPA in one block, the explicit softmax in the other
    grid = (10, 9)
    blocks = [SamBlock(32, 2, 7, grid, TimmSamAttention), SamBlock(32, 2, 0, grid, TimmSamAttentionExplicit)]
    return nn.Sequential(*blocks), torch.randn(2, *grid, 32), 2


def _mvitv2_encoder():
    grid = (6, 5)
    return nn.Sequential(MViTv2Attention(32, 2, grid), nn.LayerNorm(32), MViTv2Attention(32, 4, grid)), \
        torch.randn(2, 30, 32), 2


def _mvitv2_pooled_encoder():  # q grid 8x6 -> keys 4x3 (kv stride 2); then q and keys both pooled: 4x3 -> 2x2
    grid = (8, 6)
    return nn.Sequential(MViTv2PooledAttention(32, 2, grid, 1, 2), nn.LayerNorm(32),
                         MViTv2PooledAttention(32, 2, grid, 2, 4)), torch.randn(2, 48, 32), 2


def _hf_vitdet_encoder():  # a 64 x 40 image: an 8x5 global grid, 3x3 windows over it padded to 9x6
    return HFVitDet(), torch.randn(2, 3, 64, 40), 3


ENCODERS = {"segment_anything": _segment_anything_encoder, "timm_sam": _timm_sam_encoder, "mvitv2": _mvitv2_encoder,
            "mvitv2_pooled": _mvitv2_pooled_encoder, "hf_vitdet": _hf_vitdet_encoder}


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoder_written_elsewhere_fuses_every_layer_and_matches_float64(name):
    check_encoder(ENCODERS[name])


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoder_with_recomputed_rel_pos_copies_matches_float64(name):
    # samhq.recompute_copies finds the einsums' copies of q however the encoder writes them, and changes no result
    with no_compile_caches():
        check_encoder(ENCODERS[name], options={"samhq.recompute_copies": True})
    assert counters["samhq"]["recomputed_copies"] > 0


@pytest.mark.parametrize("name", list(ENCODERS))
def test_encoder_through_the_kernels_under_the_interpreter(name, monkeypatch):
    # On CPU the fused op runs the reference; here the opaque op takes the Triton kernels (under TRITON_INTERPRET)
    # as it does on CUDA, so the layouts Inductor hands a compiled encoder's op reach the kernels in CI too
    import samhq_fx.op as op

    if os.environ.get("TRITON_INTERPRET") != "1" or op._kernels is None:
        pytest.skip("the Triton kernels run on CPU tensors only under TRITON_INTERPRET=1 (conftest, no GPU)")
    taken, broken = [], set(op._broken)
    kernels = op._kernels
    monkeypatch.setattr(op, "_kernel_skip_reason",
                        lambda *ts: (reason := kernels.unsupported_reason(*ts)) or taken.append(1) or reason)
    check_encoder(ENCODERS[name], tol=1e-4)
    assert taken, "no call went to the kernels"
    assert op._broken == broken, op._broken - broken  # no kernel failed over to the reference


def check_encoder(build, device: str = "cpu", tol: float = 1e-5, options: dict | None = None) -> None:
    """build()'s encoder compiled with backend="samhq" (and these backend options): every layer fused, output and
    every gradient within tol of float64, still fused at a second batch size (tests/test_gpu.py runs it on CUDA)."""
    fresh_compile_state()
    torch.manual_seed(0)
    model, x, layers = build()
    model, x = model.to(device), x.to(device).requires_grad_()
    model64, x64 = _double(model), x.detach().double().requires_grad_()
    compiled = torch.compile(model, backend="samhq", options=options)
    out = compiled(x)
    assert counters["samhq"]["fused"] == layers, dict(counters["samhq"])
    ref = model64(x64)
    assert (e := rel_err(out, ref)) < tol, f"output {e:.3g}"  # rel_err: inf for any non-finite value
    w = torch.randn_like(ref)
    (out * w.float()).sum().backward()
    (ref * w).sum().backward()
    assert (e := rel_err(x.grad, x64.grad)) < tol, f"input grad {e:.3g}"
    for (name, p), p64 in zip(model.named_parameters(), model64.parameters()):
        assert (e := rel_err(p.grad, p64.grad)) < tol, f"{name} grad {e:.3g}"
    # a second batch size recompiles with a symbolic batch (automatic dynamic shapes) and stays fused
    x3 = torch.randn(3, *x.shape[1:], device=device)
    with torch.no_grad():
        assert (e := rel_err(compiled(x3), model64(x3.double()))) < tol, f"output at batch 3 {e:.3g}"
    assert counters["samhq"]["fused"] == 2 * layers, dict(counters["samhq"])


def _double(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).double()
