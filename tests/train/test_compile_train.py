"""``parallel.compile=true`` on one process: every block compiled as one graph (fullgraph, inductor) trains
the debug model to the same losses as eager, within the tolerance docs/training.md states."""

from __future__ import annotations

import pytest
from test_train_stage import logged_losses

STEPS = 12
TOL = 2e-3  # relative, per logged step: fp32 on CPU, inductor's fused kernels reorder reductions


@pytest.mark.slow
def test_compiled_blocks_train_like_eager(tmp_path, token_dir):
    common = (f"train.max_steps={STEPS}", "train.log_every=2")
    eager = logged_losses(tmp_path / "eager", token_dir, *common)
    compiled = logged_losses(tmp_path / "compiled", token_dir, *common, "parallel.compile=true")
    assert len(eager) == len(compiled) >= STEPS // 2
    for step, (a, b) in enumerate(zip(eager, compiled, strict=True)):
        assert abs(a - b) <= TOL * abs(a), f"logged step {step}: eager {a} vs compiled {b}"
