"""Data report: over a real (tiny) curate run, over recorded dedup metadata, tokens, and MLflow."""

from __future__ import annotations

import csv
import gzip
import json
import os
from pathlib import Path

import pytest
from test_curate import make_cfg, make_corpus  # the tiny curate corpus of test_curate.py

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.data.curate import curate
from zaya_pipeline.data.report import add_token_counts, log_report_to_mlflow, write_report


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def curated_run(tmp_path_factory) -> Path:
    """One real curate run of the default chain (1 task, in this process): junk for each filter, one exact
    and one near duplicate pair."""
    tmp = tmp_path_factory.mktemp("curate")
    make_corpus(tmp / "raw")
    curate(make_cfg(tmp, "data.curate.tasks=1", "data.executor.workers=1"))
    return tmp


def report_of(tmp: Path, out: Path) -> tuple[dict, list[Path]]:
    summary = json.loads((tmp / "reports" / "curate.json").read_text())
    paths = write_report(summary, tmp / "curated", tmp / "removed", out)
    return summary, paths


def test_report_of_a_curate_run_adds_up(curated_run, tmp_path):
    summary, paths = report_of(curated_run, tmp_path / "reports")
    assert [p.relative_to(tmp_path / "reports").as_posix() for p in paths] == [
        "data_report.json",
        "plots/data_steps.csv",
        "plots/data_reasons.csv",
        "plots/data_lengths.csv",
        "plots/data_languages.csv",
        "plots/data_clusters.csv",
        "data_report.png",
        "data_report.html",
    ]
    report = json.loads(paths[0].read_text())
    assert report["input_docs"] == summary["input_docs"] and report["words_out"] == summary["words_out"]
    for mine, theirs in zip(report["steps"], summary["steps"], strict=True):
        assert (mine["name"], mine["dropped"]) == (theirs["name"], theirs["dropped"])
        assert {r: v["docs"] for r, v in mine["reasons"].items()} == theirs["reasons"]
        assert mine["words_dropped"] == sum(v["words"] for v in mine["reasons"].values())
    assert sum(s["words_dropped"] for s in report["steps"]) <= summary["words_in"] - summary["words_out"]
    hist = report["length_hist"]
    assert sum(hist["kept"]) == summary["output_docs"] and sum(hist["dropped"]) == summary["dropped_docs"]
    assert all(b & (b - 1) == 0 for b in hist["bins_words"]), "bins are powers of two"
    langs = report["languages"]
    assert langs["en"]["kept"] == summary["output_docs"] and langs["de"] == {"kept": 0, "dropped": 1}
    assert langs["unknown"] == {"kept": 0, "dropped": 1}, "junk-short was dropped before the language step"
    assert sum(v["kept"] + v["dropped"] for v in langs.values()) == summary["input_docs"]
    exact, near = report["duplicates"]["exact"], report["duplicates"]["near"]
    assert (
        exact["method"].startswith("removed copies") and exact["sizes"] == {"2": 1} and exact["largest"] == 2
    )
    assert near["method"].startswith("minhash_cluster_size")
    assert (near["removed_docs"], near["clusters"], near["sizes"]) == (1, 1, {"2": 1})
    assert {s["name"]: s["type"] for s in report["steps"]}["minhash_dedup"] == "minhash_dedup"
    assert {s["name"]: s["edited"] for s in report["steps"]}["pii"] == 1

    steps_csv = read_csv(tmp_path / "reports" / "plots" / "data_steps.csv")
    assert [r["step"] for r in steps_csv] == [s["name"] for s in summary["steps"]]
    reasons_csv = read_csv(tmp_path / "reports" / "plots" / "data_reasons.csv")
    assert sum(int(r["docs"]) for r in reasons_csv) == summary["dropped_docs"]
    assert read_csv(tmp_path / "reports" / "plots" / "data_clusters.csv") == [
        {"method": "exact", "size": "2", "clusters": "1"},
        {"method": "near", "size": "2", "clusters": "1"},
    ]
    assert paths[-2].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = paths[-1].read_text()
    assert "<img alt='data report figure' src='data:image/png;base64,iVBOR" in page
    assert "near_duplicate" in page and "low_language_score" in page and "Tokens per split" not in page

    # same inputs, same bytes (DVC hashes the plots and metrics)
    _, again = report_of(curated_run, tmp_path / "again")
    for a, b in zip(paths, again, strict=True):
        assert a.read_bytes() == b.read_bytes(), a.name


