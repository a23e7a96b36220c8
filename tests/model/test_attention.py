"""Both attention types against naive per-position references written out here step by step."""

from __future__ import annotations

import math

import pytest
import torch
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import AttentionConfig
from zaya_pipeline.model.attention import (
    CompressedConvolutionalAttention,
    GroupedQueryAttention,
    rotary_dim,
)


def rotate(x_THd: torch.Tensor, rot: int, theta: float) -> torch.Tensor:
    """RoPE one head's (T, Hd) vectors: channel i < rot/2 pairs with i + rot/2; the rest pass through."""
    out, R = x_THd.clone(), rot // 2
    for t in range(x_THd.shape[0]):
        for i in range(R):
            angle = t * theta ** (-2 * i / rot)
            a, b = x_THd[t, i], x_THd[t, i + R]
            out[t, i] = a * math.cos(angle) - b * math.sin(angle)
            out[t, i + R] = a * math.sin(angle) + b * math.cos(angle)
    return out


def softmax_attention(q_HTHd, k_GTHd, v_GTHd, scale: float) -> torch.Tensor:
    """Causal attention with query head h reading key/value head h // (H / G)."""
    H, T, _ = q_HTHd.shape
    per_group = H // k_GTHd.shape[0]
    out = torch.zeros_like(q_HTHd)
    for h in range(H):
        g = h // per_group
        for t in range(T):
            scores = torch.stack([q_HTHd[h, t] @ k_GTHd[g, s] * scale for s in range(t + 1)])
            out[h, t] = scores.softmax(0) @ v_GTHd[g, : t + 1]
    return out


def causal_conv(x_TC: torch.Tensor, conv: torch.nn.Conv1d) -> torch.Tensor:
    """out[t, o] = b[o] + sum over taps j and the input channels i of o's group of w[o, i, j] *
    x[t - K + 1 + j, i], for the T - K + 1 positions t that have all their taps (the caller pads)."""
    T, C = x_TC.shape
    weight, K, groups = conv.weight, conv.kernel_size[0], conv.groups
    per = C // groups
    out = torch.zeros(T - K + 1, C, dtype=x_TC.dtype)
    for t in range(K - 1, T):
        out[t - K + 1] = conv.bias
        for j in range(K):
            for g in range(groups):
                sl = slice(g * per, (g + 1) * per)
                out[t - K + 1, sl] += weight[sl, :, j] @ x_TC[t - (K - 1) + j, sl]
    return out


def split_qkv(attn, x_TD):
    H, G, Hd = attn.H, attn.G, attn.Hd
    W = attn.qkv.weight
    q = x_TD @ W[: H * Hd].t()
    k = x_TD @ W[H * Hd : (H + G) * Hd].t()
    v = x_TD @ W[(H + G) * Hd :].t()
    return q, k, v


def reference_gqa(attn: GroupedQueryAttention, x_TD, cfg) -> torch.Tensor:
    H, G, Hd, T = attn.H, attn.G, attn.Hd, x_TD.shape[0]
    q, k, v = split_qkv(attn, x_TD)
    rot, theta = rotary_dim(cfg), cfg.attention.rope_theta
    q_HTHd = torch.stack([rotate(q[:, h * Hd : (h + 1) * Hd], rot, theta) for h in range(H)])
    k_GTHd = torch.stack([rotate(k[:, g * Hd : (g + 1) * Hd], rot, theta) for g in range(G)])
    v_GTHd = v.view(T, G, Hd).transpose(0, 1)
    o = softmax_attention(q_HTHd, k_GTHd, v_GTHd, scale=Hd**-0.5)
    return o.transpose(0, 1).reshape(T, H * Hd) @ attn.out.weight.t()


