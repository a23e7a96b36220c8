"""transformers' ``zaya`` format (``ZayaForCausalLM``, transformers >= 5.25): config and weights in and out.

Our ``cca`` attention, ``zaya1`` router, skip expert and residual scaling compute the function of
transformers' ``Zaya`` (docs/adr/0010), so a model that uses all four, top-1, converts both ways:

* ``hf_config(cfg)`` / ``model_config_from_hf(config)``: config.json <-> ``ModelConfig``. Every key that
  describes the architecture is mapped; one we cannot represent (sliding-window layers, attention or
  lm-head biases, another activation, rope scaling, top-k > 1) is refused with one line naming it.
* ``to_hf_state`` / ``from_hf_state``: state dicts, tensor for tensor (q/k/v split out of our fused
  projection, the expert matrices transposed to transformers' ``[E, out, in]``).
* ``read_folder`` / ``write_weights``: the safetensors files of a folder (one file, or shards with
  ``model.safetensors.index.json``). Nothing else is read: loading runs no code.

No transformers import: the defaults a saved config.json may leave out are in ``zaya_pipeline.hf_config``.

Shape legend:
    E  experts    D  model width    F  expert hidden width    H  query heads    G  key/value heads
    Hd  head width    R  router width
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from zaya_pipeline.config import ModelConfig, MoEConfig, RouterConfig
from zaya_pipeline.errors import DataError
from zaya_pipeline.hf_config import HF_DEFAULTS, MODEL_TYPE, read_config
from zaya_pipeline.model.attention import head_dims, rotary_dim

ARCHITECTURE = "ZayaForCausalLM"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
SHARD_BYTES = 5 * 2**30  # transformers' default max_shard_size (5 GB)


def unsupported(cfg: ModelConfig) -> str | None:
    """Why transformers' ``Zaya`` cannot express ``cfg`` (the first reason, naming the key), or None."""
    a, m = cfg.attention, cfg.moe
    H, _, Hd = head_dims(cfg)
    checks = [
        (a.type == "cca", f"model.attention.type={a.type!r} (transformers' Zaya has CCA attention only)"),
        (m.router.type == "zaya1", f"model.moe.router.type={m.router.type!r} (Zaya has the ZAYA1 router)"),
        (m.skip_expert, "model.moe.skip_expert=false (Zaya always has the skip expert)"),
        (m.top_k == 1, f"model.moe.top_k={m.top_k} (Zaya routes top-1)"),
        (m.shared_expert_hidden == 0, "model.moe.shared_expert_hidden > 0 (Zaya has no shared expert)"),
        (
            int(Hd * _rotary_factor(cfg)) == rotary_dim(cfg),
            f"model.attention.rope_fraction={a.rope_fraction}",
        ),
    ]
    return next((why for ok, why in checks if not ok), None)


def _rotary_factor(cfg: ModelConfig) -> float:
    """partial_rotary_factor for config.json: transformers rotates int(Hd * factor) channels, we an even
    number; the configured fraction when the two agree, else the exact share."""
    Hd, rot = head_dims(cfg)[2], rotary_dim(cfg)
    return cfg.attention.rope_fraction if int(Hd * cfg.attention.rope_fraction) == rot else rot / Hd


def hf_config(cfg: ModelConfig, special_ids: dict | None = None) -> dict:
    """config.json of ``cfg`` in transformers' ``zaya`` format (``unsupported(cfg)`` must be None)."""
    why = unsupported(cfg)
    if why:
        raise ValueError(f"not expressible as transformers' zaya: {why}")
    H, G, Hd = head_dims(cfg)
    a = cfg.attention
    return {
        "model_type": MODEL_TYPE,
        "architectures": [ARCHITECTURE],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": H,
        "num_key_value_heads": G,
        "head_dim": Hd,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "rope_parameters": {
            "hybrid": {
                "rope_type": "default",
                "rope_theta": a.rope_theta,
                "partial_rotary_factor": _rotary_factor(cfg),
            }
        },
        "layer_types": ["hybrid"] * cfg.n_layers,
        "sliding_window": None,
        "attention_dropout": 0.0,
        "attention_bias": False,
        "lm_head_bias": False,
        "moe_intermediate_size": cfg.moe.expert_hidden,
        "num_experts": cfg.moe.num_experts,
        "num_experts_per_tok": 1,
        "router_hidden_size": cfg.moe.router.dim,
        "cca_time0": a.conv_kernel_depthwise,
        "cca_time1": a.conv_kernel_grouped,
        "use_cache": True,
        "dtype": "float32",
        **(special_ids or {}),
    }


