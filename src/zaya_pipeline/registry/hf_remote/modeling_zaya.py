"""Hugging Face causal-LM wrapper of a zaya MoE model (copied into every ``zaya export`` folder as remote
code): ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` builds
``zaya_pipeline.model.transformer.ZayaLM`` from ``config.zaya`` and ``generate`` decodes with its own KV cache
(attention keys/values and, for CCA, the convolution state).

It imports ``zaya_pipeline`` (``pip install zaya_pipeline``): the model is the same code that trained it, not
a re-implementation. Batches must be unpadded (every row the same length).
"""

import torch
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from zaya_pipeline.model.attention import KVCache
from zaya_pipeline.model.saved_model import model_config_from_dict
from zaya_pipeline.model.transformer import ZayaLM

from .configuration_zaya import ZayaConfig


class ZayaForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = ZayaConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: ZayaConfig):
        super().__init__(config)
        self.model = ZayaLM(model_config_from_dict(config.zaya, "config.json: zaya"))
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # ZayaLM keeps its own cache (CCA also caches convolution inputs)

    def _init_weights(self, module) -> None:
        """Every weight comes from the checkpoint: nothing to initialise (ZayaLM keeps no derived tables)."""

    def get_input_embeddings(self):
        return self.model.embed

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool | None = None,
        labels: torch.LongTensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of every position; with ``use_cache`` the tokens continue ``cache`` (ZayaLM's own
        ``KVCache``, created on the first call) and the output carries it for the next step."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("zaya models take unpadded batches: every attention_mask entry must be 1")
        if not isinstance(cache, KVCache):
            cache = self.model.new_cache() if use_cache else None
        out = self.model(input_ids, cache=cache)
        loss = None
        if labels is not None:
            shifted = out.logits[:, :-1].reshape(-1, out.logits.shape[-1]).float()
            loss = torch.nn.functional.cross_entropy(shifted, labels[:, 1:].reshape(-1), ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=out.logits, cache=cache)

    def prepare_inputs_for_generation(self, input_ids, cache=None, attention_mask=None, **kwargs):
        """Only the tokens the cache has not seen (all of them on the first step)."""
        if isinstance(cache, KVCache) and cache.length:
            input_ids = input_ids[:, cache.length :]
        return {
            "input_ids": input_ids,
            "cache": cache,
            "attention_mask": attention_mask,
            "use_cache": kwargs.get("use_cache", True),
        }