def reference_cca(attn: CompressedConvolutionalAttention, x_TD, cfg) -> torch.Tensor:
    H, G, Hd, T = attn.H, attn.G, attn.Hd, x_TD.shape[0]
    q, k, v = split_qkv(attn, x_TD)
    # values: the current token's half of the projection, then the previous token's half, read as G heads
    v_now, v_prev = v[:, : G * Hd // 2], torch.zeros(T, G * Hd // 2, dtype=v.dtype)
    v_prev[1:] = v[:-1, G * Hd // 2 :]
    v_GTHd = torch.cat([v_now, v_prev], dim=1).view(T, G, Hd).transpose(0, 1)
    # one left padding of P zeros, the depthwise convolution over it, then the grouped one
    P = attn.conv_depthwise.kernel_size[0] - 1 + attn.conv_grouped.kernel_size[0] - 1
    qk = torch.cat([torch.zeros(P, (H + G) * Hd, dtype=q.dtype), torch.cat([q, k], dim=1)])
    qk = causal_conv(causal_conv(qk, attn.conv_depthwise), attn.conv_grouped)
    q_conv, k_conv = qk[:, : H * Hd].view(T, H, Hd), qk[:, H * Hd :].view(T, G, Hd)
    q_pre, k_pre = q.view(T, H, Hd), k.view(T, G, Hd)
    per = H // G
    q_res = [0.5 * (q_pre[:, h] + k_pre[:, h // per]) for h in range(H)]  # each head its own
    k_res = [sum(q_res[g * per : (g + 1) * per]) / per for g in range(G)]
    rot, theta, s = rotary_dim(cfg), cfg.attention.rope_theta, math.sqrt(Hd)
    q_HTHd = torch.stack([rotate(s * unit(q_conv[:, h] + q_res[h]), rot, theta) for h in range(H)])
    k_GTHd = torch.stack(
        [rotate(attn.temperature_G[g] * s * unit(k_conv[:, g] + k_res[g]), rot, theta) for g in range(G)]
    )
    o = softmax_attention(q_HTHd, k_GTHd, v_GTHd, scale=Hd**-0.5)
    return o.transpose(0, 1).reshape(T, H * Hd) @ attn.out.weight.t()


def unit(x_TD: torch.Tensor) -> torch.Tensor:
    return x_TD / x_TD.norm(dim=-1, keepdim=True)


GQA_CONFIGS = [
    small_config(attention=AttentionConfig(n_heads=2)),  # MHA, full RoPE
    small_config(attention=AttentionConfig(n_heads=4, n_kv_heads=2, head_dim=6, rope_fraction=0.5)),
    small_config(attention=AttentionConfig(n_heads=4, n_kv_heads=1, rope_fraction=0.0)),
]
CCA_CONFIGS = [
    cca_config(),
    cca_config(
        attention=AttentionConfig(
            "cca", n_heads=2, n_kv_heads=1, head_dim=6, conv_kernel_depthwise=3, conv_kernel_grouped=2
        )
    ),
    cca_config(attention=AttentionConfig("cca", n_heads=8, n_kv_heads=2, head_dim=4, rope_fraction=0.5)),
]


def _perturbed(module: torch.nn.Module) -> torch.nn.Module:
    """Fresh random weights everywhere (conv identity init would hide a wrong tap order)."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(std=0.3)
    return module


@pytest.mark.parametrize("cfg", GQA_CONFIGS, ids=lambda c: f"H{c.attention.n_heads}G{c.attention.n_kv_heads}")
def test_gqa_matches_the_naive_reference(cfg):
    attn = _perturbed(GroupedQueryAttention(cfg).double())
    x = torch.randn(1, 7, cfg.d_model, dtype=torch.float64)
    # RoPE angles are fp32 (as transformers computes them), the reference's exact: fp32-level tolerance
    torch.testing.assert_close(attn(x)[0], reference_gqa(attn, x[0], cfg), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "cfg",
    CCA_CONFIGS,
    ids=lambda c: f"H{c.attention.n_heads}G{c.attention.n_kv_heads}K{c.attention.conv_kernel_depthwise}",
)
def test_cca_matches_the_naive_reference(cfg):
    attn = _perturbed(CompressedConvolutionalAttention(cfg).double())
    x = torch.randn(1, 7, cfg.d_model, dtype=torch.float64)
    torch.testing.assert_close(attn(x)[0], reference_cca(attn, x[0], cfg), rtol=1e-5, atol=1e-6)


def test_cca_init_is_identity_convolution_and_unit_temperature():
    cfg = cca_config()
    attn = CompressedConvolutionalAttention(cfg)
    attn.reset_parameters(std=0.0, out_std=0.0)
    x_BCT = torch.randn(1, attn.conv_depthwise.weight.shape[0], 5)
    two_taps_of_padding = torch.nn.functional.pad(x_BCT, (attn.P, 0))
    torch.testing.assert_close(attn.conv_grouped(attn.conv_depthwise(two_taps_of_padding)), x_BCT)
    assert torch.equal(attn.temperature_G, torch.ones(attn.G))


def test_cca_shrinks_parameters_and_kv_cache_against_mha():
    from zaya_pipeline.model.sizing import attention_params, kv_cache_values_per_token

    mha = small_config(d_model=64, attention=AttentionConfig(n_heads=4))
    cca = small_config(d_model=64, attention=AttentionConfig("cca", n_heads=4, n_kv_heads=1, head_dim=8))
    assert attention_params(cca)[0] < attention_params(mha)[0] / 2
    assert kv_cache_values_per_token(mha) == 8 * kv_cache_values_per_token(cca)
