"""The curation chain from config: parsing, validation errors that name the key, and the pass plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from zaya_pipeline.config import load_config
from zaya_pipeline.data.chain import READ, WRITE, build_passes, parse_steps
from zaya_pipeline.errors import ConfigError


def steps_of(*overrides: str) -> dict:
    return load_config(list(overrides)).data.curate.steps


def test_default_chain_runs_in_order_without_sentence_dedup():
    chain = parse_steps(steps_of())
    assert [s.id for s in chain] == [
        *("normalize", "pii", "url", "length", "language", "gopher_repetition", "gopher_quality"),
        *("c4_quality", "fineweb_quality", "exact_dedup", "minhash_dedup"),
    ]
    assert {s.kind for s in chain if s.id.endswith("dedup")} == {"dedup"}
    assert chain[0].kind == "format" and chain[2].kind == "filter"


def test_users_add_remove_reorder_and_tune_steps_by_override():
    chain = parse_steps(
        steps_of(
            "data.curate.steps.sentence_dedup.enabled=true",
            "data.curate.steps.language.enabled=false",
            "data.curate.steps.minhash_dedup.num_buckets=20",
            "data.curate.steps.exact_dedup.order=5",  # dedup first, before every filter
            "+data.curate.steps.long_only={type: length, order: 45, min_chars: 2000}",
        )
    )
    ids = [s.id for s in chain]
    assert ids[0] == "exact_dedup" and "language" not in ids and ids[-1] == "sentence_dedup"
    assert ids[ids.index("length") + 1] == "long_only"
    by_id = {s.id: s for s in chain}
    assert by_id["long_only"].type == "length" and by_id["long_only"].params == {"min_chars": 2000}
    assert by_id["minhash_dedup"].params["num_buckets"] == 20


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "+data.curate.steps.minhash_dedup.num_bucket=20",
            r"steps\.minhash_dedup\.num_bucket is not a param",
        ),
        ("data.curate.steps.minhash_dedup.num_buckets=many", r"steps\.minhash_dedup\.num_buckets='many'"),
        (
            "data.curate.steps.minhash_dedup.num_buckets=0",
            r"steps\.minhash_dedup\.num_buckets=0 must be >= 1",
        ),
        ("data.curate.steps.length.min_words=12.5", r"steps\.length\.min_words=12\.5: expected a int"),
        ("data.curate.steps.url.blocklist_file=/no/such/file", r"steps\.url\.blocklist_file="),
        ("data.curate.steps.language.model_path=/no/lid.ftz", r"steps\.language\.model_path="),
        ("data.curate.steps.language.language_threshold=1.5", r"steps\.language\.language_threshold=1\.5"),
        ("data.curate.steps.language.languages=english", r"steps\.language\.languages='english'"),
        ("data.curate.steps.normalize.form=NFX", r"steps\.normalize\.form='NFX'"),
        ("data.curate.steps.c4_quality.enabled=maybe", r"steps\.c4_quality\.enabled='maybe'"),
        ("data.curate.steps.pii.order=40", r"steps\.(pii|length)\.order=40 is also the order of "),
        (
            "+data.curate.steps.x={type: bloom_filter, order: 1}",
            r"steps\.x\.type='bloom_filter' is not a step",
        ),
        ("+data.curate.steps.x={type: length}", r"steps\.x\.order=None: every step needs an integer order"),
        ("+data.curate.steps.exact_dedup.n_grams=5", r"steps\.exact_dedup\.n_grams .*accepted: none"),
    ],
)
def test_bad_step_config_names_the_key(override, message):
    steps = steps_of(override)
    with pytest.raises(ConfigError, match=r"data\.curate\." + message):
        parse_steps(steps)


def test_a_disabled_step_is_still_checked_and_an_empty_chain_refused():
    with pytest.raises(ConfigError, match=r"sentence_dedup\.n_sentence "):
        parse_steps(steps_of("+data.curate.steps.sentence_dedup.n_sentence=2"))
    off = [f"data.curate.steps.{k}.enabled=false" for k in steps_of() if k != "sentence_dedup"]
    with pytest.raises(ConfigError, match="no enabled step"):
        parse_steps(steps_of(*off))


def test_dedups_split_the_chain_into_passes(tmp_path: Path):
    chain = parse_steps(steps_of("data.curate.steps.sentence_dedup.enabled=true"))
    passes = build_passes(chain, 3, tmp_path / "raw", tmp_path / "work", tmp_path / "out", tmp_path / "rm")
    assert [(p.name, p.tasks) for p in passes] == [
        ("00_pass_0", 3),
        ("01_exact_dedup_find", 1),
        ("02_pass_1", 3),
        ("03_minhash_dedup_buckets", 25),
        ("04_minhash_dedup_cluster", 1),
        ("05_pass_2", 3),
        ("06_sentence_dedup_find", 1),
        ("07_pass_3", 3),
    ]
    first = passes[0]
    assert [a[0] for a in first.accounted.values()] == [
        *(READ, "normalize", "pii", "url", "length", "language", "gopher_repetition", "gopher_quality"),
        *("c4_quality", "fineweb_quality"),
    ]
    assert type(first.pipeline[-1]).__name__ == "ExactDedupSignature"
    assert [a[0] for a in passes[2].accounted.values()] == [READ, "exact_dedup"]
    assert [a[0] for a in passes[7].accounted.values()] == [READ, "sentence_dedup", WRITE]
    # one tokenizer object for every spaCy-based step of a pass: its word lists are cached per instance
    toks = {
        id(s.language) for s in first.pipeline if type(s).__name__.startswith(("Gopher", "C4", "FineWeb"))
    }
    assert len(toks) == 1


def test_every_pass_survives_the_trip_to_a_worker_process(tmp_path: Path):
    """LocalPipelineExecutor (forkserver), Slurm and Ray ship each pipeline to its workers with dill."""
    import dill

    chain = parse_steps(steps_of("data.curate.steps.sentence_dedup.enabled=true"))
    for p in build_passes(chain, 2, tmp_path / "raw", tmp_path / "work", tmp_path / "out", tmp_path / "rm"):
        copy = dill.loads(dill.dumps(p.pipeline))
        assert [type(s).__name__ for s in copy] == [type(s).__name__ for s in p.pipeline]
