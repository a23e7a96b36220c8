"""Our model against transformers' own ``ZayaForCausalLM``, the definition of ZAYA1's function (ADR 0010).

Tiny random models with ZAYA1's grouping (2 key/value groups of 4 query heads), every bias, scale,
temperature and EDA scale moved away from its init so that no term can hide, and balancing biases that send
some tokens to the skip expert: logits, gradients of every parameter and greedy tokens must agree; folders
written by transformers convert to our model and back tensor for tensor.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")

from transformers import ZayaConfig, ZayaForCausalLM  # noqa: E402

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, RouterConfig, load_config  # noqa: E402
from zaya_pipeline.errors import DataError  # noqa: E402
from zaya_pipeline.model import ZayaLM, hf_format, num_active_params, num_params  # noqa: E402
from zaya_pipeline.model.generate import generate  # noqa: E402

V = 96
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


def zaya_config(**overrides) -> ModelConfig:
    attention = overrides.pop(
        "attention", AttentionConfig("cca", n_heads=8, n_kv_heads=2, head_dim=8, rope_fraction=0.5)
    )
    moe = MoEConfig(
        num_experts=4, top_k=1, expert_hidden=16, skip_expert=True, router=RouterConfig("zaya1", dim=8)
    )
    base = ModelConfig(
        vocab_size=V,
        d_model=32,
        n_layers=3,
        max_seq_len=64,
        residual_scaling=True,
        moe_out_scale_init=1.0,  # transformers' init (the perturbation below moves it anyway)
        attention=attention,
        moe=moe,
    )
    return dataclasses.replace(base, **overrides)


CONFIGS = {
    "tied": zaya_config(),
    "untied-k3": zaya_config(
        tie_embeddings=False,
        attention=AttentionConfig(
            "cca", n_heads=8, n_kv_heads=2, head_dim=8, rope_fraction=1.0, conv_kernel_depthwise=3
        ),
    ),
    "4x1-k2x3": zaya_config(
        attention=AttentionConfig(
            "cca",
            n_heads=4,
            n_kv_heads=1,
            head_dim=12,
            rope_fraction=0.5,
            rope_theta=500.0,
            conv_kernel_grouped=3,
        )
    ),
}


def perturbed(cfg: ModelConfig, seed: int = 0) -> ZayaLM:
    """Every parameter moved by N(0, 0.2) noise (biases, scales, temperatures, EDA included); balancing biases
    that make the skip expert a frequent but not the only choice."""
    torch.manual_seed(seed)
    model = ZayaLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
        model.embed.weight.mul_(5.0)  # spread the logits, so that greedy tokens vary
        x = ids(4, 24, seed=seed + 100)
        for block in model.blocks:  # layer by layer: each bias changes what the next router sees
            router = block.moe.router
            router.expert_bias_E.normal_(std=0.1)
            probs: list[torch.Tensor] = []
            keep = probs.append
            hook = router.mlp.register_forward_hook(
                lambda m, i, out, keep=keep: keep(out.float().softmax(-1))
            )
            model(x)
            hook.remove()
            p_TE = probs[0]
            margin_T = (p_TE[:, :-1] + router.expert_bias_E[:-1]).max(dim=1).values - p_TE[:, -1]
            router.expert_bias_E[-1] = margin_T.median()  # about half of the tokens skip this layer
    return model


def reference(ours: ZayaLM) -> ZayaForCausalLM:
    """transformers' model with our weights, loaded strictly."""
    config = {
        k: v for k, v in hf_format.hf_config(ours.cfg).items() if k not in ("model_type", "architectures")
    }
    theirs = ZayaForCausalLM(ZayaConfig(**config)).eval()
    state = hf_format.to_hf_state(ours.state_dict(), ours.cfg)
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if ours.cfg.tie_embeddings else set())
    return theirs


