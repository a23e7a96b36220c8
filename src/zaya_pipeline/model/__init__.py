"""Single-device MoE language model: attention, router, experts, transformer, parameter counts."""

from zaya_pipeline.model.generate import generate
from zaya_pipeline.model.saved_model import load_model, save_model
from zaya_pipeline.model.sizing import num_active_params, num_params
from zaya_pipeline.model.transformer import LMOutput, ZayaLM

__all__ = ["LMOutput", "ZayaLM", "generate", "load_model", "num_active_params", "num_params", "save_model"]