def write_records(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with gzip.open(folder / "00000.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def test_recorded_language_and_cluster_metadata_are_used(tmp_path):
    words = lambda n: " ".join(["word"] * n)
    kept = [
        {"id": "a", "text": words(100), "metadata": {"language": "en", "duplicate_count": 2}},
        {"id": "b", "text": words(3), "metadata": {"language": "de"}},
        {"id": "c", "text": words(1), "metadata": {"language": "en", "duplicate_count": 0}},
    ]
    near = {
        "language": "en",
        "curate_step": "near",
        "filter_reason": "near_duplicate",
        "minhash_cluster_size": 4,
    }
    dropped = [
        {"id": "d", "text": words(0), "metadata": {"curate_step": "length", "filter_reason": "too_short"}},
        {
            "id": "e",
            "text": words(5),
            "metadata": {"language": "fr", "curate_step": "lid", "filter_reason": "lang"},
        },
        *({"id": f"n{i}", "text": words(6), "metadata": near} for i in range(3)),  # one cluster of 4
    ]
    write_records(tmp_path / "curated", kept)
    write_records(tmp_path / "removed" / "x", dropped)
    steps = [
        {
            "name": "length",
            "type": "length",
            "docs_in": 8,
            "kept": 7,
            "dropped": 1,
            "reasons": {"too_short": 1},
        },
        {"name": "lid", "type": "language", "docs_in": 7, "kept": 6, "dropped": 1, "reasons": {"lang": 1}},
        # a step id of the user's: the report finds the near dedup by its type
        {"name": "near", "type": "minhash_dedup", "docs_in": 6, "kept": 3, "dropped": 3, "reasons": {}},
    ]
    summary = {"input_docs": 8, "output_docs": 3, "dropped_docs": 5, "steps": steps}
    write_report(summary, tmp_path / "curated", tmp_path / "removed", tmp_path / "reports")
    report = json.loads((tmp_path / "reports" / "data_report.json").read_text())
    assert report["languages"] == {
        "en": {"kept": 2, "dropped": 3},
        "de": {"kept": 1, "dropped": 0},
        "fr": {"kept": 0, "dropped": 1},
        "unknown": {"kept": 0, "dropped": 1},
    }
    assert report["duplicates"]["exact"]["sizes"] == {"3": 1}
    assert report["duplicates"]["near"] == {
        "method": "minhash_cluster_size of the removed copies",
        "removed_docs": 3,
        "clusters": 1,
        "largest": 4,
        "sizes": {"4": 1},
    }
    assert report["length_hist"] == {
        "bins_words": [0, 1, 2, 4, 8, 16, 32, 64],
        "kept": [0, 1, 1, 0, 0, 0, 0, 1],
        "dropped": [1, 0, 0, 4, 0, 0, 0, 0],
    }
    assert report["steps"][1]["reasons"] == {"lang": {"docs": 1, "words": 5, "chars": 24}}


def tiny_tokenizer(folder: Path, curated: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    texts = []
    for path in sorted(curated.glob("*.jsonl.gz")):
        with gzip.open(path, "rt") as f:
            texts += [json.loads(line)["text"] for line in f]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_token_counts_go_into_plots_and_the_page(curated_run, tmp_path):
    tok = tiny_tokenizer(tmp_path / "tok", curated_run / "curated")
    alone = add_token_counts(
        tmp_path / "alone", {"train": {"docs": 1, "tokens": 9}}, tok, curated_run / "removed"
    )
    assert [p.name for p in alone] == ["data_tokens.csv"], "no curate report there: only the split counts"
    report_of(curated_run, tmp_path)
    splits = {
        "train": {"docs": 20, "tokens": 5000, "bytes": 21000},
        "val": {"docs": 2, "tokens": 400, "bytes": 1700},
    }
    assert [p.name for p in add_token_counts(tmp_path, splits)] == [
        "data_tokens.csv",
        "data_report_tokens.html",
    ]
    paths = add_token_counts(tmp_path, splits, tok, curated_run / "removed")
    assert read_csv(paths[0]) == [
        {"split": "train", "docs": "20", "tokens": "5000", "bytes": "21000"},
        {"split": "val", "docs": "2", "tokens": "400", "bytes": "1700"},
    ]
    dropped = read_csv(paths[1])
    summary = json.loads((curated_run / "reports" / "curate.json").read_text())
    assert sum(int(r["docs"]) for r in dropped) == summary["dropped_docs"]
    by_reason = {(r["step"], r["reason"]): int(r["tokens"]) for r in dropped}
    assert set(by_reason) == {(s["name"], r) for s in summary["steps"] for r in s["reasons"]}
    assert all(n > 0 for n in by_reason.values())
    page = paths[2].read_text()
    assert "Tokens per split" in page and "5,000" in page and "Tokens dropped per step and reason" in page


def test_report_is_logged_to_mlflow_as_a_curate_run(curated_run, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.chdir(tmp_path)  # the default artifact root sits beside mlflow.db
    _, paths = report_of(curated_run, tmp_path / "reports")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    registry = RegistryConfig(tracking_uri=uri, experiment_name="data")
    run_id = log_report_to_mlflow(paths, registry)
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.info.run_name == "curate" and run.data.tags["zaya.stage"] == "curate"
    assert run.info.status == "FINISHED" and run.data.tags["zaya.pid"] == str(os.getpid())  # end_dead_runs
    assert run.data.metrics["output_docs"] == json.loads(paths[0].read_text())["output_docs"]
    assert "dropped.minhash_dedup" in run.data.metrics
    top = {a.path for a in client.list_artifacts(run_id, "data_report")}
    assert {"data_report/data_report.html", "data_report/data_report.png", "data_report/plots"} <= top
    assert len(client.list_artifacts(run_id, "data_report/plots")) == 5
    # the tokenize stage adds its counts to that run (found by the digest of data_report.json)
    splits = {"train": {"docs": 20, "tokens": 5000, "bytes": 21000}}
    tok = tiny_tokenizer(tmp_path / "tok", curated_run / "curated")
    add_token_counts(tmp_path / "reports", splits, tok, curated_run / "removed", registry)
    plots = {a.path.rsplit("/", 1)[-1] for a in client.list_artifacts(run_id, "data_report/plots")}
    assert {"data_tokens.csv", "data_tokens_dropped.csv"} <= plots
    assert len(client.search_runs([run.info.experiment_id])) == 1, "no new run"
