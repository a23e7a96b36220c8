"""ZayaLM: a decoder-only MoE language model (pre-norm blocks: attention, then a routed MoE feed-forward).

Single-device code: parallelism (FSDP, expert parallel, compile) is applied from outside.

Shape legend:
    B  batch    T  sequence length    D  model width    V  vocabulary    L  layers
    E  router choices (the experts, plus the skip expert when there is one)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.attention import KVCache, build_attention, validate_attention_config
from zaya_pipeline.model.moe import MoE, MoEOutput


@dataclass
class LMOutput:
    logits: torch.Tensor  # (B, T, V)
    aux_loss: torch.Tensor  # scalar: sum over layers of the weighted router aux + z losses
    expert_counts_LE: torch.Tensor  # routed (token, slot) pairs per choice and layer (skip last), detached
    dropped_slots: torch.Tensor  # (token, slot) pairs over expert capacity, summed over layers (0: dropless)
    z_loss: torch.Tensor  # scalar, detached: the weighted router z-loss part of aux_loss (telemetry)


def validate_model_config(cfg: ModelConfig) -> None:
    if cfg.vocab_size <= 0:
        raise ConfigError(f"model.vocab_size must be > 0 to build the model, got {cfg.vocab_size}")
    if cfg.n_layers < 1:
        raise ConfigError(f"model.n_layers must be >= 1, got {cfg.n_layers}")
    validate_attention_config(cfg)
    if cfg.max_seq_len < 1:
        raise ConfigError(f"model.max_seq_len must be >= 1, got {cfg.max_seq_len}")


class ResidualAdd(nn.Module):
    """``x + f`` (plain), or with residual scaling ``(f + b_o) * a_o + (x + b_r) * a_r``: learnable
    per-channel scales (init 1) and biases (init 0) on the sub-block's output and on the residual stream, in
    the form of transformers' ``ZayaResidualScaling`` (biases added before the scales)."""

    def __init__(self, d_model: int, scaled: bool):
        super().__init__()
        self.scaled = scaled
        if scaled:
            self.res_scale_D = nn.Parameter(torch.ones(d_model))
            self.res_bias_D = nn.Parameter(torch.zeros(d_model))
            self.out_scale_D = nn.Parameter(torch.ones(d_model))
            self.out_bias_D = nn.Parameter(torch.zeros(d_model))

    def reset_parameters(self, out_scale: float = 1.0) -> None:
        """Scales 1 (the output's ``out_scale``), biases 0."""
        if self.scaled:
            nn.init.ones_(self.res_scale_D)
            nn.init.constant_(self.out_scale_D, out_scale)
            nn.init.zeros_(self.res_bias_D)
            nn.init.zeros_(self.out_bias_D)

    def forward(self, x_BTD: torch.Tensor, f_BTD: torch.Tensor) -> torch.Tensor:
        if not self.scaled:
            return x_BTD + f_BTD
        return (f_BTD + self.out_bias_D) * self.out_scale_D + (x_BTD + self.res_bias_D) * self.res_scale_D


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = build_attention(cfg)
        self.attn_add = ResidualAdd(cfg.d_model, cfg.residual_scaling)
        self.moe_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.moe = MoE(cfg.d_model, cfg.moe, cfg.norm_eps, layer_idx)
        self.moe_add = ResidualAdd(cfg.d_model, cfg.residual_scaling)

    def forward(
        self,
        x_BTD: torch.Tensor,
        router_state_TR: torch.Tensor | None = None,
        cache: dict | None = None,
        start: int = 0,
        position_ids_BT: torch.Tensor | None = None,
        doc_ids_BT: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, MoEOutput]:
        attn = self.attn(self.attn_norm(x_BTD), cache, start, position_ids_BT, doc_ids_BT)
        x_BTD = self.attn_add(x_BTD, attn)
        moe = self.moe(self.moe_norm(x_BTD), router_state_TR)
        return self.moe_add(x_BTD, moe.y_BTD), moe


def compile_blocks(model: ZayaLM, fullgraph: bool = True) -> None:
    """``torch.compile`` each block in place (state-dict keys unchanged). ``fullgraph``: a graph break is an
    error, not a silent split (every block variant compiles as one graph: tests/model/test_compile.py);
    expert parallelism's all-to-all needs host-side split sizes, so it compiles with ``fullgraph=False``."""
    for block in model.blocks:
        block.compile(fullgraph=fullgraph)


class ZayaLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        validate_model_config(cfg)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        if cfg.residual_scaling:  # (embedding + bias) * scale, per channel, before the first block
            self.input_scale_D = nn.Parameter(torch.ones(cfg.d_model))
            self.input_bias_D = nn.Parameter(torch.zeros(cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.final_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """N(0, init_std) everywhere; projections that write into the residual stream get
        init_std / sqrt(2 n_layers) so the residual's variance does not grow with depth (GPT-2). With residual
        scaling, each MoE output's scale starts at ``model.moe_out_scale_init`` (a top-1 gate is one
        softmax probability, about 1 / the number of choices at init, so its output starts that much
        smaller than a top-k renormalized gate's)."""
        std = self.cfg.init_std
        out_std = std / math.sqrt(2 * self.cfg.n_layers)
        nn.init.normal_(self.embed.weight, std=std)
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=std)
        for block in self.blocks:
            block.attn.reset_parameters(std, out_std)
            block.moe.reset_parameters(std, out_std)
            block.attn_add.reset_parameters()
            block.moe_add.reset_parameters(self.cfg.moe_out_scale_init)
        if self.cfg.residual_scaling:
            nn.init.ones_(self.input_scale_D)
            nn.init.zeros_(self.input_bias_D)
        for module in self.modules():
            if isinstance(module, nn.RMSNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def update_router_biases(self, reduce_sum=None, apply: torch.Tensor | None = None) -> None:
        """Once per optimizer step: the balancing-bias controller of every router that has one.
        ``reduce_sum`` (set by the trainer under data parallelism) sums the expert loads over ranks;
        ``apply`` (a device bool) false skips the step on the device (``Zaya1Router.update_bias``)."""
        for block in self.blocks:
            if hasattr(block.moe.router, "update_bias"):
                block.moe.router.update_bias(reduce_sum, apply)

    def new_cache(self) -> KVCache:
        """An empty decoding cache for ``forward(ids, cache=...)``."""
        return KVCache(len(self.blocks))

    def forward(
        self,
        input_ids_BT: torch.Tensor,
        cache: KVCache | None = None,
        position_ids_BT: torch.Tensor | None = None,
        doc_ids_BT: torch.Tensor | None = None,
    ) -> LMOutput:
        """Logits of every position. With ``cache`` the tokens continue the cached sequence (positions
        start at ``cache.length``) and the cache is extended: prefill and incremental decoding.

        Packed documents (training, no cache): ``position_ids_BT`` replaces the positions 0..T-1 given to
        RoPE (restart at each document); ``doc_ids_BT`` keeps every token inside its own document (attention
        mask, and CCA's convolutions). Both come from ``zaya_pipeline.data.loader.boundary_fields``."""
        start = 0 if cache is None else cache.length
        seq_len = start + input_ids_BT.shape[1]
        if seq_len > self.cfg.max_seq_len:
            raise ConfigError(
                f"input of {seq_len} tokens is longer than model.max_seq_len={self.cfg.max_seq_len}"
            )
        if cache is not None and (position_ids_BT is not None or doc_ids_BT is not None):
            raise ValueError("position_ids_BT / doc_ids_BT are for packed training sequences, not a cache")
        x_BTD = self.embed(input_ids_BT)
        if self.cfg.residual_scaling:
            x_BTD = (x_BTD + self.input_bias_D) * self.input_scale_D
        aux_losses, z_losses, counts, dropped, router_state_TR = [], [], [], [], None
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            x_BTD, moe = block(x_BTD, router_state_TR, layer_cache, start, position_ids_BT, doc_ids_BT)
            aux_losses.append(moe.aux_loss)
            z_losses.append(moe.z_loss)
            counts.append(moe.num_tokens_per_expert_E)
            dropped.append(moe.dropped_slots)
            router_state_TR = moe.router_state_TR
        if cache is not None:
            cache.length = seq_len
        h_BTD = self.final_norm(x_BTD)
        weight_VD = self.embed.weight if self.lm_head is None else self.lm_head.weight
        logits_BTV = h_BTD @ weight_VD.t()
        return LMOutput(
            logits_BTV,
            torch.stack(aux_losses).sum(),
            torch.stack(counts).detach(),
            torch.stack(dropped).sum(),
            torch.stack(z_losses).sum(),
        )
