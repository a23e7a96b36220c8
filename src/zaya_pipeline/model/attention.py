"""Causal self-attention: grouped-query attention (GQA) and ZAYA1's compressed convolutional attention (CCA).

Both take an optional per-layer decoding cache (a dict owned by ``KVCache``) and the position of their first
token, so that the same code runs a full sequence, a chunked prefill and one-token-at-a-time decoding.

Packed training sequences may also pass ``position_ids_BT`` (RoPE positions that restart at each document)
and ``doc_ids_BT`` (document number of each token): with ``doc_ids_BT`` attention is block-diagonal causal,
and CCA's convolutions and value shift read only tokens of the same document (no cache then).

Shape legend:
    B  batch    T  new tokens    S  cached + new tokens    D  model width    H  query heads
    G  key/value heads    Hd  head width    C  packed q/k channels ((H + G) * Hd)    R  rotated pairs
    V  one value half (G * Hd / 2)    P  tokens before t the two CCA convolutions reach    W  P + 1 taps
    J  taps of the grouped convolution    N  heads (H + G)    i, o  channels of one head
"""

from __future__ import annotations

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
    if a.type == "cca":
        for key in ("conv_kernel_depthwise", "conv_kernel_grouped"):
            if getattr(a, key) < 1:
                raise ConfigError(f"model.attention.{key} must be >= 1, got {getattr(a, key)}")
        if G * Hd % 2:
            raise ConfigError(
                f"cca: n_kv_heads x head_dim = {G * Hd} must be even (two value halves; model.attention)"
            )


class KVCache:
    """Decoding state of a whole model: per layer a dict with the keys and values of every token seen so far
    and, for CCA, the convolution and value-shift inputs of the last tokens; ``length`` = tokens seen."""

    def __init__(self, n_layers: int):
        self.layers: list[dict[str, torch.Tensor]] = [{} for _ in range(n_layers)]
        self.length = 0


def inverse_frequencies(rot_dim: int, theta: float, device=None) -> torch.Tensor:
    """RoPE's (rot_dim / 2,) angular frequencies, computed in fp32 exactly as transformers' ``Zaya`` does."""
    exponents = torch.arange(0, rot_dim, 2, dtype=torch.float32, device=device) / rot_dim
    return 1.0 / (theta**exponents)


