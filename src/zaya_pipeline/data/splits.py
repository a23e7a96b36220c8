"""The train/val split of the curated documents: a pure function of the document id.

The tokenize stage routes each document by ``split_of``; the curate stage uses the same function to refuse,
before it replaces its outputs, a kept corpus whose val (or train) split would be empty.
"""

from __future__ import annotations

import hashlib

SPLITS = ("train", "val")
_HASH_RANGE = 2**64


def split_of(doc_id: str, val_fraction: float, seed: int) -> str:
    """The split of a document: "val" for a ``val_fraction`` share of ids, by a seed-salted stable hash."""
    digest = hashlib.blake2b(f"{seed}\x00{doc_id}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "little") < val_fraction * _HASH_RANGE else "train"
