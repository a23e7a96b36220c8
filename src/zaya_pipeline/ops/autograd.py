"""The autograd registration shared by the expert custom ops (``zaya::grouped_mm_expert_mlp``,
``zaya::triton_expert_mlp``): a custom op saves nothing itself, so its forward returns what its backward op
needs as extra outputs and the registration below hands them over."""

from __future__ import annotations

from collections.abc import Callable


def register_expert_autograd(forward_op, backward_op, saved: Callable) -> None:
    """The autograd of an expert custom op ``forward_op(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2,
    w_down_EFD)``: ``saved(inputs, output)`` picks the tensors that ``backward_op(dy_TD, *saved)`` takes,
    which returns ``(dx_TD, d_weights_TK, dw_gate_up_EDF2, dw_down_EFD)``; the ids get no gradient."""

    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*saved(inputs, output))

    def backward(ctx, dy_TD, *_unused):
        dx, d_weights, dw_gate_up, dw_down = backward_op(dy_TD.contiguous(), *ctx.saved_tensors)
        return dx, None, d_weights, dw_gate_up, dw_down

    forward_op.register_autograd(backward, setup_context=setup_context)
