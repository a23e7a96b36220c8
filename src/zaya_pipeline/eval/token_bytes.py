"""How many bytes of text each token id stands for, so bits-per-byte compares models across tokenizers.

A byte-level BPE (GPT-2 style) spells every byte as one printable unicode character, so a token string is a
sequence of such characters and its byte length is the number of characters. Special and added tokens
(``<|endoftext|>``, padding, ``<|unused_k|>``) stand for no text and count 0 bytes; a non-special added token
is stored as plain text (not in the byte alphabet) and counts its UTF-8 length.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np

from zaya_pipeline.errors import DataError


@cache
def byte_to_unicode() -> dict[int, str]:
    """The fixed GPT-2 byte → character table: printable Latin-1 bytes map to themselves, every other byte
    (controls, space, 0x7F-0xA0, 0xAD) to the next free code point from 256 on, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@cache
def unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


def token_to_bytes(token: str) -> bytes:
    """The bytes a byte-level token string spells; ``DataError`` for a character outside the alphabet."""
    table = unicode_to_byte()
    try:
        return bytes(table[c] for c in token)
    except KeyError as exc:
        raise DataError(
            f"token {token!r} is not byte-level BPE: character {exc.args[0]!r} is no byte"
        ) from None


def _is_byte_level(tokenizer_json: dict) -> bool:
    def has(node: dict | None) -> bool:
        if not node:
            return False
        if node.get("type") == "ByteLevel":
            return True
        return any(has(child) for child in node.get("pretokenizers", node.get("decoders", [])) or [])

    return has(tokenizer_json.get("pre_tokenizer")) or has(tokenizer_json.get("decoder"))


def token_byte_lengths(tokenizer, vocab_size: int | None = None, origin: str = "tokenizer") -> np.ndarray:
    """Byte length of every token id in ``[0, vocab_size)`` as int64 (a ``tokenizers.Tokenizer``).

    ``vocab_size`` defaults to the tokenizer's own size; ids past it (a model vocabulary padded beyond the
    tokenizer) and added/special tokens count 0. ``origin`` names the tokenizer file in errors.
    """
    if not _is_byte_level(json.loads(tokenizer.to_str())):
        raise DataError(f"{origin}: bits-per-byte needs a byte-level BPE tokenizer (ByteLevel pre-tokenizer)")
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    vocab_size = n if vocab_size is None else vocab_size
    added = tokenizer.get_added_tokens_decoder()
    lengths = np.zeros(vocab_size, dtype=np.int64)
    for i in range(min(n, vocab_size)):
        if i in added:
            lengths[i] = 0 if added[i].special else len(added[i].content.encode("utf-8"))
            continue
        token = tokenizer.id_to_token(i)
        if token is None:
            continue
        try:
            lengths[i] = len(token_to_bytes(token))
        except DataError as exc:
            raise DataError(f"{origin}: id {i}: {exc}") from None
    return lengths


def load_byte_lengths(tokenizer_json: str | Path, vocab_size: int | None = None) -> np.ndarray:
    """``token_byte_lengths`` of a ``tokenizer.json`` file."""
    from tokenizers import Tokenizer

    path = Path(tokenizer_json)
    if not path.is_file():
        raise DataError(f"{path} is missing: run the tokenizer stage first (zaya tokenizer)")
    return token_byte_lengths(Tokenizer.from_file(str(path)), vocab_size, origin=str(path))
