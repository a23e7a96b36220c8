"""Small pieces our datatrove pipelines plug into datatrove's own steps.

Everything here is a module-level function: LocalPipelineExecutor starts its workers with forkserver and
pickles the pipeline, so lambdas and closures would not survive the trip.
"""

from __future__ import annotations

from pathlib import Path

from datatrove.data import Document
from datatrove.utils.text import TextNormConfig, simplify_text
from datatrove.utils.word_tokenizers import SpaCyTokenizer, strip_strings

# Exact dedup compares texts after lower-casing, dropping punctuation and collapsing whitespace; numbers and
# diacritics are kept, so pages that differ only in a version number or a name stay distinct.
EXACT_NORM = TextNormConfig(norm_numbers=False, norm_unicode_diacritics=False)
# Metadata that datatrove's steps add for their own bookkeeping: not part of a curated record. A removed
# near duplicate keeps minhash_cluster_size (the size of its cluster, for the data report).
INTERNAL_KEYS = frozenset({"file_path", "duplicate_count", "filter_reason", "minhash_cluster_size"})
REMOVED_INTERNAL_KEYS = INTERNAL_KEYS - {"minhash_cluster_size"}


class EnglishTokenizer(SpaCyTokenizer):
    """datatrove's English word/sentence tokenizer (``spacy.blank("en")`` + sentencizer), same output, faster.

    datatrove wraps every call in a spaCy memory zone, which throws away the vocabulary entries the call
    created, so every page re-creates the lexemes of its words; that is most of the time of the Gopher and
    C4 filters (measured: 2-4x). Here the vocabulary persists and is rebuilt once it holds ``max_vocab``
    entries, which bounds memory on big corpora. Pass one instance as the ``language`` of every step: the
    word lists are cached per (text, tokenizer), so the Gopher filters tokenize each page once.
    """

    def __init__(self, max_vocab: int = 500_000):
        super().__init__("en")
        self.max_vocab = max_vocab

    def _docs(self, text: str) -> list:
        if self._tokenizer is not None and len(self._tokenizer.vocab) > self.max_vocab:
            self._tokenizer = None
        return self._do_tokenize(text)

    def word_tokenize(self, text: str) -> list[str]:
        # Words need only the tokenizer (not the sentencizer), and reading the token strings from the
        # array of ids skips building a Token object per word.
        if self._tokenizer is not None and len(self._tokenizer.vocab) > self.max_vocab:
            self._tokenizer = None
        nlp = self.tokenizer
        nlp.max_length = len(text) + 10
        try:
            doc = nlp.make_doc(text)
        except Exception:
            if "IS_ALPHA" not in text:  # the one string known to break spaCy's tokenizer (as datatrove does)
                raise
            doc = nlp.make_doc(text.replace("IS_ALPHA", ""))
        strings = doc.vocab.strings
        return strip_strings([strings[orth] for orth in doc.to_array("ORTH").tolist()])

    def sent_tokenize(self, text: str) -> list[str]:
        return strip_strings([sent.text for doc in self._docs(text) for sent in doc.sents])

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [(sent.start_char, sent.end_char) for doc in self._docs(text) for sent in doc.sents]


def normalized_text(doc: Document) -> str:
    """The content exact dedup hashes (the ``-> str`` annotation tells datatrove which hash to use)."""
    return simplify_text(doc.text, EXACT_NORM)


def curated_record(writer, doc: Document) -> dict:
    """JsonlWriter adapter for kept documents: ``{"id", "text", "metadata"}`` without datatrove's keys."""
    metadata = {k: v for k, v in doc.metadata.items() if k not in INTERNAL_KEYS}
    return {"id": doc.id, "text": doc.text, "metadata": metadata}


def removed_record(writer, doc: Document, step: str = "", reason: str = "") -> dict:
    """JsonlWriter adapter for dropped documents: records which step dropped them and why."""
    metadata = {k: v for k, v in doc.metadata.items() if k not in REMOVED_INTERNAL_KEYS}
    metadata["curate_step"] = step
    metadata["filter_reason"] = doc.metadata.get("filter_reason") or reason
    return {"id": doc.id, "text": doc.text, "metadata": metadata}


def zero_gzip_mtime(path: str | Path) -> None:
    """Set the MTIME field of a gzip header (bytes 4-7) to 0, "no time stamp" in RFC 1952.

    datatrove's writers stamp the current time there, so two identical runs would give different bytes and
    DVC would see a changed output; the header has no checksum over this field (Python never sets FHCRC).
    """
    with open(path, "r+b") as f:
        header = f.read(10)
        if len(header) == 10 and header[:3] == b"\x1f\x8b\x08" and not header[3] & 0x02:
            f.seek(4)
            f.write(b"\0\0\0\0")


def run_explained(executor, what: str, logs: Path):
    """``executor.run()``; a task's failure (a corrupt input shard, a failing step) becomes one ``DataError``
    line naming ``what`` and where datatrove's task logs are, instead of a traceback."""
    from zaya_pipeline.errors import DataError, first_line

    try:
        return executor.run()
    except Exception as exc:
        why = f"{type(exc).__name__}: {first_line(exc)}"
        raise DataError(f"{what} failed: {why} (task logs: {Path(logs) / 'logs'})") from exc
