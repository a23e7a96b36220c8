"""prepare stage, folder source: every input format, and bad input that is counted and survives."""

from __future__ import annotations

import base64
import gzip
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zaya_pipeline.config import load_config
from zaya_pipeline.data.jsonl import read_jsonl
from zaya_pipeline.data.prepare import prepare
from zaya_pipeline.errors import ConfigError, DataError

PROSE = "This is a document with enough words in it to count as a real document for the corpus. " * 4
ARTICLE = (
    "<html><head><title>Rivers</title></head><body><nav>Home | About | Contact</nav><article>"
    + "".join(
        f"<p>Paragraph {i}: rivers carry water from the mountains to the sea, and the towns along their "
        f"banks have grown around the bridges, the mills and the harbours that the water made possible.</p>"
        for i in range(6)
    )
    + "</article><footer>Copyright footer</footer></body></html>"
)


def cfg_for(tmp_path: Path, *overrides: str):
    return load_config(
        [
            f"paths.raw={tmp_path}/raw",
            f"paths.reports={tmp_path}/reports",
            "data.corpus.source=folder",
            *overrides,
        ]
    )


def read_raw(raw: Path) -> dict[str, dict]:
    records = {}
    for path in sorted(raw.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records.update({r["id"]: r for r in map(json.loads, f)})
    return records


def rejects_of(tmp_path: Path) -> list[dict]:
    return [rec for _, rec in read_jsonl(tmp_path / "raw" / "rejects" / "rejects.jsonl.zst")]


def write_warc(path: Path, pages: dict[str, str]) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    with open(path, "wb") as fh:
        writer = WARCWriter(fh, gzip=path.name.endswith(".gz"))
        for url, html in pages.items():
            headers = StatusAndHeaders("200 OK", [("Content-Type", "text/html")], protocol="HTTP/1.1")
            rec = writer.create_warc_record(
                url,
                "response",
                payload=io.BytesIO(html.encode("utf-8")),
                http_headers=headers,
                warc_headers_dict={"WARC-Identified-Payload-Type": "text/html"},
            )
            writer.write_record(rec)


# -- formats and input specs ------------------------------------------------------------------------------


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    root = tmp_path / "mixed"
    (root / "web").mkdir(parents=True)
    (root / "books").mkdir()
    with open(root / "a.jsonl.zst", "wb") as fh, zstandard.ZstdCompressor().stream_writer(fh) as w:
        w.write((json.dumps({"doc": "z1", "body": PROSE + "zst"}) + "\n").encode())
    pq.write_table(pa.table({"doc": ["p1"], "body": [PROSE + "parquet"]}), root / "b.parquet")
    (root / "books" / "one.txt").write_text(PROSE + "book one\nsecond line", encoding="utf-8")
    write_warc(root / "web" / "crawl.warc.gz", {"http://example.com/rivers": ARTICLE})
    return root


@pytest.mark.parametrize("extractor", ["trafilatura", "builtin"])  # trafilatura imports with the pins
def test_every_format_with_configured_text_and_id_fields(tmp_path, mixed, extractor):
    prepare(
        cfg_for(
            tmp_path,
            f"data.corpus.input_dir={mixed}",
            "data.corpus.text_key=body",
            "data.corpus.id_key=doc",
            f"data.corpus.html_extractor={extractor}",
        )
    )
    records = read_raw(tmp_path / "raw")
    assert records["z1"]["text"] == PROSE + "zst" and records["z1"]["metadata"]["source"] == "a.jsonl.zst"
    assert records["p1"]["text"] == PROSE + "parquet"
    assert records["books/one.txt"]["text"] == PROSE + "book one\nsecond line"
    (warc,) = [r for r in records.values() if r["metadata"]["source"] == "web/crawl.warc.gz"]
    assert warc["id"].startswith("<urn:uuid:") and warc["metadata"]["url"] == "http://example.com/rivers"
    assert "Paragraph 5: rivers carry water" in warc["text"]
    assert "<p>" not in warc["text"] and "Copyright footer" not in warc["text"]
    manifest = json.loads((tmp_path / "raw" / "manifest.json").read_text())
    assert {s["format"] for s in manifest["sources"]} == {"jsonl", "parquet", "text", "warc"}
    assert manifest["rejected_docs"] == 0 and not (tmp_path / "raw" / "rejects").exists()


def test_globs_and_an_inputs_list(tmp_path, mixed):
    prepare(
        cfg_for(
            tmp_path,
            f"data.corpus.input_dir={mixed}/**/*.txt",
            f"data.corpus.inputs=[{mixed}/b.parquet,{mixed}/web]",
            f"data.corpus.dvc_dep={mixed}",  # what DVC hashes: a folder holding every input
            "data.corpus.text_key=body",
            "data.corpus.id_key=doc",
        )
    )
    names = sorted(p.name for p in (tmp_path / "raw").glob("*.jsonl.gz"))
    assert names == ["b.jsonl.gz", "books__one.jsonl.gz", "crawl.jsonl.gz"]


def test_an_input_dvc_would_not_track_is_refused_before_anything_is_read(tmp_path, mixed):
    """dvc.yaml's prepare stage depends on data.corpus.dvc_dep (by default input_dir): an input outside it,
    or a glob there, would let `dvc status` miss an edit to the corpus."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "x.jsonl").write_text(json.dumps({"id": "x", "text": PROSE}) + "\n")
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "old.jsonl.gz").write_bytes(b"the last run's output")
    cases = {
        "inputs outside": (
            [f"data.corpus.input_dir={mixed}", f"data.corpus.inputs=[{other}/x.jsonl]"],
            f"data.corpus.dvc_dep={mixed} does not hold data.corpus.inputs[0]={other}/x.jsonl: ",
        ),
        "a glob": (
            [f"data.corpus.input_dir={mixed}/**/*.txt"],
            f"data.corpus.dvc_dep={mixed}/**/*.txt is a glob: ",
        ),
    }
    for overrides, says in cases.values():
        with pytest.raises(ConfigError) as err:
            prepare(cfg_for(tmp_path, *overrides))
        msg = str(err.value)
        assert msg.startswith(says) and "\n" not in msg, msg
        common = tmp_path if "inputs" in says else mixed
        assert msg.endswith(f"Set data.corpus.dvc_dep={common} (a folder or file holding every input)"), msg
    assert sorted(p.name for p in raw.iterdir()) == ["old.jsonl.gz"], "nothing was written"
    with pytest.raises(ConfigError, match="data.corpus.dvc_dep is empty"):
        cfg_for(tmp_path, "data.corpus.input_dir=", f"data.corpus.inputs=[{mixed}]")
    body = ("data.corpus.text_key=body", "data.corpus.id_key=doc")
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={mixed}", f"data.corpus.dvc_dep={mixed}/..", *body))
    assert (raw / "b.jsonl.gz").is_file(), "a folder above every input is fine"


def test_a_glob_that_matches_nothing_and_a_bad_extractor_are_clear_errors(tmp_path, mixed, monkeypatch):
    with pytest.raises(DataError, match=r"data\.corpus\.inputs\[0\]=.*nope\*: the pattern matches no file"):
        prepare(cfg_for(tmp_path, f"data.corpus.input_dir={mixed}", f"data.corpus.inputs=[{mixed}/nope*]"))
    with pytest.raises(ConfigError, match="data.corpus.html_extractor='lxml'"):
        prepare(cfg_for(tmp_path, f"data.corpus.input_dir={mixed}", "data.corpus.html_extractor=lxml"))
    monkeypatch.setitem(sys.modules, "trafilatura", None)  # an environment where it does not import
    with pytest.raises(ConfigError, match="html_extractor=trafilatura cannot be used .*; use builtin"):
        prepare(cfg_for(tmp_path, f"data.corpus.input_dir={mixed}", "data.corpus.html_extractor=trafilatura"))


# -- bad input: counted, kept in the rejects file, the run goes on -----------------------------------------

GOOD = {"id": "g1", "text": PROSE + "g1"}


def bad_corpus(root: Path) -> dict[str, bytes]:
    """A folder of every kind of bad input; returns the raw bytes of some rejected lines, by name."""
    root.mkdir(parents=True)
    lines = {
        "good": json.dumps(GOOD).encode(),
        "malformed": b'{"id": "m", "text": "cut off',
        "utf8": b'{"id": "u", "text": "caf\xe9 latin-1"}',
        "empty": json.dumps({"id": "e", "text": ""}).encode(),
        "spaces": json.dumps({"id": "w", "text": " \n\t "}).encode(),
        "dup": json.dumps({"id": "g1", "text": PROSE + "second g1"}).encode(),
        "no_id": json.dumps({"text": PROSE + "no id"}).encode(),
        "array": b"[1, 2, 3]",
        "surrogate": b'{"id": "s", "text": "half \\ud800 pair"}',
        "number": json.dumps({"id": "n", "text": 42}).encode(),
        "no_text": json.dumps({"id": "t", "body": PROSE}).encode(),
    }
    # lines 1..11 in this order, then a blank line that is not a record
    (root / "mix.jsonl").write_bytes(b"\n".join(lines.values()) + b"\n\n")
    (root / "garbage.jsonl").write_bytes(bytes(range(256)) * 8)  # NUL bytes: binary
    (root / "notgzip.jsonl.gz").write_bytes(b"this is not gzip data")
    whole = gzip.compress(
        b"".join(json.dumps({"id": f"t{i}", "text": PROSE}).encode() + b"\n" for i in range(50))
    )
    (root / "truncated.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    (root / "garbage.parquet").write_bytes(b"PAR1 garbage")
    (root / "image.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    return lines


def test_bad_input_is_counted_by_reason_with_file_and_line(tmp_path):
    lines = bad_corpus(tmp_path / "bad")
    summary = prepare(cfg_for(tmp_path, f"data.corpus.input_dir={tmp_path / 'bad'}"))
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    assert report["rejected"] == {
        "binary_file": 2,
        "empty": 1,
        "invalid_utf8": 2,  # a bad byte, and a lone surrogate escape that cannot be written as UTF-8
        "malformed_json": 1,
        "missing_text": 1,
        "not_an_object": 1,
        "text_not_string": 1,
        "unreadable_file": 3,  # not gzip, truncated gzip, not Parquet
        "whitespace_only": 1,
    }
    assert report["rejected_docs"] == 13 == summary["rejected"]
    where = {(e["file"], e["line"]): e["reason"] for e in report["rejected_examples"]}
    assert {k: v for k, v in where.items() if k[0] == "mix.jsonl"} == {
        ("mix.jsonl", 2): "malformed_json",
        ("mix.jsonl", 3): "invalid_utf8",
        ("mix.jsonl", 4): "empty",
        ("mix.jsonl", 5): "whitespace_only",
        ("mix.jsonl", 8): "not_an_object",
        ("mix.jsonl", 9): "invalid_utf8",
        ("mix.jsonl", 10): "text_not_string",
        ("mix.jsonl", 11): "missing_text",
    }
    assert where[("garbage.jsonl", None)] == where[("image.txt", None)] == "binary_file"
    assert where[("notgzip.jsonl.gz", 1)] == where[("garbage.parquet", None)] == "unreadable_file"
    (truncated,) = [e for e in report["rejected_examples"] if e["file"] == "truncated.jsonl.gz"]
    records = read_raw(tmp_path / "raw")
    kept_before_the_break = sum(
        1 for r in records.values() if r["metadata"]["source"] == "truncated.jsonl.gz"
    )
    assert 0 < kept_before_the_break < 50 and truncated["line"] == kept_before_the_break + 1
    assert "truncated.jsonl.gz:" in truncated["message"] and "cannot read" in truncated["message"]

    # no copy of a repeated id keeps it, a missing id becomes file:line; both are counted
    assert "g1" not in records
    assert records["g1#1"]["text"] == PROSE + "g1" and records["g1#2"]["text"] == PROSE + "second g1"
    assert records["mix.jsonl:7"]["text"] == PROSE + "no id"
    assert report["renamed_ids"] == {"duplicate_id": 2, "missing_id": 1}
    assert {"file": "mix.jsonl", "line": 6, "reason": "duplicate_id", "id": "g1", "new_id": "g1#2"} in report[
        "renamed_examples"
    ]

    # nothing is lost: each rejected line is in the rejects file, byte for byte
    rejects = rejects_of(tmp_path)
    assert len(rejects) == 13
    by_line = {(r["file"], r["line"]): r for r in rejects}
    assert base64.b64decode(by_line["mix.jsonl", 3]["raw_base64"]) == lines["utf8"] + b"\n"
    assert by_line["mix.jsonl", 2]["raw"] == lines["malformed"].decode() + "\n"
    assert json.loads(by_line["mix.jsonl", 10]["raw"]) == {"id": "n", "text": 42}
    assert "sha256" in by_line["garbage.jsonl", None]["message"]


def test_duplicate_ids_across_files_and_a_taken_suffix(tmp_path):
    root = tmp_path / "dups"
    root.mkdir()
    rows = [{"id": "x", "text": PROSE}, {"id": "x#2", "text": PROSE + "b"}]
    (root / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "b.jsonl").write_text(json.dumps({"id": "x", "text": PROSE + "c"}) + "\n")
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={root}"))
    records = read_raw(tmp_path / "raw")
    assert sorted(records) == ["x#1", "x#2", "x#3"] and records["x#3"]["text"] == PROSE + "c"
    assert records["x#1"]["text"] == PROSE and records["x#2"]["text"] == PROSE + "b"


def test_an_impostor_read_first_does_not_take_a_documents_id(tmp_path):
    """The file read first (by path) used to keep a repeated id: an impostor named to sort first took it."""
    root = tmp_path / "corpus"
    root.mkdir()
    (root / "0_impostor.jsonl").write_text(json.dumps({"id": "doc-42", "text": PROSE + "fake"}) + "\n")
    (root / "real.jsonl").write_text(json.dumps({"id": "doc-42", "text": PROSE + "real"}) + "\n")
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={root}"))
    records = read_raw(tmp_path / "raw")
    assert sorted(records) == ["doc-42#1", "doc-42#2"]
    assert records["doc-42#2"]["text"] == PROSE + "real"  # input order decides the numbers, and is logged
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    assert {e["new_id"] for e in report["renamed_examples"]} == {"doc-42#1", "doc-42#2"}


def huge_document(root: Path, mb: int = 50) -> Path:
    root.mkdir(parents=True)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi. "
    text = words * (mb * 1_000_000 // len(words) + 1)
    path = root / "huge.jsonl"
    path.write_text(
        json.dumps({"id": "small", "text": PROSE}) + "\n" + json.dumps({"id": "huge", "text": text}) + "\n"
    )
    return path


def test_a_50_mb_document_is_rejected_by_the_default_cap(tmp_path):
    huge_document(tmp_path / "in")
    start = time.monotonic()
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={tmp_path / 'in'}"))
    seconds = time.monotonic() - start
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    assert report["rejected"] == {"too_long": 1} and report["docs"] == 1
    (example,) = report["rejected_examples"]
    assert example["line"] == 2 and "> data.corpus.max_doc_chars=10000000" in example["message"]
    (reject,) = rejects_of(tmp_path)
    assert len(json.loads(reject["raw"])["text"]) >= 50_000_000
    assert seconds < 30, f"{seconds:.1f} s: reading one big line must stay linear"


def test_a_50_mb_document_passes_without_a_cap(tmp_path):
    path = huge_document(tmp_path / "in")
    start = time.monotonic()
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={path}", "data.corpus.max_doc_chars=0"))
    seconds = time.monotonic() - start
    records = read_raw(tmp_path / "raw")
    assert len(records["huge"]["text"]) >= 50_000_000 and records["small"]["text"] == PROSE
    assert seconds < 60, f"{seconds:.1f} s"


# -- hostile input: symlinks out of the corpus, records Python cannot take, lines without end ---------------


def test_symlinks_out_of_the_corpus_are_counted_and_never_read(tmp_path):
    """A corpus reads only itself: a symlinked file or folder that resolves outside the input's root (the
    folder, or a glob's fixed leading folders) is rejected as outside_corpus, unread; one that stays inside
    is read once, like its target."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "passwd.txt").write_text(PROSE + "SECRET text")
    (secret / "leak.jsonl").write_text(json.dumps({"id": "s", "text": PROSE + "SECRET line"}) + "\n")
    corp = tmp_path / "corp"
    (corp / "sub").mkdir(parents=True)
    (corp / "a.jsonl").write_text(json.dumps(GOOD) + "\n")
    (corp / "sub" / "inner.txt").write_text(PROSE + "inner")
    (corp / "leak.txt").symlink_to(secret / "passwd.txt")
    (corp / "sub" / "up.jsonl").symlink_to("../../secret/leak.jsonl")
    (corp / "alias.txt").symlink_to("sub/inner.txt")  # stays inside
    (corp / "outdir").symlink_to(secret, target_is_directory=True)  # a folder out: not followed
    (corp / "loop").symlink_to(".")  # a folder inside: not entered (glob's ** used to, round and round)
    (corp / "gone.jsonl").symlink_to("nowhere.jsonl")  # broken, inside: not a file (a glob used to crash)
    for spec in (str(corp), f"{corp}/**/*"):
        prepare(cfg_for(tmp_path, f"data.corpus.input_dir={spec}", f"data.corpus.dvc_dep={corp}"))
        texts = sorted(r["text"] for r in read_raw(tmp_path / "raw").values())
        assert texts == sorted([GOOD["text"], PROSE + "inner"]), spec
        report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
        assert report["rejected"] == {"outside_corpus": 3}, spec
        rejects = rejects_of(tmp_path)
        assert sorted(r["file"] for r in rejects) == ["leak.txt", "outdir", "sub/up.jsonl"], spec
        assert all(r["line"] is None and "raw" not in r and "raw_base64" not in r for r in rejects)
        by_file = {r["file"]: r["message"] for r in rejects}
        message = by_file["leak.txt"]
        assert str((secret / "passwd.txt").resolve()) in message and str(corp.resolve()) in message
        assert "SECRET" not in json.dumps(report)


def test_records_python_cannot_parse_or_write_are_rejected_not_fatal(tmp_path):
    """JSON nested 100,000 deep (RecursionError), a 5,000-digit number (ValueError), a lone surrogate in an
    id or another field (UnicodeEncodeError when written) each spoil only their own line."""
    root = tmp_path / "in"
    root.mkdir()
    deep = '{"id": "d", "text": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    lines = [
        json.dumps(GOOD),
        deep,
        '{"id": "n", "text": "t", "n": ' + "1" * 5000 + "}",
        json.dumps({"id": "m", "text": PROSE, "note": "half \ud800 pair"}),
        json.dumps({"id": "\udc80", "text": PROSE}),
        json.dumps({"id": "g2", "text": PROSE + "g2"}),
    ]
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    summary = prepare(cfg_for(tmp_path, f"data.corpus.input_dir={root}"))
    assert sorted(read_raw(tmp_path / "raw")) == ["g1", "g2"] and summary["rejected"] == 4
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    where = {e["line"]: (e["reason"], e["message"]) for e in report["rejected_examples"]}
    assert {k: v[0] for k, v in where.items()} == {
        2: "too_deep",
        3: "malformed_json",
        4: "invalid_utf8",
        5: "invalid_utf8",
    }
    assert all(m.startswith(f"{root / 'a.jsonl'}:{k}: ") for k, (_, m) in where.items())
    assert "\n" not in "".join(m for _, m in where.values())
    by_line = {r["line"]: r for r in rejects_of(tmp_path)}
    assert by_line[2]["raw"] == deep + "\n", "the raw line is kept"


