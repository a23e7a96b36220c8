"""bf16-mixed (autocast) training of the full model: every MoE path runs under autocast, with fp32 params."""

from __future__ import annotations

import pytest
import torch

from zaya_pipeline.config import load_config
from zaya_pipeline.model.transformer import ZayaLM


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.moe.skip_expert=true", "model.moe.router.type=zaya1"],  # the masked path (index_copy)
        ["model.moe.skip_expert=false", "model.moe.capacity_factor=1.0"],  # capacity drops
        ["model.moe.skip_expert=false", "model.moe.capacity_factor=0", "model.moe.shared_expert_hidden=32"],
    ],
    ids=["skip", "capacity", "dropless-shared"],
)
def test_forward_backward_under_bf16_autocast(overrides):
    """The same parameters get gradients as in fp32 (all fp32), and the loss stays close to fp32's."""
    cfg = load_config(["model=debug", "model.vocab_size=128", *overrides]).model
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    ids = torch.randint(0, 128, (2, 16))

    def loss_and_grads(autocast: bool):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(ids)
            loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1).float(), ids.flatten())
        (loss + out.aux_loss).backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

    moe_dtypes = []
    model.blocks[0].moe.register_forward_hook(lambda mod, args, out: moe_dtypes.append(out.y_BTD.dtype))
    loss32, grads32 = loss_and_grads(False)
    loss16, grads16 = loss_and_grads(True)
    assert moe_dtypes == [torch.float32, torch.bfloat16]  # the experts ran in bf16, as a Linear would
    assert grads16.keys() == grads32.keys()
    assert all(g.dtype == torch.float32 for g in grads16.values())
    assert abs(loss16 - loss32) < 0.05 * loss32
    expert_grad = "blocks.0.moe.experts.w_gate_up_EDF2"
    assert (
        torch.nn.functional.cosine_similarity(
            grads16[expert_grad].flatten(), grads32[expert_grad].flatten(), dim=0
        )
        > 0.95
    )