def _refuse(origin: str, key: str, value, why: str) -> DataError:
    return DataError(f"{origin}: {key}={value!r} cannot be represented: {why}")


def model_config_from_hf(config: dict, origin: str, base: ModelConfig | None = None) -> ModelConfig:
    """Our ``ModelConfig`` for a transformers ``zaya`` config.json (a dict). The architecture comes from
    ``config``; what config.json does not describe (training knobs: router gains, loss weights, the expert
    backend) from ``base`` (default: transformers' init and ZAYA1's aux-loss-free router with gain 0.01)."""
    if config.get("model_type") != MODEL_TYPE:
        raise DataError(f"{origin}: model_type is {config.get('model_type')!r}, not {MODEL_TYPE!r}")
    c = {**HF_DEFAULTS, **config}
    L = int(c["num_hidden_layers"])
    layer_types = c["layer_types"] or ["hybrid"] * L
    fixed = {
        "hidden_act": ("silu", "our experts are SwiGLU (silu)"),
        "attention_bias": (False, "our attention projections have no biases"),
        "lm_head_bias": (False, "our output projection has no bias"),
        "num_experts_per_tok": (1, "transformers' Zaya routes top-1"),
        "attention_dropout": (0.0, "our attention has no dropout"),
    }
    for key, (want, why) in fixed.items():
        if c[key] != want:
            raise _refuse(origin, key, c[key], why)
    if any(t != "hybrid" for t in layer_types) or len(layer_types) != L:
        why = "only full-attention ('hybrid') layers, one per layer"
        raise _refuse(origin, "layer_types", layer_types, why)
    rope = (c["rope_parameters"] or {}).get("hybrid") or {}
    if rope.get("rope_type", "default") != "default":
        raise _refuse(origin, "rope_parameters.hybrid.rope_type", rope.get("rope_type"), "plain RoPE only")
    Hd = int(c["head_dim"])
    factor = float(rope.get("partial_rotary_factor", 1.0))
    if int(Hd * factor) % 2:
        raise _refuse(origin, "rope_parameters.hybrid.partial_rotary_factor", factor, "odd rotated width")
    # not the tiny default's tuned init: transformers' (scales 1, init_std everywhere) and ZAYA1's router gain
    base = base or ModelConfig(moe_out_scale_init=1.0, moe=MoEConfig(router=RouterConfig(aux_loss_coef=0.0)))
    attention = replace(
        base.attention,
        type="cca",
        n_heads=int(c["num_attention_heads"]),
        n_kv_heads=int(c["num_key_value_heads"]),
        head_dim=Hd,
        rope_fraction=factor,
        rope_theta=float(rope.get("rope_theta", HF_DEFAULTS["rope_parameters"]["hybrid"]["rope_theta"])),
        conv_kernel_depthwise=int(c["cca_time0"]),
        conv_kernel_grouped=int(c["cca_time1"]),
    )
    router = replace(base.moe.router, type="zaya1", dim=int(c["router_hidden_size"]), eda=True)
    moe = replace(
        base.moe,
        num_experts=int(c["num_experts"]),
        top_k=1,
        expert_hidden=int(c["moe_intermediate_size"]),
        skip_expert=True,
        shared_expert_hidden=0,
        router=router,
    )
    return replace(
        base,
        name=str(config.get("_name_or_path") or base.name or "zaya"),
        vocab_size=int(c["vocab_size"]),
        d_model=int(c["hidden_size"]),
        n_layers=L,
        max_seq_len=int(c["max_position_embeddings"]),
        norm_eps=float(c["rms_norm_eps"]),
        init_std=float(c["initializer_range"]),
        tie_embeddings=bool(c["tie_word_embeddings"]),
        residual_scaling=True,
        attention=attention,
        moe=moe,
    )


