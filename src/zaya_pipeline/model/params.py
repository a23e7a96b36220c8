"""Closed-form parameter counts of ``ZayaLM`` (a test checks them against the instantiated module).

``include_embedding=False`` leaves out the token embedding and, when untied, the output projection.
"Active" parameters are those one token uses: top_k of the num_experts experts, everything else in full.
"""

from __future__ import annotations

from zaya_pipeline.config import ModelConfig


def _count(cfg: ModelConfig, experts_used: int, include_embedding: bool) -> int:
    D, F, E = cfg.d_model, cfg.moe.expert_hidden, cfg.moe.num_experts
    attention = 4 * D * D  # fused qkv (3 D x D) + output projection (D x D)
    norms = 2 * D  # pre-attention and pre-MoE RMSNorm weights
    router = D * E
    experts = experts_used * 3 * D * F  # gate + up (D x 2F) and down (F x D) per expert
    total = cfg.n_layers * (attention + norms + router + experts) + D  # + final norm
    if include_embedding:
        total += cfg.vocab_size * D * (1 if cfg.tie_embeddings else 2)
    return total


def num_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.num_experts, include_embedding)


def num_active_params(cfg: ModelConfig, include_embedding: bool = True) -> int:
    return _count(cfg, cfg.moe.top_k, include_embedding)
