"""MoE feed-forward layer: a router picks K of the experts per token; SwiGLU experts run via ``ops``.

Dropless by default. Options: a skip ("no-op") expert the router may choose (the token then gets no expert
output for that slot, and skipped slots are not computed at all), a capacity factor (over-capacity slots
are dropped, in training only: evaluation and decoding stay dropless) and a dense shared expert.

No data-dependent shape and no host sync anywhere in the layer (it compiles as one graph): skipped and
dropped slots keep their place with expert id E, which every expert backend sorts past the experts' rows
and leaves out, and expert counts are scatter-add histograms that stay on the device.

Shape legend:
    B  batch    T  tokens (T = B * sequence length inside the layer)    D  model width
    E  experts  F  expert hidden width    K  experts per token
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zaya_pipeline.config import MoEConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.router import build_router
from zaya_pipeline.ops import check_backend, expert_mlp


@dataclass
class MoEOutput:
    y_BTD: torch.Tensor
    aux_loss: torch.Tensor  # router aux + z losses, already weighted by their coefficients
    num_tokens_per_expert_E: torch.Tensor  # per router choice: the experts, then the skip expert if any
    dropped_slots: torch.Tensor  # (token, slot) pairs over capacity (0 when dropless)
    router_state_TR: torch.Tensor | None = None  # passed to the next layer's router (EDA)
    z_loss: torch.Tensor | None = None  # the weighted z-loss part of aux_loss, detached (telemetry)


def within_capacity(topk_ids_TK: torch.Tensor, num_experts: int, capacity_factor: float) -> torch.Tensor:
    """(T, K) bool: slots that fit their expert's capacity ``ceil(cf * T * K / E)``. Slots are admitted in
    priority order: every token's first choice before any second choice, then token order (GShard).
    Ids >= num_experts (the skip expert) are never over capacity."""
    T, K = topk_ids_TK.shape
    capacity = math.ceil(capacity_factor * T * K / num_experts)
    flat_S = topk_ids_TK.t().reshape(-1)
    # a comparison, not F.one_hot: one_hot checks the ids' range on the host (a sync per call)
    onehot_SE = (flat_S[:, None] == torch.arange(num_experts, device=flat_S.device)).long()
    position_S = (onehot_SE.cumsum(dim=0) * onehot_SE).sum(dim=1)  # 1-based place in its expert's queue
    return (position_S <= capacity).view(K, T).t()


class SharedExpert(nn.Module):
    """A dense SwiGLU MLP every token goes through, added to the routed experts' output."""

    def __init__(self, d_model: int, hidden: int):
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)

    def forward(self, x_TD: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x_TD).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


class RoutedExperts(nn.Module):
    """The routed experts' weights, one tensor per projection with a leading expert dim: the layout grouped
    kernels and expert parallelism (sharding dim 0) want. A module of its own so that distributed code can
    shard it over its own mesh dims (experts: EP x FSDP; the rest of the block: FSDP)."""

    def __init__(self, num_experts: int, d_model: int, hidden: int, backend: str):
        super().__init__()
        self.w_gate_up_EDF2 = nn.Parameter(torch.empty(num_experts, d_model, 2 * hidden))
        self.w_down_EFD = nn.Parameter(torch.empty(num_experts, hidden, d_model))
        self.backend = backend
        # Set from outside by distributed.expert_parallel (this module then holds only its rank's experts,
        # global ids first_expert, first_expert + 1, ...); None = all experts are local.
        self.dispatch = None
        self.first_expert = 0

    def weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w_gate_up_EDF2, self.w_down_EFD

    def forward(self, x_TD, topk_ids_TK, topk_weights_TK) -> torch.Tensor:
        # A forward of its own (not a bare weight access), so FSDP's pre-forward unshard hooks fire.
        if self.dispatch is not None:
            return self.dispatch(x_TD, topk_ids_TK, topk_weights_TK, *self.weights(), self.backend)
        return expert_mlp(x_TD, topk_ids_TK, topk_weights_TK, *self.weights(), backend=self.backend)


