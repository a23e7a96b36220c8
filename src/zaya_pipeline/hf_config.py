"""transformers' ``zaya`` config.json, read without torch or transformers: the base layer's part of the
format (``model/hf_format.py`` converts weights; the tokenizer stage reads a model folder's tokenizer).

``save_pretrained`` writes only the values that differ from the class defaults, so a reader needs them:
``HF_DEFAULTS`` are transformers 5.25's ``ZayaConfig`` defaults for the keys we read (a test compares them
with the class).
"""

from __future__ import annotations

import json
from pathlib import Path

from zaya_pipeline.errors import DataError

MODEL_TYPE = "zaya"

# transformers 5.25's ZayaConfig defaults for the keys we read (tests/model/test_hf_format.py checks them)
HF_DEFAULTS: dict = {
    "vocab_size": 262272,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 131072,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_parameters": {
        "hybrid": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.5},
        "hybrid_sliding": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5},
    },
    "layer_types": None,  # None = every layer "hybrid"
    "sliding_window": None,
    "attention_dropout": 0.0,
    "moe_intermediate_size": 2048,
    "num_experts_per_tok": 1,
    "num_experts": 16,
    "attention_bias": False,
    "lm_head_bias": False,
    "router_hidden_size": 256,
    "cca_time0": 2,
    "cca_time1": 2,
    "pad_token_id": 0,
    "bos_token_id": 2,
    "eos_token_id": 106,
}


def read_config(folder: Path) -> dict:
    """config.json of a transformers model folder, as a dict."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"{folder}: no config.json (expected a transformers model folder)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise DataError(f"{path}: not a JSON object")
    return config


def is_hf_folder(path: Path) -> bool:
    """A folder whose config.json says ``model_type: zaya``."""
    try:
        return read_config(path).get("model_type") == MODEL_TYPE
    except (DataError, OSError):
        return False


def hf_value(config: dict, key: str):
    """``config[key]``, or transformers' default when config.json leaves it out."""
    return config[key] if key in config else HF_DEFAULTS[key]
