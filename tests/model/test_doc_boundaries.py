"""Packed documents: block-diagonal masking and per-document RoPE positions (train.data.doc_boundaries)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.data.loader import boundary_fields
from zaya_pipeline.model.attention import RotaryEmbedding
from zaya_pipeline.model.transformer import ZayaLM
from zaya_pipeline.train.module import boundary_kwargs

EOS = 0


def build(cfg) -> ZayaLM:
    torch.manual_seed(0)
    return ZayaLM(cfg).eval()


def wide_cca():
    """CCA with 3- and 4-tap convolutions: the two stacked convolutions reach 5 tokens back."""
    cfg = cca_config()
    a = dataclasses.replace(cfg.attention, conv_kernel_depthwise=3, conv_kernel_grouped=4)
    return dataclasses.replace(cfg, attention=a)


def zaya1_router(cfg):
    """The ZAYA1 router (its EDA state flows between layers, per token) and a skip expert."""
    moe = MoEConfig(
        num_experts=4, top_k=1, expert_hidden=16, skip_expert=True, router=RouterConfig("zaya1", dim=8)
    )
    return dataclasses.replace(cfg, moe=moe)


CONFIGS = {
    "gqa": small_config,
    "cca": cca_config,
    "cca-k3": wide_cca,
    "cca-zaya1-router": lambda: zaya1_router(cca_config()),
}


def docs(*lengths: int, seed: int = 1) -> list[torch.Tensor]:
    """Documents of the given lengths, each ending with EOS (ids 1..49 inside)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.cat((torch.randint(1, 50, (n - 1,), generator=g), torch.tensor([EOS]))) for n in lengths]


@pytest.mark.parametrize("name", CONFIGS)
def test_mask_gives_each_packed_document_the_logits_it_has_alone(name):
    model = build(CONFIGS[name]())
    rows = [docs(5, 9, 7, seed=1), docs(12, 3, 6, seed=2)]  # the last document of each row is cut short
    rows = [torch.cat(r)[:20] for r in rows]
    ids_BT = torch.stack(rows)
    with torch.no_grad():
        packed = model(ids_BT, **_fields(ids_BT, "mask")).logits
        plain = model(ids_BT).logits
        for b, row in enumerate(rows):
            ends = (row == EOS).nonzero().flatten().tolist() + [len(row) - 1]
            start = 0
            for end in ends:
                alone = model(row[None, start : end + 1]).logits[0]
                torch.testing.assert_close(packed[b, start : end + 1], alone, rtol=1e-5, atol=1e-5)
                start = end + 1
    # the test can fail: without the mask a later document sees the ones before it
    second = slice(5, 14)
    assert not torch.allclose(plain[0, second], packed[0, second], atol=1e-3)


@pytest.mark.parametrize("name", ["gqa", "cca"])
def test_mask_keeps_gradients_inside_each_document(name):
    """The loss on the second document alone gives no gradient to the first document's embeddings."""
    model = build(CONFIGS[name]())
    ids_BT = torch.cat(docs(6, 10))[None]
    x = model.embed(ids_BT).detach().requires_grad_(True)
    model.embed.forward = lambda ids: x  # feed the leaf in place of the lookup
    out = model(ids_BT, **_fields(ids_BT, "mask"))
    out.logits[0, 6:].sum().backward()
    assert x.grad[0, :6].abs().max() == 0 and x.grad[0, 6:].abs().max() > 0


@pytest.mark.parametrize("name", ["gqa", "cca"])
def test_reset_positions_restarts_rope_after_each_eos(name):
    model = build(CONFIGS[name]())
    with torch.no_grad():  # sharper attention than at init, so that positions visibly matter
        for block in model.blocks:
            block.attn.qkv.weight.mul_(8.0)
    ids_BT = torch.cat(docs(7, 9))[None]
    fields = _fields(ids_BT, "reset_positions")
    assert list(fields) == ["position_ids_BT"]
    assert fields["position_ids_BT"][0].tolist() == list(range(7)) + list(range(9))
    with torch.no_grad():
        reset = model(ids_BT, **fields).logits
        plain = model(ids_BT).logits
    # the first document keeps positions 0..6 (the same logits); after its EOS the positions differ
    torch.testing.assert_close(reset[0, :7], plain[0, :7], rtol=0, atol=0)
    assert not torch.allclose(reset[0, 7:], plain[0, 7:], atol=1e-3)


def test_rope_with_position_ids_rotates_each_document_from_position_zero():
    rope = RotaryEmbedding(cca_config())  # partial RoPE (rope_fraction 0.5)
    x_BHTHd = torch.randn(1, 4, 11, 8)
    position_ids_BT = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6]])
    out = rope(x_BHTHd, 0, position_ids_BT)
    torch.testing.assert_close(out[:, :, :4], rope(x_BHTHd[:, :, :4], 0))
    torch.testing.assert_close(out[:, :, 4:], rope(x_BHTHd[:, :, 4:], 0))
    torch.testing.assert_close(rope(x_BHTHd, 0, torch.arange(11)[None] + 5), rope(x_BHTHd, 5))


def test_a_row_without_eos_gives_the_plain_logits_in_every_mode(cfg):
    model = build(cfg)
    ids_BT = torch.randint(1, 50, (2, 16), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        plain = model(ids_BT).logits
        for mode in ("reset_positions", "mask"):
            torch.testing.assert_close(model(ids_BT, **_fields(ids_BT, mode)).logits, plain)
    assert boundary_fields(ids_BT, EOS, "none") == {}


def test_boundary_fields_cannot_go_with_a_decoding_cache(cfg):
    model = build(cfg)
    ids_BT = torch.cat(docs(4, 4))[None]
    with pytest.raises(ValueError, match="not a cache"):
        model(ids_BT, cache=model.new_cache(), **_fields(ids_BT, "mask"))


def _fields(ids_BT: torch.Tensor, mode: str) -> dict:
    """The model's keyword arguments for ``mode``, as the training step builds them from a batch."""
    return boundary_kwargs(boundary_fields(ids_BT, EOS, mode))
