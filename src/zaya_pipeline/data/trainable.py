"""Is what curate kept enough to train on? Checked before the curate stage replaces its outputs.

``curate.finish`` swaps the staged outputs into ``paths.curated`` / ``paths.removed`` only after
``check_trainable`` passes. It refuses, in one ``DataError`` line, a kept corpus that a later stage could
not use, instead of letting tokenize or train fail on it:

* fewer documents than ``data.curate.min_kept_docs`` (a floor the user sets);
* an empty train or val split: the split the tokenize stage will make (``splits.split_of`` with
  ``data.tokenize.val_fraction`` and ``split_seed``), computed on the kept ids, so this is exact;
* a train split too short for one training batch, or a val split too short for one sequence. Tokens are not
  known before the tokenizer is trained, so the check takes an upper bound: one token per UTF-8 byte of
  text (a byte-level BPE token covers at least one byte) plus 2 per document (EOS, and BOS when
  configured). A batch of B sequences takes ``B * train.seq_len + 1`` tokens (windows of seq_len + 1
  tokens, each sharing its last token with the next), with B = ``train.global_batch``, or when that is 0
  ``train.micro_batch`` (one rank's share: a lower bound). So the check fails only where training
  certainly cannot fill a batch.

The message names the documents kept of those read, the steps that dropped the most (curate's per-step
counts, ``curate.summarize``) and the keys to change. The tokenize and train stages read these keys and
check them again on what they get; curate reads them only to fail early, so a change to them does not
re-run curate (pyproject.toml ``[tool.zaya.dvc.params_early_checks]``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.data.jsonl import read_jsonl
from zaya_pipeline.data.splits import SPLITS, split_of
from zaya_pipeline.data.text_io import CURATED_GLOB
from zaya_pipeline.errors import DataError

TOKENS_PER_DOC = 2  # EOS, and BOS when tokenizer.bos_token is set
TOP_STEPS, TOP_REASONS = 3, 2  # named in the message


@dataclass
class Splits:
    """What each split of the kept documents would hold."""

    docs: Counter = field(default_factory=Counter)  # split → documents
    bytes: Counter = field(default_factory=Counter)  # split → UTF-8 bytes of text

    def max_tokens(self, split: str) -> int:
        return self.bytes[split] + TOKENS_PER_DOC * self.docs[split]


def count_splits(curated: Path, val_fraction: float, seed: int) -> Splits:
    """Documents and text bytes per split of the curated shards in ``curated``, split as tokenize splits."""
    s = Splits()
    for path in sorted(Path(curated).glob(CURATED_GLOB)):
        for _, rec in read_jsonl(path):
            split = split_of(str(rec["id"]), val_fraction, seed)
            s.docs[split] += 1
            s.bytes[split] += len(rec["text"].encode("utf-8"))
    return s


def problems(cfg: ZayaConfig, kept_docs: int, s: Splits) -> tuple[list[str], list[str]]:
    """What makes the kept corpus too little, and the keys (besides the filters') that would change it."""
    curate, tok, train = cfg.data.curate, cfg.data.tokenize, cfg.train
    found, keys = [], ["data.curate.min_kept_docs"]
    if kept_docs < curate.min_kept_docs:
        found.append(f"fewer than data.curate.min_kept_docs={curate.min_kept_docs} documents")
    empty = [split for split in SPLITS if not s.docs[split]]
    if empty:
        found.append(
            f"the {' and '.join(empty)} split{'s' if len(empty) > 1 else ''} would be empty "
            f"(data.tokenize.val_fraction={tok.val_fraction}, data.tokenize.split_seed={tok.split_seed})"
        )
        keys += ["data.tokenize.val_fraction"] if kept_docs > 1 else []
    batch_key = "train.global_batch" if train.global_batch else "train.micro_batch"
    batch = train.global_batch or train.micro_batch
    need = {"train": batch * train.seq_len + 1, "val": train.seq_len + 1}
    what = {
        "train": f"one batch ({batch} sequences ({batch_key}) x train.seq_len={train.seq_len} + 1)",
        "val": f"one sequence (train.seq_len={train.seq_len} + 1)",
    }
    short = [split for split in SPLITS if s.docs[split] and s.max_tokens(split) < need[split]]
    for split in short:
        found.append(
            f"the {split} split would hold at most {s.max_tokens(split):,} tokens (estimated as 1 per UTF-8 "
            f"byte + {TOKENS_PER_DOC} per document), fewer than the {need[split]:,} of {what[split]}"
        )
    keys += [batch_key, "train.seq_len"] if short else []
    return found, keys


def top_drops(steps: list[dict]) -> tuple[str, list[str]]:
    """The steps that dropped the most, with their main reasons, and their config keys."""
    dropping = sorted((st for st in steps if st["dropped"]), key=lambda st: (-st["dropped"], st["name"]))
    named = []
    for st in dropping[:TOP_STEPS]:
        reasons = sorted(st["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
        more = len(st["reasons"]) - len(reasons)
        detail = ", ".join([*(f"{r} {n:,}" for r, n in reasons), *([f"{more} more"] if more > 0 else [])])
        named.append(f"{st['name']} {st['dropped']:,}" + (f" ({detail})" if detail else ""))
    keys = [f"data.curate.steps.{st['name']}.*" for st in dropping[:TOP_STEPS]]
    return "; ".join(named), keys


def check_trainable(cfg: ZayaConfig, summary: dict, curated: Path) -> None:
    """Raise ``DataError`` when the curated shards in ``curated`` (the staged outputs) are too little to
    train on; ``summary`` is curate's (``input_docs``, ``output_docs``, ``steps``)."""
    tok = cfg.data.tokenize
    found, keys = problems(
        cfg, summary["output_docs"], count_splits(curated, tok.val_fraction, tok.split_seed)
    )
    if not found:
        return
    drops, step_keys = top_drops(summary["steps"])
    dropped = (
        f"dropped most: {drops}; loosen those steps ({', '.join(step_keys)}; .enabled=false switches one off)"
        if drops
        else f"no step dropped anything: the raw corpus ({cfg.paths.raw}) holds only that much (data.corpus)"
    )
    raise DataError(
        f"curate kept {summary['output_docs']:,} of {summary['input_docs']:,} documents, too little to train "
        f"on: {'; '.join(found)}. {dropped[0].upper()}{dropped[1:]}, or change {', '.join(keys)}. "
        f"{cfg.paths.curated} and {cfg.paths.removed} were left as they were"
    )