def _layer_names(i: int) -> dict[str, str]:
    """Our name -> transformers' name for the tensors of layer ``i`` that map one to one."""
    ours, hf = f"blocks.{i}.", f"model.layers.{i}."
    proj, gate = hf + "self_attn.qkv_proj.", hf + "mlp.gate."
    pairs = {
        "attn_norm.weight": hf + "input_layernorm.weight",
        "attn.conv_depthwise.weight": proj + "conv_qk_depthwise.weight",
        "attn.conv_depthwise.bias": proj + "conv_qk_depthwise.bias",
        "attn.conv_grouped.weight": proj + "conv_qk_grouped.weight",
        "attn.conv_grouped.bias": proj + "conv_qk_grouped.bias",
        "attn.temperature_G": hf + "self_attn.qk_norm.temp",
        "attn.out.weight": hf + "self_attn.o_proj.weight",
        "moe_norm.weight": hf + "post_attention_layernorm.weight",
        "moe.router.down.weight": gate + "down_proj.weight",
        "moe.router.down.bias": gate + "down_proj.bias",
        "moe.router.norm.weight": gate + "router_mlp.norm.weight",
        "moe.router.mlp.0.weight": gate + "router_mlp.fc1.weight",
        "moe.router.mlp.0.bias": gate + "router_mlp.fc1.bias",
        "moe.router.mlp.2.weight": gate + "router_mlp.fc2.weight",
        "moe.router.mlp.2.bias": gate + "router_mlp.fc2.bias",
        "moe.router.mlp.4.weight": gate + "router_mlp.out_proj.weight",
    }
    adds = (("attn_add", "post_attention_residual_scale"), ("moe_add", "post_mlp_residual_scale"))
    for ours_add, hf_add in adds:
        for a, b in (("res_scale_D", "residual_scale"), ("res_bias_D", "residual_bias")):
            pairs[f"{ours_add}.{a}"] = f"{hf}{hf_add}.{b}"
        for a, b in (("out_scale_D", "hidden_states_scale"), ("out_bias_D", "hidden_states_bias")):
            pairs[f"{ours_add}.{a}"] = f"{hf}{hf_add}.{b}"
    return {ours + k: v for k, v in pairs.items()}


