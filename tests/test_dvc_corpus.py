"""The user's corpus is a dependency of the prepare stage: `dvc status` sees an edit to any file under it.

dvc.yaml's prepare stage lists ``${data.corpus.dvc_dep}`` under deps, filled from params.yaml (by default
``data.corpus.input_dir``; for the Debian corpus the placeholder folder ``corpus/``). Checked in a throwaway
git + DVC copy of the project, on a corpus folder outside it.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.project import BIN, copy_project, run

DVC = str(BIN / "dvc")
TEXT = "A document with enough words in it to be one, about rivers, bridges and the towns around them. " * 3


def status(repo: Path) -> dict:
    """`dvc status prepare` as JSON: {} when prepare is up to date."""
    return json.loads(run([DVC, "status", "prepare", "--json"], repo).strip().splitlines()[-1] or "{}")


def changed_deps(repo: Path) -> dict:
    entries = status(repo).get("prepare", [])
    return {k: v for entry in entries for k, v in entry.get("changed deps", {}).items()}


def write_docs(path: Path, *ids: str) -> None:
    path.write_text("".join(json.dumps({"id": i, "text": f"{TEXT} ({i})"}) + "\n" for i in ids))


def test_an_edit_to_the_users_corpus_makes_prepare_changed_and_an_unchanged_one_does_not(tmp_path):
    # the Debian corpus reads no folder: prepare depends on the repo's placeholder, which must exist
    repo = copy_project(tmp_path / "repo", "experiment=debug")
    assert "corpus" in changed_deps(repo), "the default corpus leaves dvc.yaml's templated dep valid"

    corpus = tmp_path / "my corpus"
    (corpus / "part").mkdir(parents=True)
    write_docs(corpus / "a.jsonl", "a1", "a2")
    write_docs(corpus / "part" / "b.jsonl", "b1")
    run([str(BIN / "zaya"), "params", "experiment=debug", "data.corpus.source=folder",
         f"data.corpus.input_dir={corpus}"], repo)  # fmt: skip
    log = run([DVC, "repro", "--single-item", "prepare"], repo)
    assert "Running stage 'prepare'" in log
    assert json.loads((repo / "reports" / "prepare.json").read_text())["docs"] == 3
    assert status(repo) == {}, "prepare is up to date right after it ran"
    assert "Running stage" not in run([DVC, "repro", "--single-item", "prepare"], repo), "an unchanged corpus"

    nested = corpus / "part" / "b.jsonl"
    original = nested.read_bytes()
    write_docs(nested, "b1", "b2")  # one file, one folder down
    assert changed_deps(repo) == {str(corpus): "modified"}
    nested.write_bytes(original)
    assert status(repo) == {}, "the same bytes again: DVC compares content, not times"
    write_docs(corpus / "c.jsonl", "c1")  # a new file
    assert changed_deps(repo) == {str(corpus): "modified"}
    log = run([DVC, "repro", "--single-item", "prepare"], repo)
    assert "Running stage 'prepare'" in log and status(repo) == {}
    assert json.loads((repo / "reports" / "prepare.json").read_text())["docs"] == 4
