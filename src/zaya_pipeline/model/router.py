"""Token routers: pick the top-k experts of every token and the losses that keep routing healthy.

Shape legend:
    T  tokens    D  model width    E  experts    K  experts per token
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zaya_pipeline.config import MoEConfig
from zaya_pipeline.errors import ConfigError

ROUTER_TYPES = ("linear",)


@dataclass
class RouterOutput:
    topk_ids_TK: torch.Tensor  # int64 expert ids, best first
    topk_weights_TK: torch.Tensor  # fp32 gates: renormalized over the K chosen if K > 1, raw prob if K = 1
    aux_loss: torch.Tensor  # unweighted load-balancing loss (1.0 at perfectly uniform routing)
    z_loss: torch.Tensor  # unweighted router z-loss
    num_tokens_per_expert_E: torch.Tensor  # routed (token, slot) pairs per expert, detached


def load_balancing_loss(probs_TE: torch.Tensor, topk_ids_TK: torch.Tensor) -> torch.Tensor:
    """Switch/GShard loss ``E * sum_e f_e * P_e``: f_e = share of routed slots sent to e (no gradient),
    P_e = mean router probability of e. Equals 1 when both are uniform and grows as routing collapses."""
    num_experts = probs_TE.shape[1]
    counts_E = torch.bincount(topk_ids_TK.reshape(-1), minlength=num_experts)
    f_E = counts_E.to(probs_TE.dtype) / max(topk_ids_TK.numel(), 1)
    return num_experts * torch.sum(f_E * probs_TE.mean(dim=0))


def router_z_loss(logits_TE: torch.Tensor) -> torch.Tensor:
    """ST-MoE z-loss: mean squared log-partition; keeps router logits small so the softmax stays stable."""
    return torch.logsumexp(logits_TE, dim=-1).square().mean()


class LinearRouter(nn.Module):
    """``softmax(x W_r)`` over experts, top-k; the gate weights are renormalized over the chosen k when k > 1.

    With k = 1 the weight stays the raw probability (Switch Transformer): renormalized it would be exactly 1,
    and the router would get no gradient from the language-model loss at all.
    """

    def __init__(self, d_model: int, num_experts: int, top_k: int):
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.proj = nn.Linear(d_model, num_experts, bias=False)

    def forward(self, x_TD: torch.Tensor) -> RouterOutput:
        # Routing decisions in fp32: bf16 ties and rounding would make top-k unstable.
        logits_TE = self.proj(x_TD).float()
        probs_TE = logits_TE.softmax(dim=-1)
        topk_probs_TK, topk_ids_TK = probs_TE.topk(self.top_k, dim=-1)
        topk_weights_TK = topk_probs_TK
        if self.top_k > 1:
            topk_weights_TK = topk_probs_TK / topk_probs_TK.sum(dim=-1, keepdim=True)
        counts_E = torch.bincount(topk_ids_TK.reshape(-1), minlength=self.num_experts)
        return RouterOutput(
            topk_ids_TK=topk_ids_TK,
            topk_weights_TK=topk_weights_TK,
            aux_loss=load_balancing_loss(probs_TE, topk_ids_TK),
            z_loss=router_z_loss(logits_TE),
            num_tokens_per_expert_E=counts_E.detach(),
        )


def build_router(d_model: int, cfg: MoEConfig) -> nn.Module:
    if cfg.router.type not in ROUTER_TYPES:
        raise ConfigError(
            f"model.moe.router.type: unknown router {cfg.router.type!r}; choose one of {list(ROUTER_TYPES)}"
        )
    return LinearRouter(d_model, cfg.num_experts, cfg.top_k)
