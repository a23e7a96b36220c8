"""Byte lengths of token ids: the denominator of bits-per-byte."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from zaya_pipeline.config import TokenizerConfig
from zaya_pipeline.data.tokenizer import pad_vocab, train_bpe
from zaya_pipeline.errors import DataError
from zaya_pipeline.eval.token_bytes import byte_to_unicode, token_byte_lengths, token_to_bytes

TEXTS = ["the quick brown fox jumps over the lazy dog. " * 4, "café naïve déjà vu, the end. " * 4] * 20


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = train_bpe(TEXTS, TokenizerConfig(vocab_size=300, min_frequency=2))
    pad_vocab(tok, 64)
    return tok


def test_byte_table_is_a_bijection_with_the_gpt2_spellings():
    table = byte_to_unicode()
    assert sorted(table) == list(range(256))
    assert len(set(table.values())) == 256
    assert table[ord("A")] == "A" and table[ord("~")] == "~" and table[0xE9] == "é"
    # The well-known GPT-2 spellings: space is 'Ġ', newline 'Ċ', NUL is U+0100.
    assert table[ord(" ")] == "Ġ" and table[ord("\n")] == "Ċ" and table[0] == "Ā"
    assert all(token_to_bytes(c) == bytes([b]) for b, c in table.items())


def test_ascii_and_multibyte_text_bytes_add_up(tokenizer):
    lengths = token_byte_lengths(tokenizer)
    # "é" and "ï" were seen (merged as 2-byte tokens); the CJK and emoji characters were not and split into
    # single-byte tokens: each token counts its own bytes either way.
    for text in ["the lazy dog", "café déjà", " 日本語 🙂 naïve\n"]:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert int(lengths[ids].sum()) == len(text.encode("utf-8")), text
    emoji_ids = tokenizer.encode("🙂", add_special_tokens=False).ids
    assert len(emoji_ids) > 1 and all(lengths[i] >= 1 for i in emoji_ids)
    assert lengths[tokenizer.token_to_id("Ġthe")] == 4


def test_special_and_padding_tokens_count_zero_and_padded_ids_too(tokenizer):
    n = tokenizer.get_vocab_size()
    lengths = token_byte_lengths(tokenizer, vocab_size=n + 10)
    assert len(lengths) == n + 10
    for name in ("<|endoftext|>", "<|pad|>", "<|unused_0|>"):
        assert lengths[tokenizer.token_to_id(name)] == 0, name
    assert (lengths[n:] == 0).all()
    assert (lengths[: n - 64] > 0).sum() > 250  # every real BPE token has bytes


def test_a_plain_added_token_counts_its_text(tokenizer):
    tok = Tokenizer.from_str(tokenizer.to_str())
    tok.add_tokens([AddedToken("naïveté", special=False)])
    lengths = token_byte_lengths(tok)
    assert lengths[tok.token_to_id("naïveté")] == len("naïveté".encode())


def test_a_tokenizer_that_is_not_byte_level_is_refused():
    tok = Tokenizer(models.WordLevel({"hello": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    with pytest.raises(DataError, match="byte-level"):
        token_byte_lengths(tok, origin="my/tokenizer.json")
