"""Token routers: pick the top-k experts of every token and the losses that keep routing healthy.

With ``model.moe.skip_expert`` both routers score one more choice than there are experts: the last one is
the skip ("no-op") expert; a slot routed there gets no expert output (see ``moe.py``).

Shape legend:
    T  tokens    D  model width    E  router choices (experts + skip)    K  experts per token
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.ops import count_per_expert

ROUTER_TYPES = ("linear", "zaya1")


@dataclass
class RouterOutput:
    topk_ids_TK: torch.Tensor  # int64 expert ids, best first
    topk_weights_TK: torch.Tensor  # fp32 gates: renormalized over the K chosen if K > 1, raw prob if K = 1
    aux_loss: torch.Tensor  # unweighted load-balancing loss (1.0 at perfectly uniform routing)
    z_loss: torch.Tensor  # unweighted router z-loss
    num_tokens_per_expert_E: torch.Tensor  # routed (token, slot) pairs per expert, detached
    state_TR: torch.Tensor | None = None  # zaya1: this layer's router state, the next layer's EDA input


def load_balancing_loss(probs_TE: torch.Tensor, topk_ids_TK: torch.Tensor) -> torch.Tensor:
    """Switch/GShard loss ``E * sum_e f_e * P_e``: f_e = share of routed slots sent to e (no gradient),
    P_e = mean router probability of e. Equals 1 when both are uniform and grows as routing collapses."""
    num_experts = probs_TE.shape[1]
    counts_E = count_per_expert(topk_ids_TK, num_experts)
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
        self.num_experts = num_experts  # router choices, the skip expert included
        self.top_k = top_k
        self.proj = nn.Linear(d_model, num_experts, bias=False)

    def reset_parameters(self, std: float) -> None:
        nn.init.normal_(self.proj.weight, std=std)

    def forward(self, x_TD: torch.Tensor, prev_state_TR: torch.Tensor | None = None) -> RouterOutput:
        # Routing decisions in fp32: bf16 ties and rounding would make top-k unstable.
        logits_TE = self.proj(x_TD).float()
        probs_TE = logits_TE.softmax(dim=-1)
        topk_ids_TK = probs_TE.topk(self.top_k, dim=-1).indices
        counts_E = count_per_expert(topk_ids_TK, self.num_experts)
        return RouterOutput(
            topk_ids_TK=topk_ids_TK,
            topk_weights_TK=_gates(probs_TE, topk_ids_TK),
            aux_loss=load_balancing_loss(probs_TE, topk_ids_TK),
            z_loss=router_z_loss(logits_TE),
            num_tokens_per_expert_E=counts_E.detach(),
        )


def _gates(probs_TE: torch.Tensor, topk_ids_TK: torch.Tensor) -> torch.Tensor:
    """Gate weights from the (unbiased) probabilities: raw with one expert, renormalized over K > 1."""
    chosen_TK = probs_TE.gather(1, topk_ids_TK)
    return chosen_TK if chosen_TK.shape[1] == 1 else chosen_TK / chosen_TK.sum(dim=-1, keepdim=True)


class Zaya1Router(nn.Module):
    """The ZAYA1 router, the function of transformers' ``ZayaRouter``: down-projection (with bias), EDA,
    RMSNorm, Linear-GELU-Linear-GELU-Linear (the first two with biases), softmax.

    EDA (exponential depth averaging): from the second layer on, the previous layer's router state (its
    down-projection after its own EDA) times a learned per-channel scale is added to the down-projection.
    Experts are SELECTED on ``probs + expert_bias`` (a buffer with no gradient) and GATED by the unbiased
    probabilities (aux-loss-free balancing, as in DeepSeek-V3). ``update_bias()`` runs once per optimizer
    step: a PI controller on each expert's relative load error since the last update raises the bias of
    under-loaded experts and lowers it for over-loaded ones. The bias and the integral are buffers, so they
    are saved in checkpoints. A skip expert (``skip_bias_init`` not None) is the last choice; its bias starts
    at ``skip_bias_init`` (ZAYA1: -1, so skipping is rare early on) and is then controlled like the others.
    """

    def __init__(
        self,
        d_model: int,
        num_experts: int,
        top_k: int,
        cfg: RouterConfig,
        skip_bias_init: float | None = None,
        eps: float = 1e-5,
        layer_idx: int = 0,
    ):
        super().__init__()
        E = num_experts + (skip_bias_init is not None)
        R = cfg.dim
        self.num_experts, self.top_k, self.skip_bias_init = E, top_k, skip_bias_init
        self.p_gain, self.i_gain = cfg.bias_p_gain, cfg.bias_i_gain
        self.down = nn.Linear(d_model, R)
        # the first layer has no previous router state, so no scale (as in transformers' ZayaRouter)
        self.eda_scale_R = nn.Parameter(torch.zeros(R)) if cfg.eda and layer_idx > 0 else None
        self.eda_init, self.mlp_init_std = cfg.eda_init, cfg.mlp_init_std
        self.norm = nn.RMSNorm(R, eps=eps)
        self.mlp = nn.Sequential(
            nn.Linear(R, R),
            nn.GELU(),
            nn.Linear(R, R),
            nn.GELU(),
            nn.Linear(R, E, bias=False),
        )
        self.register_buffer("expert_bias_E", torch.empty(E))
        self.register_buffer("load_error_integral_E", torch.empty(E))
        self.register_buffer("pending_counts_E", torch.empty(E), persistent=False)
        self._reset_balancing()

    @torch.no_grad()
    def _reset_balancing(self) -> None:
        """Controller state at the start of training: zero biases (the skip expert's at skip_bias_init)."""
        self.expert_bias_E.zero_()
        if self.skip_bias_init is not None:
            self.expert_bias_E[-1] = self.skip_bias_init
        self.load_error_integral_E.zero_()
        self.pending_counts_E.zero_()

    def reset_parameters(self, std: float) -> None:
        """Weights N(0, std) (the MLP's N(0, ``model.moe.router.mlp_init_std``) when that is set), biases 0,
        EDA scales ``model.moe.router.eda_init`` (default 0, **ours**: a layer starts without its
        predecessor's state; transformers' ``Zaya`` initialises them to 1)."""
        mlp_std = self.mlp_init_std or std
        layers = (self.down, self.mlp[0], self.mlp[2], self.mlp[4])
        for linear, s in zip(layers, (std, mlp_std, mlp_std, mlp_std), strict=True):
            nn.init.normal_(linear.weight, std=s)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)
        if self.eda_scale_R is not None:
            nn.init.constant_(self.eda_scale_R, self.eda_init)
        self._reset_balancing()

    def forward(self, x_TD: torch.Tensor, prev_state_TR: torch.Tensor | None = None) -> RouterOutput:
        h_TR = self.down(x_TD)
        if self.eda_scale_R is not None and prev_state_TR is not None:
            h_TR = h_TR + self.eda_scale_R * prev_state_TR
        logits_TE = self.mlp(self.norm(h_TR)).float()
        probs_TE = logits_TE.softmax(dim=-1)
        topk_ids_TK = (probs_TE.detach() + self.expert_bias_E).topk(self.top_k, dim=-1).indices
        counts_E = count_per_expert(topk_ids_TK, self.num_experts).detach()
        if self.training:
            self.pending_counts_E += counts_E
        return RouterOutput(
            topk_ids_TK=topk_ids_TK,
            topk_weights_TK=_gates(probs_TE, topk_ids_TK),
            aux_loss=load_balancing_loss(probs_TE, topk_ids_TK),
            z_loss=router_z_loss(logits_TE),
            num_tokens_per_expert_E=counts_E,
            state_TR=h_TR,
        )

    @torch.no_grad()
    def update_bias(self, reduce_sum=None, apply: torch.Tensor | None = None) -> None:
        """One controller step on the loads routed since the last call (no-op if nothing was routed).

        ``reduce_sum`` sums a tensor over the data-parallel ranks; with it every rank steps on the global
        loads and the biases stay identical across ranks. ``apply`` (a device bool, the spike guard's
        decision) false: no step, and the loads carry over to the next one, as if it had not been called."""
        if reduce_sum is not None:
            self.pending_counts_E.copy_(reduce_sum(self.pending_counts_E.clone()))
        total = self.pending_counts_E.sum()
        routed = total > 0  # decided on the device: no host sync in the training step
        if apply is not None:
            routed = routed & apply
        mean = total.clamp_min(1) / self.num_experts
        error_E = torch.where(routed, (mean - self.pending_counts_E) / mean, 0)  # > 0: under-loaded
        self.load_error_integral_E += error_E
        step_E = self.p_gain * error_E + self.i_gain * self.load_error_integral_E
        self.expert_bias_E += torch.where(routed, step_E, 0)
        if apply is None:
            self.pending_counts_E.zero_()
        else:
            self.pending_counts_E.copy_(torch.where(apply, 0, self.pending_counts_E))


def build_router(d_model: int, cfg: MoEConfig, eps: float = 1e-5, layer_idx: int = 0) -> nn.Module:
    """The router of layer ``layer_idx`` (the ZAYA1 router's EDA starts at layer 1); ``eps``: its norm's."""
    if cfg.router.type not in ROUTER_TYPES:
        raise ConfigError(
            f"model.moe.router.type: unknown router {cfg.router.type!r}; choose one of {list(ROUTER_TYPES)}"
        )
    if cfg.router.type == "zaya1":
        if cfg.router.dim < 1:
            raise ConfigError(f"model.moe.router.dim must be >= 1, got {cfg.router.dim}")
        skip_bias = cfg.skip_bias_init if cfg.skip_expert else None
        return Zaya1Router(d_model, cfg.num_experts, cfg.top_k, cfg.router, skip_bias, eps, layer_idx)
    return LinearRouter(d_model, cfg.num_experts + int(cfg.skip_expert), cfg.top_k)
