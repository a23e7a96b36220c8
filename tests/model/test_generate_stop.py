"""``generate``'s ``check_stop`` hook: called before every decoding step, it abandons decoding by raising."""

from __future__ import annotations

import pytest
import torch
from model_cfgs import small_config

from zaya_pipeline.model import ZayaLM, generate


def test_check_stop_runs_before_every_step_and_its_error_ends_decoding():
    torch.manual_seed(0)
    model = ZayaLM(small_config(vocab_size=40)).eval()
    prompt = torch.randint(0, 40, (2, 5))
    calls = []
    out = generate(model, prompt, max_new_tokens=7, check_stop=lambda: calls.append(1))
    assert len(calls) == 7 and torch.equal(out, generate(model, prompt, max_new_tokens=7))

    def stop_at_the_fourth_step():
        calls.append(1)
        if len(calls) == 4:
            raise TimeoutError("deadline")

    calls.clear()
    with pytest.raises(TimeoutError, match="deadline"):
        generate(model, prompt, max_new_tokens=10**9, check_stop=stop_at_the_fourth_step)
    assert len(calls) == 4