def apply_rope(x_BHTHd: torch.Tensor, cos_TR: torch.Tensor, sin_TR: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x[i], x[i + R]) of the first 2R channels by position-dependent angles; the rest of
    the head passes through unchanged (partial RoPE)."""
    rot = 2 * cos_TR.shape[-1]
    x1, x2 = x_BHTHd[..., :rot].float().chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos_TR - x2 * sin_TR, x1 * sin_TR + x2 * cos_TR), dim=-1).to(x_BHTHd.dtype)
    return torch.cat((rotated, x_BHTHd[..., rot:]), dim=-1) if rot < x_BHTHd.shape[-1] else rotated


class RotaryEmbedding(nn.Module):
    """RoPE on the first ``rotary_dim`` channels of each head. The angles are computed from the positions at
    every call (no tables: nothing to size by ``max_seq_len``, nothing to re-create after a meta-device
    build), in fp32 as transformers' ``Zaya`` computes them; a layer computes them once for its q and k."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.rot_dim = rotary_dim(cfg)
        self.theta = cfg.attention.rope_theta

    def tables(
        self, T: int, start: int, position_ids_BT: torch.Tensor | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(cos, sin) of T positions from ``start`` (or of ``position_ids_BT``, broadcast over heads):
        (T, R), or (B, 1, T, R); None when no channel rotates."""
        if self.rot_dim == 0:
            return None
        inv_freq_R = inverse_frequencies(self.rot_dim, self.theta, device)
        if position_ids_BT is not None:
            angles = (position_ids_BT.float()[..., None] * inv_freq_R)[:, None]
        else:
            angles = torch.arange(start, start + T, device=device).float()[:, None] * inv_freq_R
        return angles.cos(), angles.sin()

    def forward(
        self, x_BHTHd: torch.Tensor, start: int, position_ids_BT: torch.Tensor | None = None
    ) -> torch.Tensor:
        return rotate(x_BHTHd, self.tables(x_BHTHd.shape[2], start, position_ids_BT, x_BHTHd.device))


def rotate(x_BHTHd: torch.Tensor, tables: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """``apply_rope`` with ``RotaryEmbedding.tables`` (None: unchanged)."""
    return x_BHTHd if tables is None else apply_rope(x_BHTHd, *tables)


def _extend(cache: dict | None, name: str, new_BGTHd: torch.Tensor) -> torch.Tensor:
    """The cached keys (or values) followed by the new ones along time; the cache keeps the result."""
    if cache is None:
        return new_BGTHd
    old = cache.get(name)
    full = new_BGTHd if old is None else torch.cat((old, new_BGTHd), dim=2)
    cache[name] = full
    return full


def _attend(q_BHTHd, k_BGSHd, v_BGSHd, start: int, doc_ids_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Causal SDPA of T new queries (positions start..start+T-1) over S = start + T keys; G may divide H.
    With ``doc_ids_BT`` (no cache) a query sees only the keys of its own document."""
    T, S = q_BHTHd.shape[2], k_BGSHd.shape[2]
    gqa = q_BHTHd.shape[1] != k_BGSHd.shape[1]
    if doc_ids_BT is not None:
        causal_TT = torch.ones(T, T, dtype=torch.bool, device=q_BHTHd.device).tril()
        mask_BTT = (doc_ids_BT[:, :, None] == doc_ids_BT[:, None, :]) & causal_TT
        return F.scaled_dot_product_attention(
            q_BHTHd, k_BGSHd, v_BGSHd, attn_mask=mask_BTT[:, None], enable_gqa=gqa
        )
    if T == S:  # no cache, or an empty one: plain causal
        return F.scaled_dot_product_attention(q_BHTHd, k_BGSHd, v_BGSHd, is_causal=True, enable_gqa=gqa)
    # SDPA's is_causal aligns the mask top-left; with a cache the new queries sit at the bottom right.
    positions_T = torch.arange(start, start + T, device=q_BHTHd.device)
    mask_TS = torch.arange(S, device=q_BHTHd.device)[None, :] <= positions_T[:, None]
    return F.scaled_dot_product_attention(q_BHTHd, k_BGSHd, v_BGSHd, attn_mask=mask_TS, enable_gqa=gqa)


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
        rope = self.rope.tables(T, start, position_ids_BT, x_BTD.device)
        q_BHTHd = rotate(q.view(B, T, H, Hd).transpose(1, 2), rope)
        k_BGTHd = rotate(k.view(B, T, G, Hd).transpose(1, 2), rope)
        k_BGSHd = _extend(cache, "k", k_BGTHd)
        v_BGSHd = _extend(cache, "v", v.view(B, T, G, Hd).transpose(1, 2))
        o_BHTHd = _attend(q_BHTHd, k_BGSHd, v_BGSHd, start, doc_ids_BT=doc_ids_BT)
        return self.out(o_BHTHd.transpose(1, 2).reshape(B, T, H * Hd))


def same_document_taps(doc_ids_BT: torch.Tensor, W: int) -> torch.Tensor:
    """``same_BTW[b, t, w]``: token t - (W - 1 - w) exists and is in token t's document."""
    pad_BT = torch.full_like(doc_ids_BT[:, : W - 1], -1)
    windows_BTW = torch.cat((pad_BT, doc_ids_BT), dim=1).unfold(1, W, 1)
    return windows_BTW == doc_ids_BT[:, :, None]


class CompressedConvolutionalAttention(nn.Module):
    """CCA with grouped heads (CCGQA, arXiv 2510.04476): the function of transformers' ``Zaya`` attention
    (``ZayaCCAProjection`` + ``ZayaQKNorm`` + SDPA), with the q/k/v projections fused into one matmul.

    1. Down-project x to latent queries (H x Hd), keys (G x Hd) and two value halves (G x Hd / 2 each): the
       latent widths are the compression (ZAYA1: d_model 2048 -> 8 x 128 queries, 2 x 128 keys and values).
    2. Values: the current token's half followed by the previous token's half (zeros before the first),
       the G x Hd concatenation read as G heads; with G = 2 the first value head is all current-token
       channels and the second all previous-token channels.
    3. q-k residuals, from the projections: each query head gets (q_h + k_g) / 2 with g its key/value group,
       each key the mean of those over its group.
    4. Pack q|k (C channels), left-pad it once by P = (K0 - 1) + (K1 - 1) zeros and run two causal
       convolutions with biases over time: a depthwise one (kernel K0), then one that mixes the channels
       inside each head (kernel K1). The residuals of 3 are added to their outputs.
    5. q and k L2-normalized to norm sqrt(Hd) per head, keys multiplied by a learned temperature per
       key/value head; RoPE on ``rope_fraction`` of each head.
    6. SDPA (scale Hd^-1/2) over the G latent key/value heads, then up-projection H x Hd -> d_model.

    The decoding cache holds the final keys and values (G x Hd each per token: ZAYA1 caches 512 numbers per
    token and layer where MHA would cache 4,096), the last P inputs of the convolutions and the last token's
    previous-token value half.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.H, self.G, self.Hd = head_dims(cfg)
        H, G, Hd = self.H, self.G, self.Hd
        C, K0, K1 = (H + G) * Hd, cfg.attention.conv_kernel_depthwise, cfg.attention.conv_kernel_grouped
        self.P = (K0 - 1) + (K1 - 1)  # tokens before t that output t reads, through both convolutions
        self.qkv = nn.Linear(cfg.d_model, (H + 2 * G) * Hd, bias=False)  # q | k | v current | v previous
        self.conv_depthwise = nn.Conv1d(C, C, K0, groups=C)
        self.conv_grouped = nn.Conv1d(C, C, K1, groups=H + G)
        self.temperature_G = nn.Parameter(torch.empty(G))
        self.out = nn.Linear(H * Hd, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(cfg)

    @torch.no_grad()
    def reset_parameters(self, std: float, out_std: float) -> None:
        """Projections N(0, std) (output: out_std); both convolutions start as the identity on the current
        token plus N(0, std) noise, with zero biases, so the block starts close to attention on the
        compressed q/k; temperatures 1 (**ours**: the logits then have the scale of plain attention;
        transformers' ``Zaya`` initialises them to 0, uniform attention)."""
        nn.init.normal_(self.qkv.weight, std=std)
        nn.init.normal_(self.out.weight, std=out_std)
        for conv in (self.conv_depthwise, self.conv_grouped):
            nn.init.normal_(conv.weight, std=std)
            per_group = conv.weight.shape[1]  # (C, C / groups, K)
            channel = torch.arange(conv.weight.shape[0], device=conv.weight.device)
            conv.weight[channel, channel % per_group, -1] += 1.0
            nn.init.zeros_(conv.bias)
        nn.init.ones_(self.temperature_G)

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
        q, k, v_now, v_prev_src = self.qkv(x_BTD).split((H * Hd, G * Hd, G * Hd // 2, G * Hd // 2), dim=-1)

        q_res_BTHHd = 0.5 * (q.view(B, T, H, Hd) + k.view(B, T, G, Hd).repeat_interleave(H // G, dim=2))
        k_res_BTGHd = q_res_BTHHd.view(B, T, G, H // G, Hd).mean(dim=3)
        qk_BCT = self._convolve(torch.cat((q, k), dim=-1).transpose(1, 2), cache, doc_ids_BT)
        q_conv, k_conv = qk_BCT.transpose(1, 2).split((H * Hd, G * Hd), dim=-1)
        q_BTHHd = q_conv.view(B, T, H, Hd) + q_res_BTHHd
        k_BTGHd = k_conv.view(B, T, G, Hd) + k_res_BTGHd
        v_BGTHd = self._values(v_now, v_prev_src, cache, doc_ids_BT).transpose(1, 2)

        q_BTHHd = _to_norm(q_BTHHd, Hd**0.5)
        k_BTGHd = _to_norm(k_BTGHd, Hd**0.5) * self.temperature_G[:, None].to(k_BTGHd.dtype)
        rope = self.rope.tables(T, start, position_ids_BT, x_BTD.device)
        q_BHTHd = rotate(q_BTHHd.transpose(1, 2), rope)
        k_BGTHd = rotate(k_BTGHd.transpose(1, 2), rope)
        k_BGSHd = _extend(cache, "k", k_BGTHd)
        v_BGSHd = _extend(cache, "v", v_BGTHd)
        o_BHTHd = _attend(q_BHTHd, k_BGSHd, v_BGSHd, start, doc_ids_BT=doc_ids_BT)
        return self.out(o_BHTHd.transpose(1, 2).reshape(B, T, H * Hd))

    def _convolve(self, x_BCT: torch.Tensor, cache: dict | None, doc_ids_BT: torch.Tensor | None):
        """Both convolutions over x left-padded by P cached inputs (zeros at the sequence start), so that the
        depthwise one also runs on the P padding positions (its bias reaches the first outputs).

        ``doc_ids_BT`` (no cache): output t reads input t - j only if that token is in t's document (as if
        the document stood alone: zeros before its start), written out over the P + 1 taps."""
        B, C, T = x_BCT.shape
        prev_BCP = None if cache is None else cache.get("conv")
        if prev_BCP is None:
            prev_BCP = x_BCT.new_zeros(B, C, self.P)
        x_in = torch.cat((prev_BCP, x_BCT), dim=2)
        if cache is not None:
            cache["conv"] = x_in[:, :, x_in.shape[2] - self.P :]
        dw, gr = self.conv_depthwise, self.conv_grouped
        if doc_ids_BT is None:
            return gr(dw(x_in))
        K0, K1, N = dw.kernel_size[0], gr.kernel_size[0], gr.groups
        same_BTW = same_document_taps(doc_ids_BT, self.P + 1)
        win_BCTW = x_in.unfold(2, self.P + 1, 1) * same_BTW[:, None].to(x_in.dtype)
        # the depthwise convolution at the K1 positions t - K1 + 1 .. t, each from its K0 taps of the window
        dw_BCTJ = torch.einsum("bctji,ci->bctj", win_BCTW.unfold(3, K0, 1), dw.weight.view(C, K0))
        dw_BNiTJ = (dw_BCTJ + dw.bias[:, None, None]).view(B, N, C // N, T, K1)
        w_NoiJ = gr.weight.view(N, C // N, C // N, K1)
        out_BCT = torch.einsum("bnitj,noij->bnot", dw_BNiTJ, w_NoiJ).reshape(B, C, T)
        return out_BCT + gr.bias[:, None]

    def _values(self, v_now_BTV, v_prev_src_BTV, cache: dict | None, doc_ids_BT: torch.Tensor | None):
        """(B, T, G, Hd) values: the current token's half, then the previous token's (zeros before the first
        token, and at a document's first token with ``doc_ids_BT``)."""
        B, T, _ = v_now_BTV.shape
        prev = None if cache is None else cache.get("v_prev")
        if prev is None:
            prev = v_prev_src_BTV.new_zeros(B, 1, v_prev_src_BTV.shape[-1])
        v_prev_BTV = torch.cat((prev, v_prev_src_BTV[:, :-1]), dim=1)
        if doc_ids_BT is not None:
            v_prev_BTV = v_prev_BTV * same_document_taps(doc_ids_BT, 2)[:, :, :1].to(v_prev_BTV.dtype)
        if cache is not None:
            cache["v_prev"] = v_prev_src_BTV[:, -1:]
        return torch.cat((v_now_BTV, v_prev_BTV), dim=-1).view(B, T, self.G, self.Hd)


def _to_norm(x: torch.Tensor, norm: float) -> torch.Tensor:
    """x rescaled to L2 norm ``norm`` along the last dim (transformers' ``ZayaQKNorm``: the divisor is
    clamped at the dtype's machine epsilon)."""
    return x * (norm / x.norm(p=2, dim=-1, keepdim=True).clamp_min(torch.finfo(x.dtype).eps))


def build_attention(cfg: ModelConfig) -> nn.Module:
    validate_attention_config(cfg)
    if cfg.attention.type == "cca":
        return CompressedConvolutionalAttention(cfg)
    return GroupedQueryAttention(cfg)