def bad_utf8_strings(values: list[bytes]) -> pa.Array:
    """A Parquet string column whose bytes need not be UTF-8: pyarrow's view does not check them."""
    return pa.array(values, type=pa.binary()).view(pa.string())


def test_parquet_values_python_cannot_hold_cost_only_their_row(tmp_path):
    """A string cell that is not UTF-8 (UnicodeDecodeError) or a date past 9999 (OverflowError) used to stop
    prepare; now each rejects its row, with file:row, the column and (for strings) the cell's bytes."""
    root = tmp_path / "in"
    root.mkdir()
    good = PROSE.encode()
    table = pa.table(
        {
            "id": ["r1", "r2", "r3", "r4", "r5"],
            "text": bad_utf8_strings([good, b"caf\xe9 " + good, good, good, good]),
            "title": bad_utf8_strings([b"one", b"two", b"\xff three", b"four", b"five"]),
            "day": pa.array([0, 0, 0, 2**31 - 1, 0], type=pa.date32()),  # day 2**31 - 1: after the year 9999
        }
    )
    pq.write_table(table, root / "t.parquet")
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={root}"))
    records = read_raw(tmp_path / "raw")
    assert sorted(records) == ["r1", "r5"] and records["r5"]["metadata"]["title"] == "five"
    rejects = {r["line"]: r for r in rejects_of(tmp_path)}
    assert {k: r["reason"] for k, r in rejects.items()} == {
        2: "invalid_utf8",
        3: "invalid_utf8",
        4: "bad_value",
    }
    assert rejects[2]["message"].startswith(f"{root / 't.parquet'}:2: column 'text': invalid UTF-8")
    assert base64.b64decode(rejects[3]["raw_base64"]) == b"\xff three"
    assert rejects[4]["message"].startswith(f"{root / 't.parquet'}:4: column 'day': not a Python value")


