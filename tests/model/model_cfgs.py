from __future__ import annotations

import dataclasses

from zaya_pipeline.config import ModelConfig, MoEConfig


def small_config(**overrides) -> ModelConfig:
    """A model small enough that a forward pass takes milliseconds."""
    moe = overrides.pop("moe", MoEConfig(num_experts=4, top_k=2, expert_hidden=16))
    base = ModelConfig(name="test", vocab_size=50, d_model=16, n_layers=2, n_heads=2, max_seq_len=32, moe=moe)
    return dataclasses.replace(base, **overrides)
