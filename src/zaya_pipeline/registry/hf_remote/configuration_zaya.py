"""Hugging Face config of a zaya MoE model (copied into every ``zaya export`` folder as remote code).

``zaya`` holds the model's own config (``zaya_pipeline.config.ModelConfig`` as a dict); the standard fields
(``vocab_size``, ``max_position_embeddings``, the special token ids) are copies of what it says, for tools
that read them.
"""

from transformers import PretrainedConfig


class ZayaConfig(PretrainedConfig):
    model_type = "zaya_moe"

    def __init__(self, zaya: dict | None = None, **kwargs):
        self.zaya = dict(zaya or {})
        if self.zaya:
            kwargs.setdefault("vocab_size", self.zaya["vocab_size"])
            kwargs.setdefault("max_position_embeddings", self.zaya["max_seq_len"])
            kwargs.setdefault("hidden_size", self.zaya["d_model"])
            kwargs.setdefault("num_hidden_layers", self.zaya["n_layers"])
        kwargs.setdefault("tie_word_embeddings", False)  # a tied model shares one tensor inside ZayaLM itself
        super().__init__(**kwargs)
