"""``ZayaGenerator`` in-process: input forms, params, sampling, EOS handling."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
import torch

from conftest import workspace_generator
from zaya_pipeline.model.attention import KVCache
from zaya_pipeline.registry.pyfunc import ZayaGenerator, prompts_of


@pytest.fixture(scope="module")
def generator(workspace) -> ZayaGenerator:
    return workspace_generator(workspace)


def test_prompts_come_from_every_input_form():
    assert prompts_of(pd.DataFrame({"prompt": ["a", "b"]})) == ["a", "b"]
    assert prompts_of(pd.DataFrame({0: ["a"]})) == ["a"]  # a list after MLflow's schema enforcement
    assert prompts_of(pd.DataFrame({"prompt": [["a", "b"]]})) == ["a", "b"]  # {"prompt": [...]} enforced
    assert prompts_of(["a", "b"]) == ["a", "b"] and prompts_of("a") == ["a"]
    assert prompts_of({"prompt": ["a"]}) == ["a"]
    with pytest.raises(ValueError, match="'prompt' column"):
        prompts_of(pd.DataFrame({"x": ["a"], "y": ["b"]}))
    with pytest.raises(ValueError, match="strings"):
        prompts_of([1, 2])


def test_greedy_is_deterministic_and_sampling_follows_the_seed(generator):
    prompts = ["the café serves", "document 12:"]
    greedy = generator.predict(None, prompts, {"max_new_tokens": 5})
    assert greedy == generator.predict(None, prompts, {"max_new_tokens": 5, "seed": 7})
    sample = lambda seed: generator.predict(None, prompts, dict(max_new_tokens=5, temperature=1.5, seed=seed))
    assert sample(1) == sample(1)
    assert any(sample(s) != sample(1) for s in range(2, 6))
    assert generator.predict(None, ["x"], {"max_new_tokens": 0}) == [""]


def test_generation_stops_at_eos(generator, workspace):
    eos = workspace["eos"]

    class AlwaysEos(torch.nn.Module):
        cfg = SimpleNamespace(max_seq_len=32)

        def new_cache(self):
            return KVCache(0)

        def forward(self, input_ids_BT, cache=None):
            if cache is not None:
                cache.length += input_ids_BT.shape[1]
            logits = torch.zeros(*input_ids_BT.shape, 320)
            logits[..., eos] = 10.0
            return SimpleNamespace(logits=logits)

    gen = ZayaGenerator()
    gen.__dict__.update(generator.__dict__, model=AlwaysEos())
    assert gen.predict(None, ["the café"], {"max_new_tokens": 8}) == [""]


def test_bad_params_are_refused(generator):
    with pytest.raises(ValueError, match="max_new_tokens"):
        generator.predict(None, ["a"], {"max_new_tokens": -1})
    with pytest.raises(ValueError, match="unknown params"):
        generator.predict(None, ["a"], {"max_tokens": 3})
    with pytest.raises(ValueError, match="top_p"):
        generator.predict(None, ["a"], {"temperature": 1.0, "top_p": 0.0})
