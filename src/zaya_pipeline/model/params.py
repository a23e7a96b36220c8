"""Closed-form parameter counts and FLOPs per token of ``ZayaLM`` (tests check both against the module:
the parameter counts against its tensors, the FLOPs against ``torch.utils.flop_counter``).

``include_embedding=False`` leaves out the token embedding and, when untied, the output projection.
"Active" parameters are those one token uses: top_k of the num_experts experts, everything else in full.
"""

from __future__ import annotations

import dataclasses
import json

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.utils import round_up


def per_layer_vectors(cfg: ModelConfig) -> int:
    """Per-channel parameters of a layer outside its router: 2 RMSNorms (+ 2 x 4 residual-scaling vectors)."""
    return cfg.d_model * (2 + (8 if cfg.residual_scaling else 0))


def router_params(cfg: ModelConfig) -> tuple[int, int]:
    """(all router parameters, those in matmuls) of one layer."""
    D, E, r = cfg.d_model, cfg.moe.num_experts, cfg.moe.router
    if r.type != "zaya1":
        return D * E, D * E
    matmul = D * r.dim + 2 * r.dim * r.dim + r.dim * E  # down-projection, MLP (R x R, R x R, R x E)
    return matmul + r.dim * (1 + int(r.eda)), matmul  # + router RMSNorm weight, EDA scale


def _count(cfg: ModelConfig, experts_used: int, include_embedding: bool) -> int:
    D, F = cfg.d_model, cfg.moe.expert_hidden
    attention = 4 * D * D  # fused qkv (3 D x D) + output projection (D x D)
    norms = per_layer_vectors(cfg)
    router = router_params(cfg)[0]
    experts = experts_used * 3 * D * F  # gate + up (D x 2F) and down (F x D) per expert
    total = cfg.n_layers * (attention + norms + router + experts) + D  # + final norm
    if include_embedding:
        total += cfg.vocab_size * D * (1 if cfg.tie_embeddings else 2)
    return total


def num_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.num_experts, include_embedding)


def num_active_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.top_k, include_embedding)


def matmul_params_per_token(cfg: ModelConfig) -> int:
    """Weights a token multiplies by: active non-embedding weights less norms and scales, plus unembedding."""
    router_total, router_matmul = router_params(cfg)
    not_matmul = cfg.n_layers * (per_layer_vectors(cfg) + router_total - router_matmul) + cfg.d_model
    return num_active_params(cfg, include_embedding=False) - not_matmul + cfg.vocab_size * cfg.d_model


def forward_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Forward FLOPs per token at context ``seq_len`` (default ``max_seq_len``), closed form.

    ``2 x`` the matmul weights a token uses (active experts only) plus the attention core, counted as dense
    ``Q K^T`` and ``A V`` over the whole context (``4 T D`` per layer, no causal discount): the convention of
    the PaLM MFU formula, so that training FLOPs are ``3 x`` this.
    """
    T = cfg.max_seq_len if seq_len is None else seq_len
    return 2 * matmul_params_per_token(cfg) + 4 * cfg.n_layers * T * cfg.d_model


def model_info(cfg) -> dict:
    """``zaya model-info model=<preset>``: sizes and FLOPs of the model config as JSON (no weights built)."""
    m = cfg.model
    if m.vocab_size <= 0:  # 0 = the tokenizer's: its target size padded as the tokenizer stage pads it
        vocab = round_up(cfg.tokenizer.vocab_size, cfg.tokenizer.pad_to_multiple)
        m = dataclasses.replace(m, vocab_size=vocab)
    fwd = forward_flops_per_token(m)
    info = {
        "name": m.name,
        "vocab_size": m.vocab_size,
        "params_total": num_params(m),
        "params_active": num_active_params(m),
        "params_total_non_embedding": num_params(m, include_embedding=False),
        "params_active_non_embedding": num_active_params(m, include_embedding=False),
        "seq_len": m.max_seq_len,
        "forward_flops_per_token": fwd,
        "train_flops_per_token": 3 * fwd,
    }
    print(json.dumps(info, indent=2))
    return {}
