"""MinHash near-dedup with the configured bands: recall on planted near duplicates, false positives on
distinct documents, through datatrove's real four MinHash stages as the curate stage runs them."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

from english_corpus import WORDS
from test_curate import make_cfg, read_dir

from zaya_pipeline.config import load_config
from zaya_pipeline.data.curate import curate

N_DISTINCT, N_NEAR, N_WORDS, EDITED = 200, 100, 300, 0.05


def zipf_words(rng: random.Random, n: int) -> list[str]:
    """Words with a Zipf-like frequency (frequent words recur, as in text), from a fixed vocabulary."""
    weights = [1 / (rank + 1) for rank in range(len(WORDS))]
    return rng.choices(WORDS, weights=weights, k=n)


def edit(rng: random.Random, words: list[str], fraction: float) -> list[str]:
    """A copy with ``fraction`` of the word positions replaced by another word."""
    out = list(words)
    for i in rng.sample(range(len(words)), round(fraction * len(words))):
        out[i] = rng.choice([w for w in WORDS if w != words[i]])
    return out


def test_minhash_finds_95_percent_of_5_percent_edited_copies_at_under_1_percent_false_positives(
    tmp_path: Path,
):
    rng = random.Random(1234)
    docs = {f"d{i:03d}": zipf_words(rng, N_WORDS) for i in range(N_DISTINCT)}
    originals = rng.sample(sorted(docs), N_NEAR)
    copies = {f"{o}-near": edit(rng, docs[o], EDITED) for o in originals}
    everything = list({**docs, **copies}.items())
    rng.shuffle(everything)  # copies and originals land in either shard, in any order
    (tmp_path / "raw").mkdir()
    for shard in range(2):
        with gzip.open(tmp_path / "raw" / f"s{shard}.jsonl.gz", "wt", encoding="utf-8") as f:
            for doc_id, words in everything[shard::2]:
                f.write(json.dumps({"id": doc_id, "text": " ".join(words)}) + "\n")

    only_minhash = [
        f"data.curate.steps.{s}.enabled=false"
        for s in load_config().data.curate.steps
        if s != "minhash_dedup"
    ]
    cfg = make_cfg(tmp_path, "data.curate.tasks=2", "data.executor.workers=1", *only_minhash)
    mh = cfg.data.curate.steps["minhash_dedup"]
    assert (mh["n_grams"], mh["num_buckets"], mh["hashes_per_bucket"]) == (5, 25, 4), "the configured bands"
    curate(cfg)

    removed = {r["id"] for r in read_dir(tmp_path / "removed" / "minhash_dedup")}
    found = sum(len({o, f"{o}-near"} & removed) == 1 for o in originals)
    unpaired = set(docs) - set(originals)
    false_positives = len(removed & unpaired) + sum({o, f"{o}-near"} <= removed for o in originals)
    recall, fpr = found / N_NEAR, false_positives / len(unpaired)
    print(
        f"minhash 5x25x4: recall {recall:.3f} on {N_NEAR} copies ({EDITED:.0%} words edited), FPR {fpr:.3f}"
    )
    assert recall >= 0.95, recall
    assert fpr <= 0.01, fpr
