"""ZayaLM: a decoder-only MoE language model (pre-norm blocks: attention, then a routed MoE feed-forward).

Single-device code: parallelism (FSDP, expert parallel, compile) is applied from outside.

Shape legend:
    B  batch    T  sequence length    D  model width    V  vocabulary    L  layers    E  experts
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.attention import CausalSelfAttention
from zaya_pipeline.model.moe import MoE, MoEOutput


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    aux_loss: torch.Tensor  # scalar: sum over layers of the weighted router aux + z losses
    expert_counts_LE: torch.Tensor  # routed (token, slot) pairs per expert and layer, detached


def validate_model_config(cfg: ModelConfig) -> None:
    if cfg.vocab_size <= 0:
        raise ConfigError(f"model.vocab_size must be > 0 to build the model, got {cfg.vocab_size}")
    if cfg.n_layers < 1:
        raise ConfigError(f"model.n_layers must be >= 1, got {cfg.n_layers}")
    if cfg.n_heads < 1 or cfg.d_model % cfg.n_heads or (cfg.d_model // cfg.n_heads) % 2:
        raise ConfigError(
            f"model.n_heads={cfg.n_heads} must split model.d_model={cfg.d_model} into even-width heads (RoPE)"
        )
    if cfg.max_seq_len < 1:
        raise ConfigError(f"model.max_seq_len must be >= 1, got {cfg.max_seq_len}")


class ResidualAdd(nn.Module):
    """``x + f`` (plain), or with residual scaling ``(a_r * x + b_r) + (a_o * f + b_o)``: learnable
    per-channel scales (init 1) and biases (init 0) on the residual stream and on the sub-block's output."""

    def __init__(self, d_model: int, scaled: bool):
        super().__init__()
        self.scaled = scaled
        if scaled:
            self.res_scale_D = nn.Parameter(torch.ones(d_model))
            self.res_bias_D = nn.Parameter(torch.zeros(d_model))
            self.out_scale_D = nn.Parameter(torch.ones(d_model))
            self.out_bias_D = nn.Parameter(torch.zeros(d_model))

    def reset_parameters(self) -> None:
        if self.scaled:
            for scale, bias in ((self.res_scale_D, self.res_bias_D), (self.out_scale_D, self.out_bias_D)):
                nn.init.ones_(scale)
                nn.init.zeros_(bias)

    def forward(self, x_BTD: torch.Tensor, f_BTD: torch.Tensor) -> torch.Tensor:
        if not self.scaled:
            return x_BTD + f_BTD
        return (self.res_scale_D * x_BTD + self.res_bias_D) + (self.out_scale_D * f_BTD + self.out_bias_D)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg.d_model, cfg.n_heads, cfg.max_seq_len, cfg.rope_theta)
        self.attn_add = ResidualAdd(cfg.d_model, cfg.residual_scaling)
        self.moe_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.moe = MoE(cfg.d_model, cfg.moe)
        self.moe_add = ResidualAdd(cfg.d_model, cfg.residual_scaling)

    def forward(
        self, x_BTD: torch.Tensor, router_state_TR: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, MoEOutput]:
        x_BTD = self.attn_add(x_BTD, self.attn(self.attn_norm(x_BTD)))
        moe = self.moe(self.moe_norm(x_BTD), router_state_TR)
        return self.moe_add(x_BTD, moe.y_BTD), moe


class ZayaLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        validate_model_config(cfg)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.final_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) everywhere; projections that write into the residual stream get
        init_std / sqrt(2 n_layers) so the residual's variance does not grow with depth (GPT-2)."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.embed.weight, std=std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=std)
        for block in self.blocks:
            nn.init.normal_(block.attn.qkv.weight, std=std)
            nn.init.normal_(block.attn.out.weight, std=out_std)
            block.moe.router.reset_parameters(std)
            block.attn_add.reset_parameters()
            block.moe_add.reset_parameters()
            nn.init.normal_(block.moe.w_gate_up_EDF2, std=std)
            nn.init.normal_(block.moe.w_down_EFD, std=out_std)
        for module in self.modules():
            if isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def update_router_biases(self) -> None:
        """Once per optimizer step: the balancing-bias controller of every router that has one."""
        for block in self.blocks:
            if hasattr(block.moe.router, "update_bias"):
                block.moe.router.update_bias()

    def forward(self, input_ids_BT: torch.Tensor) -> LMOutput:
        seq_len = input_ids_BT.shape[1]
        if seq_len > self.cfg.max_seq_len:
            raise ConfigError(
                f"input of {seq_len} tokens is longer than model.max_seq_len={self.cfg.max_seq_len}"
            )
        x_BTD = self.embed(input_ids_BT)
        aux_losses, counts, router_state_TR = [], [], None
        for block in self.blocks:
            x_BTD, moe = block(x_BTD, router_state_TR)
            aux_losses.append(moe.aux_loss)
            counts.append(moe.num_tokens_per_expert_E)
            router_state_TR = moe.router_state_TR
        h_BTD = self.final_norm(x_BTD)
        weight_VD = self.embed.weight if self.lm_head is None else self.lm_head.weight
        logits_BTV = h_BTD @ weight_VD.t()
        return LMOutput(logits_BTV, torch.stack(aux_losses).sum(), torch.stack(counts).detach())
