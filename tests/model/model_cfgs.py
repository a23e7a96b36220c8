from __future__ import annotations

import dataclasses

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig


def small_config(**overrides) -> ModelConfig:
    """A model small enough that a forward pass takes milliseconds."""
    moe = overrides.pop("moe", MoEConfig(num_experts=4, top_k=2, expert_hidden=16))
    attention = overrides.pop("attention", AttentionConfig(n_heads=2))
    base = ModelConfig(
        name="test",
        vocab_size=50,
        d_model=16,
        n_layers=2,
        max_seq_len=32,
        residual_scaling=False,  # the schema's default is the tiny ZAYA1's (True)
        attention=attention,
        moe=moe,
    )
    return dataclasses.replace(base, **overrides)


def cca_config(**overrides) -> ModelConfig:
    """``small_config`` with ZAYA1's CCGQA attention: 4 query heads in 2 groups, partial RoPE."""
    attention = AttentionConfig("cca", n_heads=4, n_kv_heads=2, head_dim=8, rope_fraction=0.5)
    return small_config(**{"attention": attention, **overrides})
