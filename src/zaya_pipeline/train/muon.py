"""Muon for the hidden matrices, AdamW for everything else, in one optimizer.

Muon (Keller Jordan, 2024, "Muon: An optimizer for hidden layers in neural networks",
https://kellerjordan.github.io/posts/muon/) keeps SGD momentum per weight matrix and replaces the
update by its nearest semi-orthogonal matrix (the polar factor ``U V^T`` of the momentum), computed
approximately with a few Newton–Schulz iterations. Every direction of the update then moves by about
the same amount, whatever the gradient's spectrum.

Which parameters go where:

* Muon: the 2-D hidden matrices (attention q/k/v and output projections, shared-expert MLP weights)
  and 3-D per-expert stacks such as ``w_gate_up_EDF2`` / ``w_down_EFD``, orthogonalized per expert.
* AdamW: embeddings and the (tied) output head, norms, biases, scales, the router and anything that
  is not a hidden matrix. A 1-D parameter in a Muon group is an error.

The Muon update is rescaled by ``0.2 * sqrt(max(A, B))`` (Liu et al., 2025, "Muon is Scalable for
LLM Training", the Moonlight recipe) so that its RMS is close to AdamW's (~0.2 lr): both kinds of
group can then use the same learning rate and decoupled weight decay.

FSDP2 parameters (``DTensor``, sharded on dim 0) are supported: momentum stays sharded, the full
matrix is gathered for Newton–Schulz and each rank keeps its own shard of the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.optim.adamw import adamw as adamw_functional
from torch.optim.optimizer import _get_fused_kernels_supported_devices

NS_COEFFS = (3.4445, -4.7750, 2.0315)  # Keller Jordan's quintic (a, b, c)
RMS_MATCH = 0.2  # Moonlight: update RMS ~ AdamW's
KINDS = ("muon", "adamw")
MUON_DEFAULTS = {"momentum": 0.95, "nesterov": True, "ns_steps": 5, "weight_decay": 0.0}
ADAMW_DEFAULTS = {"betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def newton_schulz(G: Tensor, steps: int = 5, eps: float = 1e-7) -> Tensor:
    """Approximate polar factor ``U V^T`` of each matrix in the last two dims of ``G`` (batched).

    Quintic Newton–Schulz iteration ``X <- a X + (b A + c A^2) X`` with ``A = X X^T`` and Keller
    Jordan's coefficients (Muon, 2024), after dividing each matrix by its Frobenius norm. It is tuned
    for speed, not convergence: singular values land in a band around 1 (roughly 0.7-1.2), not at 1.
    Runs in bf16 on CUDA/ROCm and fp32 elsewhere (CPU bf16 matmuls are slow); returns ``G.dtype``.
    """
    if G.ndim < 2:
        raise ValueError(f"newton_schulz needs a matrix or a stack of matrices, got shape {tuple(G.shape)}")
    a, b, c = NS_COEFFS
    X = G.to(torch.bfloat16 if G.device.type == "cuda" else torch.float32)
    tall = X.shape[-2] > X.shape[-1]
    if tall:
        X = X.mT
    wide_shape = X.shape
    X = X.reshape(-1, *wide_shape[-2:])  # (N, rows <= cols): one batched matmul per product
    X = X / (torch.linalg.matrix_norm(X, keepdim=True) + eps)
    for _ in range(steps):
        A = torch.bmm(X, X.mT)
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A A
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    X = X.reshape(wide_shape)
    if tall:
        X = X.mT
    return X.to(G.dtype)


def muon_scale(shape: torch.Size) -> float:
    """Moonlight's RMS matching factor ``0.2 * sqrt(max(A, B))`` over the last two dims."""
    return RMS_MATCH * math.sqrt(max(shape[-2], shape[-1]))


def _orthogonalize(update: Tensor, steps: int) -> Tensor:
    """Newton–Schulz of ``update``; a DTensor is gathered, orthogonalized on every rank (redundant
    compute, simple; a ZeRO-style split of the work across ranks is a later optimization) and turned
    back into this rank's shard locally (``src_data_rank=None``: no scatter)."""
    if not isinstance(update, DTensor):
        return newton_schulz(update, steps)
    full = newton_schulz(update.full_tensor(), steps)
    return distribute_tensor(full, update.device_mesh, update.placements, src_data_rank=None)


