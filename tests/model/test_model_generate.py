from __future__ import annotations

import pytest
import torch
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.model import ZayaLM, generate

ZAYA1_MOE = MoEConfig(
    num_experts=4, top_k=1, expert_hidden=16, skip_expert=True, router=RouterConfig("zaya1", dim=8)
)


@pytest.fixture(params=["gqa", "cca"])
def model(request) -> ZayaLM:
    torch.manual_seed(0)
    cfg = small_config(vocab_size=40) if request.param == "gqa" else cca_config(vocab_size=40, moe=ZAYA1_MOE)
    return ZayaLM(cfg).eval()


def test_cached_prefill_and_decoding_equal_the_full_forward(model):
    """Chunks of 5, 3, 1, 1, ... tokens through the cache give the logits of one pass over the whole."""
    ids = torch.randint(0, 40, (2, 14))
    full = model(ids).logits
    cache, pieces, pos = model.new_cache(), [], 0
    for n in (5, 3) + (1,) * 6:
        pieces.append(model(ids[:, pos : pos + n], cache=cache).logits)
        pos += n
    assert cache.length == 14
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, rtol=1e-5, atol=1e-5)


def test_cache_keeps_the_compressed_kv_heads_only():
    cfg = cca_config(vocab_size=40)
    model = ZayaLM(cfg).eval()
    cache = model.new_cache()
    model(torch.randint(0, 40, (1, 6)), cache=cache)
    G, Hd = cfg.attention.n_kv_heads, cfg.attention.head_dim
    assert cache.layers[0]["k"].shape == cache.layers[0]["v"].shape == (1, G, 6, Hd)
    P = cfg.attention.conv_kernel_depthwise - 1 + cfg.attention.conv_kernel_grouped - 1
    assert cache.layers[0]["conv"].shape[-1] == P  # convolution state: the last P inputs


def test_cache_longer_than_max_seq_len_is_an_error(model):
    cache = model.new_cache()
    model(torch.zeros(1, model.cfg.max_seq_len, dtype=torch.long), cache=cache)
    with pytest.raises(Exception, match="max_seq_len"):
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_cached_generation_equals_recomputing_the_context(model, temperature):
    prompt = torch.randint(0, 40, (2, model.cfg.max_seq_len - 4))  # runs past max_seq_len: re-prefill
    kwargs = dict(max_new_tokens=9, temperature=temperature, top_p=0.9)
    cached = generate(model, prompt, generator=torch.Generator().manual_seed(3), **kwargs)
    plain = generate(model, prompt, generator=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
    assert torch.equal(cached, plain)


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
