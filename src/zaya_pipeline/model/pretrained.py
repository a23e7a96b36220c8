"""Weights to start training from (``train.init_from``): a ``model.pt`` or a transformers ``zaya`` folder.

The config that trains them must describe the same network: every ``model.*`` key must equal the weights'
except those that leave the weights' meaning alone (``FREE_KEYS``: training knobs such as the router's gains
and loss weights, the expert backend, the context length and RoPE base of a context extension).
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.hf_config import is_hf_folder, read_config

# model.* keys that may differ between the weights and the config that trains them (dotted, under model.)
FREE_KEYS = frozenset(
    {
        "name",
        "init_std",
        "moe_out_scale_init",
        "max_seq_len",
        "attention.rope_theta",
        "moe.expert_backend",
        "moe.capacity_factor",
        "moe.skip_bias_init",
        "moe.router.aux_loss_coef",
        "moe.router.z_loss_coef",
        "moe.router.bias_p_gain",
        "moe.router.bias_i_gain",
        "moe.router.eda_init",
        "moe.router.mlp_init_std",
    }
)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[prefix + key] = value
    return out


def architecture_differences(weights: ModelConfig, config: ModelConfig) -> list[tuple[str, object, object]]:
    """(key, the weights' value, the config's value) for every model.* key outside FREE_KEYS that differs."""
    a, b = _flat(asdict(weights)), _flat(asdict(config))
    return [(k, a[k], b[k]) for k in sorted(a) if k not in FREE_KEYS and a[k] != b.get(k)]


def init_config(path: Path) -> ModelConfig:
    """The model config of ``path`` (a model.pt or a transformers ``zaya`` folder), weights not read."""
    from zaya_pipeline.model.hf_format import model_config_from_hf
    from zaya_pipeline.model.saved_model import read_model_file

    if path.is_dir():
        if not is_hf_folder(path):
            raise ConfigError(f"train.init_from: {path} is neither a model.pt nor a transformers zaya folder")
        return model_config_from_hf(read_config(path), str(path / "config.json"))
    if not path.is_file():
        raise ConfigError(f"train.init_from: {path} does not exist")
    return read_model_file(path, weights=False)[0]


def check_init(path: Path, model: ModelConfig) -> None:
    """``model`` (the resolved model config) can take the weights at ``path``; else one line naming the
    first key that differs."""
    differences = architecture_differences(init_config(path), model)
    if differences:
        key, theirs, ours = differences[0]
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise ConfigError(
            f"train.init_from: {path} has model.{key}={theirs!r}, the config model.{key}={ours!r}{more}; "
            "pick the model preset of those weights (e.g. model=zaya1_base)"
        )


def init_state(path: Path) -> dict:
    """The state dict at ``path`` (after ``check_init``)."""
    from zaya_pipeline.model.hf_format import load_folder
    from zaya_pipeline.model.saved_model import read_model_file

    if path.is_dir():
        return load_folder(path)[1]
    return read_model_file(path)[1]
