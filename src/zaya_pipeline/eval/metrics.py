"""Held-out loss, perplexity and bits-per-byte of a causal LM over fixed token windows.

Shape suffixes: B batch, T time (tokens), V vocabulary.

* loss = Σ nats / scored tokens (the mean next-token negative log-likelihood), perplexity = exp(loss);
* bits-per-byte = Σ nats / ln 2 / Σ bytes of the scored target tokens, with the byte length of each token id
  from ``token_bytes``. EOS targets add their nats but no bytes: predicting a document end is part of
  modelling the text, and every tokenizer pays for it the same way.

Works with any ``torch.nn.Module`` whose forward maps ``input_ids_BT`` to logits ``(B, T, V)`` or to an object
with a ``.logits`` attribute.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from zaya_pipeline.progress import Progress
from zaya_pipeline.utils import get_logger

log = get_logger("eval")


@dataclass(frozen=True)
class EvalResult:
    nats: float  # summed negative log-likelihood of the scored tokens (natural log)
    tokens: int  # scored target tokens
    bytes: int  # text bytes those targets stand for
    windows: int  # sequences scored

    @property
    def loss(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes if self.bytes else math.nan


def logits_of(output) -> torch.Tensor:
    """The ``(B, T, V)`` logits of a model output: the tensor itself or its ``.logits``."""
    return output if isinstance(output, torch.Tensor) else output.logits


def batch_nll(model: torch.nn.Module, input_ids_BT: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood ``(B, T)``, log-softmax in fp32 whatever the model's dtype."""
    logits_BTV = logits_of(model(input_ids_BT))
    assert logits_BTV.shape[:2] == labels_BT.shape, (logits_BTV.shape, labels_BT.shape)
    nll = F.cross_entropy(logits_BTV.float().flatten(0, 1), labels_BT.flatten(), reduction="none")
    return nll.view_as(labels_BT)


def _num_batches(n: int, batch_size: int, max_batches: int) -> int:
    num = -(-n // batch_size)
    return min(num, max_batches) if max_batches > 0 else num


def _batches(dataset: Sequence[dict], batch_size: int, max_batches: int):
    n = len(dataset)
    for b in range(_num_batches(n, batch_size, max_batches)):
        items = [dataset[i] for i in range(b * batch_size, min(n, (b + 1) * batch_size))]
        yield torch.stack([x["input_ids"] for x in items]), torch.stack([x["labels"] for x in items])


def evaluate_lm(
    model: torch.nn.Module,
    dataset: Sequence[dict],
    byte_lengths_V: np.ndarray,
    batch_size: int,
    max_batches: int = 0,
    device: str | torch.device = "cpu",
    log_every_s: float = 30.0,
) -> EvalResult:
    """Score ``dataset`` (items ``{"input_ids": (T,), "labels": (T,)}``, e.g. a ``PackedDataset``) in order.

    ``max_batches`` 0 scores every window. The model is put in eval mode and given back in its former mode.
    Progress: a bar on a terminal, else a log line every ``log_every_s`` seconds and at the end.
    """
    assert batch_size > 0
    lengths_V = torch.as_tensor(np.asarray(byte_lengths_V), dtype=torch.int64, device=device)
    was_training = model.training
    model.eval()
    nats, tokens, nbytes, windows = 0.0, 0, 0, 0
    num = _num_batches(len(dataset), batch_size, max_batches)
    try:
        with torch.no_grad(), Progress(num, "held-out", "batch", logger=log, every_s=log_every_s) as bar:
            for input_ids_BT, labels_BT in _batches(dataset, batch_size, max_batches):
                input_ids_BT, labels_BT = input_ids_BT.to(device), labels_BT.to(device)
                nll_BT = batch_nll(model, input_ids_BT, labels_BT)
                nats += nll_BT.double().sum().item()
                tokens += labels_BT.numel()
                nbytes += int(lengths_V[labels_BT].sum().item())
                windows += labels_BT.shape[0]
                bar.update(1, tokens=tokens, loss=f"{nats / tokens:.4f}")
    finally:
        model.train(was_training)
    return EvalResult(nats=nats, tokens=tokens, bytes=nbytes, windows=windows)
