"""Causal self-attention: grouped-query attention (GQA) and ZAYA1's compressed convolutional attention (CCA).

Both take an optional per-layer decoding cache (a dict owned by ``KVCache``) and the position of their first
token, so that the same code runs a full sequence, a chunked prefill and one-token-at-a-time decoding.

Packed training sequences may also pass ``position_ids_BT`` (RoPE positions that restart at each document)
and ``doc_ids_BT`` (document number of each token): with ``doc_ids_BT`` attention is block-diagonal causal,
and CCA's convolutions and value shift read only tokens of the same document (no cache then).

Shape legend:
    B  batch    T  new tokens    S  cached + new tokens    D  model width    H  query heads
    G  key/value heads    Hd  head width    C  packed q/k channels ((H + G) * Hd)    R  rotated pairs
    K  convolution taps
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.errors import ConfigError

ATTENTION_TYPES = ("gqa", "cca")


def head_dims(cfg: ModelConfig) -> tuple[int, int, int]:
    """(query heads H, key/value heads G, head width Hd) with the config's 0 = default resolved."""
    a = cfg.attention
    H = a.n_heads
    G = a.n_kv_heads or H
    Hd = a.head_dim or (cfg.d_model // H if H > 0 else 0)
    return H, G, Hd


def rotary_dim(cfg: ModelConfig) -> int:
    """Channels of each head RoPE rotates: ``rope_fraction * Hd`` rounded down to an even number."""
    return int(head_dims(cfg)[2] * cfg.attention.rope_fraction) // 2 * 2


def validate_attention_config(cfg: ModelConfig) -> None:
    a = cfg.attention
    if a.type not in ATTENTION_TYPES:
        raise ConfigError(
            f"model.attention.type: unknown attention {a.type!r}; choose one of {list(ATTENTION_TYPES)}"
        )
    H, G, Hd = head_dims(cfg)
    if H < 1 or G < 1 or H % G:
        raise ConfigError(
            f"model.attention.n_heads={H} must be >= 1 and a multiple of model.attention.n_kv_heads={G}"
        )
    if a.head_dim == 0 and cfg.d_model % H:
        raise ConfigError(
            f"model.attention.n_heads={H} must divide model.d_model={cfg.d_model} "
            " (or set model.attention.head_dim)"
        )
    if Hd < 2 or Hd % 2:
        raise ConfigError(f"the head width must be even and >= 2 (RoPE), got {Hd} (model.attention.head_dim)")
    if not 0.0 <= a.rope_fraction <= 1.0:
        raise ConfigError(f"model.attention.rope_fraction must be in [0, 1], got {a.rope_fraction}")
    if a.type == "cca" and a.conv_kernel < 1:
        raise ConfigError(f"model.attention.conv_kernel must be >= 1, got {a.conv_kernel}")


class KVCache:
    """Decoding state of a whole model: per layer a dict with the keys and values of every token seen so far
    and, for CCA, the convolution and value-shift inputs of the last tokens; ``length`` = tokens seen."""

    def __init__(self, n_layers: int):
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layers)]
        self.length = 0


