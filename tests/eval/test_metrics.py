"""Held-out loss / perplexity / bits-per-byte on small hand-made models whose answers are known."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from zaya_pipeline.data.loader import PackedDataset
from zaya_pipeline.eval.metrics import evaluate_lm


class Uniform(nn.Module):
    """Equal logits for every token: the loss is ln V whatever the data."""

    def __init__(self, vocab: int):
        super().__init__()
        self.vocab = vocab
        self.batch_shapes: list[tuple[int, int]] = []
        self.modes: list[bool] = []

    def forward(self, input_ids_BT):
        self.batch_shapes.append(tuple(input_ids_BT.shape))
        self.modes.append(self.training)
        return torch.zeros(*input_ids_BT.shape, self.vocab)


class Bigram(nn.Module):
    """Logits of the next token depend only on the current one, from a fixed table; returns an object with
    ``.logits`` like ZayaLM's LMOutput."""

    def __init__(self, table_VV: torch.Tensor):
        super().__init__()
        self.table_VV = table_VV

    def forward(self, input_ids_BT):
        return SimpleNamespace(logits=self.table_VV[input_ids_BT], aux_loss=torch.tensor(0.0))


def test_uniform_model_scores_ln_v_and_bpb_from_byte_counts():
    V = 11
    tokens = np.random.default_rng(0).integers(0, V, size=4 * 8 + 1).astype(np.uint16)
    byte_lengths = np.array([0, 1, 1, 2, 3, 1, 4, 1, 1, 2, 1])  # id 0 plays EOS: 0 bytes
    res = evaluate_lm(Uniform(V), PackedDataset(tokens, 8), byte_lengths, batch_size=3)
    labels = tokens[1:]
    assert res.tokens == 32 and res.windows == 4
    assert res.bytes == int(byte_lengths[labels].sum())
    assert res.loss == pytest.approx(math.log(V), rel=1e-6)
    assert res.perplexity == pytest.approx(V, rel=1e-5)
    assert res.bits_per_byte == pytest.approx(math.log(V) / math.log(2) * res.tokens / res.bytes, rel=1e-6)


def test_bigram_table_log_likelihood_matches_a_hand_computation():
    table = [[2.0, 0.0, -1.0], [0.5, 0.5, 3.0], [-2.0, 1.0, 0.0]]
    stream = [0, 2, 1, 1, 0, 0, 2, 2, 1]  # two windows of 4 (the 9th token is the last label)

    def nll(prev: int, nxt: int) -> float:
        row = table[prev]
        return -(row[nxt] - math.log(sum(math.exp(x) for x in row)))

    expected = sum(nll(a, b) for a, b in zip(stream[:-1], stream[1:], strict=True))
    res = evaluate_lm(
        Bigram(torch.tensor(table)), PackedDataset(np.array(stream), 4), np.array([1, 2, 3]), batch_size=1
    )
    assert res.tokens == 8
    assert res.nats == pytest.approx(expected, rel=1e-6)
    assert res.loss == pytest.approx(expected / 8, rel=1e-6)
    assert res.bytes == sum([1, 2, 3][b] for b in stream[1:])


def test_max_batches_limits_the_scored_windows_and_zero_means_all():
    tokens = np.arange(10 * 4 + 1) % 5
    data = PackedDataset(tokens, 4)
    model = Uniform(5)
    res = evaluate_lm(model, data, np.ones(5, dtype=np.int64), batch_size=3, max_batches=2)
    assert model.batch_shapes == [(3, 4), (3, 4)]
    assert (res.windows, res.tokens, res.bytes) == (6, 24, 24)
    model.batch_shapes.clear()
    res = evaluate_lm(model, data, np.ones(5, dtype=np.int64), batch_size=3, max_batches=0)
    assert model.batch_shapes == [(3, 4), (3, 4), (3, 4), (1, 4)]
    assert res.windows == 10


def test_windows_are_scored_in_stream_order_without_overlap():
    seen: list[torch.Tensor] = []

    class Recorder(Uniform):
        def forward(self, input_ids_BT):
            seen.append(input_ids_BT.clone())
            return super().forward(input_ids_BT)

    tokens = np.arange(3 * 5 + 3)  # a tail of 2 tokens that fits no window
    evaluate_lm(Recorder(20), PackedDataset(tokens, 5), np.ones(20, dtype=np.int64), batch_size=2)
    assert torch.cat(seen).flatten().tolist() == list(range(15))


def test_model_runs_in_eval_mode_without_grad_and_gets_its_mode_back():
    class GradProbe(Uniform):
        def forward(self, input_ids_BT):
            assert not torch.is_grad_enabled()
            return super().forward(input_ids_BT)

    model = GradProbe(4).train()
    evaluate_lm(model, PackedDataset(np.arange(9) % 4, 4), np.ones(4, dtype=np.int64), batch_size=4)
    assert model.modes == [False] and model.training