def ids(B: int, T: int, seed: int = 1) -> torch.Tensor:
    # from 1: id 0 is the pad token, whose embedding row transformers leaves out of the lookup's gradient
    return torch.randint(1, V, (B, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_equal_transformers_zaya_with_the_skip_expert_taken(name):
    ours = perturbed(CONFIGS[name])
    theirs = reference(ours)
    x = ids(2, 24)
    with torch.no_grad():
        out = ours(x)
        expected = theirs(x, use_cache=False).logits
    skipped = out.expert_counts_LE[:, -1]
    assert (skipped > 0).all() and (skipped < x.numel()).all(), "every layer must skip some tokens, not all"
    scale = expected.abs().max()
    assert scale > 1.0
    assert (out.logits - expected).abs().max() <= 1e-4 * scale


@pytest.mark.parametrize("name", ["tied", "4x1-k2x3"])
def test_gradients_of_every_parameter_equal_transformers(name):
    ours = perturbed(CONFIGS[name])
    theirs = reference(ours)
    x = ids(2, 20)
    for model in (ours, theirs):
        logits = model(x).logits if model is ours else model(x, use_cache=False).logits
        F.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten()).backward()
    ours_grads = {n: p.grad for n, p in ours.named_parameters()}
    ours_grads |= {n: torch.zeros_like(b) for n, b in ours.named_buffers() if n in ours.state_dict()}
    mapped = hf_format.to_hf_state(ours_grads, ours.cfg)
    theirs_params = dict(theirs.named_parameters())
    assert set(theirs_params) <= set(mapped)
    for key, p in theirs_params.items():
        assert p.grad is not None and p.grad.abs().sum() > 0, key  # every parameter takes part
        rel = (mapped[key] - p.grad).norm() / p.grad.norm()
        assert rel <= 1e-4, f"{key}: relative gradient error {rel:.2e}"


def test_greedy_generation_equals_transformers_and_our_cache_equals_no_cache():
    ours = perturbed(CONFIGS["untied-k3"])
    theirs = reference(ours)
    prompt = ids(1, 7, seed=5)
    with torch.no_grad():
        cached = generate(ours, prompt, max_new_tokens=12)
        uncached = generate(ours, prompt, max_new_tokens=12, use_cache=False)
        hf = theirs.generate(prompt, max_new_tokens=12, do_sample=False, eos_token_id=None)
    assert torch.equal(cached, uncached)
    assert torch.equal(cached, hf)
    assert len(set(cached[0, 7:].tolist())) > 2, "a near-constant continuation would prove little"


def test_a_transformers_folder_converts_to_our_model_and_back_tensor_for_tensor(tmp_path):
    ours = perturbed(CONFIGS["tied"], seed=3)
    theirs = reference(ours)
    theirs.save_pretrained(tmp_path / "one")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    assert (tmp_path / "sharded" / hf_format.WEIGHTS_INDEX).is_file()
    x = ids(2, 16)
    with torch.no_grad():
        expected = theirs(x, use_cache=False).logits
    for folder in (tmp_path / "one", tmp_path / "sharded"):
        config, state = hf_format.read_folder(folder)
        cfg = hf_format.model_config_from_hf(config, str(folder))
        model = ZayaLM(cfg).eval()
        model.load_state_dict(hf_format.from_hf_state(state, cfg, str(folder)))
        with torch.no_grad():
            torch.testing.assert_close(model(x).logits, expected, rtol=1e-5, atol=1e-5)
        back = hf_format.to_hf_state(model.state_dict(), cfg)
        assert set(back) == set(state)
        for key, tensor in state.items():
            assert torch.equal(back[key], tensor), key
        # and written by us, read by transformers
        out = tmp_path / f"ours-{folder.name}"
        out.mkdir()
        hf_format.write_weights(out, back, shard_bytes=60_000)
        (out / "config.json").write_text(json.dumps(hf_format.hf_config(cfg)))
        again = ZayaForCausalLM.from_pretrained(out).eval()
        with torch.no_grad():
            torch.testing.assert_close(again(x, use_cache=False).logits, expected, rtol=1e-5, atol=1e-5)


def test_zaya1_base_parameter_counts_equal_transformers():
    cfg = load_config(["model=zaya1_base"]).model
    config = {k: v for k, v in hf_format.hf_config(cfg).items() if k not in ("model_type", "architectures")}
    with torch.device("meta"):
        theirs = ZayaForCausalLM(ZayaConfig(**config))
    total = sum(p.numel() for p in theirs.parameters())  # the tied head once
    embedding = theirs.model.embed_tokens.weight.numel()
    assert total == num_params(cfg) == 8_840_488_784
    assert total - embedding == num_params(cfg, include_embedding=False) == 8_303_355_728
    experts = sum(p.numel() for n, p in theirs.named_parameters() if ".experts." in n)
    active_non_embedding = total - embedding - experts + experts // cfg.moe.num_experts
    assert active_non_embedding == num_active_params(cfg, include_embedding=False) == 753_608_528


def test_our_defaults_for_missing_keys_are_transformers_own():
    defaults = ZayaConfig()
    for key, value in hf_format.HF_DEFAULTS.items():
        if key == "layer_types":
            assert defaults.layer_types == ["hybrid"] * defaults.num_hidden_layers
        else:
            assert getattr(defaults, key) == value, key


@pytest.mark.parametrize(
    "change, key",
    [
        ({"layer_types": ["hybrid", "hybrid_sliding", "hybrid"], "sliding_window": 8}, "layer_types"),
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"hybrid": {"rope_type": "yarn", "rope_theta": 1e4}}}, "rope_type"),
        ({"model_type": "llama"}, "model_type"),
    ],
)
def test_what_we_cannot_represent_is_one_line_naming_the_key(change, key):
    config = {**hf_format.hf_config(zaya_config()), **change}
    with pytest.raises(DataError, match=key) as info:
        hf_format.model_config_from_hf(config, "x/config.json")
    assert "\n" not in str(info.value) and str(info.value).startswith("x/config.json")