def rope_tables(max_seq_len: int, rot_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_seq_len, rot_dim / 2) in fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / max(rot_dim, 1)))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x_BHTHd: torch.Tensor, cos_TR: torch.Tensor, sin_TR: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + R]) of the first 2R channels by position-dependent angles; the rest of
    the head passes through unchanged (partial RoPE)."""
    rot = 2 * cos_TR.shape[-1]
    x1, x2 = x_BHTHd[..., :rot].float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos_TR - x2 * sin_TR, x1 * sin_TR + x2 * cos_TR), dim=-1).to(x_BHTHd.dtype)
    return torch.cat((rotated, x_BHTHd[..., rot:]), dim=-1) if rot < x_BHTHd.shape[-1] else rotated


class RotaryEmbedding(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rot_dim = rotary_dim(cfg)
        cos, sin = rope_tables(cfg.max_seq_len, self.rot_dim, cfg.attention.rope_theta)
        # Derived from the config, so not saved in checkpoints.
        self.register_buffer("cos_TR", cos, persistent=False)
        self.register_buffer("sin_TR", sin, persistent=False)

    def forward(
        self, x_BHTHd: torch.Tensor, start: int, position_ids_BT: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.rot_dim == 0:
            return x_BHTHd
        if position_ids_BT is not None:  # per-token positions, broadcast over heads
            return apply_rope(
                x_BHTHd, self.cos_TR[position_ids_BT][:, None], self.sin_TR[position_ids_BT][:, None]
            )
        T = x_BHTHd.shape[2]
        return apply_rope(x_BHTHd, self.cos_TR[start : start + T], self.sin_TR[start : start + T])


def _extend(cache: dict | None, name: str, new_BGTHd: torch.Tensor) -> torch.Tensor:
    """The cached keys (or values) followed by the new ones along time; the cache keeps the result."""
    if cache is None:
        return new_BGTHd
    old = cache.get(name)
    full = new_BGTHd if old is None else torch.cat((old, new_BGTHd), dim=2)
    cache[name] = full
    return full


def _attend(
    q_BHTHd, k_BGSHd, v_BGSHd, start: int, scale: float | None = None, doc_ids_BT: torch.Tensor | None = None
) -> torch.Tensor:
    """Causal SDPA of T new queries (positions start..start+T-1) over S = start + T keys; G may divide H.
    With ``doc_ids_BT`` (no cache) a query sees only the keys of its own document."""
    T, S = q_BHTHd.shape[2], k_BGSHd.shape[2]
    gqa = q_BHTHd.shape[1] != k_BGSHd.shape[1]
    if doc_ids_BT is not None:
        causal_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTHd.device).tril()
        mask_BTT = (doc_ids_BT[:, :, None] == doc_ids_BT[:, None, :]) & causal_TT
        return F.scaled_dot_product_attention(
            q_BHTHd, k_BGSHd, v_BGSHd, attn_mask=mask_BTT[:, None], scale=scale, enable_gqa=gqa
        )
    if T == S:  # no cache, or an empty one: plain causal
        return F.scaled_dot_product_attention(
            q_BHTHd, k_BGSHd, v_BGSHd, is_causal=True, scale=scale, enable_gqa=gqa
        )
    # SDPA's is_causal aligns the mask top-left; with a cache the new queries sit at the bottom right.
    positions_T = torch.arange(start, start + T, device=q_BHTHd.device)
    mask_TS = torch.arange(S, device=q_BHTHd.device)[None, :] <= positions_T[:, None]
    return F.scaled_dot_product_attention(
        q_BHTHd, k_BGSHd, v_BGSHd, attn_mask=mask_TS, scale=scale, enable_gqa=gqa
    )


class GroupedQueryAttention(nn.Module):
    """Fused q/k/v projection, RoPE, G key/value heads shared by H / G query heads each, output projection.
    With ``n_kv_heads = n_heads`` this is standard multi-head attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.H, self.G, self.Hd = head_dims(cfg)
        H, G, Hd = self.H, self.G, self.Hd
        self.qkv = nn.Linear(cfg.d_model, (H + 2 * G) * Hd, bias=False)
        self.out = nn.Linear(H * Hd, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(cfg)

    def reset_parameters(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)

    def forward(
        self,
        x_BTD: torch.Tensor,
        cache: dict | None = None,
        start: int = 0,
        position_ids_BT: torch.Tensor | None = None,
        doc_ids_BT: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, G, Hd = self.H, self.G, self.Hd
        q, k, v = self.qkv(x_BTD).split((H * Hd, G * Hd, G * Hd), dim=-1)
        q_BHTHd = self.rope(q.view(B, T, H, Hd).transpose(1, 2), start, position_ids_BT)
        k_BGTHd = self.rope(k.view(B, T, G, Hd).transpose(1, 2), start, position_ids_BT)
        k_BGSHd = _extend(cache, "k", k_BGTHd)
        v_BGSHd = _extend(cache, "v", v.view(B, T, G, Hd).transpose(1, 2))
        o_BHTHd = _attend(q_BHTHd, k_BGSHd, v_BGSHd, start, doc_ids_BT=doc_ids_BT)
        return self.out(o_BHTHd.transpose(1, 2).reshape(B, T, H * Hd))


def _causal_conv(
    conv: nn.Conv1d, x_BCT: torch.Tensor, cache: dict | None, name: str, same_BTK: torch.Tensor | None = None
) -> torch.Tensor:
    """``conv`` over time, left-padded with the cached last K - 1 inputs (zeros at the sequence start).
    ``same_BTK`` (no cache): tap k of output t reads input t - (K - 1 - k) only where that is True."""
    K = conv.kernel_size[0]
    prev = None if cache is None else cache.get(name)
    if prev is None:
        prev = x_BCT.new_zeros(x_BCT.shape[0], x_BCT.shape[1], K - 1)
    x_in = torch.cat((prev, x_BCT), dim=2)
    if cache is not None:
        cache[name] = x_in[:, :, x_in.shape[2] - (K - 1) :]
    if same_BTK is None:
        return conv(x_in)
    # The same grouped convolution written out over the K taps, each window masked per output position.
    B, C, T = x_BCT.shape
    groups = conv.groups
    win_BNiTK = (x_in.unfold(2, K, 1) * same_BTK[:, None].to(x_in.dtype)).view(B, groups, C // groups, T, K)
    w_NoiK = conv.weight.view(groups, conv.out_channels // groups, C // groups, K)
    return torch.einsum("bnitk,noik->bnot", win_BNiTK, w_NoiK).reshape(B, conv.out_channels, T)


def same_document_taps(doc_ids_BT: torch.Tensor, K: int) -> torch.Tensor:
    """``same_BTK[b, t, k]``: token t - (K - 1 - k) exists and is in token t's document."""
    pad_BT = torch.full_like(doc_ids_BT[:, : K - 1], -1)
    windows_BTK = torch.cat((pad_BT, doc_ids_BT), dim=1).unfold(1, K, 1)
    return windows_BTK == doc_ids_BT[:, :, None]


class CompressedConvolutionalAttention(nn.Module):
    """CCA with grouped heads (CCGQA, arXiv 2510.04476), as ZAYA1 uses it; attention runs in the latent space.

    1. Down-project x to latent queries (H x Hd), keys and values (G x Hd each): the latent widths are the
       compression (ZAYA1: d_model 2048 -> 8 x 128 queries, 2 x 128 keys and values).
    2. Two value streams: in every value head the first Hd/2 channels come from the current token, the last
       Hd/2 from the previous token (zeros before the first).
    3. Pack q|k (C channels) and run two causal convolutions over time: a depthwise one, then one that also
       mixes the channels inside each head (kernel ``conv_kernel``, ZAYA1: 2).
    4. q-k mean: per key/value group, the mean of its pre-convolution query heads and its key is added to the
       convolved queries and key (a skip path that shares information between q and k).
    5. Per-head L2 normalization of q and k, RoPE on ``rope_fraction`` of each head, queries scaled by a
       learned per-head temperature (init sqrt(Hd): at init the logits have the scale of plain attention).
    6. SDPA (scale 1) over the G latent key/value heads, then up-projection H x Hd -> d_model.

    The decoding cache holds the final keys and values (G x Hd each per token: ZAYA1 caches 512 numbers per
    token and layer where MHA would cache 4,096) plus the last K - 1 inputs of each convolution and the last
    token's shifted value half.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.H, self.G, self.Hd = head_dims(cfg)
        H, G, Hd = self.H, self.G, self.Hd
        C, K = (H + G) * Hd, cfg.attention.conv_kernel
        self.qkv = nn.Linear(cfg.d_model, (H + 2 * G) * Hd, bias=False)
        self.conv_seq = nn.Conv1d(C, C, K, groups=C, bias=False)
        self.conv_mix = nn.Conv1d(C, C, K, groups=H + G, bias=False)
        self.temperature_H = nn.Parameter(torch.empty(H))
        self.out = nn.Linear(H * Hd, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(cfg)

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Projections N(0, std) (output: out_std); both convolutions start as the identity on the current
        token plus N(0, std) noise, so the block starts close to attention on the compressed q/k."""
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        for conv in (self.conv_seq, self.conv_mix):
            nn.init.normal_(conv.weight, std=std)
            per_group = conv.weight.shape[1]  # (C, C / groups, K)
            channel = torch.arange(conv.weight.shape[0], device=conv.weight.device)
            conv.weight[channel, channel % per_group, -1] += 1.0
        nn.init.constant_(self.temperature_H, math.sqrt(self.Hd))

    def forward(
        self,
        x_BTD: torch.Tensor,
        cache: dict | None = None,
        start: int = 0,
        position_ids_BT: torch.Tensor | None = None,
        doc_ids_BT: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x_BTD.shape
        H, G, Hd = self.H, self.G, self.Hd
        q, k, v = self.qkv(x_BTD).split((H * Hd, G * Hd, G * Hd), dim=-1)
        same_BTK = (
            None if doc_ids_BT is None else same_document_taps(doc_ids_BT, self.conv_seq.kernel_size[0])
        )

        # Two value streams: the second half of each head is the previous token's.
        v_BTGHd = v.view(B, T, G, Hd)
        half = Hd // 2
        v_now, v_prev_src = v_BTGHd[..., :half], v_BTGHd[..., half:]
        prev = None if cache is None else cache.get("v_shift")
        if prev is None:
            prev = v_prev_src.new_zeros(B, 1, G, Hd - half)
        v_prev = torch.cat((prev, v_prev_src[:, :-1]), dim=1)
        if doc_ids_BT is not None:  # a document's first token gets zeros, as at the sequence start
            v_prev = v_prev * (same_document_taps(doc_ids_BT, 2)[:, :, 0, None, None]).to(v_prev.dtype)
        if cache is not None:
            cache["v_shift"] = v_prev_src[:, -1:]
        v_BGTHd = torch.cat((v_now, v_prev), dim=-1).transpose(1, 2)

        # Causal convolutions over the packed q|k, then the q-k mean skip path.
        qk_BCT = torch.cat((q, k), dim=-1).transpose(1, 2)
        qk_BCT = _causal_conv(
            self.conv_mix,
            _causal_conv(self.conv_seq, qk_BCT, cache, "conv_seq", same_BTK),
            cache,
            "conv_mix",
            same_BTK,
        )
        q_conv, k_conv = qk_BCT.transpose(1, 2).split((H * Hd, G * Hd), dim=-1)
        mean_BTGHd = 0.5 * (q.view(B, T, G, H // G, Hd).mean(dim=3) + k.view(B, T, G, Hd))
        q_BTHHd = q_conv.view(B, T, H, Hd) + mean_BTGHd.repeat_interleave(H // G, dim=2)
        k_BTGHd = k_conv.view(B, T, G, Hd) + mean_BTGHd

        q_BHTHd = F.normalize(q_BTHHd.transpose(1, 2), dim=-1) * self.temperature_H[:, None, None].to(q.dtype)
        k_BGTHd = F.normalize(k_BTGHd.transpose(1, 2), dim=-1)
        q_BHTHd = self.rope(q_BHTHd, start, position_ids_BT)
        k_BGTHd = self.rope(k_BGTHd, start, position_ids_BT)
        k_BGSHd = _extend(cache, "k", k_BGTHd)
        v_BGSHd = _extend(cache, "v", v_BGTHd)
        o_BHTHd = _attend(q_BHTHd, k_BGSHd, v_BGSHd, start, scale=1.0, doc_ids_BT=doc_ids_BT)
        return self.out(o_BHTHd.transpose(1, 2).reshape(B, T, H * Hd))


def build_attention(cfg: ModelConfig) -> nn.Module:
    validate_attention_config(cfg)
    if cfg.attention.type == "cca":
        return CompressedConvolutionalAttention(cfg)
    return GroupedQueryAttention(cfg)
