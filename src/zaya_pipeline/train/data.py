"""Token shards as a LightningDataModule: the mixture stream to train on, a fixed sample to validate.

Training batches come from :class:`~zaya_pipeline.data.mixture.MixtureStream`: deterministic from the seed,
sharded over data-parallel ranks, sized by the batch ramp, and resumed at the module's ``batches_consumed``
(saved in checkpoints), so a resumed run draws exactly the batches an uninterrupted one would. The module's
count, not the stream's own ``state_dict``, is the position saved: Lightning fetches one batch ahead of the
step being trained, so the stream has always returned one batch more than was consumed. Training and
validation batches carry the ``train.data.doc_boundaries`` fields.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lightning as L
import numpy as np
from torch.utils.data import DataLoader

from zaya_pipeline.config import TrainConfig
from zaya_pipeline.data.loader import PackedDataset, check_boundary_mode, load_split, read_token_meta
from zaya_pipeline.data.mixture import MixtureStream, Phase, load_sources
from zaya_pipeline.errors import DataError
from zaya_pipeline.train.optim import batch_at, full_batch


def check_vocab(tokens: np.ndarray, where: Path | str, vocab_size: int) -> None:
    top = int(tokens.max())
    if top >= vocab_size:
        raise DataError(
            f"{where}: token id {top} is outside the model vocabulary of {vocab_size} "
            f"(tokens from another tokenizer?)"
        )


def source_dirs(train: TrainConfig, tokens_dir: str | Path) -> dict[str, str]:
    return dict(train.data.sources) or {"main": str(tokens_dir)}


def phases_of(train: TrainConfig, names: list[str]) -> list[Phase]:
    """train.data.phases as :class:`Phase` objects; none configured = one phase, every source weight 1."""
    if not train.data.phases:
        return [Phase("all", 0, {name: 1.0 for name in names})]
    return [Phase(p.name or f"phase{i}", p.tokens, dict(p.weights)) for i, p in enumerate(train.data.phases)]


class TokenDataModule(L.LightningDataModule):
    def __init__(self, tokens_dir: str | Path, train: TrainConfig, vocab_size: int, world_size: int = 1):
        super().__init__()
        self.tokens_dir = Path(tokens_dir)
        self.train = train
        self.vocab_size = vocab_size
        self.world_size = world_size

    def setup(self, stage: str) -> None:
        t = self.train
        check_boundary_mode(t.data.doc_boundaries)
        if stage == "fit":
            dirs = source_dirs(t, self.tokens_dir)
            self.sources = load_sources(dirs, "train")
            for name, tokens in self.sources.items():
                check_vocab(tokens, Path(dirs[name]) / "train", self.vocab_size)
            self.phases = phases_of(t, list(self.sources))
            self.train_eos_id = read_token_meta(next(iter(dirs.values()))).get("eos_id")
        # Validation windows in a seeded order: the first val_batches batches are a fixed random sample of the
        # whole split, the same at every validation pass.
        val = load_split(self.tokens_dir, "val")
        check_vocab(val, self.tokens_dir / "val", self.vocab_size)
        eos_id = read_token_meta(self.tokens_dir).get("eos_id")
        self.val_set = PackedDataset(
            val, t.seq_len, seed=t.seed, eos_id=eos_id, doc_boundaries=t.data.doc_boundaries
        )

    def stream(self, start_batch: int = 0, rank: int = 0) -> MixtureStream:
        full = full_batch(self.train, self.world_size)
        return MixtureStream(
            self.sources,
            self.phases,
            self.train.seq_len,
            batch_sequences=lambda b: batch_at(b, self.train.batch_ramp, full),
            seed=self.train.seed,
            rank=rank,
            world_size=self.world_size,
            start_batch=start_batch,
            eos_id=self.train_eos_id,
            doc_boundaries=self.train.data.doc_boundaries,
        )

    def train_dataloader(self) -> Iterator[dict]:
        module = self.trainer.lightning_module
        # The stream's iterator, not the stream: Lightning would save and restore a stream's state_dict
        # (one batch ahead, see above) on top of the module's position.
        return iter(self.stream(getattr(module, "batches_consumed", 0), self.trainer.global_rank))

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.train.micro_batch, shuffle=False)
