"""Token shards as a LightningDataModule: shuffled packed windows to train on, a fixed sample to validate."""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from zaya_pipeline.data.loader import PackedDataset, load_split
from zaya_pipeline.errors import DataError


class TokenDataModule(L.LightningDataModule):
    def __init__(self, tokens_dir: str | Path, seq_len: int, micro_batch: int, seed: int, vocab_size: int):
        super().__init__()
        self.tokens_dir = Path(tokens_dir)
        self.seq_len = seq_len
        self.micro_batch = micro_batch
        self.seed = seed
        self.vocab_size = vocab_size

    def _load(self, split: str, seed: int | None) -> PackedDataset:
        tokens = load_split(self.tokens_dir, split)
        top = int(tokens.max())
        if top >= self.vocab_size:
            raise DataError(
                f"{self.tokens_dir / split}: token id {top} is outside the model vocabulary of "
                f"{self.vocab_size} (tokens from another tokenizer?)"
            )
        return PackedDataset(tokens, self.seq_len, seed=seed)

    def setup(self, stage: str) -> None:
        if stage == "fit":
            self.train_set = self._load("train", None)  # the DataLoader reshuffles every epoch
            if len(self.train_set) < self.micro_batch:
                raise DataError(
                    f"{self.tokens_dir / 'train'}: {len(self.train_set)} windows of train.seq_len="
                    f"{self.seq_len} tokens, fewer than one batch of train.micro_batch={self.micro_batch}"
                )
        # Validation windows in a seeded order: the first val_batches batches are a fixed random sample of the
        # whole split, the same at every validation pass.
        self.val_set = self._load("val", self.seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.micro_batch,
            shuffle=True,
            drop_last=True,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=self.micro_batch, shuffle=False)
