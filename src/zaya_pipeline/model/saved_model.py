"""``model.pt``: the model config and weights in one ``torch.save`` file, enough to rebuild ``ZayaLM``.

Format: ``{"format": 2, "model_config": dataclasses.asdict(ModelConfig), "state_dict": ZayaLM.state_dict()}``;
it loads with ``torch.load(weights_only=True)`` (plain types and tensors only).

Format 2 (2026-12): ``cca`` attention, the ``zaya1`` router and residual scaling compute transformers'
``Zaya`` function (docs/adr/0010). A format-1 file (no ``format`` key) that uses none of the three loads as
before (GQA attention and the linear router did not change); one that uses any of them is refused with one
line, since its weights mean something else now.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import asdict, fields, is_dataclass
from pathlib import Path
from typing import get_type_hints

import torch

from zaya_pipeline.config import ModelConfig
from zaya_pipeline.errors import DataError, first_line
from zaya_pipeline.model.transformer import ZayaLM

FORMAT = 2


def upgrade_config(d: dict, origin: str) -> dict:
    """A model config dict of any format as format 2 (see the module docstring); refuses what cannot be."""
    attention = d.get("attention") or {}
    if "conv_kernel" not in attention:
        return d
    router = (d.get("moe") or {}).get("router") or {}
    changed = [
        key
        for key, used in (
            ("model.attention.type=cca", attention.get("type") == "cca"),
            ("model.moe.router.type=zaya1", router.get("type") == "zaya1"),
            ("model.residual_scaling=true", bool(d.get("residual_scaling"))),
        )
        if used
    ]
    if changed:
        raise DataError(
            f"{origin}: saved by zaya_pipeline before its {changed[0]} became transformers' Zaya function "
            "(docs/adr/0010-zaya-exact.md); retrain the model, or use the version that trained it"
        )
    return {**d, "attention": {k: v for k, v in attention.items() if k != "conv_kernel"}}


def model_config_from_dict(d: dict, origin: str) -> ModelConfig:
    """Rebuild the nested ``ModelConfig``; a key the schema does not know is an error naming ``origin``."""

    def build(cls, values: dict, prefix: str):
        hints = get_type_hints(cls)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise DataError(f"{origin}: unknown model config keys {[prefix + k for k in unknown]}")
        nested = {
            k: build(hints[k], v, f"{prefix}{k}.")
            for k, v in values.items()
            if is_dataclass(hints[k]) and isinstance(v, dict)
        }
        return cls(**{**values, **nested})

    return build(ModelConfig, upgrade_config(d, origin), "model.")


def save_model(path: str | Path, model: ZayaLM, model_cfg: ModelConfig, state: dict | None = None) -> Path:
    """Write atomically (temp file + rename): a crash never leaves a truncated model.pt. ``state`` (a full
    state dict, e.g. ``distributed.state.full_state_dict``) replaces ``model.state_dict()`` when given."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if state is None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        torch.save({"format": FORMAT, "model_config": asdict(model_cfg), "state_dict": state}, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def read_model_file(path: str | Path, weights: bool = True) -> tuple[ModelConfig, dict | None]:
    """The config and (``weights``) the state dict of a ``model.pt``; ``weights=False`` maps the file
    without reading its tensors. Anything that is not one is one line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path} is missing: run the train stage first (zaya train)")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=not weights)
        cfg = model_config_from_dict(ckpt["model_config"], str(path))
        return cfg, ckpt["state_dict"] if weights else None
    except pickle.UnpicklingError:  # torch's message would suggest weights_only=False: never do that here
        raise DataError(
            f"{path} holds pickled objects that are not a config and tensors: refused to load it "
            "(it would run code); it is not a model.pt this pipeline wrote"
        ) from None
    except (KeyError, TypeError, RuntimeError, EOFError) as exc:
        raise DataError(f"{path} is not a zaya model checkpoint: {first_line(exc)}") from None


def non_finite(state: dict) -> list[str]:
    """The names of the floating-point tensors of ``state`` that hold a NaN or an infinity."""
    return [k for k, v in state.items() if torch.is_floating_point(v) and not bool(torch.isfinite(v).all())]


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[ZayaLM, ModelConfig]:
    """The saved model in eval mode on ``map_location``, and its config. Weights holding NaN or Inf (a
    diverged run saved by an older version) are refused with one line: nothing downstream can use them."""
    cfg, state = read_model_file(path)
    if bad := non_finite(state):
        raise DataError(
            f"{path} holds NaN or Inf weights ({len(bad)} tensors, e.g. {bad[0]}): the run that wrote it "
            "diverged; train again (e.g. a lower train.optim.lr)"
        )
    model = ZayaLM(cfg)
    model.load_state_dict(state)
    return model.to(map_location).eval(), cfg


def save_safetensors(model_pt: str | Path, out_dir: str | Path) -> tuple[Path, Path]:
    """``model.safetensors`` (the state dict; a tied weight stored once) and ``model_config.json`` from a
    ``model.pt``: the native weights in a format any framework reads without unpickling."""
    import json
    from dataclasses import asdict

    from safetensors.torch import save_model as save_st

    model, cfg = load_model(model_pt)
    out_dir = Path(out_dir)
    weights, config = out_dir / "model.safetensors", out_dir / "model_config.json"
    save_st(model, str(weights))
    config.write_text(json.dumps(asdict(cfg), indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return weights, config


def load_safetensors(weights: str | Path, config: str | Path) -> tuple[ZayaLM, ModelConfig]:
    """The model written by :func:`save_safetensors`, in eval mode on the CPU."""
    import json

    from safetensors.torch import load_model as load_st

    cfg = model_config_from_dict(json.loads(Path(config).read_text()), str(config))
    model = ZayaLM(cfg)
    load_st(model, str(weights))
    return model.eval(), cfg