class MuonAdamW(torch.optim.Optimizer):
    """Muon or AdamW per param group, chosen by the group's ``"optimizer"`` key.

    Every group needs ``"optimizer"`` (``"muon"`` | ``"adamw"``) and should have ``"name"``.
    AdamW groups: ``lr, betas, eps, weight_decay`` (decoupled, as ``torch.optim.AdamW``; state keys
    ``step, exp_avg, exp_avg_sq`` alike). Muon groups: ``lr, momentum, nesterov, ns_steps,
    weight_decay``; per parameter ``buf = m buf + g``, ``u = g + m buf`` (nesterov) or ``buf``,
    ``p *= 1 - lr wd``, ``p -= lr 0.2 sqrt(max(A, B)) NS(u)``. Defaults: ``MUON_DEFAULTS``,
    ``ADAMW_DEFAULTS`` (torch's); ``lr`` is required.
    """

    def __init__(self, param_groups: list[dict]):
        super().__init__(param_groups, {})

    def add_param_group(self, param_group: dict) -> None:
        name = param_group.get("name", "<unnamed>")
        kind = param_group.get("optimizer")
        if kind not in KINDS:
            raise ValueError(f"param group {name!r}: 'optimizer' must be one of {KINDS}, got {kind!r}")
        if "lr" not in param_group:
            raise ValueError(f"param group {name!r} has no 'lr'")
        params = param_group["params"]
        params = [params] if isinstance(params, Tensor) else list(params)
        if kind == "muon":
            for p in params:
                if p.ndim < 2:
                    raise ValueError(
                        f"param group {name!r} is a muon group but holds a parameter of shape "
                        f"{tuple(p.shape)}: Muon needs matrices (ndim >= 2); put it in an adamw group"
                    )
        defaults = MUON_DEFAULTS if kind == "muon" else ADAMW_DEFAULTS
        super().add_param_group({**defaults, "name": name, **param_group, "params": params})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        """One update of every group; ``closure`` re-evaluates the loss, as in torch optimizers.

        Like torch's fused optimizers, a ``found_inf`` attribute (a 0-dim float tensor on the parameters'
        device, set by :func:`zaya_pipeline.train.optim.step_unless`) drops the whole update on the device
        when it is 1: no parameter, momentum, moment or step count changes, and the host never reads it."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            if group["optimizer"] == "muon":
                self._muon_step(group, found_inf)
            else:
                self._adamw_step(group, found_inf)
        return loss

    def _muon_step(self, group: dict, found_inf: Tensor | None) -> None:
        lr, wd, m = group["lr"], group["weight_decay"], group["momentum"]
        for p in group["params"]:
            if p.grad is None:
                continue
            grad = p.grad
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(grad)
            buf = state["momentum_buffer"]
            new_buf = buf * m + grad
            update = grad + new_buf * m if group["nesterov"] else new_buf
            ortho = _orthogonalize(update, group["ns_steps"])
            new_p = (p * (1 - lr * wd) if wd else p) - ortho * (lr * muon_scale(p.shape))
            if found_inf is None:
                buf.copy_(new_buf)
                p.copy_(new_p)
                continue
            # Skipped on the device: keep the old values (a select, not a multiply, since a skipped step's
            # gradient may be NaN). A DTensor's 0-dim gate is replicated implicitly.
            with implicit_replication():
                skip = found_inf.bool()
                buf.copy_(torch.where(skip, buf, new_buf))
                p.copy_(torch.where(skip, p, new_p))

    def _adamw_step(self, group: dict, found_inf: Tensor | None) -> None:
        params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
        for p in group["params"]:
            if p.grad is not None:
                params.append(p)
                grads.append(p.grad)
        if not params:
            return
        fusable = _get_fused_kernels_supported_devices()
        fused = all(p.device.type in fusable and torch.is_floating_point(p) for p in params)
        if found_inf is not None and not fused and bool(found_inf):  # no fused kernel: read the host
            return
        for p in params:
            state = self.state[p]
            if "step" not in state:
                step_device = p.device if fused else torch.device("cpu")
                state["step"] = torch.zeros((), dtype=torch.float32, device=step_device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif fused and state["step"].device != p.device:  # load_state_dict keeps steps on the CPU
                state["step"] = state["step"].to(p.device)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            steps.append(state["step"])
        beta1, beta2 = group["betas"]
        adamw_functional(
            params,
            grads,
            exp_avgs,
            exp_avg_sqs,
            [],
            steps,
            foreach=not fused,
            fused=fused,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            found_inf=found_inf if fused else None,
        )
