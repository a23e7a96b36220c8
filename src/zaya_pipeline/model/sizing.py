"""Closed-form parameter counts and FLOPs per token of ``ZayaLM`` (tests check both against the module:
the parameter counts against its tensors, the FLOPs against ``torch.utils.flop_counter``).

``include_embedding=False`` leaves out the token embedding and, when untied, the output projection.
"Active" parameters are those one token uses: top_k of the num_experts experts, everything else in full.
"""

from __future__ import annotations

import dataclasses
import json

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.model.attention import head_dims
from zaya_pipeline.utils import round_up


def per_layer_vectors(cfg: ModelConfig) -> int:
    """Per-channel parameters of a layer outside its router: 2 RMSNorms (+ 2 x 4 residual-scaling vectors)."""
    return cfg.d_model * (2 + (8 if cfg.residual_scaling else 0))


def attention_params(cfg: ModelConfig) -> tuple[int, int]:
    """(all attention parameters, those in matmuls and convolutions) of one layer."""
    D = cfg.d_model
    H, G, Hd = head_dims(cfg)
    matmul = (H + 2 * G) * Hd * D + H * Hd * D  # fused q/k/v (down-)projection + output projection
    if cfg.attention.type != "cca":
        return matmul, matmul
    a = cfg.attention
    C = (H + G) * Hd
    matmul += C * a.conv_kernel_depthwise + C * Hd * a.conv_kernel_grouped  # one MAC per weight
    return matmul + 2 * C + G, matmul  # + the two convolutions' biases, a temperature per kv head


def router_params(cfg: ModelConfig) -> tuple[int, int]:
    """(all router parameters, those in matmuls) of one layer, EDA scales aside (``eda_params``)."""
    D, E, r = cfg.d_model, cfg.moe.num_experts + int(cfg.moe.skip_expert), cfg.moe.router
    if r.type != "zaya1":
        return D * E, D * E
    matmul = D * r.dim + 2 * r.dim * r.dim + r.dim * E  # down-projection, MLP (R x R, R x R, R x E)
    return matmul + 4 * r.dim, matmul  # + biases of the down-projection and the first two MLP layers, norm


def model_vectors(cfg: ModelConfig) -> int:
    """Per-channel parameters outside the layers' own: the final norm, the input scaling and the EDA
    scales (ZAYA1 router: every layer but the first)."""
    r = cfg.moe.router
    eda = r.dim * (cfg.n_layers - 1) if r.type == "zaya1" and r.eda else 0
    return cfg.d_model * (1 + (2 if cfg.residual_scaling else 0)) + eda


def _count(cfg: ModelConfig, experts_used: int, include_embedding: bool) -> int:
    D, F = cfg.d_model, cfg.moe.expert_hidden
    attention = attention_params(cfg)[0]
    norms = per_layer_vectors(cfg)
    router = router_params(cfg)[0]
    # gate + up (D x 2F) and down (F x D) per expert used, and the shared expert every token uses
    experts = (experts_used * F + cfg.moe.shared_expert_hidden) * 3 * D
    total = cfg.n_layers * (attention + norms + router + experts) + model_vectors(cfg)
    if include_embedding:
        total += cfg.vocab_size * D * (1 if cfg.tie_embeddings else 2)
    return total


def num_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.num_experts, include_embedding)


def num_active_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.top_k, include_embedding)


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Weights a token multiplies by: active non-embedding weights less norms, scales and biases, plus
    unembedding."""
    router_total, router_matmul = router_params(cfg)
    attention_total, attention_matmul = attention_params(cfg)
    per_layer = per_layer_vectors(cfg) + router_total - router_matmul + attention_total - attention_matmul
    not_matmul = cfg.n_layers * per_layer + model_vectors(cfg)
    return num_active_params(cfg, include_embedding=False) - not_matmul + cfg.vocab_size * cfg.d_model


def forward_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs per token at context ``seq_len`` (default ``max_seq_len``), closed form.

    ``2 x`` the matmul weights a token uses (active experts only) plus the attention core, counted as dense
    ``Q K^T`` and ``A V`` over the whole context (``4 T H Hd`` per layer, no causal discount; CCA attends in
    its compressed latent width H x Hd): the convention of the PaLM MFU formula, so that training FLOPs are
    ``3 x`` this. Skipped and capacity-dropped tokens are not discounted.
    """
    T = cfg.max_seq_len if seq_len is None else seq_len
    H, _, Hd = head_dims(cfg)
    return 2 * matmul_params_per_token(cfg) + 4 * cfg.n_layers * T * H * Hd


def kv_cache_values_per_token(cfg: ModelConfig) -> int:
    """Numbers the decoding cache keeps per token over all layers: keys and values of the G kv heads."""
    _, G, Hd = head_dims(cfg)
    return cfg.n_layers * 2 * G * Hd


def with_resolved_vocab(cfg) -> ModelConfig:
    """``cfg.model`` with ``vocab_size: 0`` (= the tokenizer's) replaced by the tokenizer's target size padded
    as the tokenizer stage pads it, so sizes can be computed before any tokenizer exists."""
    m = cfg.model
    if m.vocab_size > 0:
        return m
    return dataclasses.replace(
        m, vocab_size=round_up(cfg.tokenizer.vocab_size, cfg.tokenizer.pad_to_multiple)
    )


def model_info(cfg) -> dict:
    """``zaya model-info model=<preset>``: sizes and FLOPs of the model config as JSON (no weights built)."""
    m = with_resolved_vocab(cfg)
    fwd = forward_flops_per_token(m)
    info = {
        "name": m.name,
        "vocab_size": m.vocab_size,
        "params_total": num_params(m),
        "params_active": num_active_params(m),
        "params_total_non_embedding": num_params(m, include_embedding=False),
        "params_active_non_embedding": num_active_params(m, include_embedding=False),
        "seq_len": m.max_seq_len,
        "kv_cache_values_per_token": kv_cache_values_per_token(m),
        "forward_flops_per_token": fwd,
        "train_flops_per_token": 3 * fwd,
    }
    print(json.dumps(info, indent=2))
    return {}