def test_a_damaged_parquet_row_group_costs_only_its_rows(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    path = root / "groups.parquet"
    rows = {"id": [f"r{i}" for i in range(9)], "text": [f"{PROSE} {i}" for i in range(9)]}
    pq.write_table(pa.table(rows), path, row_group_size=3, compression="none")
    column = pq.ParquetFile(path).metadata.row_group(1).column(1)  # rows 4..6, the text column
    data = bytearray(path.read_bytes())
    start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
    data[start : start + column.total_compressed_size] = b"\xff" * column.total_compressed_size
    path.write_bytes(bytes(data))
    prepare(cfg_for(tmp_path, f"data.corpus.input_dir={root}"))
    assert sorted(read_raw(tmp_path / "raw")) == ["r0", "r1", "r2", "r6", "r7", "r8"]
    (reject,) = rejects_of(tmp_path)
    assert reject["reason"] == "unreadable_file" and reject["line"] == 4
    assert reject["message"].startswith(f"{path}:4: rows 4-6 (row group 2 of 3) cannot be read")


BOUNDED_RUN = """
import json, resource, sys, tracemalloc
from zaya_pipeline.config import load_config
from zaya_pipeline.data.prepare import prepare

tmp = sys.argv[1]
cfg = load_config([f"paths.raw={tmp}/raw", f"paths.reports={tmp}/reports", "data.corpus.source=folder",
                   f"data.corpus.input_dir={tmp}/in", "data.corpus.max_doc_chars=1000000"])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
prepare(cfg)
peak = tracemalloc.get_traced_memory()[1]
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"peak_mb": peak / 2**20, "grew_mb": grew / 1024}))
"""


def write_big(path: Path, mb: int = 200) -> None:
    """A file (gzip'd by suffix) of one line of ``mb`` MB between a good line and another: a text of "a"s,
    or NUL bytes for ``*.bin.jsonl``."""
    block = (b"\0" if path.name.endswith(".bin.jsonl") else b"a") * (1 << 20)
    is_jsonl = path.name.endswith(".jsonl.gz")
    with gzip.open(path, "wb", compresslevel=1) if path.suffix == ".gz" else open(path, "wb") as out:
        out.write(json.dumps(GOOD).encode() + b'\n{"id": "big", "text": "' if is_jsonl else b"")
        for _ in range(mb):
            out.write(block)
        out.write(b'"}\n' + json.dumps({"id": "after", "text": PROSE}).encode() + b"\n" if is_jsonl else b"")


@pytest.mark.parametrize(
    ("name", "reason", "line", "docs"),
    [
        ("big.jsonl.gz", "too_long", 2, 3),  # + small.txt
        ("big.txt", "too_long", None, 1),
        ("big.bin.jsonl", "binary_file", None, 1),  # hashed for the rejects file, not read whole
    ],
)
def test_an_endless_record_is_cut_while_it_is_read(tmp_path, name, reason, line, docs):
    """A record is stopped at data.corpus.max_doc_chars while it is decompressed and read: a 200 MB line
    (or text file) costs a few MB, not its size several times over; the next line is still read. Measured
    in a fresh process: the peak of Python's allocations (tracemalloc) and the growth of its peak RSS."""
    root = tmp_path / "in"
    root.mkdir()
    write_big(root / name)
    (root / "small.txt").write_text(PROSE)
    run = subprocess.run(
        [sys.executable, "-c", BOUNDED_RUN, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    memory = json.loads(run.stdout.strip().splitlines()[-1])
    assert memory["peak_mb"] < 64 and memory["grew_mb"] < 100, f"200 MB read whole: {memory}"
    report = json.loads((tmp_path / "reports" / "prepare.json").read_text())
    assert report["rejected"] == {reason: 1} and report["docs"] == docs
    (reject,) = rejects_of(tmp_path)
    assert reject["file"] == name and reject["line"] == line and "sha256" in reject["message"]
    assert "raw" not in reject and "raw_base64" not in reject
    assert reason != "too_long" or "data.corpus.max_doc_chars=1000000" in reject["message"]
