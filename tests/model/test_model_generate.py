from __future__ import annotations

import pytest
import torch
from model_cfgs import small_config

from zaya_pipeline.model import ZayaLM, generate


@pytest.fixture
def model() -> ZayaLM:
    torch.manual_seed(0)
    return ZayaLM(small_config(vocab_size=40)).eval()


def test_greedy_is_deterministic_and_generates_max_new_tokens(model):
    prompt = torch.randint(0, 40, (3, 5))
    a = generate(model, prompt, max_new_tokens=7)
    b = generate(model, prompt, max_new_tokens=7)
    assert a.shape == (3, 12) and a.dtype == torch.long
    assert torch.equal(a, b)
    assert torch.equal(a[:, :5], prompt)
    # Greedy: each new token is the argmax given everything before it.
    for t in range(5, 12):
        assert torch.equal(a[:, t], model(a[:, :t]).logits[:, -1].argmax(-1))


def test_eos_pads_finished_rows_and_stops_when_all_are_done(model):
    prompt = torch.randint(0, 40, (2, 4))
    free = generate(model, prompt, max_new_tokens=10)[:, 4:]
    eos = int(free[0, 0])  # row 0 emits this first, so it finishes at once
    out = generate(model, prompt, max_new_tokens=10, eos_id=eos)[:, 4:]
    # Index of each row's first EOS among the free-running tokens (10 = never).
    first = [int((row == eos).nonzero()[0]) if (row == eos).any() else 10 for row in free]
    assert out.shape[1] == min(10, max(first) + 1)
    for r in range(2):
        n = min(first[r] + 1, out.shape[1])
        assert torch.equal(out[r, :n], free[r, :n])  # same tokens up to and including EOS
        assert (out[r, n:] == eos).all()  # then padding
    assert (out[0] == eos).all()


def test_sampling_is_reproducible_and_tiny_top_p_is_greedy(model):
    prompt = torch.randint(0, 40, (2, 3))
    s1 = generate(model, prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(1))
    s2 = generate(model, prompt, 6, temperature=1.0, generator=torch.Generator().manual_seed(1))
    assert torch.equal(s1, s2)
    nucleus = generate(
        model, prompt, 6, temperature=1.0, top_p=1e-6, generator=torch.Generator().manual_seed(2)
    )
    assert torch.equal(nucleus, generate(model, prompt, 6))


def test_context_longer_than_max_seq_len_is_cropped(model):
    prompt = torch.randint(0, 40, (1, model.cfg.max_seq_len + 5))
    out = generate(model, prompt, max_new_tokens=2)
    assert out.shape == (1, model.cfg.max_seq_len + 7)
    assert out[0, -2] == model(prompt[:, -model.cfg.max_seq_len :]).logits[0, -1].argmax()
