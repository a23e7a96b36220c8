"""Dropless MoE feed-forward layer: a router picks K experts per token; SwiGLU experts run via ``ops``.

Shape legend:
    B  batch    T  tokens (T = B * sequence length inside the layer)    D  model width
    E  experts  F  expert hidden width    K  experts per token
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zaya_pipeline.config import MoEConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.router import build_router
from zaya_pipeline.ops import expert_mlp, resolve_backend


@dataclass
class MoEOutput:
    y_BTD: torch.Tensor
    aux_loss: torch.Tensor  # router aux + z losses, already weighted by their coefficients
    num_tokens_per_expert_E: torch.Tensor
    router_state_TR: torch.Tensor | None = None  # passed to the next layer's router (EDA)


class MoE(nn.Module):
    def __init__(self, d_model: int, cfg: MoEConfig):
        super().__init__()
        if not 1 <= cfg.top_k <= cfg.num_experts:
            raise ConfigError(f"model.moe.top_k must be in [1, model.moe.num_experts], got {cfg.top_k}")
        resolve_backend(cfg.expert_backend)  # fail at build time, not at the first forward
        self.backend = cfg.expert_backend
        self.aux_loss_coef = cfg.router.aux_loss_coef
        self.z_loss_coef = cfg.router.z_loss_coef
        self.router = build_router(d_model, cfg)
        E, D, F = cfg.num_experts, d_model, cfg.expert_hidden
        # One tensor per projection kind with a leading expert dim: the layout grouped kernels and expert
        # parallelism (sharding dim 0) want.
        self.w_gate_up_EDF2 = nn.Parameter(torch.empty(E, D, 2 * F))
        self.w_down_EFD = nn.Parameter(torch.empty(E, F, D))

    def forward(self, x_BTD: torch.Tensor, router_state_TR: torch.Tensor | None = None) -> MoEOutput:
        x_TD = x_BTD.reshape(-1, x_BTD.shape[-1])
        routed = self.router(x_TD, router_state_TR)
        y_TD = expert_mlp(
            x_TD,
            routed.topk_ids_TK,
            routed.topk_weights_TK,
            self.w_gate_up_EDF2,
            self.w_down_EFD,
            backend=self.backend,
        )
        aux = self.aux_loss_coef * routed.aux_loss + self.z_loss_coef * routed.z_loss
        return MoEOutput(y_TD.view_as(x_BTD), aux, routed.num_tokens_per_expert_E, routed.state_TR)
