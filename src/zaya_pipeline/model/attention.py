"""Causal multi-head self-attention with rotary position embeddings (RoPE).

Shape legend:
    B  batch    T  sequence length    D  model width    H  heads    Hd  head width (D / H)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def rope_tables(max_seq_len: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_seq_len, head_dim / 2) in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x_BHTHd: torch.Tensor, cos_TR: torch.Tensor, sin_TR: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + Hd/2]) by position-dependent angles (R = Hd / 2)."""
    x1, x2 = x_BHTHd.float().chunk(2, dim=-1)
    out = torch.cat((x1 * cos_TR - x2 * sin_TR, x1 * sin_TR + x2 * cos_TR), dim=-1)
    return out.to(x_BHTHd.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_seq_len: int, rope_theta: float):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        cos, sin = rope_tables(max_seq_len, self.head_dim, rope_theta)
        # Derived from the config, so not saved in checkpoints.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x_BTD: torch.Tensor) -> torch.Tensor:
        B, T, D = x_BTD.shape
        qkv = self.qkv(x_BTD).view(B, T, 3, self.n_heads, self.head_dim)
        q_BHTHd, k_BHTHd, v_BHTHd = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        q_BHTHd, k_BHTHd = apply_rope(q_BHTHd, cos, sin), apply_rope(k_BHTHd, cos, sin)
        o_BHTHd = F.scaled_dot_product_attention(q_BHTHd, k_BHTHd, v_BHTHd, is_causal=True)
        return self.out(o_BHTHd.transpose(1, 2).reshape(B, T, D))