def _qkv_split(cfg: ModelConfig) -> tuple[tuple[str, ...], tuple[int, ...]]:
    H, G, Hd = head_dims(cfg)
    names = ("q_proj", "k_proj", "v_proj_current", "v_proj_delayed")
    return names, (H * Hd, G * Hd, G * Hd // 2, G * Hd // 2)


def to_hf_state(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """transformers' state dict for our ``ZayaLM.state_dict()`` (``unsupported(cfg)`` must be None).

    A model without residual scaling gets scales 1 and biases 0, one without EDA scales 0: the same
    function. The balancing biases are shifted so that the skip expert's is -1: transformers' loader sets
    that entry to -1 whatever the file holds, and a constant shift of every bias leaves routing unchanged."""
    D, R, L = cfg.d_model, cfg.moe.router.dim, cfg.n_layers
    ones, zeros = torch.ones(D), torch.zeros(D)
    out = {"model.embed_tokens.weight": state["embed.weight"]}
    out["model.norm.weight"] = state["final_norm.weight"]
    out["model.input_hidden_states_scale"] = state.get("input_scale_D", ones)
    out["model.input_hidden_states_bias"] = state.get("input_bias_D", zeros)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = state["lm_head.weight"]
    names, sizes = _qkv_split(cfg)
    for i in range(L):
        ours, hf = f"blocks.{i}.", f"model.layers.{i}."
        for name, hf_name in _layer_names(i).items():
            default = ones if name.endswith("scale_D") else zeros
            out[hf_name] = state[name] if name in state or not name.endswith("_D") else default
        for name, w in zip(names, state[ours + "attn.qkv.weight"].split(sizes), strict=True):
            out[f"{hf}self_attn.qkv_proj.{name}.weight"] = w
        if i > 0:
            eda_R = state.get(ours + "moe.router.eda_scale_R", torch.zeros(R))  # no EDA = scale 0
            out[hf + "mlp.gate.router_states_scale"] = eda_R
        bias_E = state[ours + "moe.router.expert_bias_E"].float()
        hf_bias_E = bias_E - (bias_E[-1] + 1.0)  # the same choices with the skip bias at transformers' -1
        hf_bias_E[-1] = -1.0  # exactly, whatever the rounding: a re-export of an import is bit-identical
        out[hf + "mlp.gate.balancing_biases"] = hf_bias_E
        out[hf + "mlp.experts.gate_up_proj"] = state[ours + "moe.experts.w_gate_up_EDF2"].transpose(1, 2)
        out[hf + "mlp.experts.down_proj"] = state[ours + "moe.experts.w_down_EFD"].transpose(1, 2)
    return {k: v.contiguous() for k, v in out.items()}


def from_hf_state(hf: dict[str, torch.Tensor], cfg: ModelConfig, origin: str) -> dict[str, torch.Tensor]:
    """Our state dict for transformers' (``cfg`` from ``model_config_from_hf``). Every tensor of ``hf`` is
    used and every one we need is there, else one line names the first missing or unexpected key."""
    hf = dict(hf)
    out: dict[str, torch.Tensor] = {}

    def take(key: str) -> torch.Tensor:
        if key not in hf:
            raise DataError(f"{origin}: the weights lack {key}")
        return hf.pop(key)

    out["embed.weight"] = take("model.embed_tokens.weight")
    out["final_norm.weight"] = take("model.norm.weight")
    out["input_scale_D"] = take("model.input_hidden_states_scale")
    out["input_bias_D"] = take("model.input_hidden_states_bias")
    if cfg.tie_embeddings:
        hf.pop("lm_head.weight", None)  # a tied copy, if the writer stored one
    else:
        out["lm_head.weight"] = take("lm_head.weight")
    names, _ = _qkv_split(cfg)
    for i in range(cfg.n_layers):
        ours, hfp = f"blocks.{i}.", f"model.layers.{i}."
        for name, hf_name in _layer_names(i).items():
            out[name] = take(hf_name)
        qkv = [take(f"{hfp}self_attn.qkv_proj.{n}.weight") for n in names]
        out[ours + "attn.qkv.weight"] = torch.cat(qkv)
        if i > 0:
            out[ours + "moe.router.eda_scale_R"] = take(hfp + "mlp.gate.router_states_scale")
        bias_E = take(hfp + "mlp.gate.balancing_biases").float()
        out[ours + "moe.router.expert_bias_E"] = bias_E
        out[ours + "moe.router.load_error_integral_E"] = torch.zeros_like(bias_E)
        out[ours + "moe.experts.w_gate_up_EDF2"] = take(hfp + "mlp.experts.gate_up_proj").transpose(1, 2)
        out[ours + "moe.experts.w_down_EFD"] = take(hfp + "mlp.experts.down_proj").transpose(1, 2)
    if hf:
        raise DataError(f"{origin}: unexpected weights, e.g. {sorted(hf)[0]} ({len(hf)} in all)")
    return {k: v.contiguous() for k, v in out.items()}


def read_folder(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """config.json and every tensor of a transformers folder: ``model.safetensors``, or the shards that
    ``model.safetensors.index.json`` lists. Pickled weights (``*.bin``) are refused, never read."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = read_config(folder)
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"{index}: not a safetensors index ({exc})") from None
    elif (folder / WEIGHTS).is_file():
        files = [WEIGHTS]
    else:
        pickled = sorted(p.name for p in folder.glob("*.bin"))
        why = f" ({pickled[0]} is a pickle: we load safetensors only)" if pickled else ""
        raise DataError(f"{folder}: no {WEIGHTS} or {WEIGHTS_INDEX}{why}")
    state: dict[str, torch.Tensor] = {}
    for name in files:
        path = folder / name
        if Path(name).name != name or not path.is_file():
            raise DataError(f"{index}: shard {name!r} is not a file in {folder}")
        try:
            state.update(load_file(str(path)))
        except (SafetensorError, OSError) as exc:
            raise DataError(f"{path}: not a safetensors file ({exc})") from None
    return config, state


def write_weights(folder: Path, state: dict[str, torch.Tensor], shard_bytes: int = SHARD_BYTES) -> list[str]:
    """``state`` as ``model.safetensors``, or as shards with an index when it is bigger than ``shard_bytes``
    (transformers' layout: ``model-00001-of-0000N.safetensors``); returns the file names."""
    from safetensors.torch import save_file

    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(state):
        nbytes = state[key].numel() * state[key].element_size()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][key] = state[key]
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(folder / WEIGHTS), metadata={"format": "pt"})
        return [WEIGHTS]
    n = len(shards)
    names = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    for name, shard in zip(names, shards, strict=True):
        save_file(shard, str(folder / name), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in state.values())
    weight_map = {key: name for name, shard in zip(names, shards, strict=True) for key in shard}
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / WEIGHTS_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return [*names, WEIGHTS_INDEX]


def load_folder(folder: Path, base: ModelConfig | None = None) -> tuple[ModelConfig, dict, dict]:
    """(ModelConfig, our state dict, config.json) of a transformers ``zaya`` folder, the weights checked
    against the model the config describes (every tensor there, with its shape). ``base``: as in
    ``model_config_from_hf``."""
    from zaya_pipeline.model.transformer import ZayaLM

    config, hf_state = read_folder(folder)
    cfg = model_config_from_hf(config, str(folder / "config.json"), base)
    state = from_hf_state(hf_state, cfg, str(folder))
    with torch.device("meta"):
        expected = ZayaLM(cfg).state_dict()
    for key, want in expected.items():
        got = state.get(key)
        if got is None:
            raise DataError(f"{folder}: nothing in its weights maps to our {key}")
        if tuple(got.shape) != tuple(want.shape):
            raise DataError(
                f"{folder}: {key} has shape {tuple(got.shape)}, config.json says {tuple(want.shape)}"
            )
    return cfg, state, config