class MoE(nn.Module):
    def __init__(self, d_model: int, cfg: MoEConfig, norm_eps: float = 1e-5, layer_idx: int = 0):
        super().__init__()
        if not 1 <= cfg.top_k <= cfg.num_experts:
            raise ConfigError(f"model.moe.top_k must be in [1, model.moe.num_experts], got {cfg.top_k}")
        if cfg.capacity_factor < 0:
            raise ConfigError(
                f"model.moe.capacity_factor must be >= 0 (0 = dropless), got {cfg.capacity_factor}"
            )
        if cfg.shared_expert_hidden < 0:
            raise ConfigError(f"model.moe.shared_expert_hidden must be >= 0, got {cfg.shared_expert_hidden}")
        check_backend(cfg.expert_backend)  # fail at build time, not at the first forward
        self.num_experts = cfg.num_experts
        self.skip_expert = cfg.skip_expert
        self.capacity_factor = cfg.capacity_factor
        self.aux_loss_coef = cfg.router.aux_loss_coef
        self.z_loss_coef = cfg.router.z_loss_coef
        self.router = build_router(d_model, cfg, norm_eps, layer_idx)
        self.experts = RoutedExperts(cfg.num_experts, d_model, cfg.expert_hidden, cfg.expert_backend)
        self.shared = SharedExpert(d_model, cfg.shared_expert_hidden) if cfg.shared_expert_hidden else None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("w_gate_up_EDF2", "w_down_EFD"):  # checkpoints written before RoutedExperts existed
            if prefix + name in state_dict:
                state_dict[f"{prefix}experts.{name}"] = state_dict.pop(prefix + name)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def reset_parameters(self, std: float, out_std: float) -> None:
        """Inputs N(0, std); projections that write into the residual stream N(0, out_std)."""
        self.router.reset_parameters(std)
        nn.init.normal_(self.experts.w_gate_up_EDF2, std=std)
        nn.init.normal_(self.experts.w_down_EFD, std=out_std)
        if self.shared is not None:
            nn.init.normal_(self.shared.gate_up.weight, std=std)
            nn.init.normal_(self.shared.down.weight, std=out_std)

    def forward(self, x_BTD: torch.Tensor, router_state_TR: torch.Tensor | None = None) -> MoEOutput:
        x_TD = x_BTD.reshape(-1, x_BTD.shape[-1])
        routed = self.router(x_TD, router_state_TR)
        ids_TK, weights_TK = routed.topk_ids_TK, routed.topk_weights_TK
        dropped = torch.zeros((), dtype=torch.long, device=x_TD.device)
        capacity = self.capacity_factor > 0 and self.training
        if self.skip_expert or capacity:
            # Slots routed to the skip expert or over capacity get id E ("no expert": sorted past every
            # expert's rows and never computed) and weight 0. Shapes stay fixed: no nonzero, no host sync.
            keep_TK = ids_TK < self.num_experts  # False for the skip expert
            if capacity:
                fits_TK = within_capacity(ids_TK, self.num_experts, self.capacity_factor)
                dropped = (keep_TK & ~fits_TK).sum()
                keep_TK = keep_TK & fits_TK
            ids_TK = ids_TK.masked_fill(~keep_TK, self.num_experts)
            weights_TK = weights_TK * keep_TK
        y_TD = self._experts(x_TD, ids_TK, weights_TK)
        if self.shared is not None:
            y_TD = y_TD + self.shared(x_TD)
        aux = self.aux_loss_coef * routed.aux_loss + self.z_loss_coef * routed.z_loss
        z = (self.z_loss_coef * routed.z_loss).detach()
        return MoEOutput(
            y_TD.view_as(x_BTD), aux, routed.num_tokens_per_expert_E, dropped, routed.state_TR, z
        )

    def _experts(self, x_TD, ids_TK, weights_TK) -> torch.Tensor:
        return self.experts(x_TD, ids_TK, weights_TK)
